"""The one probe of the distributed environment: which rank this process is, and torchrun's group.

    torchrun --standalone --nproc_per_node=2 -m tokpack.evaluate data/sample --model bigram

``process_group`` joins the group that torchrun's environment describes (``WORLD_SIZE`` > 1),
for the prepare and evaluate commands and ``scripts/train_gpt.py`` alike, and leaves it again;
``probe`` tells the rank and world size of a running group. Neither imports torch unless a
group is asked for or already exists, so the prepare wing stays torch-free on one process.

See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Distributed:
    """This process's place: rank, world size, and the device it computes on (None: not asked)."""

    rank: int
    world_size: int
    device: str | None = None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank (picklable, small), in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r} in the environment is not a non-negative int; "
                         f"unset {name} or launch with torchrun")
    return value


def launched_world() -> int:
    """The world size torchrun's environment announces (1 without it), checked as a whole number."""
    return _env_int("WORLD_SIZE", 1)


def probe() -> tuple[int, int]:
    """(rank, world size) of the running process group, or (0, 1) without one.

    Environment variables alone (``WORLD_SIZE`` > 1 with no process group) are refused: a silent
    share of the data is worse than an error.
    """
    dist = sys.modules.get("torch.distributed")  # a group can exist only once this is imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env_world = _env_int("WORLD_SIZE", 1)
    if env_world > 1:
        raise ValueError(
            f"WORLD_SIZE={env_world} is set but torch.distributed is not initialised; call "
            "torch.distributed.init_process_group() first, pass rank= and world_size=, "
            "or unset RANK and WORLD_SIZE"
        )
    return 0, 1


def resolve_device(device: str) -> str:
    """``"auto"``: cuda when this torch has a device, else cpu; a cuda device without one is refused."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.split(":")[0] not in ("cpu", "cuda", "mps", "xpu", "meta"):
        raise ValueError(f"--device {device!r} is not a device; use auto, cpu or cuda (cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch has no CUDA device; use --device cpu (or auto)")
    return device


@contextlib.contextmanager
def process_group(device: str | None = None) -> Iterator[Distributed]:
    """This process's place under torchrun (a group joined from its environment if none exists,
    and left at the end), or rank 0 of 1.

    Args:
        device: None for a process that computes nothing on a device (gloo, no torch on one
            process); else ``auto``, ``cpu`` or ``cuda``: resolved, and under torchrun each rank
            takes ``cuda:LOCAL_RANK`` and the group uses nccl.
    """
    if device is not None:
        device = resolve_device(device)
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        yield Distributed(0, 1, device)
        return
    import torch.distributed as dist

    if not dist.is_initialized() and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        raise ValueError(f"WORLD_SIZE={world} is set but MASTER_ADDR and MASTER_PORT are not, so torchrun did not "
                         "start this process; launch it with torchrun, or unset RANK and WORLD_SIZE to run it as "
                         "one process")

    cuda = device is not None and device.startswith("cuda")
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        if cuda and device == "cuda":
            import torch

            device = f"cuda:{_env_int('LOCAL_RANK', 0)}"
            torch.cuda.set_device(device)
        yield Distributed(dist.get_rank(), dist.get_world_size(), device)
    finally:
        if created:
            # Together: a rank that tears the group down while another still uses it aborts gloo.
            if sys.exc_info()[0] is None:
                dist.barrier()
            dist.destroy_process_group()
