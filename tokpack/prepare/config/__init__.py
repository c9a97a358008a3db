"""What a prepare run is asked: ``PrepareConfig``, every option with its help, the groups as
checked values of their own (``[guard]``: ``GuardOptions``; ``[launch]``: ``LaunchOptions``).

    python -m tokpack.prepare --config configs/sample.toml     # any PrepareConfig key in TOML

The command's flags and the TOML keys both come from these dataclasses. ``make_plan``
(``tokpack.prepare.plan``) turns a config into the run's one ``Plan``.

See docs/prepare.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ...chat import Renderer
from ...corpus import ReadOptions
from ...options import default_of, option
from ...storage import is_url, redact
from ...tokenizer import encoding_key
from ...tokenizer.fast import BACKENDS
from .guard import Dedup, GuardOptions
from .launch import Launch, LaunchOptions

__all__ = ["Dedup", "GuardOptions", "Launch", "LaunchOptions", "PrepareConfig"]

LLMC_SHARD_TOKENS = 100_000_000  # llm.c's shard size
EOT_MODES = ("auto", "append", "prepend", "none")
FORMATS = ("flat", "llmc", "megatron")
# The options that change the output: meta.json records them, and a rerun's units must match them.
OUTPUT_OPTIONS = ("encoding", "eot_token", "special_text", "dtype", "val_fraction", "val_tokens", "val_inputs", "seed", "eot",
                  "doc_sep", "jsonl_key", "text_column", "errors", "format", "shard_tokens", "shard_boundary", "unit_mb")
CHAT_OPTIONS = ("chat", "chat_template", "max_tokens", "skip_bad", "mixture")


@dataclass(frozen=True)
class PrepareConfig:
    """Every option of ``tokpack.prepare``; those that change the output go into meta.json."""

    inputs: tuple[str, ...] = option((), "files, folders (recursive), globs or URLs (s3://, gs://, https://, "
                                     "hf://: tokpack[remote]); text, .jsonl, .gz and .zst of both, .parquet "
                                     "(default: the built-in sample corpus, the Python docs topics)")
    out_dir: str | None = option(None, "output folder, or a URL to publish it to (s3://bucket/prefix: "
                                 "tokpack[remote]) (default: data/sample for the sample, else data/<first input's stem>)")
    encoding: str = option("gpt2", "tiktoken encoding name, NAME.tiktoken file, spec file (.toml/.json), or a "
                           "Hugging Face tokenizer.json or its folder")
    eot_token: str | None = option(None, "the special token that ends (or, with --eot prepend, starts) each "
                                   "document, when a tokenizer.json's config does not name it (default: from the "
                                   "config)")
    special_text: str = option("ordinary", "a Hugging Face tokenizer's special-token text inside a document: "
                               "ordinary encodes it as text (the end-of-text id only where documents meet, as "
                               "tiktoken does); special gives its special id, the library's default",
                               ("ordinary", "special"))
    dtype: str = option("auto", "token dtype; auto is the narrowest that holds every id",
                        ("auto", "uint16", "uint32"))
    val_fraction: float = option(0.1, "share of documents (or of a lone document's tail) that goes to val")
    val_tokens: int = option(0, "a fixed val budget instead: the documents first in hash order until they hold "
                             "at least N tokens, e.g. modded-nanogpt's 10485760 (default: 0, off)")
    storage_options: dict[str, Any] | None = option(
        None, "options of remote inputs' store as a JSON object, or a [storage_options] table in a config: "
        "endpoint_url, key, secret, anon, profile, timeout (seconds, default 60), ... as fsspec's library for "
        "the URL takes them; never recorded (default: the library's own, from the environment)")
    val_inputs: tuple[str, ...] = option((), "these files, folders or globs are the val split, whole (nanochat's "
                                         "last parquet file, llm.c's first shard); the rest is train (default: none)")
    seed: int = option(1337, "seed of the per-document split hash")
    eot: str = option("auto", "where the end-of-text token goes around each document (default: auto: append, "
                      "prepend with --format llmc, none for a corpus of one document)", EOT_MODES)
    doc_sep: str | None = option(None, "cut text files into documents at this string (default: none)")
    jsonl_key: str = option("text", "text field of .jsonl records")
    text_column: str = option("text", "text column of .parquet files")
    errors: str = option("strict", "invalid UTF-8 handling", ("strict", "replace"))
    workers: int = option(0, "tokenizer threads (default: 0, every core)")
    backend: str = option("auto", "the BPE implementation of a tiktoken encoding: auto uses splintr "
                          "(tokpack[fast]) where it is proven, else tiktoken", BACKENDS)
    check_fraction: float = option(0.01, "share of pieces an accelerated backend's ids are checked against "
                                   "tiktoken's")
    piece_chars: int = option(1 << 18, "characters per tokenized piece")
    unit_mb: float = option(1024.0, "input MB per resumable unit of a sharded run: a rerun keeps the units a "
                            "killed run finished")
    format: str = option("flat", "flat: train.bin/val.bin, nanoGPT's; llmc: llm.c / modded-nanogpt shards "
                         "NAME_train_000001.bin, ...; megatron: Megatron-LM's indexed datasets "
                         "train_text_document.bin/.idx", FORMATS)
    shard_tokens: int = option(0, f"write each split as shards of at most N tokens (default: 0: llm.c's "
                               f"{LLMC_SHARD_TOKENS} with --format llmc, else one file a split)")
    shard_boundary: str = option("auto", "where a shard ends: document, before a document that does not fit (one "
                                 "longer than a shard runs on); token, at exactly --shard-tokens (default: auto: "
                                 "document with --format llmc, as modded-nanogpt reads them, else token)",
                                 ("auto", "document", "token"))
    chat: str = option("none", "read the inputs (.jsonl or .parquet) as conversations ('messages', or TRL's 'prompt' "
                       "and 'completion') and write a loss mask a token beside the tokens (SPLIT.mask): nanochat "
                       "renders them as nanochat does, with its special tokens; template with the tokenizer's own "
                       "chat template, as transformers does", tuple(Renderer))
    chat_template: str | None = option(None, "with --chat template, the template: a .jinja file, or a "
                                       "tokenizer_config.json that holds one (default: the tokenizer's own, "
                                       "chat_template.jinja or tokenizer_config.json beside its tokenizer.json)")
    max_tokens: int = option(2048, "with --chat, a conversation's tokens at most, the rest cut (nanochat's 2048); "
                             "0 keeps every token")
    skip_bad: bool = option(False, "with --chat, leave out a record that is not a valid conversation, counted in "
                            "meta.json, instead of stopping at it")
    mixture: tuple[str, ...] = option((), "with --chat, write each split as nanochat's TaskMixture of the inputs: "
                                      "INPUT=EPOCHS for an input as given (the others once), every (input, "
                                      "conversation) shuffled by --seed as TaskMixture shuffles by 42")
    spool_dir: str | None = option(None, "with a URL as --out-dir, the local folder a unit's shards wait in until "
                                   "they are uploaded (default: the system's temporary folder)")
    force: bool = option(False, "overwrite an existing prepared folder or another tool's token files")
    quiet: bool = option(False, "no progress bar or summary")
    guard: GuardOptions = option(GuardOptions(), "the split guard, dedup and decontamination: a [guard] table")
    launch: LaunchOptions = option(LaunchOptions(), "how the run is launched: a [launch] table")

    # Keys that moved into a table: a config file's top-level one still works, with a warning.
    MOVED: ClassVar[dict[str, str]] = {name: "launch" for name in LaunchOptions.__dataclass_fields__}

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(map(str, self.inputs)))
        object.__setattr__(self, "val_inputs", tuple(map(str, self.val_inputs)))
        # A tokenizer file is recorded by its absolute path: readers elsewhere find the same file.
        object.__setattr__(self, "encoding", encoding_key(self.encoding))
        if self.val_tokens < 0:
            raise ValueError(f"--val-tokens {self.val_tokens} is negative; use 0 for --val-fraction, or N > 0")
        if self.val_tokens and self.val_inputs:
            raise ValueError("--val-tokens and --val-inputs each choose the val split; pass one of them")
        # An option that would do nothing is refused, not recorded.
        if (self.val_tokens or self.val_inputs) and self.val_fraction != default_of(PrepareConfig, "val_fraction"):
            raise ValueError(f"--val-fraction {self.val_fraction} does nothing beside "
                             f"{'--val-tokens' if self.val_tokens else '--val-inputs'}, which chooses the val split; "
                             "pass one of them")
        remote_out = self.out_dir is not None and is_url(self.out_dir)
        if self.spool_dir is not None and not remote_out:
            raise ValueError(f"--spool-dir {self.spool_dir} holds what waits to be uploaded to a URL --out-dir; "
                             "this run writes a local folder: drop --spool-dir")
        if self.storage_options is not None and not remote_out and not any(
                map(is_url, (*self.inputs, *self.val_inputs))):
            raise ValueError("--storage-options configures a remote store, and no input or --out-dir is a URL: "
                             "drop --storage-options")
        if self.backend == "tiktoken" and self.check_fraction != default_of(PrepareConfig, "check_fraction"):
            raise ValueError(f"--check-fraction {self.check_fraction} checks an accelerated backend's ids against "
                             "tiktoken's; with --backend tiktoken there is none: drop --check-fraction")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction {self.val_fraction} must lie strictly between 0 and 1; try 0.1")
        if self.eot not in EOT_MODES:
            raise ValueError(f"--eot {self.eot!r} is not one of {', '.join(EOT_MODES)}")
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"--errors {self.errors!r} is not strict or replace")
        if not 0.0 <= self.check_fraction <= 1.0:
            raise ValueError(f"--check-fraction {self.check_fraction} must lie in [0, 1]; try 0.01")
        if self.workers < 0:
            raise ValueError(f"--workers {self.workers} is negative; use 0 for all cores")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.format == "megatron" and self.shard_tokens:
            raise ValueError(f"--format megatron writes one .bin/.idx pair a split, not shards of "
                             f"{self.shard_tokens} tokens; drop --shard-tokens")
        self._check_launch(remote_out)
        if self.shard_tokens < 0:
            raise ValueError(f"--shard-tokens {self.shard_tokens} is negative; use 0 for the default, or N > 0")
        if not self.unit_mb > 0:
            raise ValueError(f"--unit-mb {self.unit_mb} must be positive; try 1024")
        if self.piece_chars < 2:
            raise ValueError(f"piece_chars {self.piece_chars} is too small; use at least 2")
        self._check_chat()

    def _check_launch(self, remote_out: bool) -> None:
        """Ray's workers share no disk with this process: with a URL, each uploads its own units."""
        if remote_out and self.launch.ray is not None and self.one_file_a_split():
            raise ValueError("--ray with a URL --out-dir has each task upload its own units from its worker, so the "
                             "run must be sharded (--format llmc or --shard-tokens N: a split written as one file is "
                             "joined on one disk); or prepare into a disk the workers share")

    def _check_chat(self) -> None:
        """Conversations each start with their own BOS, in the split their hash chooses."""
        if self.chat not in tuple(Renderer):
            raise ValueError(f"--chat {self.chat!r} is not one of {', '.join(Renderer)}")
        if self.chat_template is not None and self.chat != Renderer.TEMPLATE:
            raise ValueError(f"--chat-template {self.chat_template} applies to --chat template; pass it, or drop "
                             "--chat-template")
        if self.chat == Renderer.NONE:
            for name in ("max_tokens", "skip_bad", "mixture"):
                if getattr(self, name) != default_of(PrepareConfig, name):
                    raise ValueError(f"--{name.replace('_', '-')} applies to conversations: pass --chat, or drop it")
            return
        if self.max_tokens < 0:
            raise ValueError(f"--max-tokens {self.max_tokens} is negative; use 0 to keep every token")
        if self.chat == Renderer.NANOCHAT and self.special_text == "special":
            raise ValueError("--special-text special would let text typed in a message become control tokens; "
                             "--chat nanochat places its special tokens by id and never lets a message's text become "
                             "them: drop --special-text")
        unsupported = [flag for flag, used in (("--val-tokens", bool(self.val_tokens)),
                                                ("--eot " + self.eot, self.eot not in ("auto", "none"))) if used]
        if unsupported:
            raise ValueError(f"--chat writes each conversation led by its own BOS, in the split its messages' hash "
                             f"or --val-inputs chooses, and does not take {', '.join(unsupported)}; drop it")

    def one_file_a_split(self) -> bool:
        """Whether one process writes each split as one file (flat, or Megatron's pair), not shards."""
        return self.format != "llmc" and not self.shard_tokens

    def output_options(self) -> dict[str, Any]:
        """The options meta.json records (and a run's fingerprint holds): a URL among them as
        tokpack shows it, without user information or a web URL's query (a signed URL's key)."""
        chat = CHAT_OPTIONS if self.chat != Renderer.NONE else ()  # a text run's record stays as it was
        shown = {"val_inputs": list(map(redact, self.val_inputs))}
        if self.guard.active:
            shown["guard"] = {**dataclasses.asdict(self.guard), "decontaminate": list(map(redact, self.guard.decontaminate))}
        return {**{k: getattr(self, k) for k in OUTPUT_OPTIONS + chat}, **shown}

    def read_options(self) -> ReadOptions:
        return ReadOptions(self.errors, self.doc_sep, self.jsonl_key, self.text_column)
