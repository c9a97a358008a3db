"""A prepare run's one plan: every decision made once (``make_plan``), read by every stage and by
every process of the run.

The input is cut into units, consecutive byte ranges in input order, so the units' outputs,
concatenated, are the one process's, byte for byte, for any number of units and processes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...chat import ChatRenderer, Nanochat, Renderer
from ...cli import error_line
from ...corpus import ReadOptions, documents, is_jsonl, is_parquet, is_records, is_single_document
from ...dedup.minhash import WORD_RULE
from ...dedup.ngrams import NgramIndex
from ...format import InputsInfo
from ...inputs import resolve_groups
from ...options import default_of
from ...storage import InputFile, is_url, redact
from ...tokenizer import Encoder, load_encoding, token_dtype
from ..config import GuardOptions, PrepareConfig
from ..config import launch
from . import holdout
from .holdout import Holdout
from .mixture import Mixture
from .shares import Share, share_of


class Join(enum.Enum):
    """How the run's units become its folder at the finish: ``AS_IS``, one unit's flat files
    renamed into place; ``MERGE``, the units' shards kept and their indexes merged; ``FLATTEN``,
    the units' files joined into one process's flat files (``--processes``); ``MIX``, the units'
    conversations copied out in mixture order (``--mixture``)."""

    AS_IS = "as is"
    MERGE = "merge"
    FLATTEN = "flatten"
    MIX = "mix"


class GuardRules(NamedTuple):
    """What the guard stage is given (``--near-split``, ``--dedup``, ``--decontaminate``): its
    options, the evaluation sets' n-grams (None without ``--decontaminate``) and their names as
    reports name them, each input file's name and the input it was given in, and the count of
    inputs given (meta.json counts dropped documents by input)."""

    options: GuardOptions
    ngrams: NgramIndex | None
    sets: list[str]
    files: list[str]
    groups: list[int]
    inputs: int


class Read(NamedTuple):
    """One read of a unit's input: its ``shares`` in input order, every document into ``split``,
    or (None) each where its hash sends it. The guard signs, and the tokenize stage writes, a
    unit's documents read by the same list, each numbered by its place in its read."""

    split: str | None
    shares: list[Share]


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan:
    """A run's decisions, made once in ``prepare()`` and handed to every stage."""

    config: PrepareConfig
    enc: Encoder  # on the backend the run encodes with
    dtype: np.dtype
    eot: str  # append, prepend or none: "auto" resolved
    single: bool  # one document, cut by position rather than split by hash
    files: tuple[InputFile, ...]
    sizes: dict[InputFile, int]
    inputs: InputsInfo  # meta.json's description of the inputs
    out: Path
    sharded: bool  # units publish their shards as they finish, with records a rerun keeps
    join: Join  # how the units become the folder at the finish
    units: int
    fingerprint: str  # of the inputs and every option that changes the output
    workers: int
    started: float
    holdout: Holdout  # the val rule
    read: ReadOptions
    chat: ChatRenderer | None = None  # how conversations are rendered (--chat), or None for text
    mixture: Mixture | None = None  # the order conversations are written in (--mixture), or None: input order
    guard: GuardRules | None = None  # documents moved or dropped (--near-split, --dedup, --decontaminate)

    def encoding_threads(self) -> tuple[int, int]:
        """(threads, batches in flight) of the encoding pipeline, batches of ``piece_chars``. An
        encoder that threads itself gets batches from two threads: while one batch's last documents
        keep a few of its threads busy, the other batch fills the rest (from one thread, that tail
        left cores idle: tokenizers' path ran 8 % slower); larger batches held more text at no
        gain. Any other runs in ``workers`` threads, two batches in flight each."""
        return (2, 2) if self.enc.parallel else (self.workers, 2 * self.workers)

    def share(self, unit: int) -> list[Share]:
        """Unit ``unit``'s share of the input."""
        return share_of(self.files, self.sizes, unit, self.units)

    def reads(self, share: list[Share]) -> list[Read]:
        """The reads of a unit's ``share``: all its input at once, or, by file, the val inputs'
        documents into val and the others into train (``--val-inputs``), each in input order.
        Every unit has as many: the run's number of read ``i`` of unit ``u`` is ``u * len + i``."""
        if self.holdout.kind != "inputs":
            return [Read(None, share)]
        val = self.holdout.files
        return [Read("val", [e for e in share if e.file in val]), Read("train", [e for e in share if e.file not in val])]


