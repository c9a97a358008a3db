"""The output folder of a prepare run: locked, checked, and published whole or not at all.

    python -m tokpack.prepare corpus/ --out-dir data/web     # holds the folder's lock while it runs

A folder is never written by two runs at once, never overwrites token files another tool wrote
(without --force), and ends whole (verified, meta.json last) or without meta.json and without
this run's files. Its lock is opened without following a link and is never truncated unless it
holds a pid; nothing but tokpack's own regular files is ever removed.

See docs/prepare.md.
"""

from __future__ import annotations

import array
import dataclasses
import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...format import (BIN_NAME, IDX_NAME, INDEX_DTYPE, LOCK_NAME, MASK_DTYPE, MASK_NAME, MEGATRON_NAME, META_NAME, SPLITS,
                       Meta, UnitRecord, meta_files, read_meta)
from ...storage.local import LocalFolder, remove_leftovers, remove_own, write_json_atomic
from ...storage import InputFile
from ...verify import VerifyError, verify_folder
from .. import tokenize
from ..guard import Verdicts
from ..guard.placement import Placement
from ..plan import Join, Plan
from ..plan.input_hash import input_sha256
from ..plan.mixture import Mixture
from ..plan.shares import share_of
from ..tokenize.writers import HashingWriter, SplitWriter, remove_temporaries, split_writers
from . import ledger
from .meta import meta_of
from .sink import Sink

# Files other tools write into a data folder; never overwritten without --force.
TOKEN_FILE = re.compile(r"(train|val)\.(bin|idx)|(?:.+_)?(train|val|test)(?:_\d+)+\.bin")


class OutputFolder:
    """The output folder of one run, as a context manager.

    Created with any missing parents, and locked for the whole run (an advisory ``flock`` on
    ``.tokpack.lock``, released by the kernel if the run is killed, so a stale lock never
    blocks); a second run into it fails at once naming the holder. What a run killed after its
    meta.json left behind, and temporary files that killed runs left, are removed. If the run
    fails, every folder it created is removed again.
    """

    def __init__(self, path: Path, clean: bool = True):
        self.path, self.clean = path, clean  # clean: remove every run's temporaries (none may be writing)
        self.created: list[Path] = []
        self._lock: BinaryIO | None = None

    def __enter__(self) -> OutputFolder:
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot create output folder {self.path} ({exc.strerror}); "
                             "choose a writable --out-dir") from None
        self.created = missing  # deepest first
        remove_leftovers(self.path)  # of a run killed after its meta.json: they would hold the folder back
        try:
            self._acquire()
        except BaseException:
            self._remove_created()
            raise
        if self.clean:
            remove_temporaries(self.path, every_run=True)
        return self

    def _acquire(self) -> None:
        lock_path = self.path / LOCK_NAME
        while True:
            f = self._open_lock(lock_path)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read(32).decode("ascii", "replace").strip() or "unknown"
                f.close()
                raise ValueError(f"{self.path} is being written by another tokpack.prepare (pid {holder}); "
                                 "wait for it to finish or choose another --out-dir") from None
            # A run that finished between our open and our lock unlinked the file we hold.
            if os.path.exists(lock_path) and os.fstat(f.fileno()).st_ino == os.stat(lock_path).st_ino:
                break
            f.close()
        f.seek(0)
        held = f.read(64)
        if held and not (len(held) < 20 and held.strip().isdigit()):
            f.close()
            raise ValueError(f"{lock_path} holds something other than a run's pid, so tokpack did not write it; "
                             "move it away and rerun")
        f.seek(0)
        f.truncate()  # a pid that a killed run left: the lock file is tokpack's own
        f.write(str(os.getpid()).encode())
        f.flush()
        self._lock = f

    @staticmethod
    def _open_lock(lock_path: Path) -> BinaryIO:
        """The lock file, opened without following a link and without truncating it."""
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"{lock_path} is a link; tokpack opens nothing for writing through a link; "
                                 "remove the link and rerun") from None
            raise ValueError(f"output folder {lock_path.parent} is not writable ({exc.strerror}); "
                             "choose a writable --out-dir") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            raise ValueError(f"{lock_path} is not a plain file of its own (a hard link or a special file); "
                             "move it away and rerun")
        return os.fdopen(fd, "r+b")

    def _remove_created(self) -> None:
        for folder in self.created:
            try:
                folder.rmdir()  # only if empty: a failed run leaves nothing behind, not its folders
            except OSError:
                break

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is not None:
            remove_temporaries(self.path)  # even those of writers a signal cut short in their making
        if self._lock is not None:
            remove_own(self.path / LOCK_NAME)
            self._lock.close()  # closing releases the lock
            self._lock = None
        if kind is not None:
            self._remove_created()


