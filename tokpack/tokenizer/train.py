"""Train a byte-level BPE tokenizer on a corpus, as nanochat does, and write it in both forms.

    pip install "tokpack[train]"
    python -m tokpack.tokenizer train corpus/ --vocab-size 32768 --out tok/ --max-chars 2e9
    python -m tokpack.prepare corpus/ --encoding tok/tokenizer.toml --out-dir data/mine

The text comes through tokpack's own reader (every input kind and format prepare reads, the same
document order and newline rules): each document cropped to ``doc_cap`` characters, until
``max_chars`` are seen (the document that crosses the budget is the last), as nanochat's
``tok_train.py`` feeds it. rustbpe learns ``vocab_size - len(specials)`` ranks with the split
pattern; the special tokens take the ids after them. The folder gets, together or not at all:
``tokenizer.tiktoken`` (the ranks), ``tokenizer.toml`` (tokpack's spec file: ranks, pattern,
special tokens, end of text), ``tokenizer.json`` (the same vocabulary as a Hugging Face byte-level
BPE, its merges derived from the ranks), ``tokenizer_config.json`` (its end-of-text token, and
special-token text read as text, as prepare reads it) and
``training.json`` (the inputs, the budget, the pattern and the vocabulary's hash).
Memory on the reading side is one buffer of documents; the counting is rustbpe's.

See docs/tokenizers.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import regex
from tqdm import tqdm

from .specials import NANOCHAT_TOKENS
from ..corpus import ReadOptions, documents
from ..storage.local import open_new, remove_own
from ..inputs import resolve_inputs
from ..options import option
from .bpe import TiktokenEncoder, gpt2_byte_decoder
from .patterns import ENDOFTEXT, NAMED_PATTERNS
from .ranks import tiktoken_lines
from .vocab import build, split_pattern

FILES = ("tokenizer.tiktoken", "tokenizer.toml", "tokenizer.json", "tokenizer_config.json", "training.json")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every option of ``python -m tokpack.tokenizer train``."""

    inputs: tuple[str, ...] = option((), "files, folders or globs of text, .jsonl, .parquet (and .gz/.zst of them)")
    out: str = option("tok", "the folder to write the tokenizer into")
    vocab_size: int = option(32768, "ids in all, special tokens included (nanochat's 2^15)")
    max_chars: float = option(2e9, "characters to train on, at most (the document crossing it is the last)")
    doc_cap: int = option(10_000, "characters of each document, at most")
    pattern: str = option("nanochat", f"the split pattern: {', '.join(NAMED_PATTERNS)}, or a regex")
    special: tuple[str, ...] = option((ENDOFTEXT,), "special tokens, the first ending (or starting) every "
                                      "document; 'nanochat' for nanochat's nine")
    jsonl_key: str = option("text", "text field of .jsonl records")
    text_column: str = option("text", "text column of .parquet files")
    errors: str = option("strict", "invalid UTF-8 handling", ("strict", "replace"))
    force: bool = option(False, "replace a tokenizer this command wrote in --out")
    quiet: bool = option(False, "no progress bar or summary")

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(map(str, self.inputs)))
        specials = NANOCHAT_TOKENS if self.special == ("nanochat",) else tuple(self.special)
        object.__setattr__(self, "special", specials)
        if not specials or len(set(specials)) < len(specials) or not all(specials):
            raise ValueError(f"--special {' '.join(self.special)}: give one or more distinct, non-empty tokens")
        if not 256 + len(specials) <= self.vocab_size <= 2**32:
            raise ValueError(f"--vocab-size {self.vocab_size} must lie in {256 + len(specials)}..{2**32}: 256 byte "
                             f"tokens and the {len(specials)} special tokens at least, 2^32 ids at most")
        if not self.max_chars >= 1:
            raise ValueError(f"--max-chars {self.max_chars:g} leaves nothing to train on; give at least 1")
        if self.doc_cap < 1:
            raise ValueError(f"--doc-cap {self.doc_cap} must be at least 1")

    def split_pattern(self) -> str:
        """The pattern's regex, checked (``vocab.split_pattern``), and splitting no special token into a
        pre-token of its own (text would then encode to it)."""
        pattern = split_pattern(self.pattern, "--pattern", f"one of {', '.join(NAMED_PATTERNS)}")
        compiled = regex.compile(pattern)
        for token in self.special:
            if compiled.fullmatch(token):
                raise ValueError(f"--special {token!r} is one pre-token of the pattern, so text would produce it too; "
                                 "give special tokens the pattern splits, like <|name|>")
        return pattern


