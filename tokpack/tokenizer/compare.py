"""Compare tokenizers on held-out text: bytes per token and tokens per document.

    python -m tokpack.tokenizer eval tok/ --inputs val/ --against gpt2 cl100k_base

Each tokenizer encodes the same documents (read by tokpack's reader, each whole, special-token
text as ordinary text); a table and a JSON line give, per tokenizer, its vocabulary, the tokens,
the bytes per token (higher compresses better) and the tokens per document, and each one's tokens
against the first's.

See docs/tokenizers.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..corpus import ReadOptions, documents
from ..inputs import resolve_inputs
from . import Encoder, load_encoding

TRAINED_SPEC = "tokenizer.toml"


def trained(name: str) -> Encoder:
    """A tokenizer by name or file, or a folder ``train`` wrote (its spec file)."""
    path = Path(name)
    if path.is_dir() and (path / TRAINED_SPEC).is_file():
        return load_encoding(str(path / TRAINED_SPEC))
    return load_encoding(name)


def compare(names: Sequence[str], inputs: Sequence[str], options: ReadOptions = ReadOptions(),
            batch_chars: int = 1 << 22) -> list[dict[str, Any]]:
    """One row per tokenizer over the documents of ``inputs``. O(corpus) per tokenizer, memory a
    batch of documents."""
    encoders = [(name, trained(name)) for name in names]
    files = resolve_inputs(inputs)
    tokens = [0] * len(encoders)
    count = nbytes = 0
    batch: list[str] = []

    def flush() -> None:
        for i, (_, enc) in enumerate(encoders):
            tokens[i] += sum(len(ids) for ids in enc.encode_batch(batch))
        batch.clear()

    for runs in documents(files, options):
        text = "".join(runs)
        if not text:
            continue
        count += 1
        nbytes += len(text.encode("utf-8", "surrogatepass"))
        batch.append(text)
        if sum(map(len, batch)) >= batch_chars:
            flush()
    flush()
    if not count:
        raise ValueError(f"the inputs ({', '.join(inputs)}) hold no text to compare on; pass non-empty files")
    return [{"tokenizer": name, "vocabulary": enc.n_vocab, "documents": count, "bytes": nbytes, "tokens": n,
             "bytes/token": nbytes / n, "tokens/document": n / count, "tokens vs first": n / tokens[0]}
            for (name, enc), n in zip(encoders, tokens)]