def check_out_dir(out: Path, force: bool, files: Sequence[InputFile], folders: Sequence[Path],
                  ours: AbstractSet[str] = frozenset()) -> None:
    """Refuse an output folder that would read its own output, overwrite an input, or overwrite a
    prepared corpus or another tool's token files without ``force``; ``ours`` are token files an
    unfinished earlier run of tokpack recorded (kept or replaced, never foreign)."""
    target = out.resolve()
    for folder in map(Path.resolve, folders):
        if target == folder or folder in target.parents:
            raise ValueError(f"--out-dir {out} lies inside the corpus folder {folder}, so a rerun would read "
                             "its own output; choose an --out-dir outside the input folders")
    for f in files:  # the name first: resolving every input costs a system call a path component
        local = f.local_path()
        if local is not None and (TOKEN_FILE.fullmatch(f.name) or f.name == META_NAME) and local.resolve().parent == target:
            raise ValueError(f"input {f} would be overwritten by the output; choose another --out-dir")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out-dir {out} is a file, not a folder; choose another --out-dir")
    if force or not out.is_dir():
        return
    if (out / META_NAME).exists():
        raise ValueError(f"{out} already holds a prepared corpus; pass --force to overwrite it or choose another --out-dir")
    theirs = sorted(p.name for p in out.iterdir() if TOKEN_FILE.fullmatch(p.name) and p.name not in ours)
    if theirs:
        shown = ", ".join(theirs[:4]) + (f" and {len(theirs) - 4} more" if len(theirs) > 4 else "")
        raise ValueError(f"{out} holds token files that tokpack did not write ({shown}); pass --force to "
                         "overwrite them or choose another --out-dir")


def publish(out: Path, meta: Mapping[str, Any], renames: list[tuple[str, str]]) -> None:
    """Rename the finished files (temporary, final) into place, meta.json last, and verify.

    If anything fails from here on, the new files go too: a folder is whole, or has no meta.json
    and none of this run's token files.
    """
    new = {f["file"] for f in meta_files(meta["splits"])}
    stale = _listed_files(out) - new
    # Old meta.json goes first: from here on, until the new one lands, the folder is incomplete.
    remove_own(out / META_NAME)
    try:
        for name in stale:  # an earlier run's extra shards must not be read with this run's
            remove_own(out / name)
        for tmp, final in renames:
            os.replace(tmp, final)
        write_json_atomic(out / META_NAME, meta)
        try:
            verify_folder(out)
        except VerifyError as exc:
            raise ValueError(f"the written folder {out} does not verify ({exc}); check the disk and rerun") from None
    except BaseException:
        remove_own(out / META_NAME)
        for name in new:
            remove_own(out / name)
        raise


def retire(out: Path, keep: set[str]) -> None:
    """Before a run publishes files one by one: meta.json goes first (the folder is incomplete from
    then on), then the token files it listed, but ``keep``, so none is read with the new ones."""
    listed = _listed_files(out)
    remove_own(out / META_NAME)
    for name in listed - keep:
        remove_own(out / name)


def _listed_files(out: Path) -> set[str]:
    """The token files an earlier meta.json in ``out`` lists (none if it is absent or unreadable)."""
    try:
        splits = read_meta(out)["splits"]
    except (OSError, ValueError):
        return set()
    return {f["file"] for f in meta_files(splits)}


