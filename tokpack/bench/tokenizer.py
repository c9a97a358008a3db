"""``python -m tokpack.bench tokenizer``: training a tokenizer through tokpack against rustbpe fed
directly, and the trained tokenizer's compression against gpt2 and cl100k_base.

    python -m tokpack.bench tokenizer --mb 100 --vocab-size 32768

On one corpus (the Python docs topics copied to ``--mb`` MB of jsonl), in interleaved rounds,
each run in a fresh process: ``python -m tokpack.tokenizer train`` (reading the files) against
rustbpe's ``train_from_iterator`` on the same cropped documents already in memory; wall time and
peak memory of both. Then bytes per token of the trained vocabulary, gpt2 and cl100k_base on
held-out text. Cost: O(corpus) reading, flat in memory on the reading side; the counting is
rustbpe's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..cli import table
from ..tokenizer.compare import compare
from .prepare import synthetic_corpus

_PEAK = "next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))"
_OURS = ("import sys, time; from tokpack.tokenizer.train import TrainConfig, train; t = time.perf_counter(); "
         "train(TrainConfig(inputs=(sys.argv[1],), out=sys.argv[2], vocab_size=int(sys.argv[3]), force=True, "
         "quiet=True)); print(time.perf_counter() - t, " + _PEAK + ")")
_RAW = ("import json, sys, time, rustbpe; from pathlib import Path; from tokpack.tokenizer import NANOCHAT_PATTERN; "
        "docs = [json.loads(l)['text'][:10000] for f in sorted(Path(sys.argv[1]).iterdir()) for l in open(f)]; "
        "t = time.perf_counter(); tok = rustbpe.Tokenizer(); "
        "tok.train_from_iterator(iter(docs), int(sys.argv[3]) - 1, pattern=NANOCHAT_PATTERN); "
        "print(time.perf_counter() - t, " + _PEAK + ")")


def _run(code: str, corpus: Path, out: Path, vocab_size: int) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(vocab_size)], check=True,
                          capture_output=True, text=True)
    seconds, peak = done.stdout.split()
    return float(seconds), float(peak)


def bench_tokenizer(folder: Path, megabytes: float, vocab_size: int, rounds: int) -> dict[str, Any]:
    corpus = folder / "corpus"
    docs = synthetic_corpus(corpus, megabytes)
    runs: dict[str, list[tuple[float, float]]] = {"tokpack train (reads the files)": [],
                                                   "rustbpe on documents in memory": []}
    for _ in range(rounds):
        runs["tokpack train (reads the files)"].append(_run(_OURS, corpus, folder / "tok", vocab_size))
        runs["rustbpe on documents in memory"].append(_run(_RAW, corpus, folder / "raw", vocab_size))
    rows = [{"run": name, "seconds": statistics.median(t for t, _ in values),
             "peak MB": max(m for _, m in values)} for name, values in runs.items()]
    ours, raw = (list(values) for values in runs.values())
    speed = statistics.median(r[0] / o[0] for o, r in zip(ours, raw))
    print(f"{megabytes:g} MB, {len(docs):,} documents, vocabulary {vocab_size:,}; medians of {rounds} interleaved "
          "rounds, each run in its own process")
    print(table(rows, ["run", "seconds", "peak MB"]))
    print(f"tokpack's speed / rustbpe's: {speed:.2f}x")
    held_out = folder / "held-out"
    synthetic_corpus(held_out, 1)
    compression = compare([str(folder / "tok"), "gpt2", "cl100k_base"], [str(held_out)])
    print(table(compression, ["tokenizer", "vocabulary", "tokens", "bytes/token", "tokens vs first"]))
    return {"bench": "tokenizer", "megabytes": megabytes, "vocab_size": vocab_size, "rounds": rounds,
            "speed_vs_rustbpe": speed, "runs": rows, "compression": compression}
