"""An accelerated BPE backend, used where it is proven to give tiktoken's ids, and checked while
it runs: splintr-rs (``pip install "tokpack[fast]"``).

    python -m tokpack.prepare corpus/ --backend splintr --check-fraction 0.01

Proven here for the split patterns of gpt2 (r50k_base), cl100k_base, o200k_base and nanochat,
over any ranks: tests/tokenizer/test_fast.py compares it with tiktoken on adversarial text, for
the public encodings and for spec files with other ranks (its merge rule is tiktoken's: the
lowest-ranked adjacent pair first, the leftmost of equals). It is built from the encoding's
ranks with a form of its pattern that splintr's regex engine takes (it refuses possessive
quantifiers) and no special tokens, so ``<|endoftext|>`` in text stays text; lone surrogates
become U+FFFD first, as tiktoken does. During prepare a seeded share of the pieces is encoded
with tiktoken too, and any difference stops the run.

See docs/tokenizers.md.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from .patterns import CL100K_PATTERN, NANOCHAT_PATTERN, O200K_PATTERN, R50K_PATTERN
from .ranks import ranks_file

BACKENDS = ("auto", "tiktoken", "splintr")
# The split patterns the differential test proves, each with the form splintr is built with: a
# pattern constant of splintr's by name, or a regex. nanochat's possessive quantifiers become
# greedy ones, which match the same here: what follows each can never fail back into it.
PROVEN = {R50K_PATTERN: "GPT2_PATTERN", CL100K_PATTERN: "CL100K_BASE_PATTERN", O200K_PATTERN: "O200K_BASE_PATTERN",
          NANOCHAT_PATTERN: NANOCHAT_PATTERN.replace("?+", "?").replace("++", "+")}
PROVEN_FOR = "the split patterns of gpt2, cl100k_base, o200k_base and nanochat"
_PROBE = "Hello world!  It's 2026 — naïve 東京 <|endoftext|>\n\n  x"


def without_surrogates(text: str) -> str:
    """tiktoken's handling of lone surrogates: replaced by U+FFFD before encoding."""
    if text.isascii():  # known without a look at the characters: no surrogate, no copy
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def split_flat(flat: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """Each text's ids, from all of them laid end to end and the ``len(texts) + 1`` offsets."""
    return [flat[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


class SplintrBackend:
    """splintr-rs over an encoding's ranks: ``encode_batch`` in its own threads (Rayon)."""

    name = "splintr"

    def __init__(self, enc: Any):
        import splintr

        self.version = splintr.__version__
        pattern = PROVEN[enc._pat_str]
        self.tokenizer = splintr.Tokenizer.from_bytes(ranks_file(enc), getattr(splintr, pattern, pattern), None)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids one after another (uint32), and where each text's start: ``len(texts) + 1``
        offsets."""
        if not all(map(str.isascii, texts)):  # else no text can hold a surrogate
            texts = [without_surrogates(t) for t in texts]
        ids, offsets = self.tokenizer.encode_batch_flat(texts)
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return split_flat(*self.encode_flat(texts))

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version}


def choose_backend(enc: Any, asked: str) -> SplintrBackend | None:
    """The backend for ``enc`` (a ``tiktoken.Encoding``): splintr where it is installed and proven
    (``auto``), or as asked; None means tiktoken. A backend that cannot build the encoding, or
    gives other ids on a probe, falls back to tiktoken with one warning; asked for by name, it is
    one line instead."""
    if asked not in BACKENDS:
        raise ValueError(f"--backend {asked!r} is not one of {', '.join(BACKENDS)}")
    if asked == "tiktoken":
        return None
    if enc._pat_str not in PROVEN:
        if asked == "splintr":
            raise ValueError(f"--backend splintr is proven here for {PROVEN_FOR} only, not the pattern of "
                             f"{enc.name!r}; use --backend tiktoken")
        return None
    try:
        import splintr  # noqa: F401
    except ImportError:
        if asked == "splintr":
            raise ValueError('--backend splintr needs splintr-rs; pip install "tokpack[fast]"') from None
        return None
    try:
        backend, agrees = _built(enc)
    except Exception as exc:  # any failure to build: tiktoken is always there
        problem = f"it failed to build {enc.name} ({type(exc).__name__}: {exc})"
    else:
        if agrees:
            return backend
        problem = f"it gives other ids than tiktoken for {enc.name} on a probe text"
    if asked == "splintr":
        raise ValueError(f"--backend splintr: {problem}; use --backend tiktoken")
    warnings.warn(f"the splintr backend is not used: {problem}; encoding with tiktoken", stacklevel=3)
    return None


@functools.lru_cache(maxsize=4)
def _built(enc: Any) -> tuple[SplintrBackend, bool]:
    """splintr built over ``enc`` (a cached ``tiktoken.Encoding``) and whether it agrees with it on
    the probe: once a process, as tiktoken builds an encoding once (a build is ~50 ms and 17 MB)."""
    backend = SplintrBackend(enc)
    return backend, backend.encode_batch([_PROBE])[0].tolist() == enc.encode_ordinary(_PROBE)


def _mixed(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64s: every bit of the output depends on every bit of the input."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sampled(flat: np.ndarray, bounds: np.ndarray, seed: int, fraction: float) -> np.ndarray:
    """Which texts (indices) are among the seeded ``fraction`` checked against tiktoken, from the
    backend's ids of them laid end to end (``bounds``, each text's offsets): by their count, sum,
    first and last ids, so the same texts are checked on every run, in a few array operations a
    batch. A decision a text cost as much as the checks themselves, for conversations cut into
    tens of thousands of short stretches."""
    lengths = np.diff(bounds)
    if fraction >= 1:
        return np.arange(len(lengths))
    filled = np.flatnonzero(lengths)  # an empty text's ids are its length: nothing more to check
    if fraction <= 0 or not len(filled):
        return filled[:0]
    ids, starts = flat.astype(np.uint64), bounds[:-1][filled]
    with np.errstate(over="ignore"):  # the mixing wraps around, as meant
        key = _mixed(lengths[filled].astype(np.uint64) ^ np.uint64(seed & (2**64 - 1)))
        key = _mixed(key ^ np.add.reduceat(ids, starts))
        key = _mixed(key ^ ids[starts] ^ (ids[bounds[1:][filled] - 1] << np.uint64(32)))
    return filled[key < np.uint64(int(fraction * 2**64))]


def check_piece(backend: SplintrBackend, enc: Any, text: str, ids: np.ndarray) -> None:
    """Refuse the run if ``ids`` are not tiktoken's for ``text``, naming the backend and the offset."""
    expected = enc.encode_ordinary(text)
    if ids.tolist() == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(ids.tolist(), expected)) if a != b), min(len(ids), len(expected)))
    offset = len(enc.decode(expected[:first]))
    raise ValueError(f"backend {backend.name} {backend.version} gave other ids than tiktoken at character "
                     f"{offset} of a piece ({text[offset:offset + 20]!r}); nothing was published: rerun with "
                     "--backend tiktoken and report it")
