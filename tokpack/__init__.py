"""tokpack: text corpus -> token files -> PyTorch training and evaluation loops.

    python -m tokpack.prepare corpus.txt      # train.bin, val.bin, meta.json
    python -m tokpack.verify data/corpus      # are the files whole and consistent?
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> defining module. Imported on first use so that `python -m tokpack.prepare`
# never pays for torch (about 200 MB and seconds of start-up).
_EXPORTS = {
    "TokenWindows": "windows",
    "build_loader": "loader",
    "seed_worker": "loader",
    "to_device": "loader",
    "evaluate": "evaluate",
    "RandomStartSampler": "samplers",
    "EpochSampler": "samplers",
    "SequentialSampler": "samplers",
    "DocumentDataset": "documents",
    "pad_collate": "documents",
    "BucketBatchSampler": "documents",
    "WeightedSampler": "documents",
    "inverse_frequency_weights": "documents",
    "MixedWindows": "mixing",
    "TokenStream": "streams",
    "build_stream_loader": "streams",
    "PrepareConfig": "prepare",
    "load_encoding": "tokenizer",
    "open_tokens": "format",
    "read_meta": "format",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tokpack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
