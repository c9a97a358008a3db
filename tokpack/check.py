"""Show that a prepared folder's loaders are reproducible, resumable and rank-exact.

    python -m tokpack.check data/sample [--batches 24] [--block-size 64] [--batch-size 8]

Hashes the first N batches of the train loaders (random starts, shuffled epochs, packed
documents) and the val loaders (in order, and document by document), and compares, in one
table: a fresh run against a second fresh run, a run
resumed from its state_dict at a random step, num_workers 0 against 2, and, for evaluation, one
rank against the union of two simulated ranks. Exits 1 on any difference.

See docs/loading.md.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .cli import parser, run_cli, table
from .data.loader import TokenLoader, build_loader
from .data.layouts import EvalRows, TrainRows
from .data.packing import PackedDocuments
from .data.windows import TokenWindows
from .split import open_splits


def batch_hash(batch: Any) -> str:
    """A short hash of a batch's tensors (and numbers): a tuple of them, or a dict (in key order)."""
    digest = hashlib.sha256()
    for tensor in batch.values() if isinstance(batch, dict) else batch:
        digest.update(torch.as_tensor(tensor).numpy().tobytes())
    return digest.hexdigest()[:16]


def take(loader: TokenLoader, n: int) -> list[str]:
    """Hashes of the next ``n`` batches, carrying on into later epochs as a training loop does."""
    out: list[str] = []
    while len(out) < n:
        before = len(out)
        for batch in loader:
            out.append(batch_hash(batch))
            if len(out) == n:
                break
        if len(out) == before:
            break
    return out


def resumed(build: Callable[[], TokenLoader], n: int, at: int) -> list[str]:
    """Hashes of ``n`` batches: ``at`` from one loader, the rest from a loader restored from its state."""
    first = build()
    head = take(first, at)
    second = build()
    second.load_state_dict(first.state_dict())
    return head + take(second, n - at)


def check_folder(folder: str | Path, batches: int = 24, block_size: int = 64, batch_size: int = 8,
                 seed: int = 0, workers: Sequence[int] = (0, 2)) -> list[dict[str, Any]]:
    """One row per comparison, one column per loader: 'same' or 'DIFFERENT'."""
    splits = open_splits(folder)
    train = TokenWindows(splits["train"], block_size)
    train_epochs = TokenWindows(splits["train"], block_size, stride=block_size)
    packed = PackedDocuments(splits["train"], block_size, rows=TrainRows("bestfit", buffer_size=64))
    evaluations = {"val (in order)": TokenWindows(splits["val"], block_size, stride=block_size),
                   "val (per document)": PackedDocuments(splits["val"], block_size, rows=EvalRows(block_size))}
    setups: dict[str, Callable[..., TokenLoader]] = {
        "train (random starts)": lambda **kw: build_loader(train, batch_size, seed, num_samples=batch_size * 5, **kw),
        "train (epochs)": lambda **kw: build_loader(train_epochs, batch_size, seed, shuffle=True, **kw),
        "train (packed, best fit)": lambda **kw: build_loader(packed, batch_size, seed, **kw),
        **{name: (lambda val=val, **kw: build_loader(val, batch_size, seed, **kw))
           for name, val in evaluations.items()},
    }
    at = random.Random(seed).randrange(1, batches)
    rows: dict[str, dict[str, Any]] = {}

    def record(row: str, column: str, same: bool | None) -> None:
        rows.setdefault(row, {"check": row})[column] = "n/a" if same is None else "same" if same else "DIFFERENT"

    for name, build in setups.items():
        fresh = take(build(num_workers=workers[0]), batches)
        record("fresh run == fresh run", name, fresh == take(build(num_workers=workers[0]), batches))
        for w in workers:
            record(f"resumed at batch {at} == fresh (workers={w})", name,
                   resumed(lambda build=build, w=w: build(num_workers=w), batches, at) == fresh)
            if w != workers[0]:
                record(f"workers={w} == workers={workers[0]}", name, take(build(num_workers=w), batches) == fresh)
        union = None
        if name in evaluations:
            val = evaluations[name]
            one_epoch = lambda **kw: [batch_hash(b) for b in build_loader(val, 1, seed, **kw)]  # noqa: E731
            union = one_epoch() == [h for r in range(2) for h in one_epoch(rank=r, world_size=2)]
        record("1 rank == union of 2 ranks (per window)", name, union)
    return list(rows.values())


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("check", __doc__)
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    p.add_argument("--batches", type=int, default=24, help="batches hashed per run (default: 24)")
    p.add_argument("--block-size", type=int, default=64, help="window length T (default: 64)")
    p.add_argument("--batch-size", type=int, default=8, help="batch size B (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="loader seed; also picks the resume step (default: 0)")
    args = p.parse_args(argv)

    def body() -> int:
        rows = check_folder(args.folder, args.batches, args.block_size, args.batch_size, args.seed)
        columns = list(rows[0])
        print(table(rows, columns))
        bad = sum(v == "DIFFERENT" for row in rows for v in row.values())
        print(f"tokpack.check: {'all identical' if not bad else f'{bad} DIFFERENCES'}")
        return 1 if bad else 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
