"""The DataLoader lab: four experiments that show what the loader does, in a temporary folder.

    python scripts/lab.py [--mp-context forkserver|spawn|fork] [--seed 0]

(a) an IterableDataset of 2,000 integers on 2 workers, unsharded (every item twice) and sharded
    with tokpack's shard_of (every item once);
(b) a 50,000-token uint16 memmap through TokenWindows with numpy masking augmentation drawn from
    the dataset's per-batch Generator, run twice with one loader seed: identical batches;
(c) random vs bucketed batching of 2,000 sequences of lengths uniform in [4, 64]: padded share;
(d) samples/s with 0 and 2 workers (printed, never asserted: it depends on the machine).
The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from tokpack import BucketBatchSampler, TokenWindows, build_loader
from tokpack.data.runtime import worker_context
from tokpack.data.streams import shard_of
from tokpack.data.windows import WindowBatch


def padded_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of padding in the padded batches: 1 - real tokens / (rows x longest), summed over batches."""
    lengths = np.asarray(lengths)
    real = sum(int(lengths[b].sum()) for b in batches)
    total = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1.0 - real / total


class Integers(IterableDataset):
    """0..n-1; with ``sharded``, each worker yields only its share (as TokenStream does)."""

    def __init__(self, n: int, sharded: bool):
        self.n, self.sharded = n, sharded

    def __iter__(self):
        shard, shards = shard_of(0, 1) if self.sharded else (0, 1)
        return iter(range(shard, self.n, shards))


class MaskedWindows(TokenWindows):
    """Zeroes 15 % of the input ids with the dataset's Generator, seeded for each batch from its place."""

    def __getitems__(self, indices):
        batch = super().__getitems__(indices)
        keep = torch.from_numpy(self.rng.random(batch.x.shape) >= 0.15)
        return WindowBatch(batch.x * keep, batch.y)


def duplicates(context: str | None) -> dict[str, int]:
    out = {}
    for sharded in (False, True):
        loader = DataLoader(Integers(2000, sharded), batch_size=50, num_workers=2,
                            multiprocessing_context=worker_context(context))
        seen = Counter(i for batch in loader for i in batch.tolist())
        out["sharded" if sharded else "unsharded"] = sum(seen.values()) - len(seen)
        out[("sharded" if sharded else "unsharded") + "_distinct"] = len(seen)
    return out


def augmentation_runs(path: Path, seed: int, context: str | None) -> dict[str, bool]:
    def run() -> list[str]:
        ds = MaskedWindows(path, 64, dtype="uint16")
        loader = build_loader(ds, 16, seed=seed, num_samples=16 * 20, num_workers=2, multiprocessing_context=context)
        return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x, _ in loader]

    first, second = run(), run()
    plain = build_loader(TokenWindows(path, 64, dtype="uint16"), 16, seed=seed, num_samples=16 * 20)
    unmasked = [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x, _ in plain]
    return {"reproducible": first == second, "augmented": first != unmasked}


def bucketing(seed: int) -> dict[str, float]:
    lengths = torch.randint(4, 65, (2000,), generator=torch.Generator().manual_seed(seed)).tolist()
    order = torch.randperm(2000, generator=torch.Generator().manual_seed(seed + 1)).tolist()
    random_batches = [order[i:i + 32] for i in range(0, 2000, 32)]
    return {"random_padded": padded_fraction(lengths, random_batches),
            "bucketed_padded": padded_fraction(lengths, list(BucketBatchSampler(lengths, 32, seed=seed)))}


def throughput(path: Path, seed: int, context: str | None) -> dict[str, float]:
    out = {}
    for workers in (0, 2):
        loader = build_loader(TokenWindows(path, 64, dtype="uint16"), 32, seed=seed, num_samples=32 * 300,
                              num_workers=workers, multiprocessing_context=context, persistent_workers=workers > 0)
        next(iter(loader))
        start = time.perf_counter()
        count = sum(len(x) for x, _ in loader)
        out[f"workers_{workers}_samples_per_s"] = count / (time.perf_counter() - start)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mp-context", choices=["forkserver", "spawn", "fork"],
                   help="worker start method (default: fork where available, else the OS default)")
    p.add_argument("--seed", type=int, default=0, help="loader seed (default: 0)")
    args = p.parse_args()
    context = args.mp_context or "default"
    with tempfile.TemporaryDirectory(prefix="tokpack-lab-") as tmp:
        path = Path(tmp) / "tokens.bin"
        np.random.default_rng(args.seed).integers(0, 50257, 50_000, dtype=np.uint16).tofile(path)
        results = {"mp_context": context, "duplicates": duplicates(context),
                   "augmentation": augmentation_runs(path, args.seed, context), "bucketing": bucketing(args.seed),
                   "throughput": throughput(path, args.seed, context)}
    d, a, b, t = (results[k] for k in ("duplicates", "augmentation", "bucketing", "throughput"))
    print(f"(a) 2,000 items on 2 workers: {d['unsharded']} duplicates unsharded, {d['sharded']} sharded")
    print(f"(b) masking from per-worker generators: reproducible={a['reproducible']}, augmented={a['augmented']}")
    print(f"(c) padded share: random batches {b['random_padded']:.1%}, bucketed {b['bucketed_padded']:.1%}")
    print(f"(d) samples/s: 0 workers {t['workers_0_samples_per_s']:,.0f}, 2 workers {t['workers_2_samples_per_s']:,.0f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