def fingerprint(settings: dict[str, Any]) -> str:
    """A digest of ``settings``: a unit's record, and its signatures, are this run's where it matches."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()




SAMPLE_CORPUS = Path("data/sample-corpus")


def write_sample_corpus(folder: Path = SAMPLE_CORPUS) -> Path:
    """The built-in sample: the Python documentation topics, one file per topic."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(topics.items()):
        path = folder / f"{name}.txt"
        if not path.is_file() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
    return folder


def _describe_inputs(groups: list[tuple[str, list[InputFile]]], sizes: dict[InputFile, int]) -> InputsInfo:
    """Each input as given, with its file count and bytes, and a hash of the whole file listing.

    Per-file entries would make meta.json grow with the number of files; the hash still pins them.
    """
    listing = hashlib.sha256()
    for _, found in groups:
        for f in found:
            listing.update(f"{f}\t{sizes[f]}\n".encode("utf-8", "surrogateescape"))
    return {
        "given": [{"path": redact(raw) if is_url(raw) else raw, "files": len(found), "bytes": sum(sizes[f] for f in found)}
                  for raw, found in groups],
        "files": len(sizes),
        "bytes": sum(sizes.values()),
        "listing_sha256": listing.hexdigest(),
    }


def make_plan(config: PrepareConfig, world: int, started: float, independent: bool = False) -> Plan:
    """Every decision of the run, once: encoding, dtype, inputs, end of text, output folder, units.

    The input is cut into units in input order, so the units' outputs, concatenated, are the one
    process's, byte for byte, for any number of units and ranks. A flat run is one unit written
    straight to train.bin / val.bin. A sharded run (``--shard-tokens``, ``--format llmc`` or
    torchrun) publishes each unit's shards as it finishes, with a record, so a rerun keeps them.
    """
    groups, val_files = _input_groups(config)
    files = tuple(f for _, found in groups for f in found)
    single = not config.val_inputs and is_single_document(files, config.doc_sep)
    if single and config.guard.near_split:  # one document has no near-copy: its run is as unguarded
        config = dataclasses.replace(config, guard=dataclasses.replace(config.guard, near_split=False))
    if single and config.val_tokens:
        raise ValueError(f"--val-tokens chooses whole documents, but {files[0]} is one document; "
                         "use --val-fraction, or --doc-sep to cut it into documents")
    _warn_unused(config, files)
    # llm.c's convention is an <|endoftext|> before every document; a conversation brings its own BOS.
    eot = config.eot if config.eot != "auto" else ("none" if single or config.chat != "none" else
                                                   "prepend" if config.format == "llmc" else "append")
    # Documents led by the token take a Hugging Face config's BOS token, where it names one.
    enc = load_encoding(config.encoding, config.eot_token, config.special_text, eot == "prepend")
    dtype = token_dtype(enc, config.dtype)
    out = Path(config.out_dir or ("data/sample" if not config.inputs else f"data/{files[0].name.split('.')[0]}"))
    sizes = {p: p.size() for p in files}
    total = sum(sizes.values())
    if world > max(total, 1):  # a unit is a byte range of the input: more than one a byte leaves some empty
        what = (f"--processes {world:,}" if config.launch.processes > 1 else f"--tasks {world:,}" if independent else
                f"{world:,} processes")
        raise ValueError(f"{what} is more than the {total:,} bytes of input, so some would have nothing to do; "
                         f"give at most {max(total, 1):,}")
    if config.mixture and (not config.one_file_a_split() or (independent and not config.launch.starts_tasks)
                           or world > 1 and not config.launch.starts_tasks):
        raise ValueError("--mixture writes each split in one order, into one file: drop --tasks, --shard-tokens, "
                         "--format llmc or torchrun (--processes N writes it as one process does)")
    # A mixture's units, and --processes' ones, are joined into one process's files at the finish
    # (a mixture's in mixture order), Megatron's pair too.
    sharded = not config.one_file_a_split() or world > 1 or independent or bool(config.mixture)
    join = (Join.MIX if config.mixture else Join.FLATTEN if config.one_file_a_split() and sharded
            and config.launch.starts_tasks else Join.MERGE if sharded else Join.AS_IS)
    if config.format == "megatron" and join is Join.MERGE:
        raise ValueError(f"--format megatron writes one .bin/.idx pair a split, which one process writes; run it "
                         f"without torchrun (this is {world} processes), or use --format flat or llmc")
    count = max(world, math.ceil(total / (config.unit_mb * 1e6))) if sharded else 1
    inputs = _describe_inputs(groups, sizes)
    enc, chat = _renderer(config, enc)
    # A rendering's own facts (a template's sha256, whatever file it came from) decide a unit's bytes too.
    digest = fingerprint({"options": config.output_options(), "units": count, "eot": eot,
                          "inputs": inputs["listing_sha256"], "val_files": sorted(map(str, val_files)),
                          **({"chat": chat.describe()} if chat is not None else {})})
    plan = Plan(config=config, enc=enc.with_backend(config.backend, config.check_fraction, config.seed),
                dtype=dtype, eot=eot, single=single, files=files, sizes=sizes, inputs=inputs, out=out,
                sharded=sharded, join=join, units=count, fingerprint=digest, workers=_workers(config.workers),
                started=started, holdout=_holdout(config, files, val_files, enc, eot), read=config.read_options(),
                chat=chat, mixture=Mixture.of(config.mixture, groups, config.seed))
    return _guarded(plan, groups) if config.guard.active else plan


