"""Which documents are validation: one rule per run, decided once in the plan.

    python -m tokpack.prepare corpus/ --val-fraction 0.01                # by a seeded hash of each document
    python -m tokpack.prepare corpus/ --val-tokens 10485760              # a fixed budget (modded-nanogpt's)
    python -m tokpack.prepare shards/*.parquet --val-inputs shards/last.parquet   # nanochat's last file

Each document's split follows from its own text (its seeded hash) or its own file, never from
where it lies in the run, so the split is the same on one process and under torchrun; a corpus
that is one document is cut where val begins (``Holdout.lone_cut``). A token
budget is turned into a hash threshold before tokenizing: the documents with the smallest hashes,
in hash order, until they hold at least N tokens. Finding it reads the corpus once more and
encodes only documents that enter the running set of smallest hashes (about k ln(n / k) of n
documents for k in val), holding O(k) numbers.

See docs/prepare.md.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...corpus import ReadOptions, count_chars, documents
from ...storage import InputFile
from ...tokenizer import Encoder


class Rule(enum.StrEnum):
    """How val is chosen: ``FRACTION``, documents whose seeded hash falls in the first fraction of
    the hash range (a lone document: its tail); ``TOKENS``, the smallest-hash documents holding a
    token budget; ``INPUTS``, whole files named as val. meta.json records it by its value."""

    FRACTION = "fraction"
    TOKENS = "tokens"
    INPUTS = "inputs"


@dataclass(frozen=True)
class Holdout:
    """The split rule: a document is val when its hash is below ``below``, or when it comes from
    one of ``files`` (then ``below`` is None)."""

    kind: Rule
    below: int | None
    files: frozenset[InputFile] = frozenset()
    value: Any = None  # the fraction, the token budget, or the val inputs as given

    def is_val(self, text_hash: bytes) -> bool:
        assert self.below is not None
        return int.from_bytes(text_hash, "big") < self.below

    def lone_cut(self, document: InputFile, errors: str) -> int:
        """Where val begins in a corpus that is one document: the character after the first
        1 - fraction of it (a lone document has no other documents to hash)."""
        n = count_chars(document, errors)
        if n == 0:
            raise ValueError(f"the corpus {document} holds no text; pass a non-empty file")
        cut = int(n * (1 - self.value))
        if not 0 < cut < n:
            raise ValueError(f"{document} has {n} characters: cutting at {cut} for --val-fraction {self.value} leaves "
                             "a split empty; use a larger corpus or another fraction")
        return cut

    def describe(self) -> dict[str, Any]:
        """meta.json's record of the rule."""
        out: dict[str, Any] = {"rule": self.kind.value, "value": self.value}
        if self.kind == Rule.TOKENS:
            out["hash_below"] = self.below
        if self.kind == Rule.INPUTS:
            out["files"] = len(self.files)
        return out


def by_fraction(fraction: float) -> Holdout:
    # A hash h is val when h < fraction * 2**64, which for whole numbers is h < ceil(that).
    return Holdout(Rule.FRACTION, math.ceil(fraction * 2**64), value=fraction)


def by_inputs(files: Sequence[InputFile], given: Sequence[str]) -> Holdout:
    return Holdout(Rule.INPUTS, None, frozenset(files), list(given))


def document_key(seed: int) -> bytes:
    """The key of ``document_hash`` for a run's ``--seed``."""
    return seed.to_bytes(8, "little", signed=True)


def document_hash(key: bytes) -> Any:
    """The hash a document's split is decided by: keyed by the seed, over its UTF-8 text."""
    return hashlib.blake2b(digest_size=8, key=key)


def conversation_hash(key: bytes, found: list[dict[str, Any]]) -> bytes:
    """The split hash of a conversation: over each message's "role\\0content\\0" in one update,
    whatever renders it (a message of tool calls alone has no content)."""
    digest = document_hash(key)
    hash_small(digest, "".join([f"{m['role']}\0{_text(m.get('content', ''))}\0" for m in found]).encode(
        "utf-8", "surrogatepass"))
    return digest.digest()


_DUMPS = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False), built once


def _text(content: Any) -> str:
    return content if isinstance(content, str) else _DUMPS(content)


# hashlib lets other threads run while it hashes this many bytes or more; the thread that hashed
# then waits out one of their turns to go on.
HASH_RELEASE_BYTES = 2048


def hash_small(digest: Any, data: bytes) -> None:
    """``digest.update(data)`` in pieces too small to let other threads run: for the many small
    texts a thread hashes while the others wait on it."""
    if len(data) < HASH_RELEASE_BYTES:
        digest.update(data)
        return
    view = memoryview(data)
    for i in range(0, len(data), HASH_RELEASE_BYTES - 1):
        digest.update(view[i:i + HASH_RELEASE_BYTES - 1])


def by_tokens(budget: int, files: Sequence[InputFile], enc: Encoder, eot: str, seed: int, options: ReadOptions) -> Holdout:
    """The threshold that makes val the smallest-hash documents holding at least ``budget`` tokens."""
    key = document_key(seed)
    extra = 0 if eot == "none" else 1
    chosen: list[tuple[int, int]] = []  # (-hash, tokens): a max-heap of the smallest hashes
    held = 0
    for runs in documents(list(files), options):
        text = "".join(runs)
        if not text:
            continue
        digest = document_hash(key)
        digest.update(text.encode("utf-8", "surrogatepass"))
        h = int.from_bytes(digest.digest(), "big")
        if held >= budget and h >= -chosen[0][0]:
            continue  # larger than every hash the budget needs
        tokens = len(enc.encode_batch([text])[0]) + extra
        heapq.heappush(chosen, (-h, tokens))
        held += tokens
        while held - chosen[0][1] >= budget:  # the largest hash is not needed to reach the budget
            held -= heapq.heappop(chosen)[1]
    if held < budget:
        raise ValueError(f"--val-tokens {budget:,} is more than the corpus's {held:,} tokens; "
                         "use a smaller budget")
    return Holdout(Rule.TOKENS, -chosen[0][0] + 1, value=budget)
