"""The tokenize stage: one unit of the input into its splits' files, each document where its hash,
the val rule and the guard's verdicts send it; text as pieces encoded on every core in input
order, conversations rendered with their loss mask (``chats``).

See docs/prepare.md.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ...corpus import Piece, documents, pieces, split_runs
from ...format import IDX_NAME, MEGATRON_NAME, SPLITS, UNIT_INDEX, UnitPart, UnitRecord
from ...format.megatron import write_index
from ...tokenizer import encode_in_order, safe_cut
from ..config import LLMC_SHARD_TOKENS
from ..guard.placement import Placement
from ..plan import Plan, Read
from ..plan.input_hash import InputTap, input_sha256
from ..plan.shares import Share
from .chats import chat_counts, write_chats
from .writers import DocumentBuffer, HashingWriter, ShardLayout, SplitWriter, split_writers


def layout(plan: Plan, split: str, unit: int) -> ShardLayout | None:
    """How a unit's tokens of a split are cut into files: llm.c shards, bare shards, or one flat
    file. Of several units, each names its shards after itself, so that they sort in input order."""
    config = plan.config
    tag = f"{unit:05d}_" if plan.units > 1 else ""
    at_documents = config.shard_boundary == "document" or (config.shard_boundary == "auto" and config.format == "llmc")
    if config.format == "llmc":
        # llm.c's names and numbering: NAME_val_000000.bin, NAME_train_000001.bin, ...; modded-nanogpt
        # reads two train shards at least.
        return ShardLayout(f"{plan.out.resolve().name}_{split}_{tag}", 0 if split == "val" or tag else 1,
                           config.shard_tokens or LLMC_SHARD_TOKENS, header=True, at_documents=at_documents,
                           min_shards=2 if split == "train" and plan.units == 1 else 1)
    if config.shard_tokens or plan.sharded:  # a sharded run's one unit too: its records name shards
        return ShardLayout(f"{split}_{tag}", 0, config.shard_tokens or None, header=False, at_documents=at_documents)
    return None


def run_unit(plan: Plan, unit: int, placement: Placement | None) -> UnitRecord:
    """Tokenize one unit of the input, each document where the guard's ``placement`` send it (a
    guarded run's): its record, its files still at their temporary names, each split's renames
    beside its part (the ledger publishes a sharded run's unit; the leader a flat run's files)."""
    share = plan.share(unit)
    passes = plan.reads(share)
    # Where the unit reads its input once, in order, and all of it whole files, the reader hashes
    # what it reads. Anything else is hashed in a thread of its own while the unit is tokenized,
    # where it fills the pipeline's idle start and end instead of coming before it.
    tap = InputTap(share) if len(passes) == 1 and not plan.single and InputTap.fits(share) else None
    stop = threading.Event()  # a failed unit does not wait for its input to be hashed
    with ThreadPoolExecutor(1, thread_name_prefix="tokpack-input-hash") as hashing:
        digest = tap.hexdigest if tap else hashing.submit(input_sha256, share, stop).result
        writers: dict[str, SplitWriter] = {}
        counts = chat_counts()
        try:
            writers = open_writers(plan, unit)
            if plan.chat is not None:
                write_chats(plan, [Read(only, tap.share if tap else entries) for only, entries in passes], writers,
                            counts, unit * len(passes), placement)
            for i, (only, entries) in enumerate(passes if plan.chat is None else ()):
                tokenize(_encoded(plan, tap.share if tap else entries), writers,
                         DocumentBuffer(plan.out, plan.config.seed), plan, sum(plan.sizes[f] for f, _, _ in entries),
                         only, unit * len(passes) + i, placement)
            plan.enc.flush()  # every check of the unit's ids passed before anything of it is published
            read = digest()
            if placement is not None:
                placement.check_input(unit, read)
            return finish(plan, unit, read, writers, placement, counts if plan.chat is not None else None)
        except BaseException:
            stop.set()
            for writer in writers.values():
                writer.discard()
            raise


def open_writers(plan: Plan, unit: int) -> dict[str, SplitWriter]:
    """A writer a split, to temporary names: tokens, tokpack's index, and Megatron's ``.bin``."""
    megatron = plan.config.format == "megatron"
    return split_writers(lambda s: SplitWriter(
        plan.out, s, plan.dtype, plan.eot, plan.enc.eot_token, layout(plan, s, unit),
        UNIT_INDEX.format(split=s, unit=unit) if plan.sharded else IDX_NAME.format(split=s),
        f"{MEGATRON_NAME.format(split=s)}.bin" if megatron else "", masked=plan.chat is not None))


def _documents(plan: Plan, entries: list[Share]) -> Iterator[Iterator[str]]:
    """The documents of ``entries``; a lone document as two, cut where val begins."""
    docs = documents(entries, plan.read)
    if not (plan.single and entries):
        return docs
    return iter(split_runs(next(docs), plan.holdout.lone_cut(plan.files[0], plan.read.errors)))


def _encoded(plan: Plan, entries: list[Share]) -> Iterator[tuple[Piece, np.ndarray]]:
    """Every piece of ``entries`` with its tokens, in order, in ``plan.encoding_threads()``."""
    enc = plan.enc
    workers, in_flight = plan.encoding_threads()

    def encode(batch: list[Piece]) -> list[np.ndarray]:
        # Ids already of the stored width (uint32 ones) are written as they come: a copy of each
        # was 4 bytes a token more of the memory traffic a CPU-bound run shares with its encoder.
        return [ids.astype(plan.dtype, copy=False) for ids in enc.encode_batch([piece.text for piece in batch])]

    cut = safe_cut if enc.can_cut else None
    piece_chars = plan.config.piece_chars  # the batches too: see Plan.encoding_threads
    return encode_in_order(pieces(_documents(plan, entries), piece_chars, cut), encode, workers, piece_chars, in_flight)


def finish(plan: Plan, unit: int, digest: str, writers: dict[str, SplitWriter], placement: Placement | None,
           chat: dict[str, Any] | None = None) -> UnitRecord:
    """The writers closed: the unit's record (with the digest of the guard's ``placement`` on its
    documents, and its ``chat`` counts), its files still temporary, each split's renames in its
    part."""
    record: UnitRecord = {"fingerprint": plan.fingerprint, "unit": unit, "input_sha256": digest,
                          "splits": {s: closed(plan, writer) for s, writer in writers.items()}}
    if placement is not None:
        record["verdicts"] = placement.placed[unit]
    if chat is not None:
        record["chat"] = chat
    return record


def closed(plan: Plan, writer: SplitWriter) -> UnitPart:
    """A split's part of the unit: its counts and files, its index, the renames left to make."""
    info = writer.close()
    idx = info.pop("idx")
    part: UnitPart = {"info": info, "idx": idx, "renames": writer.renames()}
    if plan.config.format == "megatron" and not plan.sharded:
        part["renames"] += megatron_index(plan.out, writer.split, writer.idx.tmp, info, plan.dtype)
    return part