def _guarded(plan: Plan, groups: list[tuple[str, list[InputFile]]]) -> Plan:
    """The plan with its guard's rules: the evaluation sets' n-grams read now; the units' documents
    are signed and matched once the folder is ready, by the tasks that run them."""
    options = plan.config.guard
    if plan.single and options.decontaminate:
        raise ValueError(f"--decontaminate removes train documents, and {plan.files[0]} is one document; pass "
                         "--doc-sep to cut it into documents, or drop --decontaminate")
    if plan.single:  # one document has no copy: its tail split stands as it is
        return plan
    index = evaluation_index(options, plan.config.errors, plan.config.storage_options) if options.decontaminate else None
    # The evaluation sets' contents, and the rule that reads words, decide which documents are
    # dropped: a rerun with other sets, or by another rule, redoes the units.
    digest = fingerprint({"run": plan.fingerprint, "evaluation_sets": index.digest() if index else None,
                          "words": WORD_RULE})
    group = {f: i for i, (_, found) in enumerate(groups) for f in found}
    rules = GuardRules(options, index, list(map(redact, options.decontaminate)), [redact(str(f)) for f in plan.files],
                       [group[f] for f in plan.files], len(groups))
    return dataclasses.replace(plan, guard=rules, fingerprint=digest)


def evaluation_index(options: GuardOptions, errors: str, storage_options: dict[str, Any] | None) -> NgramIndex:
    """The n-grams of ``--decontaminate``'s files: a text file's lines, a record's text field."""
    sets = []
    for given in options.decontaminate:
        read = ReadOptions(errors, "\n", options.decontaminate_key, options.decontaminate_key)
        try:
            found = [f for _, files in resolve_groups([given], storage_options) for f in files]
            texts = ["".join(runs) for runs in documents(found, read)]
        except (ValueError, OSError) as exc:  # what names an input names an evaluation set here
            said = error_line(exc).replace("--jsonl-key", "--decontaminate-key").replace("--text-column",
                                                                                         "--decontaminate-key")
            raise ValueError(f"--decontaminate {given}: {said}") from None
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise ValueError(f"--decontaminate {given} holds no text; pass an evaluation set with examples in it")
        sets.append(texts)
    return NgramIndex.of(enumerate(sets), options.decontaminate_ngram, options.decontaminate_min_words)


def processes_plan(config: PrepareConfig, started: float) -> Plan:
    """The plan of a ``--processes`` run, the same in each of its processes. Its units are one
    process's where one process writes shards (so the folder is that process's, and either
    resumes the other); a split written as one file gets one a process at least, joined at the end."""
    world = config.launch.processes if config.one_file_a_split() else 1
    plan = make_plan(config, world, started, independent=True)
    if plan.units < config.launch.processes:
        share = plan.inputs["bytes"] / 1e6 / config.launch.processes
        warnings.warn(f"the run is {plan.units} units of --unit-mb {config.unit_mb:g}, so only {plan.units} of "
                      f"--processes {config.launch.processes} have work; pass --unit-mb {share:.3g} or less to give every "
                      "process one (the shards then follow the units)", stacklevel=3)
    return plan


