"""``python -m tokpack.bench packing``: PackedDocuments against nanochat's best-fit loop and plain windows.

    python -m tokpack.bench packing [--tokens 2000000] [--block-size 1024] [--batch-size 8]

On one synthetic split of documents with log-normal lengths (BOS-led, as ``--eot prepend`` writes
them): rows per second of tokpack's best fit (the loader's batches, document structure included)
against nanochat's loop on the same documents, already tokenized in memory as it holds them; the
loader's batches per second against plain windows; and each packing's utilisation and cropped
share. Costs: a choice is O(log buffer) (nanochat's scan is O(buffer)); a batch's structure
O(B * T); a resume starts from the packer's saved state, O(buffer) (``python -m tokpack.bench
resume``).

See docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cli import table
from ..data.loader import build_loader
from ..data.layouts import EvalRows, TrainRows
from ..data.packing import PackedDocuments
from ..data.windows import TokenWindows
from ..format import INDEX_DTYPE
from ..split import open_split
from .timing import interleaved, ratio, ratio_range

BOS = 50256


def synthetic_documents(folder: Path, tokens: int, mean_length: float, seed: int = 0) -> Path:
    """``train.bin`` and ``train.idx`` of random documents, each led by BOS, lengths log-normal."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, rng.lognormal(np.log(mean_length) - 0.5, 1.0, tokens // 2).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    data = rng.integers(0, BOS, int(lengths.sum()), dtype=np.uint16)
    data[starts] = BOS
    path = folder / "train.bin"
    data.tofile(path)
    starts.astype(INDEX_DTYPE).tofile(folder / "train.idx")
    return path


def nanochat_bestfit(docs: Iterable[list[int]], B: int, T: int, buffer_size: int,
                     counts: dict[str, int] | None = None) -> Iterator[tuple[torch.Tensor, ...]]:
    """nanochat's BOS-aligned best-fit loop (``tokenizing_distributed_data_loader_bos_bestfit``) on
    documents already tokenized (cycled), refilling one document at a time: scan the buffer for the
    largest that fits, else crop the shortest. ``counts`` gathers the tokens placed and cropped."""
    source = itertools.cycle(docs)
    counts = {} if counts is None else counts
    counts.update(placed=0, cropped=0)
    doc_buffer: list[list[int]] = []
    row_buffer = torch.empty((B, T + 1), dtype=torch.long)
    while True:
        for row in range(B):
            pos = 0
            while pos < T + 1:
                while len(doc_buffer) < buffer_size:
                    doc_buffer.append(next(source))
                remaining = T + 1 - pos
                best, best_len = -1, 0
                for i, doc in enumerate(doc_buffer):
                    if remaining >= len(doc) > best_len:
                        best, best_len = i, len(doc)
                if best >= 0:
                    doc = doc_buffer.pop(best)
                    row_buffer[row, pos:pos + len(doc)] = torch.tensor(doc, dtype=torch.long)
                    pos += len(doc)
                    counts["placed"] += len(doc)
                else:
                    shortest = min(range(len(doc_buffer)), key=lambda i: len(doc_buffer[i]))
                    doc = doc_buffer.pop(shortest)
                    row_buffer[row, pos:] = torch.tensor(doc[:remaining], dtype=torch.long)
                    pos += remaining
                    counts["placed"] += len(doc)
                    counts["cropped"] += len(doc) - remaining
        yield row_buffer[:, :-1].clone(), row_buffer[:, 1:].clone()