def finish(plan: Plan, parts: list[UnitRecord], verdicts: Verdicts | None, sink: Sink,
           whole: Callable[[], str] | None = None) -> Meta:
    """The run's one finish: every unit's record (in unit order) joined as the plan says
    (``plan.join``), meta.json made from them and the guard's ``verdicts``, and the folder
    published into ``sink``, meta.json last. ``whole``: the whole input's sha256 where the caller
    took it already (a join into one process's files records it), else it is read now.

    A flat run's one part leaves its files (index included) temporary for the renames here.
    Sharded units have published their shards already and kept their document indexes as hidden
    parts: these are merged into one index per split (offsets shifted by the tokens of the units
    before), and removed, with the units' records, once meta.json stands."""
    if plan.join in (Join.FLATTEN, Join.MIX):
        digest = whole() if whole is not None else parts[0]["input_sha256"] if len(parts) == 1 else \
            input_sha256(share_of(plan.files, plan.sizes, 0, 1))
        parts = [mixed(plan, parts, digest) if plan.join is Join.MIX else
                 flattened(plan.out, parts, digest, plan.dtype, plan.config.format == "megatron")]
    meta = meta_of(plan, parts, verdicts)
    renames = [pair for part in parts for split in SPLITS for pair in part["splits"][split].get("renames", [])]
    if plan.join is Join.MERGE:
        renames += merged_indexes(plan.out, meta, parts)
    else:
        for split in SPLITS:
            meta["splits"][split]["idx"] = parts[0]["splits"][split]["idx"]
    sink.publish(plan, meta, renames)
    if plan.join in (Join.FLATTEN, Join.MIX):
        ledger.drop_own(plan.out, plan.fingerprint)  # the units' files, joined now
    ledger.clear(plan.out)  # the units' records, index parts and signatures: the folder stands
    return meta


class LocalSink:
    """The run's folder itself: a sharded run's units are published as they finish, and kept by
    a rerun; a flat run's one unit waits for the leader to publish it."""

    apart = False

    def kept(self, plan: Plan, unit: int, placement: Placement | None) -> UnitRecord | None:
        return ledger.load(plan, unit, placement) if plan.sharded else None

    def keep(self, plan: Plan, record: UnitRecord) -> UnitRecord:
        return ledger.keep(plan, record) if plan.sharded else record

    def done(self) -> None:
        pass

    def numbered(self, plan: Plan) -> set[int]:
        return ledger.numbered(plan.out)

    def recorded(self, plan: Plan, placement: Placement | None) -> tuple[list[UnitRecord], list[int]]:
        # Its tasks wrote or checked each unit just now, under the folder's lock: named and sized only.
        return ledger.every([ledger.load(plan, unit, placement, proven=True) for unit in range(plan.units)])

    def share(self, plan: Plan, names: list[str]) -> None:
        pass  # the tasks read this very folder

    def publish(self, plan: Plan, meta: Mapping[str, Any], renames: list[tuple[str, str]]) -> None:
        publish(plan.out, meta, renames)