def _renderer(config: PrepareConfig, enc: Encoder) -> tuple[Encoder, ChatRenderer | None]:
    """How conversations are rendered (``--chat``), or None for text; and the encoder they are
    encoded with: a template's control tokens (the tokenizer's added tokens its text writes, as
    transformers infers them: Qwen's ``<think>``) read as special, so a message's stay text."""
    if config.chat == Renderer.NANOCHAT:
        return enc, Nanochat(enc.specials, config.max_tokens)
    if config.chat != Renderer.TEMPLATE:
        return enc, None
    from ...chat.template import Template
    from ...tokenizer.templates import read_template

    if config.chat_template is not None:
        source, origin = read_template(Path(config.chat_template)), config.chat_template
    elif (own := enc.chat_template()) is not None:
        source, origin = own
    else:
        raise ValueError(f"--chat template needs a chat template, and {config.encoding} has none beside it (no "
                         "chat_template.jinja, no chat_template in tokenizer_config.json); pass --chat-template FILE")
    if config.special_text == "ordinary":
        enc = enc.with_controls(name for name in enc.added if name in source)
    return enc, Template(source, origin, enc, config.max_tokens, enc.template_variables(), config.special_text)


def _input_groups(config: PrepareConfig) -> tuple[list[tuple[str, list[InputFile]]], list[InputFile]]:
    """The inputs as given with the files each names, val inputs among them; and the val files."""
    options = config.storage_options
    groups = resolve_groups(config.inputs or [str(write_sample_corpus())], options)
    if not config.val_inputs:
        return groups, []
    val_files = [f for _, found in resolve_groups(config.val_inputs, options) for f in found]
    # A file is one file however it is reached: among the inputs, a val file goes by its val path.
    val_ids = {f.identity(): f for f in val_files}
    respelled = [(f, val_ids[f.identity()]) for _, found in groups for f in found
                 if f.identity() in val_ids and val_ids[f.identity()] != f]
    if respelled:
        swap = dict(respelled)
        groups = [(raw, [swap.get(f, f) for f in found]) for raw, found in groups]
        warnings.warn(f"{len(respelled)} input file(s) are --val-inputs reached by another path ({respelled[0][0]} is "
                      f"{respelled[0][1]}); they go to val only", stacklevel=4)
    listed = {f.identity() for _, found in groups for f in found}
    groups += [(str(f), [f]) for f in val_files if f.identity() not in listed]  # val inputs not among the inputs
    if all(f in set(val_files) for _, found in groups for f in found):
        raise ValueError(f"--val-inputs names every input ({len(val_files)} files), which leaves train empty; "
                         "name only the val files")
    return groups, val_files


def _warn_unused(config: PrepareConfig, files: tuple[InputFile, ...]) -> None:
    """A warning for each reading option no input uses."""
    if config.doc_sep and all(map(is_records, files)):
        warnings.warn("--doc-sep has no effect: every input is .jsonl or .parquet, whose records are the documents",
                      stacklevel=4)
    for option, of_kind, kind in (("jsonl_key", is_jsonl, ".jsonl"), ("text_column", is_parquet, ".parquet")):
        value = getattr(config, option)
        if value != default_of(PrepareConfig, option) and not any(map(of_kind, files)):
            warnings.warn(f"--{option.replace('_', '-')} {value!r} has no effect: no input is {kind}", stacklevel=4)


def _workers(asked: int) -> int:
    cores = launch.cores()
    if asked > cores:
        # Each worker holds pieces in flight: beyond the cores they cost memory and add no speed.
        warnings.warn(f"--workers {asked} is more than the {cores} cores this process may use; using {cores}",
                      stacklevel=4)
    return min(asked or cores, cores)


def _holdout(config: PrepareConfig, files: tuple[InputFile, ...], val_files: list[InputFile], enc: Encoder,
             eot: str) -> Holdout:
    if config.val_inputs:
        return holdout.by_inputs(val_files, config.val_inputs)
    if config.val_tokens:
        return holdout.by_tokens(config.val_tokens, files, enc, eot, config.seed, config.read_options())
    return holdout.by_fraction(config.val_fraction)


def input_folders(config: PrepareConfig) -> list[Path]:
    return [Path(i) for i in config.inputs if not is_url(i) and Path(i).is_dir()]
