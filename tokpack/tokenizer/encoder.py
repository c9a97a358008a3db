"""The one interface every tokenizer meets: what prepare, the readers and evaluation ask of it.

    python -c "from tokpack.tokenizer import load_encoding; e = load_encoding('gpt2'); print(e.describe())"

Three kinds implement it: tiktoken encodings (built-in names, ``NAME.tiktoken`` files and spec
files, with an accelerated backend as an option), and Hugging Face ``tokenizer.json`` files.
No caller asks which kind it holds.

See docs/tokenizers.md.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .specials import with_leads


@runtime_checkable
class Encoder(Protocol):
    """A tokenizer as tokpack uses it.

    ``can_cut``: documents may be cut inside, at the points ``tokenizer.safe_cut`` finds, without
    changing their ids (proven for the split patterns of gpt2, cl100k_base and o200k_base); else
    each document is encoded whole. ``parallel``: ``encode_batch`` uses every core itself, so
    one thread feeds it large batches; else tokpack runs it in several threads.
    """

    kind: str  # "tiktoken" or "huggingface": what the encoding's files are, for messages and checks
    name: str
    n_vocab: int
    eot_token: int
    can_cut: bool
    parallel: bool
    special_ids: frozenset[int]
    specials: dict[str, int]  # the special tokens, by their text
    normal_form: str | None  # the Unicode form its normalizer puts text in ("NFC"), where that is all it does
    added: dict[str, int]  # tokens added to the vocabulary but not special (Qwen's <think>), by their text
    vocab_sha256: str  # the vocabulary's hash, recorded in meta.json and checked by readers
    library: Any  # the library's own object (a tiktoken Encoding, a tokenizers Tokenizer), for comparisons

    def encode_ordinary(self, text: str) -> list[int]:
        """The ids of ``text``, special-token text encoded as ordinary text."""
        ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """``encode_ordinary`` of every text, as uint32 arrays."""
        ...

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode_ordinary`` of every text, the ids laid end to end (uint32), and where each
        text's start (``len(texts) + 1`` offsets, the last their end): one call for many short
        texts, which an encoder may encode at once."""
        ...

    def encode_marked(self, texts: list[str], marks: frozenset[str],
                      held: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all the texts laid end to end (uint32), where the text of a special token in
        ``marks`` is that token and the stretches between them are ``encode_ordinary``'s, and
        where each text's ids start (``len(texts) + 1`` offsets, the last their end); the caller
        makes sure no other special-token text touches them (``tokpack.tokenizer.specials.specials_apart``).
        Many texts a call: an encoder may encode them at once. ``held``: how many marks each text
        holds, where the caller knows (else they are counted)."""
        ...

    def decode(self, ids: list[int]) -> str:
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes of the text a token stands for; KeyError for an id the vocabulary leaves unused."""
        ...

    def chat_template(self) -> tuple[str, str] | None:
        """The tokenizer's own chat template (its text, and where it is); None where it has none."""
        ...

    def template_variables(self) -> dict[str, str]:
        """The special tokens its config names (``bos_token``, ...), as any chat template is given
        them, its own or one passed with --chat-template."""
        ...

    def flush(self) -> None:
        """Wait for work in flight (an accelerated backend's checks); an error found there raises."""
        ...

    def with_controls(self, names: Iterable[str]) -> Encoder:
        """This encoder reading the added tokens ``names`` as special ones (a chat template's
        control tokens: placed by id where it writes them, text where a message holds them)."""
        ...

    def with_backend(self, asked: str, check_fraction: float, seed: int) -> Encoder:
        """This encoder on the backend ``asked`` (auto, tiktoken or splintr), or itself."""
        ...

    def describe(self) -> dict[str, Any]:
        """meta.json's ``encoding`` entry: name, vocabulary hash, n_vocab, eot id and backend."""
        ...


@lru_cache(maxsize=8)
def marks_pattern(marks: frozenset[str]) -> re.Pattern[str]:
    """The special tokens ``marks`` as one pattern (longest first), in a group."""
    return re.compile("(" + "|".join(map(re.escape, sorted(marks, key=len, reverse=True))) + ")")


def encode_marked_stretches(enc: Encoder, texts: list[str], marks: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """``encode_marked`` for an encoder that does not read the marks itself: each text cut at the
    marks, the stretches between them encoded in one ``encode_flat``, each mark's id placed before
    the stretch after it."""
    cut = [marks_pattern(marks).split(text) for text in texts]  # text, mark, text, ..., text
    stretches = [part for parts in cut for part in parts[::2]]
    leads = [lead for parts in cut for lead in [[], *([enc.specials[mark]] for mark in parts[1::2])]]
    ids, layout = with_leads(*enc.encode_flat(stretches), leads)
    first = np.cumsum([0, *(len(parts) // 2 + 1 for parts in cut)])  # each text's first stretch
    return ids, np.append(layout[first[:-1], 0], len(ids))


def flat_arrays(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Arrays of ids laid end to end (uint32), and each one's offsets."""
    bounds = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)), out=bounds[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
    return flat.astype(np.uint32, copy=False), bounds


def flat_lists(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids laid end to end (uint32), and each one's offsets."""
    bounds = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=bounds[1:])
    return np.fromiter(itertools.chain.from_iterable(lists), dtype=np.uint32, count=int(bounds[-1])), bounds
