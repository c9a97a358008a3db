"""``python -m tokpack.bench loader | train | open``: the read wing against its baselines.

Baselines run in the same process on the same memmap: nanoGPT's get_batch (memmap reopened per
batch, a Python slice per row, torch.stack) and the raw limit (one numpy fancy-index gather plus
the int64 widening, no DataLoader).

See docs/benchmarks.md.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..cli import table
from ..options import from_dict, load_toml
from ..data.loader import build_loader
from ..data.windows import TokenWindows, WindowBatch
from ..format import FORMAT_VERSION, INDEX_DTYPE, META_NAME, read_meta
from ..models import GPT, GPTConfig
from . import peers as peer_tools
from .timing import interleaved, per_second, ratio, ratio_range, timed


class BusyWindows(TokenWindows):
    """Windows with ``work`` rounds of per-sample numpy work, as an augmentation would cost."""

    def __init__(self, path: Path, block_size: int, work: int):
        super().__init__(path, block_size, dtype="uint16")
        self.work = work

    def __getitems__(self, indices: Any) -> WindowBatch:
        batch = super().__getitems__(indices)
        for row in batch.x.numpy():
            for _ in range(self.work):
                np.sort(row)
        return batch


def get_batch_nanogpt(path: Path, block_size: int, batch_size: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    data = np.memmap(path, dtype=np.uint16, mode="r")  # reopened every batch, as nanoGPT does
    return nanogpt_rows(data, torch.randint(len(data) - block_size, (batch_size,), generator=g), block_size)


def nanogpt_rows(data: np.ndarray, ix: Any, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's ``get_batch`` rows: each window a slice widened on its own, x and y stacked."""
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def contiguous_slice(data: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator) -> torch.Tensor:
    start = int(rng.integers(0, len(data) - batch_size * (block_size + 1)))
    return torch.from_numpy(data[start:start + batch_size * (block_size + 1)].astype(np.int64))