def bench_packing(folder: Path, tokens: int, T: int, B: int, batches: int, buffer_size: int, rounds: int,
                  mean_length: float) -> dict[str, Any]:
    path = synthetic_documents(folder, tokens, mean_length)
    split = open_split(path, dtype="uint16")
    packed = PackedDocuments(split, T, rows=TrainRows("bestfit", buffer_size=buffer_size), bos_id=BOS)
    flat = np.fromfile(path, dtype=np.uint16)
    ends = np.append(packed.index.starts[1:], len(flat))
    docs = [flat[s:e].tolist() for s, e in zip(packed.index.starts.tolist(), ends.tolist())]
    theirs = nanochat_bestfit(docs, B, T, buffer_size)
    ours = iter(build_loader(packed, B, seed=0, shuffle=False))
    plain = TokenWindows(split, T)
    windows = iter(build_loader(plain, B, seed=0))
    # With workers the packing and the reads happen there; the training process widens the batch.
    ours2 = iter(build_loader(packed, B, seed=0, num_workers=2, persistent_workers=True))
    windows2 = iter(build_loader(plain, B, seed=0, num_workers=2, persistent_workers=True))
    finished = PackedInt64(split, T, rows=TrainRows("bestfit", buffer_size=buffer_size), bos_id=BOS)
    ours2_int64 = iter(build_loader(finished, B, seed=0, num_workers=2, persistent_workers=True))
    next(ours2), next(windows2), next(ours2_int64)  # the workers start outside the timing
    first, reference = next(ours), next(theirs)
    same = torch.equal(first.x, reference[0]) and torch.equal(first.y, reference[1])
    runs = {
        "tokpack PackedDocuments bestfit (with position_ids, cu_seqlens)": lambda: [next(ours) for _ in range(batches)],
        "nanochat best-fit loop (documents in memory)": lambda: [next(theirs) for _ in range(batches)],
        "tokpack TokenWindows (no document structure)": lambda: [next(windows) for _ in range(batches)],
        "tokpack PackedDocuments bestfit, 2 workers": lambda: [next(ours2) for _ in range(batches)],
        "tokpack TokenWindows, 2 workers": lambda: [next(windows2) for _ in range(batches)],
        "tokpack PackedDocuments bestfit, 2 workers sending int64 tensors": lambda: [next(ours2_int64)
                                                                                 for _ in range(batches)],
    }
    times = interleaved(runs, rounds, warmup=True)
    names = list(times)
    rows = [{"run": name, "rows/s": batches * B / statistics.median(t), "packed / this": ratio(times, names[0], name),
             "rounds' range": ratio_range(times, names[0], name),
             "packed, 2 workers / this": ratio(times, names[3], name),
             "2 workers range": ratio_range(times, names[3], name)}
            for name, t in times.items()]
    print(f"B={B}, T={T}, {len(docs):,} documents of {len(flat):,} tokens (mean {len(flat) / len(docs):.0f}), "
          f"buffer {buffer_size}, {batches} batches a run, medians of {rounds} interleaved rounds; "
          f"first batch identical to nanochat's: {'yes' if same else 'NO'}")
    print(table(rows, ["run", "rows/s", "packed / this", "rounds' range", "packed, 2 workers / this",
                       "2 workers range"]))
    stages = _stages(packed, B, batches, rounds)
    packings = []
    for name, rows in (("aligned", TrainRows("aligned", buffer_size=buffer_size)),
                       ("bestfit", TrainRows("bestfit", buffer_size=buffer_size)),
                       ("bestfit, split_long", TrainRows("bestfit", buffer_size=buffer_size, split_long=True)),
                       ("evaluation (stride T)", EvalRows(T))):
        data = PackedDocuments(split, T, rows=rows, bos_id=BOS)
        packings.append({"packing": name, **data.stats(len(flat) // (T + 1) if data.stride is None else 10**9)})
    print(f"packings over one epoch's worth of rows ({len(flat) // (T + 1):,}; evaluation: every document once):")
    print(table(packings, ["packing", "rows", "utilisation", "cropped"]))
    return {"bench": "packing", "B": B, "T": T, "tokens": len(flat), "documents": len(docs),
            "identical_to_nanochat": same, "packed_vs_nanochat": ratio(times, names[0], names[1]),
            "packed_vs_windows": ratio(times, names[0], names[2]),
            "packed_vs_windows_2_workers": ratio(times, names[3], names[4]),
            "int64_from_workers_vs_rows": ratio(times, names[3], names[5]), "stages_us": stages, "packings": packings}


class PackedInt64(PackedDocuments):
    """Packed rows whose loader workers send the finished int64 batch (torch's shared-memory
    tensors) instead of the rows as stored, which the training process widens."""

    def worker_copy(self) -> None:
        return None


def _stages(packed: PackedDocuments, B: int, batches: int, rounds: int) -> dict[str, float]:
    """Microseconds a batch of the 0-worker loader's three stages: best fit's choices, the gather
    of the rows' tokens and structure, the widening to int64."""
    rows = list(itertools.islice(packed.rows(0, 0, 1, False), B * batches))
    chunks = [rows[i:i + B] for i in range(0, len(rows), B)]
    gathered = [packed.gather(chunk, checked=True) for chunk in chunks]
    runs = {"best fit": lambda: sum(1 for _ in itertools.islice(packed.rows(0, 0, 1, False), B * batches)),
            "gather": lambda: [packed.gather(chunk, checked=True) for chunk in chunks],
            "widen": lambda: [g.widen() for g in gathered]}
    times = interleaved(runs, rounds, warmup=True)
    stages = {name: 1e6 * statistics.median(t) / batches for name, t in times.items()}
    segments = sum(len(row) for row in rows) / len(rows)
    print(f"0 workers, a batch of {B} rows ({B * segments:.0f} document segments): " +
          ", ".join(f"{name} {us:.0f} us" for name, us in stages.items()) +
          f" (medians of {rounds} interleaved rounds; best fit includes filling its buffer once)")
    return stages


def bench_resume(folder: Path, positions: list[int], block_size: int, batch_size: int, buffer_size: int,
                 documents: int, replay_limit: float) -> dict[str, Any]:
    """A packed loader resumed at batch k of best fit: the time to load its state and serve the next
    batch, against packing every row before it again (what a resume cost before the packer's state
    was saved; timed where it takes under ``replay_limit`` seconds, else extrapolated linearly).

    Synthetic lengths: every document exactly one row (T + 1 tokens, BOS-led), so the packer's
    state at any row is known without packing up to it; the resume checks that state in
    O(buffer_size) like any other."""
    from ..data.packers import Order, PackerState, buffer_key

    width = block_size + 1
    starts = np.arange(documents, dtype=np.int64) * width
    data = np.random.default_rng(0).integers(0, BOS, documents * width, dtype=np.uint16)
    data[starts] = BOS
    data.tofile(folder / "train.bin")
    starts.astype(INDEX_DTYPE).tofile(folder / "train.idx")
    dataset = PackedDocuments(open_split(folder / "train.bin", dtype="uint16"), block_size,
                              rows=TrainRows("bestfit", buffer_size=buffer_size), bos_id=BOS)
    stream, rows = (0, 0, 1, True), []
    order = Order()
    runs = order.ranges(documents, stream)
    replay_rate = None
    for batch in positions:
        row = batch * batch_size
        arrivals = np.arange(row, row + buffer_size - 1, dtype=np.int64)
        keys = []
        for epoch in np.unique(arrivals // documents).tolist():
            here = arrivals[arrivals // documents == epoch]
            docs = order.documents_at(documents, here % documents, stream, epoch, runs)
            keys += [buffer_key(doc, width, arrival, None) for arrival, doc in zip(here.tolist(), docs.tolist())]
        loader = build_loader(dataset, batch_size, seed=0)
        state = {**loader.state_dict(), "batch": batch,
                 "packer": dataset.save_state(stream, PackerState(row, row + buffer_size - 1, sorted(keys)))}
        started = time.perf_counter()
        resumed = build_loader(dataset, batch_size, seed=0)
        resumed.load_state_dict(state)
        next(iter(resumed))
        after = time.perf_counter() - started
        if replay_rate is None or row / replay_rate <= replay_limit:
            started = time.perf_counter()
            sum(1 for _ in itertools.islice(dataset.rows(*stream), row))
            before = time.perf_counter() - started
            replay_rate = row / max(before, 1e-9)
            measured = "measured"
        else:
            before, measured = row / replay_rate, "extrapolated"
        rows.append({"batch": batch, "resume s": after, "replay s (before)": before, "replay": measured})
    print(f"best fit, B={batch_size}, T={block_size}, buffer {buffer_size}, {documents:,} documents of T + 1 tokens")
    print(table(rows, ["batch", "resume s", "replay s (before)", "replay"]))
    return {"bench": "resume", "rows": rows}
