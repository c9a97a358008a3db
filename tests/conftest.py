from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokpack.preparation import PrepareConfig, prepare

ROOT = Path(__file__).resolve().parents[1]

WORDS = ("the quick brown fox jumps over the lazy dog while 42 cats don't sleep; "
         "naïve café — 東京 ünïcode! (tabs)\tand\nnewlines\n\n  spaces   ").split(" ")


def make_docs(n: int, seed: int = 0, words: int = 60) -> list[str]:
    """Deterministic small documents of varied length and content."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, words))) + f" doc{i}" for i in range(n)]


def write_docs(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_text(doc, "utf-8")
    return folder


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A small prepared folder of 60 documents."""
    corpus = write_docs(tmp_path / "corpus", make_docs(60, words=200))
    out = tmp_path / "prepared"
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), quiet=True, val_fraction=0.3))
    return out


def run_module(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m tokpack.<tool> ...`` in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=None)


def bare_file(path: Path, n: int, dtype=np.uint16, seed: int = 0) -> np.ndarray:
    """``n`` random ids written as a bare token file (no header), as nanoGPT's prepare writes them."""
    tokens = np.random.default_rng(seed).integers(0, 50000, n).astype(dtype)
    tokens.tofile(path)
    return tokens


def shard_file(path: Path, tokens, version: int = 1) -> Path:
    """A shard in llm.c's published layout: 256 little-endian int32 header words (magic, version,
    token count), then the tokens: magic 20240520 / version 1 with uint16, 20240801 / 7 with uint32."""
    magic, dtype = {1: (20240520, "<u2"), 7: (20240801, "<u4")}[version]
    header = np.zeros(256, dtype="<i4")
    header[:3] = (magic, version, len(tokens))
    path.write_bytes(header.tobytes() + np.asarray(tokens).astype(dtype).tobytes())
    return path


def write_tiktoken_file(path: Path) -> Path:
    """gpt2's ranks as a .tiktoken file (base64 token, rank per line) named ``path``."""
    from tokpack.tokenizer import load_encoding

    enc = load_encoding("gpt2")
    lines = [base64.b64encode(enc.decode_single_token_bytes(rank)) + b" %d" % rank for rank in range(50256)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