def raw_gather(data: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    ix = rng.integers(0, len(data) - block_size, batch_size)
    return data[ix[:, None] + np.arange(block_size + 1)].astype(np.int64)


def three_loops(model: nn.Module, loader: Any, label: str) -> dict[str, Any]:
    """The loader alone, the step alone on one cached batch, and the real loop, over one epoch.

    Real ~ step alone: the loader is hidden. Real ~ loader + step: the model waits for data.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    steps = len(loader)
    cached = next(iter(loader))
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batch": 0})
    t_loader = timed(lambda: [None for _ in loader])[1]
    t_step = timed(lambda: [step(*cached) for _ in range(steps)])[1]
    t_real = timed(lambda: [step(x, y) for x, y in loader])[1]
    hidden = t_real <= t_step + 0.5 * t_loader
    print(f"three loops, {steps} steps of {label}: loader alone {t_loader:.3f} s, step alone {t_step:.3f} s, "
          f"real loop {t_real:.3f} s -> the loader is {'hidden' if hidden else 'NOT hidden'} "
          f"({100 * t_loader / t_real:.1f}% of the real loop)")
    return {"loader_alone_s": t_loader, "step_alone_s": t_step, "real_loop_s": t_real, "loader_hidden": hidden}


def bench_train(folder: Path, config: Path, steps: int, num_workers: int) -> dict[str, Any]:
    """The three loops on scripts/train_gpt.py's model and loader, from a training config's
    ``batch_size`` and ``[model]`` table."""
    vocab = read_meta(folder)["encoding"]["n_vocab"]
    settings = load_toml(config)
    shape = from_dict(GPTConfig, settings.get("model", {}), str(config), prefix="model.")
    B = settings.get("batch_size", 8)
    if type(B) is not int or B < 1:
        raise ValueError(f"batch_size = {B!r} in {config} is not a positive int; fix the config")
    model = GPT(replace(shape, vocab_size=vocab), seed=0)
    T = model.config.block_size
    loader = build_loader(TokenWindows(folder, T, split="train"), B, seed=0, num_samples=B * steps,
                          num_workers=num_workers, persistent_workers=num_workers > 0)
    label = f"GPT {model.num_params() / 1e6:.1f}M params, B={B}, T={T}, {num_workers} workers"
    return {"bench": "train", "config": str(config), "steps": steps, "num_workers": num_workers,
            **three_loops(model, loader, label)}


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _worker_memory(path: Path, batches: int, block_size: int, batch_size: int) -> list[dict[str, Any]]:
    """Anonymous and file-backed RSS of each worker after its first batch and after ``batches``."""
    ds = TokenWindows(path, block_size, dtype="uint16")
    # Persistent, so the workers are still there to be measured once the epoch is over.
    loader = build_loader(ds, batch_size, seed=0, num_samples=batch_size * batches, num_workers=2,
                          persistent_workers=True)
    it = iter(loader.dataloader)
    next(it)
    pids = [w.pid for w in it._workers]  # noqa: SLF001 - the bench inspects the worker processes
    start = {pid: (_status_kb(pid, "RssAnon"), _status_kb(pid, "RssFile")) for pid in pids}
    for _ in it:
        pass
    rows = []
    for k, pid in enumerate(pids):
        anon, file = _status_kb(pid, "RssAnon"), _status_kb(pid, "RssFile")
        rows.append({"worker": k, "anon_growth_mb": (anon - start[pid][0]) / 1024,
                     "file_backed_growth_mb": (file - start[pid][1]) / 1024, "anon_mb": anon / 1024})
    del it
    return rows


def _startup_seconds(path: Path, context: str) -> float:
    ds = TokenWindows(path, 64, dtype="uint16")
    loader = build_loader(ds, 8, seed=0, num_samples=16, num_workers=2, multiprocessing_context=context)
    start = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - start


def startup_table(path: Path, start_methods: Sequence[str]) -> dict[str, float]:
    """Seconds from iter() to the first batch with 2 workers, per start method, the first time and
    once more (a forkserver starts once). Run first, before anything here has started a forkserver."""
    startup = {}
    for context in [c for c in start_methods if c in multiprocessing.get_all_start_methods()]:
        startup[f"{context}_first_s"] = _startup_seconds(path, context)
        startup[f"{context}_later_s"] = _startup_seconds(path, context)
    print("loader start-up to first batch, 2 workers: " +
          ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in startup.items()))
    return startup


def throughput_table(path: Path, T: int, B: int, batches: int, rounds: int, peers: bool) -> dict[str, float]:
    """tokpack's loader with 0 and 2 workers against nanoGPT's get_batch, the raw gather and litdata,
    in interleaved rounds."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    g, rng = torch.Generator().manual_seed(0), np.random.default_rng(0)
    ds = TokenWindows(path, T, dtype="uint16")
    in_process = build_loader(ds, B, seed=0)  # endless: each round reads on
    with_workers = build_loader(ds, B, seed=0, num_workers=2, persistent_workers=True)
    streams = {"0": iter(in_process), "2": iter(with_workers)}
    next(streams["2"])  # the workers start outside the timing
    runs = {
        "nanoGPT get_batch": lambda: [get_batch_nanogpt(path, T, B, g) for _ in range(batches)],
        "raw gather + int64 (no DataLoader)": lambda: [raw_gather(data, T, B, rng) for _ in range(batches)],
        # The least a batch can cost: one contiguous read of B * (T + 1) tokens, widened once.
        "one contiguous slice + int64": lambda: [contiguous_slice(data, T, B, rng) for _ in range(batches)],
        "tokpack build_loader, 0 workers": lambda: [next(streams["0"]) for _ in range(batches)],
        "tokpack build_loader, 2 workers": lambda: [next(streams["2"]) for _ in range(batches)],
    }
    skip = peer_tools.missing("litdata") if peers else "skipped (--no-peers)"
    if skip:
        print(f"litdata StreamingDataLoader: {skip}")
    else:
        with peer_tools.quiet():
            read = peer_tools.litdata_loader(path, T, B, 2)
            read(1)  # its workers start outside the timing
        runs["litdata StreamingDataLoader, 2 workers"] = lambda: read(batches)
    times = interleaved(runs, rounds)
    names = list(times)
    rows = [{"run": name, "tokens/s": batches * B * T / statistics.median(t),
             "vs nanoGPT": ratio(times, names[0], name) ** -1,
             "nanoGPT range": ratio_range(times, names[0], name, True),
             "vs raw": ratio(times, names[1], name) ** -1, "raw range": ratio_range(times, names[1], name, True),
             "vs slice": ratio(times, names[2], name) ** -1, "slice range": ratio_range(times, names[2], name, True)}
            for name, t in times.items()]
    print(f"B={B}, T={T}, {len(data):,}-token uint16 memmap in the page cache, {batches} batches a run, "
          f"medians of {rounds} interleaved rounds, each ratio with its lowest and highest round")
    print(table(rows, ["run", "tokens/s", "vs nanoGPT", "nanoGPT range", "vs raw", "raw range", "vs slice",
                       "slice range"]))
    figures = {"loader_vs_nanogpt": rows[3]["vs nanoGPT"], "loader_vs_raw": rows[3]["vs raw"],
               "loader_vs_slice": rows[3]["vs slice"], "workers2_vs_nanogpt": rows[4]["vs nanoGPT"]}
    if len(names) > 5:
        figures["workers2_vs_litdata2"] = ratio(times, names[4], names[5])
    streams.clear()  # lets the persistent workers go before the next measurements
    return figures


def workers_table(path: Path, work: int) -> list[dict[str, Any]]:
    """Samples/s with 0, 1 and 2 workers, without and with per-sample work."""
    rows = []
    for workers in (0, 1, 2):
        row: dict[str, Any] = {"workers": workers}
        for rounds in (0, work):
            busy = BusyWindows(path, 256, rounds)
            wl = build_loader(busy, 16, seed=0, num_samples=16 * 40, num_workers=workers,
                              persistent_workers=workers > 0)
            next(iter(wl))  # start the workers outside the timing
            row[f"work={rounds}"] = per_second(lambda: [None for _ in wl], 16 * 39)
        rows.append(row)
    print("samples/s by workers and rounds of per-sample work (B=16, T=256)")
    print(table(rows, ["workers", "work=0", f"work={work}"]))
    return rows


def memory_table(path: Path, batches: int, T: int, B: int) -> list[dict[str, Any]]:
    rows = _worker_memory(path, batches, T, B)
    print(f"worker memory after {batches:,} batches of B={B}, T={T}")
    print(table(rows, ["worker", "anon_growth_mb", "file_backed_growth_mb", "anon_mb"]))
    return rows


def bench_loader(folder: Path, tokens: int, block_size: int, batch_size: int, batches: int,
                 memory_batches: int, work: int, rounds: int = 5, peers: bool = True,
                 start_methods: Sequence[str] = ("forkserver", "spawn", "fork")) -> dict[str, Any]:
    """Every loader table on one random uint16 memmap of ``tokens`` tokens."""
    path = folder / "tokens.bin"
    np.random.default_rng(0).integers(0, 50257, tokens, dtype=np.uint16).tofile(path)  # now in the page cache
    startup = startup_table(path, start_methods)
    figures = throughput_table(path, block_size, batch_size, batches, rounds, peers)
    small = build_loader(TokenWindows(path, 64, dtype="uint16"), 8, seed=0, num_samples=8 * min(batches, 10))
    loops = three_loops(GPT(GPTConfig(block_size=64, n_layer=1, n_head=2, n_embd=32)), small, "GPT 1x32, B=8, T=64")
    worker_rows = workers_table(path, work)
    memory = memory_table(path, memory_batches, block_size, batch_size)
    return {"bench": "loader", "B": batch_size, "T": block_size, "tokens": tokens, **figures, **loops,
            "samples_per_s": worker_rows, "work": work,
            **startup, "worker_anon_growth_mb": max(r["anon_growth_mb"] for r in memory),
            "memory_batches": memory_batches}


def bench_open(folder: Path, shard_counts: Sequence[int], tokens_per_shard: int, rounds: int) -> dict[str, Any]:
    """Opening a split of N shards and taking a loader state, at each N: cost per shard.

    A prepared folder of N bare shards (meta.json and all) is written for each N; then, in
    interleaved rounds, ``TokenWindows(folder, T, split="train")`` is built and a loader over it
    takes ``state_dict()``. Opening is O(shards) (meta.json read once, each file looked at once)
    and a state O(1) in shards (the fingerprint is taken at open), so the time per shard to open
    stays flat as N grows and the state's time does not grow at all.
    """
    folders = {n: write_shard_folder(folder / f"shards{n}", n, tokens_per_shard) for n in shard_counts}
    loaders: dict[int, Any] = {}

    def open_one(n: int) -> None:
        loaders[n] = build_loader(TokenWindows(folders[n], 8, split="train"), 4, seed=0)

    runs: dict[str, Any] = {}
    for n in shard_counts:
        runs[f"open {n}"] = lambda n=n: open_one(n)
        runs[f"state {n}"] = lambda n=n: [loaders[n].state_dict() for _ in range(100)]
    for n in shard_counts:  # each opened once before the timing, so every state run has a loader
        open_one(n)
    times = interleaved(runs, rounds)
    rows = [{"shards": n, "open_s": statistics.median(times[f"open {n}"]),
             "open_ms_per_shard": 1e3 * statistics.median(times[f"open {n}"]) / n,
             "rounds' range": "{:.3f}-{:.3f}".format(*(1e3 * f(times[f"open {n}"]) / n for f in (min, max))),
             "state_dict_ms": 10 * statistics.median(times[f"state {n}"])} for n in shard_counts]
    print(f"TokenWindows over a prepared split of N shards of {tokens_per_shard} tokens, then state_dict(); "
          f"medians of {rounds} interleaved rounds")
    print(table(rows, ["shards", "open_s", "open_ms_per_shard", "rounds' range", "state_dict_ms"]))
    first, last = rows[0], rows[-1]
    return {"bench": "open", "rows": rows,
            "open_per_shard_growth": last["open_ms_per_shard"] / first["open_ms_per_shard"],
            "state_dict_growth": last["state_dict_ms"] / first["state_dict_ms"]}


def write_shard_folder(folder: Path, shards: int, tokens_per_shard: int) -> Path:
    """A prepared folder whose train split is ``shards`` bare uint16 shards (val one), with its
    meta.json, as ``prepare --shard-tokens`` writes one, but made directly: writing the corpus
    through prepare would time prepare, not the reader."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def entry(name: str, data: bytes, **extra: int) -> dict[str, Any]:
        (folder / name).write_bytes(data)
        return {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), **extra}

    splits = {}
    for split, count in (("train", shards), ("val", 1)):
        files = [entry(f"{split}_{k:06d}.bin", rng.integers(0, 50257, tokens_per_shard, dtype=np.uint16).tobytes(),
                       tokens=tokens_per_shard) for k in range(count)]
        total = tokens_per_shard * count
        starts = np.arange(0, total, tokens_per_shard, dtype=INDEX_DTYPE)
        splits[split] = {"tokens": total, "documents": len(starts), "shards": files,
                         "idx": entry(f"{split}.idx", starts.tobytes())}
    meta = {"format_version": FORMAT_VERSION, "tokpack_version": "bench", "dtype": "uint16", "eot": "append",
            "encoding": {"name": "gpt2", "n_vocab": 50257, "eot_id": 50256, "ranks_sha256": ""},
            "options": {"encoding": "gpt2", "format": "flat"}, "splits": splits}
    (folder / META_NAME).write_text(json.dumps(meta))
    return folder


class NanoGPTContract(nn.Module):
    """tokpack's GPT behind nanoGPT's ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        logits = self.model(idx)
        if targets is None:
            return logits[:, [-1], :], None
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def bench_evaluate(folder: Path, block_size: int, batch_size: int, n_layer: int, n_embd: int,
                   rounds: int, split: str = "val") -> dict[str, Any]:
    """``tokpack.evaluate`` at stride T against nanoGPT's ``estimate_loss`` loop over the same windows
    on one model in both contracts: tokpack's (logits) and nanoGPT's (``(logits, loss)`` given
    targets). The baseline runs twice: as nanoGPT writes it (``get_batch`` each batch, the memmap
    reopened, rows stacked) and with its batches built beforehand (the forward and the loss alone)."""
    from ..evaluation import evaluate

    val = TokenWindows(folder, block_size, split=split, stride=block_size)
    if len(val.paths) != 1:
        raise ValueError(f"the {split} split of {folder} is in {len(val.paths)} files; nanoGPT's get_batch reads one")
    loader = build_loader(val, batch_size)
    batches = [(x, y.masked_fill(y == -100, -1)) for x, y in loader]
    starts = range(0, int(val.lengths[0]) - block_size, block_size)  # the windows get_batch reads whole
    gpt = GPT(GPTConfig(vocab_size=50304, block_size=block_size, n_layer=n_layer, n_head=2, n_embd=n_embd), seed=0)
    nano = NanoGPTContract(gpt).eval()

    def estimate_loss(get: Any, count: int) -> float:
        with torch.no_grad():
            return float(np.mean([nano(*get(k))[1].item() for k in range(count)]))

    def get_batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(val.paths[0], dtype=val.dtype, mode="r")  # reopened every batch, as nanoGPT does
        return nanogpt_rows(data, starts[k * batch_size:(k + 1) * batch_size], block_size)

    runs = {"nanoGPT estimate_loss (batches built)": lambda: estimate_loss(batches.__getitem__, len(batches)),
            "nanoGPT estimate_loss (get_batch)": lambda: estimate_loss(get_batch, len(starts) // batch_size),
            "tokpack.evaluate, nanoGPT's model": lambda: evaluate(nano, loader),
            "tokpack.evaluate, tokpack's GPT": lambda: evaluate(gpt.eval(), loader)}
    times = interleaved(runs, rounds)
    names = list(times)
    tokens = sum(int((y >= 0).sum()) for _, y in batches)
    # get_batch's whole windows only: its time is scaled to the tokens the others score.
    times[names[1]] = [t * tokens / (len(starts) // batch_size * batch_size * block_size) for t in times[names[1]]]
    rows = [{"run": name, "tokens/s": tokens / statistics.median(t),
             "vs built": ratio(times, names[0], name) ** -1, "built range": ratio_range(times, names[0], name, True),
             "vs get_batch": ratio(times, names[1], name) ** -1,
             "get_batch range": ratio_range(times, names[1], name, True)} for name, t in times.items()]
    print(f"{tokens:,} {split} tokens, B={batch_size}, T={block_size}, GPT {n_layer}x{n_embd}, vocabulary 50,304; "
          f"medians of {rounds} interleaved rounds")
    print(table(rows, ["run", "tokens/s", "vs built", "built range", "vs get_batch", "get_batch range"]))
    return {"bench": "evaluate", "tokens": tokens, "rows": rows}
