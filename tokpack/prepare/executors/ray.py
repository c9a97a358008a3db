"""``--ray ADDRESS``: the tasks of a run as Ray tasks (``tokpack[ray]``), on the cluster at
ADDRESS (``HOST:PORT``, its GCS address as ``ray start --head`` prints it), the one this machine
belongs to (``auto``), or one started here for the run (``local``).

Each task is a ``ray.remote`` call of ``tasks.run_task`` with ``max_retries``: a task whose worker
or node dies is run again by Ray, and keeps the units it had recorded. Every worker must see the
inputs (a shared disk, or object storage) and the output folder (a shared disk; or, for a sharded
run, object storage, where each task uploads its units: ``tasks.publish_task``), and have
tokpack installed. A task that fails on its input stops the others and its one line is raised; one that
Ray gave up on raises ``TaskLost``; Ctrl-C cancels every task.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from typing import Any

from ...cli import USER_ERRORS
from ..config import PrepareConfig
from ..tasks import run_task
from .base import Ready, TaskLost

RETRIES = 3  # runs of a task after its worker died, Ray's max_retries
POLL_S = 0.2
CONNECT_S = 5.0  # how long an address may take to answer before the run is refused
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RayTasks:
    """Every task a Ray task on the cluster at ``address``."""

    def __init__(self, address: str):
        self.address = address

    def run(self, config: PrepareConfig, tasks: int, ready: Callable[[], Ready],
            tick: Callable[[], None]) -> None:
        ray = _ray()
        _answers(self.address)
        local = self.address == "local"
        if local:  # its services on the loopback address: nothing of it reaches beyond this machine
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:  # a head on the loopback address is joined there, not at this machine's network address
            loopback = {"_node_ip_address": "127.0.0.1"} if _host(self.address) in LOOPBACK else {}
            ray.init(address=self.address, log_to_driver=False, configure_logging=False, **loopback)
        try:
            tasks = ready().tasks  # every task on the cluster: its workers may not share this machine's disk
            threads = config.workers or 1
            task = ray.remote(max_retries=RETRIES, retry_exceptions=False, num_cpus=threads)(run_task)
            asked = dataclasses.replace(config, workers=threads, quiet=True)
            refs = {task.remote(asked, i): i for i in range(tasks)}
            _wait(ray, refs, tick)
        finally:
            ray.shutdown()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray runs the tasks on a Ray cluster and needs Ray: pip install 'tokpack[ray]'") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a prepare reports nothing to anyone
    return ray


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def _answers(address: str) -> None:
    """Refuse, in a few seconds and one line, an address where no cluster answers (Ray itself
    retries for minutes)."""
    if address in ("local", "auto"):
        return
    try:  # the address's form was checked with the options
        socket.create_connection((_host(address), int(address.rpartition(":")[2])), timeout=CONNECT_S).close()
    except OSError as exc:
        raise ValueError(f"no Ray cluster answers at --ray {address} ({exc.strerror or exc}); start one (ray start "
                         "--head) or pass its address") from None


def _wait(ray: Any, refs: dict[Any, int], tick: Callable[[], None]) -> None:
    """Until every task has ended well; the first that did not is raised, the others cancelled."""
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            tick()
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the task's own error, raised in it
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, USER_ERRORS):
                        raise cause from None
                    raise TaskLost(f"task {refs[ref]} of {len(refs)} failed on Ray: {cause!r}") from None
                except ray.exceptions.RayError as exc:  # its worker or node died, retries spent
                    raise TaskLost(f"task {refs[ref]} of {len(refs)} was lost on Ray after {RETRIES} retries "
                                   f"({type(exc).__name__}); run the same command again: the units done are "
                                   "kept") from None
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
