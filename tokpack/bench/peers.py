"""The tools users would pick instead, run by ``python -m tokpack.bench`` on the same data.

    pip install datasets                                            # nanoGPT's openwebtext recipe
    pip install --no-deps litdata lightning-utilities && pip install boto3 tifffile obstore

Each peer is written the way its own documentation or recipe uses it. A peer that is not
installed is skipped with one line; installing them as above never replaces the installed torch
(litdata's own requirements would pull torchvision and another torch).

See docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..tokenizer import load_encoding


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The peers' progress bars and worker chatter, sent to /dev/null (their processes too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def missing(module: str) -> str | None:
    """None if ``module`` imports, else the one line saying it is skipped."""
    try:
        __import__(module)
    except ImportError:
        return f"skipped: {module} is not installed (see python -m tokpack.bench --help for the install line)"
    return None


def nanogpt_openwebtext(files: list[Path], out: Path, num_proc: int) -> int:
    """nanoGPT's data/openwebtext/prepare.py on local jsonl: HF datasets' map with encode_ordinary
    plus eot, then each split written to a uint16 memmap in sharded batches. Returns tokens."""
    from datasets import load_dataset

    enc = load_encoding("gpt2")
    dataset = load_dataset("json", data_files=[str(f) for f in files], cache_dir=str(out / "hf-cache"))
    split = dataset["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    split["val"] = split.pop("test")

    def process(example: dict[str, Any]) -> dict[str, Any]:
        ids = enc.encode_ordinary(example["text"])
        ids.append(enc.eot_token)
        return {"ids": ids, "len": len(ids)}

    tokenized = split.map(process, remove_columns=["text"], num_proc=num_proc)
    total = 0
    for name, dset in tokenized.items():
        arr_len = int(np.sum(dset["len"], dtype=np.uint64))
        arr = np.memmap(out / f"{name}.bin", dtype=np.uint16, mode="w+", shape=(arr_len,))
        idx, shards = 0, min(1024, len(dset))
        for k in range(shards):
            batch = dset.shard(num_shards=shards, index=k, contiguous=True).with_format("numpy")
            arr_batch = np.concatenate(batch["ids"])
            arr[idx:idx + len(arr_batch)] = arr_batch
            idx += len(arr_batch)
        arr.flush()
        total += arr_len
    return total


def _tokenize_jsonl(path: str) -> Any:
    import torch

    enc = load_encoding("gpt2")
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield torch.tensor(enc.encode_ordinary(json.loads(line)["text"]) + [enc.eot_token], dtype=torch.int)


def litdata_optimize(files: list[Path], out: Path, num_workers: int) -> None:
    """litdata's ``optimize`` with ``TokensLoader``, one input file a task, as its README shows."""
    from litdata import TokensLoader, optimize

    optimize(fn=_tokenize_jsonl, inputs=[str(f) for f in files], output_dir=str(out / "litdata"),
             chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=num_workers)


def litdata_loader(path: Path, block_size: int, batch_size: int, num_workers: int) -> Callable[[int], None]:
    """A function that reads ``n`` batches through litdata's StreamingDataLoader over ``path``,
    a token file first written as litdata chunks (done here, outside any timing)."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

    out = path.parent / "litdata-tokens"
    if not out.exists():
        optimize(fn=_chunks_of, inputs=[str(path)], output_dir=str(out), chunk_bytes="64MB",
                 item_loader=TokensLoader(), num_workers=1)
    dataset = StreamingDataset(str(out), item_loader=TokensLoader(block_size=block_size + 1), shuffle=True,
                               drop_last=True)
    loader = StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    stream = iter(loader)

    def read(n: int) -> None:
        nonlocal stream
        for _ in range(n):
            try:
                batch = next(stream)
            except StopIteration:  # a new epoch, as a training loop would start it
                stream = iter(loader)
                batch = next(stream)
            batch[:, :-1].long(), batch[:, 1:].long()  # x and y, as a training loop takes them

    return read


def _chunks_of(path: str) -> Any:
    import torch

    tokens = np.fromfile(path, dtype=np.uint16)
    step = 1 << 20
    for start in range(0, len(tokens), step):
        yield torch.from_numpy(tokens[start:start + step].astype(np.int32))
