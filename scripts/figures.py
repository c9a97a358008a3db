"""Regenerate the three figures of docs/evaluation.md from the built-in sample (needs tokpack[plot]).

    python scripts/figures.py                    # prepare, train the sample GPT (about 13 minutes on
                                                 # 2 CPU cores), evaluate, draw
    python scripts/figures.py --no-training      # draw from an existing out/sample run

Writes docs/figures/losses.png (train and val loss, n-gram baselines), sweep.png (loss and
bits/byte against stride for the GPT and the baselines, across documents and each document
alone) and lengths.png (document lengths).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import train_gpt  # scripts/train_gpt.py, beside this file

from tokpack.evaluation import main as evaluate
from tokpack.inspect import main as inspect
from tokpack.plot import pyplot
from tokpack.evaluation import describe_losses, draw_run
from tokpack.prepare.__main__ import main as prepare

DATA, RUN, CONFIG, FIGURES = Path("data/sample"), Path("out/sample"), "configs/train_sample.toml", Path("docs/figures")
BLOCK_SIZE = "128"  # the sample config's


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-training", action="store_true", help="use the run already in out/sample (default: train)")
    args = p.parse_args()
    pyplot()  # the extra, before anything long
    FIGURES.mkdir(parents=True, exist_ok=True)
    if not (DATA / "meta.json").is_file():
        prepare(["--quiet"])
    if not args.no_training:
        train_gpt.main(["--config", CONFIG])
    print(f"figures: losses {describe_losses(draw_run(RUN, FIGURES / 'losses.png'))}")
    evaluate([str(DATA), "--checkpoint", str(RUN / "ckpt.pt"), "--model", "bigram", "--model", "unigram",
              "--block-size", BLOCK_SIZE, "--stride", "128", "64", "32", "16", "--documents", "--quiet",
              "--plot", str(FIGURES / "sweep.png")])
    inspect([str(DATA), "--lengths", str(FIGURES / "lengths.png"), "--block-size", BLOCK_SIZE])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
