"""Figures: a sweep's loss and bits/byte against stride, a training run's loss curves, and the
document lengths of a prepared folder. PNG files, written atomically, readable without tokpack.

    pip install "tokpack[plot]"                                     # matplotlib
    python -m tokpack.plot out/sample --out losses.png              # train/val loss, n-gram baselines
    python -m tokpack.evaluate data/sample --model bigram --stride 128 64 --plot sweep.png
    python -m tokpack.inspect data/sample --lengths lengths.png --block-size 128

Each figure's numbers come from the data and are returned (or printed) too, so that what it
shows can be checked without looking at it. A training run's numbers are gathered by
``tokpack.evaluation.draw_run``, which draws with this package: figures never import the
evaluation.

See docs/evaluation.md.
"""

from __future__ import annotations

import json
import math
import os
import stat
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.local import open_new, remove_own, tmp_path
from ..split import Split, open_splits, read_index

FIGSIZE = (8.0, 4.5)  # inches; at DPI, 800 x 450 pixels
DPI = 100


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ValueError('plotting needs matplotlib; pip install "tokpack[plot]"') from None
    matplotlib.use("Agg")  # files only: no display is needed or opened
    import matplotlib.pyplot as plt

    return plt


def png_path(path: str | Path) -> Path:
    """``path``, checked before any work: a .png name in a folder that exists; and matplotlib there."""
    pyplot()
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; name the PNG file to write in it, e.g. {path / 'figure.png'}")
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path} does not end in .png; figures are PNG files, name one NAME.png")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"folder {path.parent} of {path} does not exist; create it or choose another path")
    return path


