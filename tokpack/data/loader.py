"""``build_loader``: a DataLoader wired for token windows, with one seed and exact resume.

    from tokpack import TokenWindows, build_loader
    train_loader = build_loader(TokenWindows("data/sample/train.bin", 256), batch_size=64,
                                seed=1337, num_samples=64 * 5000)
    for x, y in train_loader: ...
    state = train_loader.state_dict()          # into the checkpoint; load_state_dict() resumes

The dataset provides its default sampler (random starts for training windows, in order or
shuffled per epoch for everything else) and its default collate function. The loader counts the
batches it has handed out; a loader restored from that count yields exactly the batches the
uninterrupted one would have yielded next, by starting its sampler there (no data is fetched and
thrown away).

See docs/loading.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .protocol import LoaderDataset
from .runtime import mix_seed, resolve_pin_memory, seed_worker, to_device, worker_context
from .samplers import STATE_VERSION, ResumableBatchSampler, check_state, index_sampler
from .windows import collate_windows

# A worker batch made whole in the training process: (batch, device) -> batch.
Finish = Callable[[Any, "torch.device | str | None"], Any]


class TokenLoader:
    """A DataLoader plus the position (epoch, batch) it has handed out, for exact resume."""

    def __init__(self, dataloader: DataLoader, sampler: ResumableBatchSampler, seed: int,
                 device: torch.device | str | None = None, dataset: Dataset | None = None,
                 finish: Finish | None = None):
        self.dataloader, self.sampler, self.seed, self.device = dataloader, sampler, seed, device
        self._dataset = dataset if dataset is not None else dataloader.dataset
        self._finish = finish
        self.epoch = 0
        self.batch = 0

    @property
    def dataset(self) -> Dataset:
        """The dataset as the user built it (workers may read a compact copy of it)."""
        return self._dataset

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        per_epoch = self.sampler.batches_per_epoch()
        self.sampler.set_position(self.epoch, self.batch)
        # Worker seeds (numpy's and random's global state in each worker) follow from
        # (seed, rank, epoch), not from history; tokpack datasets seed per batch as well.
        self.dataloader.generator = torch.Generator().manual_seed(
            mix_seed("workers", self.seed, self.sampler.rank, self.epoch))
        for item in self._fetched():
            if self._finish is not None:  # a narrow batch from the workers, made whole here
                item = self._finish(item, self.device)
            elif self.device is not None:
                item = to_device(item, self.device)
            self.batch += 1
            if self.batch >= per_epoch:  # roll over now, so a state taken here resumes in the next epoch
                self.epoch, self.batch = self.epoch + 1, 0
            yield item

    def _fetched(self) -> Iterator[Any]:
        """The DataLoader's batches. In this process without pinning, fetched here as its
        single-process iterator fetches them (the dataset's ``__getitems__``, else item by item, then
        the collate function): the same batches, without its per-batch machinery (tens of
        microseconds, as much as a whole window batch's work)."""
        loader = self.dataloader
        if loader.num_workers or loader.pin_memory:
            yield from loader
            return
        dataset, collate = loader.dataset, loader.collate_fn
        getitems = getattr(dataset, "__getitems__", None)
        for indices in loader.batch_sampler:
            yield collate(getitems(indices) if getitems else [dataset[i] for i in indices])

    def _settings(self) -> dict[str, Any]:
        fingerprint = getattr(self.dataset, "fingerprint", None)
        return {**self.sampler.settings(),
                "dataset": fingerprint() if callable(fingerprint) else len(self.dataset)}  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, with the settings (and data) that position depends on."""
        return {"version": STATE_VERSION, **self._settings(), "epoch": self.epoch, "batch": self.batch,
                **self.sampler.stream_state(self.batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refused, naming both values, if taken under other settings or data."""
        # The loader rolls over at an epoch's last batch, so a state of its own is always inside one.
        epoch, batch = check_state(state, "loader", self._settings(), self.sampler.batches_per_epoch() - 1)
        self.sampler.load_stream_state(state, batch)
        self.epoch, self.batch = epoch, batch


def build_loader(
    dataset: LoaderDataset | Dataset,
    batch_size: int | None = None,
    seed: int | None = None,
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
    sampler: ResumableBatchSampler | None = None,
    collate_fn: Any = None,
    device: torch.device | str | None = None,
) -> TokenLoader:
    """A resumable loader over ``dataset`` (usually a ``TokenWindows``).

    Sampling: the dataset's ``default_sampler`` (training windows draw random starts,
    ``num_samples`` per epoch and rank, endless if None; strided windows, documents and other
    datasets go in order, or shuffled per epoch with ``shuffle=True``), or ``sampler``, which then
    decides batch size, seed, shuffling and ranks: a ``batch_size`` or ``seed`` that contradicts
    it is refused. ``seed`` defaults to 0. ``rank``/``world_size`` default to torch.distributed's.
    ``collate_fn`` defaults to the dataset's ``default_collate_fn``. ``pin_memory="auto"`` pins
    only with an accelerator. With workers, ``TokenWindows`` and ``PackedDocuments`` send the
    stored tokens, finished in the main process (on ``device`` after the copy; ``device`` moves
    every other batch too). What the loader reads of a dataset: ``tokpack.data.protocol``.
    ``multiprocessing_context="default"`` is fork where the platform has it, so workers start in
    any script, with or without a ``__main__`` guard.
    """
    if sampler is None:
        sampler = _default_sampler(dataset, batch_size, seed, shuffle=shuffle, num_samples=num_samples,
                                   drop_last=drop_last, rank=rank, world_size=world_size)
    else:
        _check_sampler(sampler, batch_size, seed, shuffle=shuffle, num_samples=num_samples, drop_last=drop_last,
                       rank=rank, world_size=world_size)
    if sampler.batches_per_epoch() == 0:
        raise ValueError(f"the sampler yields no batch in an epoch ({sampler.num_items} items, batch_size "
                         f"{sampler.batch_size}, {sampler.world_size} ranks, drop_last={sampler.drop_last}); "
                         "use a smaller batch_size, drop_last=False or more data")
    if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
        warnings.warn("persistent_workers and prefetch_factor have no effect with num_workers=0", stacklevel=2)
    read = _worker_copy(dataset) if num_workers > 0 else None
    loader = DataLoader(
        read if read is not None else dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn or getattr(dataset, "default_collate_fn", collate_windows),
        pin_memory=resolve_pin_memory(pin_memory),
        worker_init_fn=seed_worker if num_workers else None,
        multiprocessing_context=worker_context(multiprocessing_context) if num_workers else None,
        persistent_workers=persistent_workers and num_workers > 0,
        prefetch_factor=prefetch_factor if num_workers else None,
    )
    return TokenLoader(loader, sampler, sampler.seed, device, dataset,
                       dataset.finish_batch if read is not None else None)  # type: ignore[attr-defined]


def _worker_copy(dataset: Dataset) -> Dataset | None:
    """The copy of ``dataset`` workers read: narrower batches (TokenWindows: the stored tokens, 2 or 4
    bytes each, not int64 x and y at 16), which the dataset finishes in the training process."""
    make = getattr(dataset, "worker_copy", None)
    return make() if make is not None else None


def _default_sampler(dataset: Dataset, batch_size: int | None, seed: int | None, *, num_samples: int | None,
                     **options: Any) -> ResumableBatchSampler:
    """The sampler the dataset asks for (``default_sampler``), else its indices in order or shuffled."""
    if batch_size is None:
        raise ValueError("build_loader needs a batch_size (or a sampler, which has one)")
    seed = 0 if seed is None else seed
    make = getattr(dataset, "default_sampler", None)
    if make is not None:
        return make(batch_size, seed, num_samples=num_samples, **options)
    if num_samples is not None:
        raise ValueError("num_samples applies to random draws; these items are used once per epoch")
    return index_sampler(len(dataset), batch_size, seed, options["shuffle"],  # type: ignore[arg-type]
                         options["drop_last"], options["rank"], options["world_size"])


def _check_sampler(sampler: Any, batch_size: int | None, seed: int | None, **ignored: Any) -> None:
    if not isinstance(sampler, ResumableBatchSampler):
        raise TypeError(f"sampler {type(sampler).__name__} is not a tokpack ResumableBatchSampler; "
                        "pass one of tokpack's samplers, or use torch's DataLoader directly")
    for name, given, has in (("batch_size", batch_size, sampler.batch_size), ("seed", seed, sampler.seed)):
        if given is not None and given != has:
            raise ValueError(f"{name}={given} contradicts the sampler's {name}={has}; "
                             f"drop {name}= or build the sampler with {name}={given}")
    given = [name for name, value in ignored.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} would be ignored: the sampler decides them; "
                         "pass them to the sampler instead")
