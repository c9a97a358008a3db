"""The loss figure of a scripts/train_gpt.py run: its logs, its checkpoint's evaluations, and the
n-gram baselines of its data at its block size.

    from tokpack.plot.runs import draw_run
    draw_run("out/sample", "losses.png")                  # what python -m tokpack.plot out/sample does
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..evaluation import sweep
from ..models import load_gpt
from . import plot_losses, png_path, read_losses, run_folder


def draw_run(run_dir: str | Path, path: str | Path, device: str = "cpu") -> dict[str, Any]:
    """Draw a run's losses into ``path``: the train loss of every step (ranks merged), the val loss
    of every evaluation in ``ckpt.pt``, and the bigram and unigram baselines as lines.

    Returns {"train": {step: loss}, "val": {step: loss}, "baselines": {name: loss}}: what was drawn.
    """
    run_dir = run_folder(run_dir)
    png_path(path)  # a missing extra or a bad name is one line before the work
    train = read_losses(run_dir)
    model, ckpt = load_gpt(run_dir / "ckpt.pt", device)
    val = {int(e["step"]): float(e["loss"]) for e in ckpt.get("evals", []) if "scope" not in e}
    data_dir = ckpt.get("config", {}).get("data_dir")
    if not isinstance(data_dir, str):
        raise ValueError(f"{run_dir / 'ckpt.pt'} names no data_dir in its config; pass a scripts/train_gpt.py run")
    rows = sweep(data_dir, baselines=["bigram", "unigram"], block_size=model.config.block_size, quiet=True)
    baselines = {row["model"]: row["loss"] for row in rows}
    plot_losses(train, val, baselines, path,
                f"{run_dir}: {model.num_params():,} parameters, block size {model.config.block_size}")
    return {"train": train, "val": val, "baselines": baselines}


def describe_losses(drawn: dict[str, Any]) -> str:
    """One line of what ``draw_run`` drew: the last val loss and the baselines."""
    val = drawn["val"]
    last = f", val {val[max(val)]:.4f} at step {max(val)}" if val else ""
    base = ", ".join(f"{name} {loss:.4f}" for name, loss in drawn["baselines"].items())
    return f"{max(drawn['train'], default=0)} steps{last}; baselines {base}"