def merged_indexes(out: Path, meta: Mapping[str, Any], parts: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each split's document index from the units' hidden parts (offsets shifted by the tokens of
    the units before), written to a temporary name and entered in ``meta``; the renames to make."""
    renames = []
    for split in SPLITS:
        merged = _merged_index(out, split, parts)
        meta["splits"][split]["idx"] = merged.close()
        renames += merged.renames()
    return renames


def _merged_index(out: Path, split: str, parts: Sequence[Mapping[str, Any]]) -> HashingWriter:
    merged = HashingWriter(out / IDX_NAME.format(split=split))
    offset = 0
    for part in parts:
        entry = part["splits"][split]
        merged.write(np.fromfile(out / entry["idx"]["file"], dtype=INDEX_DTYPE) + np.uint64(offset))
        offset += entry["info"]["tokens"]
    return merged


def flattened(out: Path, parts: Sequence[Mapping[str, Any]], digest: str, dtype: np.dtype, megatron: bool) -> UnitRecord:
    """The one part a one-process flat run writes, from the recorded units of a run of several
    processes: each split's unit shards, masks and index parts joined in input order into
    ``SPLIT.bin`` (Megatron's ``SPLIT_text_document.bin`` and ``.idx`` with ``megatron``),
    ``SPLIT.mask`` and ``SPLIT.idx``, at temporary names, with the renames to make; ``digest``, the
    whole input's sha256, as one process records it. O(corpus) read and written once, O(1) memory."""
    folder = LocalFolder(out)  # the records named plain files of a unit's pattern; links are refused
    splits: dict[str, Any] = {}
    for split in SPLITS:
        held = [part["splits"][split]["info"] for part in parts]
        bin_name = f"{MEGATRON_NAME.format(split=split)}.bin" if megatron else BIN_NAME.format(split=split)
        info: dict[str, Any] = {"tokens": sum(i["tokens"] for i in held), "documents": sum(i["documents"] for i in held)}
        writers = {"bin": _joined(folder, out / bin_name, [s for i in held for s in i["shards"]])}
        if "mask_shards" in held[0]:
            writers["mask"] = _joined(folder, out / MASK_NAME.format(split=split),
                                      [m for i in held for m in i["mask_shards"]])
            info["supervised"] = sum(i["supervised"] for i in held)
        index = _merged_index(out, split, parts)
        info.update((key, writer.close()) for key, writer in writers.items())
        idx = index.close()
        renames = [pair for writer in (*writers.values(), index) for pair in writer.renames()]
        if megatron:  # as one process writes it, from the starts just joined
            renames += tokenize.megatron_index(out, split, index.tmp, info, dtype)
        splits[split] = {"info": info, "idx": idx, "renames": renames}
    part: UnitRecord = {"input_sha256": digest, "splits": splits}
    if "chat" in parts[0]:
        part["chat"] = {key: sum(p["chat"][key] for p in parts) for key in parts[0]["chat"]}
    return part


def mixed(plan: Plan, parts: Sequence[Mapping[str, Any]], digest: str) -> UnitRecord:
    """The one part a one-process mixture writes, from the recorded units of a ``--processes`` run
    (each unit's conversations in input order, their inputs in its record's ``sources``): the
    units' conversations staged in input order, then copied out in mixture order into the flat
    files, at temporary names, with the renames to make; ``digest``, the whole input's sha256.
    O(corpus) read and written twice, O(conversations) memory for the order: staged, because the
    mixture order jumps across the units, and mapping every unit's files at once would hold two
    file descriptors a unit."""
    flat = dataclasses.replace(plan, sharded=False, units=1)  # the files one process writes
    folder = LocalFolder(plan.out)  # the records named plain files of a unit's pattern; links are refused
    staged, writers = staging_writers(plan.out, plan.dtype, plan.enc.eot_token), {}
    try:
        kinds = {split: array.array("I") for split in staged}
        for part in parts:  # in input order, as one process stages them
            for split, writer in staged.items():
                for kind, count in part["chat"]["sources"][split]:  # checked with the record
                    kinds[split].extend(array.array("I", [kind]) * count)
                _stage(folder, part["splits"][split], writer, plan.dtype)
        writers = tokenize.open_writers(flat, 0)
        assert plan.mixture is not None
        report = mix(plan.mixture, plan.dtype, staged, kinds, writers)
        splits = {split: tokenize.closed(flat, writer) for split, writer in writers.items()}
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    finally:
        for writer in staged.values():
            writer.discard()
    chat = {key: sum(p["chat"][key] for p in parts) for key in parts[0]["chat"] if key != "sources"}
    return {"input_sha256": digest, "splits": splits, "chat": {**chat, "mixture": report}}


def _stage(folder: LocalFolder, part: dict[str, Any], writer: SplitWriter, dtype: np.dtype) -> None:
    """A unit's conversations of one split (its shards, masks and index part, mapped) into ``writer``."""
    starts = np.frombuffer(folder.read(part["idx"]["file"]), dtype="<u8").astype(np.int64)
    tokens = _mapped(folder, part["info"]["shards"], dtype)
    mask = _mapped(folder, part["info"]["mask_shards"], MASK_DTYPE)
    writer.write_documents(tokens, mask, np.append(starts, len(tokens)))


def _mapped(folder: LocalFolder, entries: list[dict[str, Any]], dtype: Any) -> np.ndarray:
    """The files ``entries`` name, one after another: mapped where there is one (a unit's split
    of a flat run is one file), never a link (the folder opens none)."""
    arrays = []
    for entry in entries:
        with folder.open(entry["file"]) as f:
            arrays.append(np.memmap(f, dtype=dtype, mode="r") if entry["bytes"] else np.zeros(0, dtype))
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays or [np.zeros(0, dtype)])


def _joined(folder: LocalFolder, path: Path, entries: list[dict[str, Any]]) -> HashingWriter:
    """The files ``entries`` name, one after another, into a new file at ``path``'s temporary name."""
    joined = HashingWriter(path)
    try:
        for entry in entries:
            with folder.open(entry["file"]) as f:
                while block := f.read(1 << 22):
                    joined.write(block)
    except BaseException:
        joined.discard()
        raise
    return joined


UNMIXED = "{split}.unmixed"  # the name the rendered conversations are held at, temporary


def staging_writers(out: Path, dtype: np.dtype, eot_token: int) -> dict[str, SplitWriter]:
    """A writer a split in ``out`` for the conversations before they are mixed, at temporary names
    only."""
    def staged(split: str) -> SplitWriter:
        held = UNMIXED.format(split=split)
        return SplitWriter(out, split, dtype, "none", eot_token, None, f"{held}.idx", f"{held}.bin", masked=True,
                           mask_name=f"{held}.mask")

    return split_writers(staged)


def _read(writer: SplitWriter, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed staging writer's tokens and mask (mapped) and its conversations' starts and ends."""
    if not writer.tokens:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, dtype), np.zeros(0, MASK_DTYPE), np.stack([empty, empty])
    # A staging writer writes one file of tokens and one of masks (``staging_writers``).
    assert isinstance(writer.bin, HashingWriter) and isinstance(writer.mask, HashingWriter)
    tokens = np.memmap(writer.bin.tmp, dtype=dtype, mode="r")
    mask = np.memmap(writer.mask.tmp, dtype=MASK_DTYPE, mode="r")
    starts = np.fromfile(writer.idx.tmp, dtype="<u8").astype(np.int64)
    return tokens, mask, np.stack([starts, np.append(starts[1:], len(tokens))])


def mix(mixture: Mixture, dtype: np.dtype, staged: dict[str, SplitWriter], kinds: dict[str, array.array],
        writers: dict[str, SplitWriter]) -> dict[str, Any]:
    """Each split's staged conversations (tokens of ``dtype``) into its writer in mixture order;
    meta.json's report: each input's epochs and, split by split, its conversations, tokens and
    supervised tokens written, and its share of the supervised tokens."""
    report: dict[str, Any] = {"seed": mixture.seed, "inputs": [{"input": n, "epochs": e} for n, e in
                                                                 zip(mixture.names, mixture.epochs)]}
    for split, held in staged.items():
        held.close()
        tokens, mask, (starts, ends) = _read(held, dtype)
        source = np.frombuffer(kinds[split], dtype=np.uint32) if len(kinds[split]) else np.zeros(0, np.uint32)
        tally = np.zeros((len(mixture.names), 3), dtype=np.int64)  # conversations, tokens, supervised
        out = writers[split]
        for doc in mixture.order(source):
            a, b = starts[doc], ends[doc]
            out.start_document(int(b - a))
            out.write(tokens[a:b], mask[a:b])
            out.end_document()
            tally[source[doc]] += (1, b - a, np.count_nonzero(mask[a:b]))
        total = max(1, int(tally[:, 2].sum()))
        for entry, (conversations, count, supervised) in zip(report["inputs"], tally.tolist()):
            entry[split] = {"conversations": conversations, "tokens": count, "supervised": supervised,
                            "supervised_share": round(supervised / total, 6)}
    return report
