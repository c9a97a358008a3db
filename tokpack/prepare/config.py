"""What a prepare run is asked (``PrepareConfig``) and what it decides once (``Plan``).

    python -m tokpack.prepare --config configs/sample.toml     # any PrepareConfig key in TOML

``PrepareConfig`` holds the options as given; ``prepare()`` turns them into one frozen ``Plan``
(the encoding, dtype, end-of-text rule, input files, output folder, whether the run is sharded and
into how many units) that every stage of the run reads instead of deciding again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LLMC_SHARD_TOKENS = 100_000_000  # llm.c's shard size
EOT_MODES = ("auto", "append", "prepend", "none")
FORMATS = ("flat", "llmc", "megatron")


@dataclass(frozen=True)
class PrepareConfig:
    """Every option of ``tokpack.prepare``; those that change the output go into meta.json."""

    inputs: tuple[str, ...] = ()
    out_dir: str | None = None
    encoding: str = "gpt2"
    eot_token: str | None = None
    dtype: str = "auto"
    val_fraction: float = 0.1
    val_tokens: int = 0
    val_inputs: tuple[str, ...] = ()
    seed: int = 1337
    eot: str = "auto"
    doc_sep: str | None = None
    jsonl_key: str = "text"
    text_column: str = "text"
    errors: str = "strict"
    workers: int = 0
    backend: str = "auto"
    check_fraction: float = 0.01
    piece_chars: int = 1 << 18
    unit_mb: float = 1024.0
    format: str = "flat"
    shard_tokens: int = 0
    force: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(map(str, self.inputs)))
        object.__setattr__(self, "val_inputs", tuple(map(str, self.val_inputs)))
        if self.val_tokens < 0:
            raise ValueError(f"--val-tokens {self.val_tokens} is negative; use 0 for --val-fraction, or N > 0")
        if self.val_tokens and self.val_inputs:
            raise ValueError("--val-tokens and --val-inputs each choose the val split; pass one of them")
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
        if self.shard_tokens < 0:
            raise ValueError(f"--shard-tokens {self.shard_tokens} is negative; use 0 for the default, or N > 0")
        if not self.unit_mb > 0:
            raise ValueError(f"--unit-mb {self.unit_mb} must be positive; try 1024")
        if self.piece_chars < 2:
            raise ValueError(f"piece_chars {self.piece_chars} is too small; use at least 2")

    def output_options(self) -> dict[str, Any]:
        keys = ("encoding", "eot_token", "dtype", "val_fraction", "val_tokens", "val_inputs", "seed", "eot", "doc_sep", "jsonl_key", "text_column", "errors",
                "format", "shard_tokens", "unit_mb")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True, eq=False)
class Plan:
    """A run's decisions, made once in ``prepare()`` and handed to every stage."""

    config: PrepareConfig
    enc: Any  # the tiktoken Encoding
    dtype: np.dtype
    eot: str  # append, prepend or none: "auto" resolved
    single: bool  # one document, cut by position rather than split by hash
    files: tuple[Path, ...]
    sizes: dict[Path, int]
    inputs: dict[str, Any]  # meta.json's description of the inputs
    out: Path
    sharded: bool  # units publish their shards as they finish, with records a rerun keeps
    units: int
    fingerprint: str  # of the inputs and every option that changes the output
    workers: int
    started: float
    backend: Any = None  # an accelerated encoder proven for this encoding (tokenizer.fast), or None: tiktoken
    holdout: Any = None  # the val rule (prepare.holdout.Holdout)
