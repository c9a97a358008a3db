"""``TokenStream``: windows tokenized on the fly from raw text, or read in order from a .bin.

    from tokpack import TokenStream, build_stream_loader
    stream = TokenStream(["corpus/"], block_size=256, seed=0, shuffle_buffer=1024)
    for x, y in build_stream_loader(stream, batch_size=32, num_workers=2): ...

For corpora too large or too live to prepare. An iterable dataset has no index, so it shards
itself: the stream's documents (or, for a .bin, its stride-T windows) are dealt round-robin to
``world_size x num_workers`` shards, shard = rank x num_workers + worker id, so every window is
produced exactly once across all workers and ranks. Shuffling is the shard order (files permuted
per epoch from the seed) plus a seeded shuffle buffer. Each shard packs its documents' tokens
(each followed by <|endoftext|>) into windows and drops its last partial one. Call ``set_epoch`` (build_stream_loader's
loader does it for you) to reshuffle. There is no exact resume for streams: use TokenWindows.

See docs/loading.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..corpus import ReadOptions, documents
from ..inputs import resolve_inputs
from ..split import open_tokens
from ..tokenizer import load_encoding
from .runtime import generator, mix_seed, rank_world, resolve_pin_memory, seed_worker, worker_context


def shard_of(rank: int, world_size: int) -> tuple[int, int]:
    """(this process's shard, number of shards): rank x num_workers + worker id of world x num_workers."""
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world_size * workers


class TokenStream(IterableDataset):
    """Non-overlapping (x, y) windows of ``block_size`` from text files or one token file."""

    def __init__(self, paths: str | Path | Sequence[str | Path], block_size: int, *, encoding: str = "gpt2",
                 seed: int = 0, shuffle_buffer: int = 0, shard: bool = True, jsonl_key: str = "text",
                 doc_sep: str | None = None, errors: str = "strict", rank: int | None = None,
                 world_size: int | None = None):
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        self.token_file = Path(paths[0]) if len(paths) == 1 and str(paths[0]).endswith(".bin") else None
        self.files = [] if self.token_file else resolve_inputs(paths)
        if self.token_file:
            open_tokens(self.token_file)  # fail now, in the main process, on a bad file
        else:
            load_encoding(encoding)
        if block_size < 1 or shuffle_buffer < 0:
            raise ValueError(f"block_size {block_size} must be >= 1 and shuffle_buffer {shuffle_buffer} >= 0")
        self.block_size, self.encoding, self.seed = block_size, encoding, seed
        self.shuffle_buffer, self.shard = shuffle_buffer, shard
        self.jsonl_key, self.doc_sep, self.errors = jsonl_key, doc_sep, errors
        self.rank, self.world_size = rank_world(rank, world_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _windows_from_text(self, shard: int, shards: int) -> Iterator[np.ndarray]:
        enc = load_encoding(self.encoding)
        order = torch.randperm(len(self.files), generator=generator("stream", self.seed, self.epoch)).tolist()
        buffer = np.empty(0, dtype=np.int64)
        T = self.block_size
        options = ReadOptions(self.errors, self.doc_sep, self.jsonl_key)
        for number, runs in enumerate(documents([self.files[i] for i in order], options)):
            text = "".join(runs)  # read every document, tokenize only this shard's
            if number % shards != shard or not text:
                continue
            buffer = np.concatenate([buffer, enc.encode_ordinary(text), [enc.eot_token]])
            while len(buffer) > T:
                yield buffer[:T + 1]
                buffer = buffer[T:]  # the last target is the next window's first input

    def _windows_from_tokens(self, shard: int, shards: int) -> Iterator[np.ndarray]:
        tokens = open_tokens(self.token_file)
        T = self.block_size
        for k in range(shard, (len(tokens) - 1) // T, shards):
            yield tokens[k * T:k * T + T + 1].astype(np.int64)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        shard, shards = shard_of(self.rank, self.world_size) if self.shard else (0, 1)
        windows = (self._windows_from_tokens if self.token_file else self._windows_from_text)(shard, shards)
        rng = np.random.default_rng(mix_seed("buffer", self.seed, self.epoch, shard))
        pool: list[np.ndarray] = []
        for window in windows:
            if len(pool) < self.shuffle_buffer:
                pool.append(window)
                continue
            if self.shuffle_buffer:
                slot = int(rng.integers(len(pool)))
                pool[slot], window = window, pool[slot]
            yield torch.from_numpy(window[:-1].copy()), torch.from_numpy(window[1:].copy())
        for slot in rng.permutation(len(pool)).tolist():
            yield torch.from_numpy(pool[slot][:-1].copy()), torch.from_numpy(pool[slot][1:].copy())


class StreamLoader:
    """A DataLoader over a TokenStream that tells the stream its epoch before every pass."""

    def __init__(self, dataloader: DataLoader, seed: int):
        self.dataloader, self.seed, self.epoch = dataloader, seed, 0

    def __iter__(self) -> Iterator[Any]:
        stream = self.dataloader.dataset
        stream.set_epoch(self.epoch)
        self.dataloader.generator = torch.Generator().manual_seed(mix_seed("workers", self.seed, self.epoch))
        yield from self.dataloader
        self.epoch += 1


def build_stream_loader(stream: TokenStream, batch_size: int, *, num_workers: int = 0, seed: int | None = None,
                        pin_memory: bool | str = "auto", multiprocessing_context: str | None = "default",
                        drop_last: bool = False) -> StreamLoader:
    """Batches of a TokenStream with the same seeding, workers and pinning as build_loader.

    ``seed`` is the stream's; another one is refused, since the stream's shuffling would not follow it.
    """
    if seed is not None and seed != stream.seed:
        raise ValueError(f"seed={seed} contradicts the stream's seed={stream.seed}; drop seed= or build "
                         f"the TokenStream with seed={seed}")
    seed = stream.seed
    loader = DataLoader(stream, batch_size=batch_size, num_workers=num_workers, drop_last=drop_last,
                        pin_memory=resolve_pin_memory(pin_memory),
                        worker_init_fn=seed_worker if num_workers else None,
                        multiprocessing_context=worker_context(multiprocessing_context) if num_workers else None,
                        generator=torch.Generator().manual_seed(seed))
    return StreamLoader(loader, seed)
