"""``python -m tokpack.bench tokenizer``: training a tokenizer through tokpack against rustbpe fed
directly, and the trained tokenizer's compression against gpt2 and cl100k_base.

    python -m tokpack.bench tokenizer --mb 100 --vocab-size 32768

Speed: on ``--mb`` MB of jsonl with many distinct words (a Zipf draw from a random lexicon, with
punctuation and numbers, so that the vocabulary fills), in interleaved rounds, each run in a fresh
process: tokpack's training (reading the files) against rustbpe's ``train_from_iterator`` on the
same cropped documents already in memory; wall time and peak memory of both. Compression: a
vocabulary of ``--compression-vocab`` trained on 80 % of the Python docs topics (English prose
that ships with CPython), its bytes per token on the other 20 % beside gpt2's and cl100k_base's.
Cost: O(corpus) reading, overlapped with the counting, flat in memory on the reading side.

See docs/benchmarks.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..cli import table
from ..tokenizer.compare import compare
from ..tokenizer.train import TrainConfig, train

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


def diverse_corpus(folder: Path, megabytes: float, seed: int = 0) -> int:
    """jsonl shards of documents drawn from a random lexicon of 100,000 words (Zipf frequencies),
    with punctuation and numbers; returns the documents."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
                        1.9, 1.5, 1.0, 0.8, 0.2, 0.2, 0.1, 0.1])
    lexicon = ["".join(rng.choice(letters, rng.integers(2, 12), p=weights / weights.sum())) for _ in range(100_000)]
    lexicon += [",", ".", ";", "(", ")", "1", "2024", "3.14", "—"]
    folder.mkdir(parents=True)
    documents, size = 0, 0
    with open(folder / "shard-00000.jsonl", "w", encoding="utf-8") as out:
        while size < megabytes * 1e6:
            ids = np.minimum(rng.zipf(1.15, 500), len(lexicon)) - 1
            text = " ".join(lexicon[i] for i in ids.tolist())
            out.write(json.dumps({"text": text}) + "\n")
            documents, size = documents + 1, size + len(text)
    return documents


def bench_tokenizer(folder: Path, megabytes: float, vocab_size: int, rounds: int,
                    compression_vocab: int) -> dict[str, Any]:
    corpus = folder / "corpus"
    documents = diverse_corpus(corpus, megabytes)
    runs: dict[str, list[tuple[float, float]]] = {"tokpack train (reads the files)": [],
                                                   "rustbpe on documents in memory": []}
    for _ in range(rounds):
        runs["tokpack train (reads the files)"].append(_run(_OURS, corpus, folder / "tok", vocab_size))
        runs["rustbpe on documents in memory"].append(_run(_RAW, corpus, folder / "raw", vocab_size))
    rows = [{"run": name, "seconds": statistics.median(t for t, _ in values),
             "peak MB": max(m for _, m in values)} for name, values in runs.items()]
    ours, raw = (list(values) for values in runs.values())
    speeds = [r[0] / o[0] for o, r in zip(ours, raw)]
    speed = statistics.median(speeds)
    print(f"{megabytes:g} MB, {documents:,} documents, vocabulary {vocab_size:,}; medians of {rounds} interleaved "
          "rounds, each run in its own process")
    print(table(rows, ["run", "seconds", "peak MB"]))
    print(f"tokpack's speed / rustbpe's: {speed:.2f}x (rounds {min(speeds):.2f}-{max(speeds):.2f})")
    compression = _compression(folder, compression_vocab)
    return {"bench": "tokenizer", "megabytes": megabytes, "vocab_size": vocab_size, "rounds": rounds,
            "speed_vs_rustbpe": speed, "runs": rows, "compression": compression}


def _compression(folder: Path, vocab_size: int) -> list[dict[str, Any]]:
    from pydoc_data.topics import topics

    texts = [text for _, text in sorted(topics.items())]
    cut = len(texts) * 4 // 5
    for name, part in (("docs-train", texts[:cut]), ("docs-held-out", texts[cut:])):
        (folder / name).mkdir()
        for i, text in enumerate(part):
            (folder / name / f"{i:04d}.txt").write_text(text, "utf-8")
    train(TrainConfig(inputs=(str(folder / "docs-train"),), out=str(folder / "docs-tok"), vocab_size=vocab_size,
                      quiet=True))
    rows = compare([str(folder / "docs-tok"), "gpt2", "cl100k_base"], [str(folder / "docs-held-out")])
    rows[0]["tokenizer"] = f"trained here ({vocab_size:,})"
    print(f"bytes per token on {rows[0]['documents']} held-out Python docs topics ({rows[0]['bytes']:,} bytes):")
    print(table(rows, ["tokenizer", "vocabulary", "tokens", "bytes/token", "tokens vs first"]))
    return rows