def megatron_index(out: Path, split: str, starts: Path, info: dict[str, Any], dtype: np.dtype) -> list[tuple[str, str]]:
    """Megatron's own index of ``split`` beside tokpack's, from the document starts just written
    at ``starts``, at a temporary name: its entry goes into ``info``; the renames to make."""
    index = HashingWriter(out / f"{MEGATRON_NAME.format(split=split)}.idx")
    write_index(index.write, starts, info["documents"], info["tokens"], dtype)
    info["megatron_idx"] = index.close()
    return index.renames()


def tokenize(stream: Iterator[tuple[Piece, np.ndarray]], writers: dict[str, SplitWriter], buffer: DocumentBuffer,
             plan: Plan, total_bytes: int, only: str | None, read: int, placement: Placement | None) -> None:
    """Every piece into its split's writer: a lone document by its cut, others by their hash, or
    all into split ``only``; where the guard's ``placement`` move or drop a document (looked up by
    ``read``, the run's read this is, and the document's number), as they say."""
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, disable=plan.config.quiet or None,
               desc="tokpack.prepare", file=sys.stderr, smoothing=0.1)
    try:
        for count, (piece, tokens) in enumerate(stream):
            raw = piece.text.encode("utf-8", "surrogatepass")
            bar.update(len(raw))
            if count % 64 == 0 and not bar.disable:
                done = sum(w.tokens for w in writers.values()) + buffer.held + buffer.spilled
                bar.set_postfix_str(f"{done / (time.perf_counter() - plan.started):,.0f} tokens/s", refresh=False)
            if plan.single:
                writer = writers[SPLITS[piece.doc]]
                if not writer.documents:  # each split holds one part of the lone document
                    writer.start_document()
                writer.write(tokens)
                if piece.last:
                    writer.end_document()
                continue
            buffer.add(raw, tokens)
            if piece.last:
                split: str | None = only or ("val" if plan.holdout.is_val(buffer.hash.digest()) else "train")
                if placement is not None:
                    split = placement.split(read, piece.doc, split)
                if split is not None:
                    buffer.drain_into(writers[split])
                buffer.reset()
    finally:
        bar.close()
        buffer.discard()