def text_budget(files: list[Path], options: ReadOptions, max_chars: float, doc_cap: int,
                seen: dict[str, int]) -> Iterator[str]:
    """Each document cropped to ``doc_cap`` characters, until more than ``max_chars`` were given;
    ``seen`` counts documents and characters as they go. Only the cropped head of a document is
    read into memory."""
    for runs in documents(files, options):
        head, size = [], 0
        for run in runs:
            head.append(run[:doc_cap - size])
            size += len(head[-1])
            if size >= doc_cap:
                break
        text = "".join(head)
        seen["documents"] += 1
        seen["chars"] += len(text)
        seen["text"] += not text.isspace() and bool(text)
        yield text
        if seen["chars"] > max_chars:
            return


@contextlib.contextmanager
def read_ahead(items: Iterator[str], chunk: int = 1024, depth: int = 8) -> Iterator[Iterator[str]]:
    """``items`` read by a thread of its own, ``depth`` chunks ahead: the reading (decompressing,
    parsing, cropping) overlaps the trainer's counting, which releases the GIL. Memory: ``depth``
    chunks of ``chunk`` documents. An error in the reader comes out of the returned iterator."""
    chunks: queue.Queue[list[str] | BaseException | None] = queue.Queue(depth)
    stop = threading.Event()

    def put(item: list[str] | BaseException | None) -> None:
        while not stop.is_set():  # a consumer that stopped early takes nothing more
            try:
                return chunks.put(item, timeout=0.1)
            except queue.Full:
                continue

    def read() -> None:
        try:
            batch: list[str] = []
            for item in items:
                batch.append(item)
                if len(batch) == chunk:
                    put(batch)
                    batch = []
                if stop.is_set():
                    return
            put(batch)
            put(None)
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            put(exc)

    def consume() -> Iterator[str]:
        while (got := chunks.get()) is not None:
            if isinstance(got, BaseException):
                raise got
            yield from got

    reader = threading.Thread(target=read, name="tokpack-read-ahead", daemon=True)
    reader.start()
    try:
        yield consume()
    finally:
        stop.set()


def train(config: TrainConfig) -> dict[str, Any]:
    """Train and write the tokenizer; returns what ``training.json`` records."""
    try:
        import rustbpe
    except ImportError:
        raise ValueError('training a tokenizer needs rustbpe; pip install "tokpack[train]"') from None
    out = Path(config.out)
    _check_out(out, config.force)
    pattern = config.split_pattern()
    files = resolve_inputs(config.inputs)
    seen = {"documents": 0, "chars": 0, "text": 0}
    total = min(config.max_chars, sum(f.stat().st_size for f in files))
    with tqdm(total=int(total), unit="char", unit_scale=True, disable=config.quiet or None, desc="tokpack train",
              file=sys.stderr) as bar:
        def texts() -> Iterator[str]:
            for text in text_budget(files, _read_options(config), config.max_chars, config.doc_cap, seen):
                bar.update(len(text))
                yield text

        trainer = rustbpe.Tokenizer()
        with read_ahead(texts()) as ahead:
            trainer.train_from_iterator(ahead, config.vocab_size - len(config.special), pattern=pattern)
    if not seen["text"]:
        raise ValueError(f"the inputs ({', '.join(config.inputs)}) hold no text but whitespace, or none at all; "
                         "pass files with text")
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    if len(ranks) + len(config.special) < config.vocab_size:
        warnings.warn(f"the text holds too few distinct pairs for --vocab-size {config.vocab_size}: the trainer "
                      f"stopped at {len(ranks)} ranks, so the vocabulary has {len(ranks) + len(config.special)} ids",
                      stacklevel=2)
    specials = {token: len(ranks) + i for i, token in enumerate(config.special)}
    enc = TiktokenEncoder(build("tokenizer", pattern, ranks, specials, out), eot=config.special[0])
    record = {"inputs": list(config.inputs), "files": len(files), "documents": seen["documents"],
              "chars": seen["chars"], "max_chars": config.max_chars, "doc_cap": config.doc_cap,
              "budget_reached": seen["chars"] > config.max_chars, "pattern": pattern,
              "special_tokens": specials, "eot": config.special[0], "vocab_size": enc.n_vocab,
              "ranks_sha256": enc.vocab_sha256, "trainer": f"rustbpe {_version('rustbpe')}"}
    _publish(out, _files(enc, ranks, pattern, specials, config.special[0], record))
    return record


