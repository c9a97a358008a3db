"""tokpack: text corpus -> token files -> PyTorch training and evaluation loops.

    python -m tokpack.prepare corpus.txt      # train.bin, val.bin, meta.json
    python -m tokpack.verify data/corpus      # are the files whole and consistent?

The write wing is ``tokpack.prepare`` (torch-free), the read wing ``tokpack.data``; every public
name below is imported on first use, so that ``python -m tokpack.prepare`` never pays for torch.

See docs/design.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _compat
from .version import __version__

_compat.install()

# ``python -m tokpack.evaluate`` needs a package of that name, while ``tokpack.evaluate`` is the
# function. Python binds a submodule to its package on its first import only: importing the
# command package here, first, and freeing the name keeps ``tokpack.evaluate`` the function.
importlib.import_module(".evaluate", __name__)
del evaluate  # noqa: F821 - bound by the import above

# Public name -> defining module.
_EXPORTS = {
    "TokenWindows": "data.windows",
    "collate_windows": "data.windows",
    "build_loader": "data.loader",
    "TokenLoader": "data.loader",
    "seed_worker": "data.runtime",
    "to_device": "data.runtime",
    "rank_world": "data.runtime",
    "ResumableBatchSampler": "data.samplers",
    "RandomStartSampler": "data.samplers",
    "EpochSampler": "data.samplers",
    "InOrderSampler": "data.samplers",
    "WeightedSampler": "data.samplers",
    "BucketBatchSampler": "data.samplers",
    "MixtureSampler": "data.samplers",
    "inverse_frequency_weights": "data.samplers",
    "DocumentDataset": "data.documents",
    "pad_collate": "data.documents",
    "PackedDocuments": "data.packing",
    "PackedBatch": "data.packing",
    "TrainRows": "data.layouts",
    "EvalRows": "data.layouts",
    "Rows": "data.layouts",
    "Flat": "data.layouts",
    "HF": "data.layouts",
    "MegatronSFT": "data.layouts",
    "preset": "data.layouts",
    "MixedWindows": "data.mixing",
    "TokenStream": "data.streams",
    "build_stream_loader": "data.streams",
    "evaluate": "evaluation",
    "PrepareConfig": "prepare",
    "load_encoding": "tokenizer",
    "Encoder": "tokenizer",
    "read_meta": "format",
    "Split": "split",
    "open_split": "split",
    "open_tokens": "split",
}

if TYPE_CHECKING:
    from .data.documents import DocumentDataset, pad_collate
    from .data.layouts import HF, EvalRows, Flat, MegatronSFT, Rows, TrainRows, preset
    from .data.loader import TokenLoader, build_loader
    from .data.mixing import MixedWindows
    from .data.packing import PackedBatch, PackedDocuments
    from .data.runtime import rank_world, seed_worker, to_device
    from .data.samplers import (BucketBatchSampler, EpochSampler, InOrderSampler, MixtureSampler,
                                RandomStartSampler, ResumableBatchSampler, WeightedSampler, inverse_frequency_weights)
    from .data.streams import TokenStream, build_stream_loader
    from .data.windows import TokenWindows, collate_windows
    from .evaluation import evaluate
    from .format import read_meta
    from .prepare import PrepareConfig
    from .split import Split, open_split, open_tokens
    from .tokenizer import Encoder, load_encoding

# Spelled out, so that static analysis sees the public names; tests check it matches _EXPORTS.
# ``prepare`` is the write wing's package: ``from tokpack.prepare import prepare, PrepareConfig``.
__all__ = [
    "__version__",
    "TokenWindows", "collate_windows", "build_loader", "TokenLoader", "seed_worker", "to_device", "rank_world",
    "ResumableBatchSampler", "RandomStartSampler", "EpochSampler", "InOrderSampler", "WeightedSampler",
    "BucketBatchSampler", "MixtureSampler", "inverse_frequency_weights", "DocumentDataset", "pad_collate",
    "PackedDocuments", "PackedBatch", "TrainRows", "EvalRows", "Rows", "Flat", "HF", "MegatronSFT", "preset",
    "MixedWindows", "TokenStream", "build_stream_loader", "evaluate", "PrepareConfig", "load_encoding", "Encoder",
    "read_meta", "Split", "open_split", "open_tokens",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tokpack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
