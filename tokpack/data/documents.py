"""Whole documents: a dataset over a prepared split's document index, and padding.

    from tokpack import BucketBatchSampler, DocumentDataset, build_loader
    docs = DocumentDataset("data/sample/train.bin", max_length=512)
    loader = build_loader(docs, 16, seed=0, sampler=BucketBatchSampler(docs.lengths, 16, seed=0))
    batch = next(iter(loader))   # {"input_ids", "attention_mask", "labels"}: (16, T) each

``pad_collate`` right-pads to the batch's longest document with the split's end-of-text id
(``docs.pad_id``: set a Hugging Face model's ``pad_token_id`` to it); ``BucketBatchSampler`` (in
``tokpack.data.samplers``) groups documents of similar length so that little of each batch is padding.
Both keep the loader's seed, workers, pinning and exact resume.

See docs/loading.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..split import OpenedFiles, Split, open_split, read_index
from .windows import IGNORE_INDEX


def pad_collate(samples: Sequence[Any], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad 1-D id tensors to the longest with ``pad_id``: the keys Hugging Face models take.

    Plain documents give ``input_ids``, ``attention_mask`` (arange(T) < length) and ``labels``, the
    ids with -100 at padding, as ``*ForCausalLM`` expects (it shifts them itself); documents with
    their masks (dicts) have -100 too where a token is not trained on. (ids, class
    label) pairs give ``labels`` of shape (B,), the class ids, as ``*ForSequenceClassification``
    expects. Module-level, so spawn and forkserver workers can pickle it. No default ``pad_id``:
    a sequence classifier reads each row at its last token that is not ``pad_token_id``, so the
    padding must be the id the model is told (``DocumentDataset`` gives the encoding's end of text).
    """
    if isinstance(samples[0], dict):  # documents with their loss masks
        batch = pad_collate([s["input_ids"] for s in samples], pad_id)
        for row, s in enumerate(samples):
            batch["labels"][row, :len(s["assistant_masks"])].masked_fill_(s["assistant_masks"] == 0, IGNORE_INDEX)
        return batch
    labelled = isinstance(samples[0], (tuple, list))
    seqs = [s[0] for s in samples] if labelled else list(samples)
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    input_ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    if labelled:
        labels = torch.tensor([int(s[1]) for s in samples], dtype=torch.long)
    else:
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class DocumentIndex:
    """A split's documents: their starts and ends (from its ``.idx``, read once) and reads of any
    token range across its files, memory-mapped lazily in each process."""

    def __init__(self, split: Split):
        self.split = split
        self.offsets = np.concatenate([[0], np.cumsum(split.lengths)])  # of each file in the split
        self.starts = read_index(split)
        self.ends = np.append(self.starts[1:], int(self.offsets[-1]))
        self._tokens: OpenedFiles | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}  # workers reopen the memmaps, never copy them

    def __len__(self) -> int:
        return len(self.starts)

    def tokens(self) -> OpenedFiles:
        if self._tokens is None:
            self._tokens = self.split.open()
        return self._tokens

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the split, across file boundaries."""
        return self.tokens().span(start, stop)


class DocumentDataset(Dataset):
    """The documents of a prepared split (from its ``.idx``), each truncated to ``max_length``.

    ``path`` is a split's ``.bin``, or a prepared folder with ``split=``; in a sharded folder a
    document may run on across shard files, and is read across them, whole. ``labels`` (one int
    per document) makes items ``(ids, label)`` pairs, for classification and for
    ``inverse_frequency_weights``. A split with a loss mask (conversations) gives dicts of
    ``input_ids`` and ``assistant_masks`` (1 = trained on), the columns TRL's SFT trainer takes.
    """

    def __init__(self, path: str | Path | Split, max_length: int, labels: Sequence[int] | None = None,
                 split: str | None = None, pad_id: int | None = None):
        """Args:
            path: a split's ``.bin``, a prepared folder (with ``split``), or a ``Split`` already opened.
            max_length: the longest a document is served; longer ones are truncated.
            labels: one class id per document, for classification.
            split: the split of a prepared folder.
            pad_id: the id batches are padded with; None: the encoding's end-of-text id from meta.json.
        """
        if max_length < 1:
            raise ValueError(f"max_length {max_length} must be at least 1")
        self.index = DocumentIndex(open_split(path, split))
        self._mask_files: OpenedFiles | None = None
        self.split, self.starts, self.ends = self.index.split, self.index.starts, self.index.ends
        self.max_length = max_length
        self.lengths = np.minimum(self.ends - self.starts, max_length)
        if labels is not None and len(labels) != len(self.starts):
            raise ValueError(f"{len(labels)} labels for {len(self.starts)} documents in {self.split.describe()}; "
                             "give one per document")
        if labels is not None and self.split.mask is not None:
            raise ValueError(f"{self.split.describe()} is a split of conversations with a loss mask; labels classify "
                             "plain documents: pass a split without a mask, or drop labels")
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        if pad_id is None:
            if self.split.meta is None:
                raise ValueError(f"{self.split.describe()} has no meta.json to name its end-of-text id; pass pad_id= "
                                 "(the id your model pads with)")
            pad_id = int(self.split.meta["encoding"]["eot_id"])
        self.pad_id = pad_id
        # What build_loader collates with: a partial of a module-level function, so workers pickle it.
        self.default_collate_fn = functools.partial(pad_collate, pad_id=pad_id)

    def fingerprint(self) -> str:
        """The split's fingerprint: resume states taken on other data are refused."""
        return self.split.fingerprint

    def __len__(self) -> int:
        return len(self.starts)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mask_files": None}  # workers map their own

    def __getitem__(self, i: int) -> Any:
        start = int(self.starts[i])
        stop = start + int(self.lengths[i])
        ids = torch.from_numpy(self.split.check_ids(self.index.span(start, stop)).astype(np.int64))
        if self.split.mask is not None:  # a conversation split: its mask files, cut where its token files are
            if self._mask_files is None:
                self._mask_files = self.split.mask.open()
            mask = self.split.mask.check_mask(self._mask_files.span(start, stop)).astype(np.int64)
            return {"input_ids": ids, "assistant_masks": torch.from_numpy(mask)}
        return ids if self.labels is None else (ids, int(self.labels[i]))