def _read_options(config: TrainConfig) -> ReadOptions:
    return ReadOptions(config.errors, None, config.jsonl_key, config.text_column)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _check_out(out: Path, force: bool) -> None:
    """An output folder that holds only what this command writes, or nothing; another tokenizer of
    ours is replaced only with ``force``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose another --out")
    if not out.is_dir():
        return
    names = {p.name for p in out.iterdir()}
    if names & set(FILES) and not force:
        raise ValueError(f"{out} already holds a tokenizer ({', '.join(sorted(names & set(FILES)))}); pass --force to "
                         "replace it or choose another --out")


def _files(enc: TiktokenEncoder, ranks: dict[bytes, int], pattern: str, specials: dict[str, int], eot: str,
           record: dict[str, Any]) -> dict[str, bytes]:
    """Every file's bytes: written only once all of them are made."""
    table = "\n".join(f"{_toml_string(name)} = {token_id}" for name, token_id in specials.items())
    spec = (f"# written by python -m tokpack.tokenizer train; see training.json\n"
            f"ranks = \"tokenizer.tiktoken\"\npattern = {_toml_string(pattern)}\neot = {_toml_string(eot)}\n"
            f"[special_tokens]\n{table}\n")
    return {"tokenizer.tiktoken": tiktoken_lines(ranks), "tokenizer.toml": spec.encode(),
            "tokenizer.json": hf_tokenizer_json(ranks, pattern, list(specials)).encode(),
            # split_special_tokens: transformers then reads special-token text in a document as
            # text, as prepare does, where by default it would become the special id.
            "tokenizer_config.json": json.dumps({"eos_token": eot, "split_special_tokens": True}, indent=1).encode(),
            "training.json": json.dumps(record, indent=1, ensure_ascii=False).encode()}


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, with non-ASCII kept as it is."""
    return json.dumps(text, ensure_ascii=False)


def _publish(out: Path, files: dict[str, bytes]) -> None:
    """Write every file into a new hidden folder beside ``out``, then rename that folder into place:
    the files appear together or not at all. A folder holding only an earlier tokenizer of this
    command is set aside first and removed after; one holding other files too gets the files
    renamed in one by one (all written before the first rename)."""
    staging = out.parent / f".{out.name}.tokpack-tmp"
    _remove_ours(staging)  # of a killed run of this command
    staging.mkdir(parents=True)
    try:
        for name, data in files.items():
            with open_new(staging / name) as f:
                f.write(data)
        if not out.exists():
            os.rename(staging, out)
        elif {p.name for p in out.iterdir()} <= set(FILES):
            old = out.parent / f".{out.name}.tokpack-old"
            _remove_ours(old)
            os.rename(out, old)
            os.rename(staging, out)
            _remove_ours(old)
        else:
            for name in files:
                os.replace(staging / name, out / name)
    finally:
        _remove_ours(staging)


def _remove_ours(folder: Path) -> None:
    """A folder of this command's files only, removed; anything else in it stays, and so does it."""
    if folder.is_dir() and not folder.is_symlink():
        for name in FILES:
            remove_own(folder / name)
        with contextlib.suppress(OSError):
            folder.rmdir()


def hf_tokenizer_json(ranks: dict[bytes, int], pattern: str, specials: list[str]) -> str:
    """The ranks as a Hugging Face byte-level BPE (``tokenizer.json``): the same split pattern,
    GPT-2's byte alphabet, and each token's merge, the two parts BPE reaches with the ranks below it;
    the special tokens get the ids after the ranks, in order."""
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ValueError('writing tokenizer.json needs the tokenizers library; pip install "tokpack[train]"') from None
    alphabet = {byte: char for char, byte in gpt2_byte_decoder().items()}
    text = {token: "".join(alphabet[b] for b in token) for token in ranks}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = _last_merge(ranks, token, rank)
            merges.append((text[left], text[right]))
    tok = Tokenizer(models.BPE({text[token]: rank for token, rank in ranks.items()}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok.to_str()


def _last_merge(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes]:
    """The two parts BPE joins last into ``token``: its bytes merged by every rank below ``rank``."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            found = ranks.get(parts[i] + parts[i + 1], rank)
            if found < best:
                best, at = found, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"rank {rank} of the trained vocabulary is not a merge of two tokens below it; the "
                         "trainer's output is not a BPE vocabulary")
    return parts[0], parts[1]


def summary(record: dict[str, Any], out: Path) -> str:
    lines = [f"tokpack.tokenizer train -> {out} ({record['vocab_size']:,} ids, ranks {record['ranks_sha256'][:12]}...)",
             f"  {record['documents']:,} documents, {record['chars']:,} characters"
             + (f" (the corpus is smaller than --max-chars {record['max_chars']:g}: trained on all of it)"
                if not record["budget_reached"] else "")]
    return "\n".join(lines)
