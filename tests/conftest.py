from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tokpack.prepare import PrepareConfig, prepare

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
