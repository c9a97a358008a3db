"""``build_loader``: a DataLoader wired for token windows, with one seed and exact resume.

    from tokpack import TokenWindows, build_loader
    train_loader = build_loader(TokenWindows("data/sample/train.bin", 256), batch_size=64,
                                seed=1337, num_samples=64 * 5000)
    for x, y in train_loader: ...
    state = train_loader.state_dict()          # into the checkpoint; load_state_dict() resumes

The sampler follows from the dataset: random starts for training windows, a shuffled epoch for
strided windows with ``shuffle=True``, in order for evaluation. The loader counts the batches it
has handed out; a loader restored from that count yields exactly the batches the uninterrupted
one would have yielded next, by starting its sampler there (no data is fetched and thrown away).
"""

from __future__ import annotations

import multiprocessing
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from .samplers import (
    EpochSampler,
    RandomStartSampler,
    SequentialSampler,
    WindowBatchSampler,
    mix_seed,
)
from .windows import TokenWindows, collate_windows

STATE_VERSION = 1


def seed_worker(worker_id: int) -> None:
    """Seed numpy, ``random`` and the worker's own copy of the dataset from the worker seed.

    PyTorch seeds torch in each worker from the loader's generator (base_seed + worker_id); an RNG
    object pickled with the dataset would otherwise be the same in every worker.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = get_worker_info()
    if info is not None:
        info.dataset.rng = np.random.default_rng(seed)


def accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


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


def default_mp_context() -> str | None:
    """forkserver with torch and numpy preloaded where the platform has it, else the OS default."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return None


def mp_context(name: str | None) -> Any:
    if name is None:
        return None
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        # Later worker pools fork from a server that already imported these, not a fresh interpreter.
        ctx.set_forkserver_preload(["torch", "numpy", "tokpack.windows", "tokpack.loader"])
    return ctx


class TokenLoader:
    """A DataLoader plus the position (epoch, batch) it has reached, for exact resume."""

    def __init__(self, dataloader: DataLoader, sampler: WindowBatchSampler, seed: int):
        self.dataloader, self.sampler, self.seed = dataloader, sampler, seed
        self.epoch = 0
        self.batch = 0

    @property
    def dataset(self) -> Dataset:
        return self.dataloader.dataset

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        per_epoch = self.sampler.batches_per_epoch()
        self.sampler.epoch, self.sampler.start_batch = self.epoch, self.batch
        rank = self.sampler.rank
        # Worker seeds (and so any augmentation) follow from (seed, rank, epoch), not from history.
        self.dataloader.generator = torch.Generator().manual_seed(mix_seed("workers", self.seed, rank, self.epoch))
        if self.dataloader.num_workers == 0 and hasattr(self.dataset, "rng"):
            self.dataset.rng = np.random.default_rng(mix_seed("main", self.seed, rank, self.epoch))
        for item in self.dataloader:
            self.batch += 1
            if self.batch >= per_epoch:  # roll over now, so a state taken here resumes in the next epoch
                self.epoch, self.batch = self.epoch + 1, 0
            yield item

    def _settings(self) -> dict[str, Any]:
        s = self.sampler
        return {"kind": s.kind, "seed": self.seed, "batch_size": s.batch_size, "world_size": s.world_size,
                "rank": s.rank, "dataset_len": s.num_windows, "num_samples": getattr(s, "num_samples", None),
                "drop_last": s.drop_last}

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, with the settings that position depends on."""
        return {"version": STATE_VERSION, **self._settings(), "epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refused if it was taken under other settings."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state has version {state.get('version')!r}, this tokpack reads {STATE_VERSION}")
        for key, value in self._settings().items():
            if state.get(key) != value:
                raise ValueError(
                    f"loader state was taken with {key}={state.get(key)!r} but this loader has {key}={value!r}; "
                    f"build the loader with the same {key} to resume"
                )
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


def build_loader(
    dataset: Dataset,
    batch_size: int,
    seed: int = 0,
    *,
    shuffle: bool | None = None,
    num_samples: int | None = None,
    drop_last: bool | None = None,
    num_workers: int = 0,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    pin_memory: bool | str = "auto",
    multiprocessing_context: str | None = "default",
    rank: int | None = None,
    world_size: int | None = None,
    sampler: WindowBatchSampler | None = None,
    collate_fn: Any = None,
) -> TokenLoader:
    """A resumable loader over ``dataset`` (usually a ``TokenWindows``).

    Sampling: training windows (no stride) draw random starts, ``num_samples`` per epoch and
    rank (endless if None); strided windows go in order, or shuffled per epoch with
    ``shuffle=True``. ``rank``/``world_size`` default to torch.distributed or torchrun's
    environment. Other datasets (documents, mixtures) take a ``sampler`` or go in order, or
    shuffled per epoch with ``shuffle=True``; ``collate_fn`` defaults to the dataset's
    ``default_collate_fn`` if it has one. ``pin_memory="auto"`` pins only with an accelerator.
    ``multiprocessing_context="default"`` means forkserver with torch preloaded where available.
    """
    if sampler is None:
        sampler = _default_sampler(dataset, batch_size, seed, shuffle, num_samples, drop_last, rank, world_size)
    if pin_memory == "auto":
        pin_memory = accelerator_available()
    elif pin_memory and not accelerator_available():
        warnings.warn("pin_memory=True has no effect: no accelerator is present", stacklevel=2)
        pin_memory = False
    if num_workers == 0:
        if persistent_workers or prefetch_factor is not None:
            warnings.warn("persistent_workers and prefetch_factor have no effect with num_workers=0", stacklevel=2)
        persistent_workers, prefetch_factor = False, None
    context = default_mp_context() if multiprocessing_context == "default" else multiprocessing_context
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn or getattr(dataset, "default_collate_fn", collate_windows),
        pin_memory=bool(pin_memory),
        worker_init_fn=seed_worker if num_workers else None,
        multiprocessing_context=mp_context(context) if num_workers else None,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        generator=torch.Generator().manual_seed(seed),
    )
    return TokenLoader(loader, sampler, seed)


def _default_sampler(dataset: Dataset, batch_size: int, seed: int, shuffle: bool | None, num_samples: int | None,
                     drop_last: bool | None, rank: int | None, world_size: int | None) -> WindowBatchSampler:
    n = len(dataset)  # type: ignore[arg-type]
    if isinstance(dataset, TokenWindows) and dataset.stride is None:
        if shuffle is False:
            raise ValueError("windows at every start position are only sampled at random; "
                             "pass stride=block_size to TokenWindows for in-order windows")
        return RandomStartSampler(n, batch_size, seed, num_samples, rank, world_size,
                                  drop_last=True if drop_last is None else drop_last)
    if num_samples is not None:
        raise ValueError("num_samples applies to random-start windows; these items are used once per epoch")
    if shuffle:
        return EpochSampler(n, batch_size, seed, rank, world_size, drop_last=bool(drop_last))
    if drop_last:
        raise ValueError("drop_last=True would skip up to batch_size-1 evaluation windows; leave it off")
    return SequentialSampler(n, batch_size, rank, world_size)
