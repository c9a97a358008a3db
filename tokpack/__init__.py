"""tokpack: text corpus -> token files -> PyTorch training and evaluation loops.

    python -m tokpack.prepare corpus.txt      # train.bin, val.bin, meta.json
    python -m tokpack.verify data/corpus      # are the files whole and consistent?
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# `python -m tokpack.prepare` and `python -m tokpack.evaluate` are command packages with nothing
# in them to import. Importing them here, first, binds their names before any user import does;
# Python binds a submodule to its package only on its first import, so once the names are freed
# below, `tokpack.prepare` and `tokpack.evaluate` stay the functions whatever is imported later.
importlib.import_module(".prepare", __name__)
importlib.import_module(".evaluate", __name__)
del prepare, evaluate  # noqa: F821 - bound by the two imports above

# Public name -> defining module. Imported on first use so that `python -m tokpack.prepare`
# never pays for torch (about 200 MB and seconds of start-up).
_EXPORTS = {
    "TokenWindows": "windows",
    "collate_windows": "windows",
    "build_loader": "loader",
    "TokenLoader": "loader",
    "seed_worker": "runtime",
    "to_device": "runtime",
    "rank_world": "runtime",
    "evaluate": "evaluation",
    "ResumableBatchSampler": "samplers",
    "RandomStartSampler": "samplers",
    "EpochSampler": "samplers",
    "InOrderSampler": "samplers",
    "WeightedSampler": "samplers",
    "BucketBatchSampler": "samplers",
    "MixtureSampler": "samplers",
    "inverse_frequency_weights": "samplers",
    "DocumentDataset": "documents",
    "pad_collate": "documents",
    "MixedWindows": "mixing",
    "TokenStream": "streams",
    "build_stream_loader": "streams",
    "PrepareConfig": "preparation",
    "prepare": "preparation",
    "load_encoding": "tokenizer",
    "open_tokens": "format",
    "read_meta": "format",
}

if TYPE_CHECKING:
    from .documents import DocumentDataset, pad_collate
    from .evaluation import evaluate
    from .format import open_tokens, read_meta
    from .loader import TokenLoader, build_loader
    from .mixing import MixedWindows
    from .preparation import PrepareConfig, prepare
    from .runtime import rank_world, seed_worker, to_device
    from .samplers import (BucketBatchSampler, EpochSampler, InOrderSampler, MixtureSampler, RandomStartSampler,
                           ResumableBatchSampler, WeightedSampler, inverse_frequency_weights)
    from .streams import TokenStream, build_stream_loader
    from .tokenizer import load_encoding
    from .windows import TokenWindows, collate_windows

# Spelled out, so that static analysis sees the public names; tests check it matches _EXPORTS.
__all__ = [
    "__version__",
    "TokenWindows", "collate_windows", "build_loader", "TokenLoader", "seed_worker", "to_device", "rank_world",
    "evaluate", "ResumableBatchSampler", "RandomStartSampler", "EpochSampler", "InOrderSampler",
    "WeightedSampler", "BucketBatchSampler", "MixtureSampler", "inverse_frequency_weights", "DocumentDataset",
    "pad_collate", "MixedWindows", "TokenStream", "build_stream_loader", "PrepareConfig", "prepare",
    "load_encoding", "open_tokens", "read_meta",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tokpack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
