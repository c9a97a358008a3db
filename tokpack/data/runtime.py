"""Process facts every stage shares: ranks, accelerators, worker start methods, seeds, devices.

    python -c "from tokpack.data.runtime import rank_world; print(rank_world())"

One home for what a process needs to know about where it runs, so samplers, streams, the loader,
evaluation and the training script agree on them.

See docs/loading.md.
"""

from __future__ import annotations

import ast
import hashlib
import multiprocessing
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..distributed import probe

# What the forkserver imports once, so that worker pools fork from a warm interpreter. It skips a
# name that fails to import without a word, so a test imports each of these.
FORKSERVER_PRELOAD = ("torch", "numpy", "tokpack.data.windows", "tokpack.data.loader")


def rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): the arguments where given, else the running process group's
    (``tokpack.distributed.probe``, which refuses ranks in the environment without a group)."""
    if rank is None or world_size is None:
        found = probe()
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must lie in 0..world_size-1 (world_size {world_size})")
    return rank, world_size


def mix_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts, so (seed, rank, epoch) streams never collide."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator(*parts: int | str) -> torch.Generator:
    """A ``torch.Generator`` seeded from ``parts``; never the global RNG."""
    return torch.Generator().manual_seed(mix_seed(*parts))


def accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def resolve_pin_memory(pin_memory: bool | str) -> bool:
    """``"auto"`` pins only with an accelerator; an explicit True without one warns and is dropped."""
    if pin_memory == "auto":
        return accelerator_available()
    if pin_memory and not accelerator_available():
        import warnings

        warnings.warn("pin_memory=True has no effect: no accelerator is present", stacklevel=3)
        return False
    return bool(pin_memory)


def main_is_importable() -> bool:
    """Whether spawn/forkserver workers can re-import ``__main__`` without re-running a script.

    Such workers import the main script (or ``python -m`` module) again; one with no
    ``if __name__ == "__main__":`` guard (nanoGPT's train.py) would start its training again in
    every worker. Interactive sessions have no script to re-import.
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None:
        return True
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.If) and _is_main_test(node.test) for node in tree.body)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    values = {s.value for s in sides if isinstance(s, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


def worker_context(name: str | None) -> Any:
    """The multiprocessing context for loader workers.

    ``"default"``: fork where the platform has it, else the platform's default. Fork works in any
    script, guarded or not, as a plain DataLoader does on Linux up to Python 3.13; Python 3.14
    makes forkserver Linux's default start method, which would re-run unguarded scripts, so the
    choice is explicit here. ``spawn``/``forkserver`` (asked for, or the interpreter's default)
    from a script without a ``__main__`` guard are refused here, in the main process, with the
    fix, rather than failing later as a dead worker.
    """
    if name == "default":
        name = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    if name is None:
        # The first listed method is the platform's default; asking the default context would fix it.
        name = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if name in ("spawn", "forkserver") and not main_is_importable():
        script = getattr(sys.modules["__main__"], "__file__", "__main__")
        raise ValueError(
            f"multiprocessing_context={name!r} re-runs {script} in every worker because it has no "
            "'if __name__ == \"__main__\":' guard; add the guard or use multiprocessing_context='fork'"
        )
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def seed_worker(worker_id: int) -> None:
    """Seed numpy's and ``random``'s global state in a worker from torch's worker seed.

    PyTorch seeds only torch in each worker (base_seed + worker_id); forked workers would
    otherwise share the parent's numpy and ``random`` state and draw the same numbers.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def to_device(batch: Any, device: torch.device | str) -> Any:
    """Copy a batch (tensors, tuples, lists, dicts) to ``device`` with non_blocking copies."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
