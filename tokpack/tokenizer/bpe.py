"""A tiktoken encoding behind the ``Encoder`` interface, with an accelerated backend as an option.

    python -m tokpack.prepare corpus/ --encoding cl100k_base --backend splintr

Built-in names, ``NAME.tiktoken`` files and spec files all load into this class (see
``tokpack.tokenizer``); only where they come from differs.

See docs/tokenizers.md.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import tiktoken

from .specials import specials_apart
from . import fast
from .encoder import encode_marked_stretches, flat_arrays, marks_pattern
from .patterns import CUT_SAFE_PATTERNS, ENDOFTEXT
from .ranks import ranks_sha256


@lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the printable character that stands for each byte."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(visible), 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, chars)}


class _Check:
    """A seeded share of an accelerated backend's pieces re-encoded with tiktoken, in a thread of
    its own: the thread that feeds the backend goes on to the next batch. At most ``AHEAD``
    batches wait for their check; ``flush`` waits for all and raises the first difference."""

    AHEAD = 4

    def __init__(self, fraction: float, seed: int):
        self.fraction, self.seed = fraction, seed
        self._pool: ThreadPoolExecutor | None = None
        self._pending: collections.deque[Future[None]] = collections.deque()
        self._lock = threading.Lock()

    def _run(self, backend: fast.SplintrBackend, library: tiktoken.Encoding, texts: list[str],
             flat: np.ndarray, bounds: np.ndarray) -> None:
        for i in fast.sampled(flat, bounds, self.seed, self.fraction).tolist():
            fast.check_piece(backend, library, texts[i], flat[bounds[i]:bounds[i + 1]])

    def submit(self, backend: fast.SplintrBackend, library: tiktoken.Encoding, texts: list[str],
               flat: np.ndarray, bounds: np.ndarray) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokpack-check")
            while self._pending and (self._pending[0].done() or len(self._pending) >= self.AHEAD):
                self._pending.popleft().result()  # a difference found so far stops the run here
            self._pending.append(self._pool.submit(self._run, backend, library, texts, flat, bounds))

    def flush(self) -> None:
        with self._lock:
            try:
                while self._pending:
                    self._pending.popleft().result()
            finally:
                self._pending.clear()
                if self._pool is not None:  # its thread goes; the next batch starts another
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = None


class TiktokenEncoder:
    """A ``tiktoken.Encoding`` (``library``) whose documents end with the special token ``eot``:
    ``<|endoftext|>``, or a spec file's own (nanochat's ``<|bos|>``, say)."""

    kind = "tiktoken"

    def __init__(self, library: tiktoken.Encoding, eot: str = ENDOFTEXT,
                 backend: fast.SplintrBackend | None = None, check: _Check | None = None):
        self.library, self.eot_name, self.backend, self._check = library, eot, backend, check
        self.name, self.n_vocab = library.name, library.n_vocab
        self.eot_token = library._special_tokens[eot]
        self.can_cut = library._pat_str in CUT_SAFE_PATTERNS
        self.parallel = backend is not None  # splintr threads itself; tiktoken runs in tokpack's threads
        self.specials = dict(library._special_tokens)
        self.normal_form = None  # tiktoken reads text as it is
        self.added: dict[str, int] = {}  # no token is added to its ranks but the special ones
        self.special_ids = frozenset(self.specials.values())

    @cached_property
    def vocab_sha256(self) -> str:
        return ranks_sha256(self.library)

    @cached_property
    def _special_table(self) -> np.ndarray:
        """Whether each id is a special token's: one lookup an id, where a set test costs a sort."""
        table = np.zeros(self.n_vocab, dtype=bool)
        table[list(self.special_ids)] = True
        return table

    def encode_ordinary(self, text: str) -> list[int]:
        return self.library.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.backend is None:
            return [self._encode_allowing(text, frozenset()) for text in texts]
        return fast.split_flat(*self._encode_flat(texts))

    def _encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The backend's ids of ``texts`` one after another, and each one's offset; checked."""
        assert self.backend is not None
        flat, bounds = self.backend.encode_flat(texts)
        if self._check is not None:
            self._check.submit(self.backend, self.library, texts, flat, bounds)
        return flat, bounds

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.backend is not None:
            return self._encode_flat(texts)
        # tiktoken is one call for all the texts, joined by a special token it alone reads as
        # special: a call a text would hand the GIL back once a text. The joins must be all it
        # finds (no text holds its text), else each text is encoded alone.
        gap = self._gap
        if gap is None or len(texts) < 2:
            return flat_arrays(self.encode_batch(texts))
        ids = self._encode_allowing(gap.join(texts), frozenset([gap]))
        at = np.flatnonzero(ids == self.specials[gap])
        if len(at) != len(texts) - 1:
            return flat_arrays(self.encode_batch(texts))
        kept = np.ones(len(ids), dtype=bool)
        kept[at] = False
        return ids[kept], np.concatenate(([0], at - np.arange(len(at)), [len(ids) - len(at)]))

    @cached_property
    def _gap(self) -> str | None:
        """A special token to join texts by: one no text can run into (``specials_apart``), the
        end-of-text token first."""
        return next((name for name in [self.eot_name, *sorted(self.specials)] if specials_apart([name])), None)

    def _encode_allowing(self, text: str, allowed: frozenset[str]) -> np.ndarray:
        """tiktoken's ids of ``text`` reading the special tokens ``allowed``, and no other, as special."""
        try:
            return self.library.encode_to_numpy(text, allowed_special=allowed, disallowed_special=())
        except UnicodeEncodeError:  # a lone surrogate: U+FFFD, as tiktoken's encode_ordinary makes it
            return self.library.encode_to_numpy(fast.without_surrogates(text), allowed_special=allowed,
                                                disallowed_special=())

    def encode_marked(self, texts: list[str], marks: frozenset[str],
                      held: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        # An accelerated backend knows no special tokens: it is given the stretches between them.
        # tiktoken gets one call for all the texts, joined by a mark (no stretch runs past one): a
        # call a text would hand the GIL back once a text. It cuts at the allowed specials and
        # encodes each stretch on its own.
        if self.backend is not None:
            return encode_marked_stretches(self, texts, marks)
        if not texts:
            return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
        if held is None:
            held = [len(found) for found in map(marks_pattern(marks).findall, texts)]
        ids = self._encode_allowing(min(marks).join(texts), marks)
        at = np.flatnonzero(self._special_table[ids])  # text never encodes to a special token
        if len(at) != sum(held) + len(texts) - 1:
            raise ValueError(f"{self.name} read {len(at)} special tokens in {len(texts)} texts holding "
                             f"{sum(held)}; this is a bug: report it, with the tokenizer")
        gaps = at[np.cumsum(np.add(held[:-1], 1), dtype=np.int64) - 1]  # the marks that joined the texts
        kept = np.ones(len(ids), dtype=bool)
        kept[gaps] = False
        bounds = np.concatenate(([0], gaps - np.arange(len(gaps)), [len(ids) - len(gaps)]))
        return ids[kept], bounds

    def chat_template(self) -> None:
        """A tiktoken encoding carries no chat template: pass one with --chat-template."""
        return None

    def template_variables(self) -> dict[str, str]:
        """None: a tiktoken encoding has no config naming its special tokens."""
        return {}

    def flush(self) -> None:
        """Wait for the backend's checks in flight; a difference raises here."""
        if self._check is not None:
            self._check.flush()

    def decode(self, ids: list[int]) -> str:
        return self.library.decode(ids)

    def token_bytes(self, token: int) -> bytes:
        return self.library.decode_single_token_bytes(token)

    def with_controls(self, names: Iterable[str]) -> TiktokenEncoder:
        """Itself: a tiktoken encoding has no added tokens besides its special ones."""
        return self

    def with_backend(self, asked: str, check_fraction: float, seed: int) -> TiktokenEncoder:
        backend = fast.choose_backend(self.library, asked)
        if backend is None:
            return self
        encoder = TiktokenEncoder(self.library, self.eot_name, backend, _Check(check_fraction, seed))
        encoder.__dict__["vocab_sha256"] = self.vocab_sha256  # the same vocabulary: hashed once
        return encoder

    def describe(self) -> dict[str, Any]:
        backend = (self.backend.describe() if self.backend is not None
                   else {"name": "tiktoken", "version": tiktoken.__version__})
        return {"name": self.name, "ranks_sha256": self.vocab_sha256, "n_vocab": self.n_vocab,
                "eot_id": self.eot_token, "backend": backend}

    def __repr__(self) -> str:
        return f"<TiktokenEncoder {self.name!r}>"