def save_png(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG under a temporary name, renamed when complete."""
    path = png_path(path)
    tmp = tmp_path(path)
    try:
        with open_new(tmp) as f:
            fig.savefig(f, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        remove_own(tmp)
        pyplot().close(fig)
    return path


def plot_sweep(rows: Sequence[dict[str, Any]], path: str | Path) -> dict[str, dict[int, tuple[float, float]]]:
    """Loss and bits/byte against stride (the context every scored token has: T - S before the
    window's new targets), one line per model (and per model scored document by document), from
    ``tokpack.evaluate``'s sweep rows.

    Returns {model: {stride: (loss, bits_per_byte)}}: the points drawn.
    """
    plt = pyplot()
    points: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in rows:
        label = row["model"] + (" (per document)" if row.get("scope") == "documents" else "")
        points[label][row["stride"]] = (row["loss"], row["bits_per_byte"])
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE)
    colours: dict[str, Any] = {}
    for model, by_stride in points.items():
        # A model scored document by document: its colour, dashed, values written below the points.
        base, alone = model.removesuffix(" (per document)"), model.endswith(" (per document)")
        strides = sorted(by_stride, reverse=True)
        for axis, k in ((left, 0), (right, 1)):
            values = [by_stride[s][k] for s in strides]
            line, = axis.plot(strides, values, marker="o", linestyle="--" if alone else "-", color=colours.get(base),
                              label=None if alone else base)
            colours.setdefault(base, line.get_color())
            for s, v in zip(strides, values):
                axis.annotate(f"{v:.3f}", (s, v), textcoords="offset points", xytext=(0, -11 if alone else 5),
                              ha="center", fontsize=7)
    if any(model.endswith(" (per document)") for model in points):
        left.plot([], [], linestyle="--", color="grey", label="dashed: each document alone")
    for axis, name in ((left, "loss (nats/token)"), (right, "bits/byte (text only)")):
        axis.set_xlabel("stride S (smaller: more context per scored token)")
        axis.set_ylabel(name)
        axis.invert_xaxis()
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    block = sorted({row["block_size"] for row in rows})
    fig.suptitle(f"{rows[0]['split']} split, block size {', '.join(map(str, block))}")
    fig.tight_layout()
    save_png(fig, path)
    return dict(points)


def run_folder(run_dir: str | Path) -> Path:
    """A training run's folder, refused by its own name when it does not exist."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist; pass the out_dir of a scripts/train_gpt.py run")
    return run_dir


MAX_POINTS = 20_000  # points of a loss curve: a longer run is drawn in buckets of consecutive steps
MAX_LINE_BYTES = 4096  # a log line of train_gpt.py is about 50 bytes


def read_losses(run_dir: str | Path) -> dict[int, float]:
    """The train loss of every step of a scripts/train_gpt.py run: each rank's ``losses-rankN.jsonl``,
    merged by step (the mean over ranks, each of which trained on its own batch).

    The logs are data on disk: only regular files are read (no link, FIFO or device), line by
    line; a line that is too long, not a step's JSON, or a loss that is NaN or infinite is skipped
    and counted in one warning. Memory is bounded: past MAX_POINTS steps, consecutive steps are
    averaged into buckets (the returned keys are each bucket's first step)."""
    run_dir = run_folder(run_dir)
    logs = sorted(p for p in run_dir.glob("losses-rank*.jsonl") if p.name[len("losses-rank"):-len(".jsonl")].isdigit())
    if not logs:
        raise FileNotFoundError(f"{run_dir} holds no losses-rank*.jsonl; train with scripts/train_gpt.py first")
    curve = _Buckets()
    skipped = 0
    for log in logs:
        for line in _lines(log):
            point = _point(line)
            if point is None:
                skipped += 1
            else:
                curve.add(*point)
    if skipped:
        warnings.warn(f"{skipped} lines of {run_dir}'s losses are not drawn: not a step's JSON, too long, or a loss "
                      "that is NaN or infinite", stacklevel=2)
    return curve.means()


def _lines(log: Path) -> Iterator[bytes | None]:
    """The lines of a regular file, each at most MAX_LINE_BYTES (None for a longer one)."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{log} cannot be read as a log ({exc.strerror}); a run's logs are its own regular "
                         "files, not links") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{log} is not a regular file (a FIFO or a device); a run's logs are regular files")
        while line := f.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of an over-long line, read in bounded pieces
                yield None
            else:
                yield line


def _point(line: bytes | None) -> tuple[int, float] | None:
    """(step, loss) of a log line, or None for a line that is not one."""
    if line is None:
        return None
    try:
        entry = json.loads(line)
        step, loss = int(entry["step"]), float(entry["loss"])
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError):
        return None
    return (step, loss) if math.isfinite(loss) else None


class _Buckets:
    """Mean losses by step in at most MAX_POINTS buckets of ``width`` consecutive steps."""

    def __init__(self) -> None:
        self.width = 1
        self.sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])

    def add(self, step: int, loss: float) -> None:
        bucket = self.sums[step // self.width * self.width]
        bucket[0] += loss
        bucket[1] += 1
        if len(self.sums) > MAX_POINTS:  # twice as wide: the count halves, memory stays bounded
            self.width *= 2
            merged: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])
            for start, (total, count) in self.sums.items():
                merged[start // self.width * self.width][0] += total
                merged[start // self.width * self.width][1] += count
            self.sums = merged

    def means(self) -> dict[int, float]:
        return {start: total / count for start, (total, count) in sorted(self.sums.items())}


def plot_losses(train: dict[int, float], val: dict[int, float], baselines: dict[str, float], path: str | Path,
                title: str) -> Path:
    """Train loss per step, val loss per evaluation, and baselines as horizontal lines."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=FIGSIZE)
    axis.plot(list(train), list(train.values()), lw=0.8, alpha=0.6, label="train (per step, ranks merged)")
    if val:
        axis.plot(list(val), list(val.values()), marker="o", label="val")
        last = max(val)
        axis.annotate(f"{val[last]:.3f}", (last, val[last]), textcoords="offset points", xytext=(0, 6), ha="center")
    for (name, loss), style in zip(baselines.items(), ("--", ":", "-.")):
        axis.axhline(loss, color="gray", ls=style, label=f"{name} baseline {loss:.3f}")
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats/token)")
    everything = [*train.values(), *val.values(), *baselines.values()]
    axis.set_ylim(min(everything) * 0.9, max(baselines.values(), default=max(everything)) * 1.25)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(title)
    fig.tight_layout()
    return save_png(fig, path)


def length_stats(split: Split, block_size: int) -> dict[str, Any]:
    """Document lengths (tokens, from the split's index) and the share of tokens that lie in
    documents longer than ``block_size`` + 1: a window of T + 1 tokens starting at a document's
    start cannot hold them whole, so this share decides between aligned and best-fit packing."""
    starts = read_index(split)
    lengths = np.diff(np.append(starts, int(split.lengths.sum())))
    long = lengths > block_size + 1
    return {"documents": int(len(lengths)), "tokens": int(lengths.sum()), "min": int(lengths.min()),
            "median": float(np.median(lengths)), "mean": float(lengths.mean()), "max": int(lengths.max()),
            "block_size": block_size, "long_documents": int(long.sum()),
            "long_token_share": float(lengths[long].sum() / lengths.sum()), "lengths": lengths}


def describe_lengths(folder: str | Path, block_size: int) -> tuple[str, dict[str, dict[str, Any]]]:
    """The length statistics of every split of a prepared folder, as text and as numbers."""
    stats = {name: length_stats(split, block_size) for name, split in open_splits(folder).items()}
    lines = [f"document lengths in tokens (block size {block_size}):"]
    for name, s in stats.items():
        lines.append(f"  {name:5s} {s['documents']:>9,} documents  min {s['min']:,}  median {s['median']:,.0f}  "
                     f"mean {s['mean']:,.0f}  max {s['max']:,}  {s['long_token_share']:.1%} of tokens in "
                     f"{s['long_documents']:,} documents longer than {block_size + 1}")
    return "\n".join(lines), stats


def plot_lengths(stats: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """A histogram of document lengths per split on a log axis, from ``describe_lengths``."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=FIGSIZE)
    low, top = min(int(s["min"]) for s in stats.values()), max(int(s["max"]) for s in stats.values())
    bins = np.unique(np.geomspace(low, top + 1, 40).astype(np.int64))
    block_size = next(iter(stats.values()))["block_size"]
    for name, s in stats.items():
        axis.hist(s["lengths"], bins=bins, alpha=0.6,
                  label=f"{name}: {s['documents']:,} documents, {s['long_token_share']:.1%} of tokens in longer "
                        f"than {block_size + 1}")
    axis.axvline(block_size + 1, color="black", ls="--", lw=1, label=f"block size + 1 = {block_size + 1}")
    axis.set_xscale("log")
    axis.set_xlabel("document length (tokens, log scale)")
    axis.set_ylabel("documents")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def plot_compression(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Bytes per token of each tokenizer on the same text, as bars (``tokpack.tokenizer eval``)."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=FIGSIZE)
    names = [f"{row['tokenizer']}\n({row['vocabulary']:,} ids)" for row in rows]
    values = [row["bytes/token"] for row in rows]
    bars = axis.bar(names, values, color="tab:blue", alpha=0.8)
    axis.bar_label(bars, fmt="%.2f")
    axis.set_ylabel("bytes per token (higher compresses better)")
    axis.set_title(f"{rows[0]['documents']:,} documents, {rows[0]['bytes']:,} bytes")
    axis.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_png(fig, path)


def png_size(path: str | Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG header."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
