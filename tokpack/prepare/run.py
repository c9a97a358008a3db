"""The prepare run, as its stages:

    plan      every decision of the run, once, touching nothing        make_plan (plan/)
    hold      the folder locked, checked and cleared, once              OutputFolder, tasks.ready
    guard     every unit signed and matched, the verdicts decided       guard.placed, in tasks.work
    tokenize  one loop over units whoever launches the run              tasks.work (tokenize/)
    finish    joined (as is, merge, flatten, mix), meta.json, published folder.finish (publish/)

How the run is launched is decided once (``LaunchOptions.kind``): this process, torchrun's ranks,
an independent task, or the tasks of ``--processes`` and Ray; and where it writes, once
(``launches.destination``): its local folder, or a spool published to a URL. ``launches`` holds
how each launcher runs the stages.

    python -m tokpack.prepare docs/ --out-dir data/web
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..storage import redact
from . import launches
from .config import PrepareConfig


def prepare(config: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns meta.json's content plus a ``stats`` entry.

    On one process, under torchrun on every rank of its group (joined here, gloo), as one of
    independent tasks (``--tasks``), or as ``--processes`` of this machine or Ray's tasks
    (``tokpack.prepare.executors``); into a local folder, or a spool published to a URL
    (``tokpack.prepare.publish.remote``).
    """
    started = time.perf_counter()
    config = dataclasses.replace(config, launch=config.launch.on_the_cores())
    launch = config.launch.kind()
    with launches.destination(config, launch) as where:
        result = launches.LAUNCHERS[launch](where, started)
    if where.config is not config:  # published to a URL: the spool it was made in is gone
        result["stats"]["out_dir"] = redact(str(config.out_dir))
    return result
