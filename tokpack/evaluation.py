"""Evaluation: every target token of a split scored exactly once, on one process or many.

    python -m tokpack.evaluate data/sample --model bigram --model unigram   # baselines, no training
    python -m tokpack.evaluate data/sample --checkpoint out/ckpt.pt --stride 128 64 --documents
    python -m tokpack.evaluate data/shakespeare --checkpoint out-shakespeare/ckpt.pt   # nanoGPT's too
    python -m tokpack.evaluate data/edu --llmc-model gpt2_124M.bin --hf-model models/my-llama
    torchrun --standalone --nproc_per_node=2 -m tokpack.evaluate data/sample --checkpoint out/ckpt.pt

``evaluate(model, loader, device=...)`` runs every window of an evaluation loader through the
model, sums the per-token cross-entropy in float64 over labels that are not -100, all-reduces
the sums when torch.distributed is initialised (each rank scores its own windows; uneven shares
are fine), and returns loss, ppl, bits_per_token, bits_per_byte, tokens and windows. Packed
batches (``PackedDocuments``) carry their documents to the model, so each is scored alone.
``sweep`` runs it over checkpoints, baselines and strides (with ``--documents``, also document by
document); the command line runs ``sweep`` and, under torchrun, initialises the process group
itself.

See docs/evaluation.md.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from .cli import parser, run_cli, table
from .data.loader import build_loader
from .data.layouts import EvalRows
from .data.packing import PackedDocuments
from .data.runtime import rank_world, to_device
from .data.windows import IGNORE_INDEX, TokenWindows
from .distributed import process_group
from .split import Split, open_splits
from .tokenizer import Encoder, folder_encoding

# Logits scored at a time: 8 MB of float32 on the CPU, where a reused slice is faster than fresh
# memory for the whole batch; 256 MB on an accelerator, where each slice is a kernel launch.
CE_ELEMENTS, CE_ELEMENTS_ACCELERATOR = 1 << 21, 1 << 26


def token_byte_lengths(meta: dict[str, Any]) -> np.ndarray:
    """``byte_lengths`` of a prepared folder's encoding, checked against its meta.json."""
    return _byte_lengths_cached(folder_encoding(meta))


@functools.cache
def _byte_lengths_cached(enc: Encoder) -> np.ndarray:
    return byte_lengths(enc)


def byte_lengths(enc: Encoder) -> np.ndarray:
    """UTF-8 bytes of the text of every token id of an encoder: special tokens (end of text) are
    not text and count 0, so sums over scored tokens give the bytes of the text alone."""
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)
    for token in range(enc.n_vocab):
        if token in enc.special_ids:
            continue
        try:
            lengths[token] = len(enc.token_bytes(token))
        except KeyError:
            pass  # an id the encoding leaves unused
    return lengths


def _byte_lengths_for(loader: Any) -> np.ndarray | None:
    """The encoding's byte lengths, when the loader reads a prepared split (its meta.json names it)."""
    meta = getattr(getattr(getattr(loader, "dataset", None), "split", None), "meta", None)
    return None if meta is None else token_byte_lengths(meta)


def _model_vocab(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None) or getattr(model, "vocab_size", None)
    return vocab if isinstance(vocab, int) else None


def _check_ids(model: torch.nn.Module, loader: Any, token_bytes: np.ndarray | None) -> None:
    """Refuse, before any batch, data whose ids the model or the encoding cannot index: an index
    error deep in the model, or a huge allocation from a misread dtype, otherwise."""
    max_id = getattr(getattr(loader, "dataset", None), "max_id", None)
    if max_id is None:
        return
    top = max_id()
    for limit, what in ((_model_vocab(model), f"{type(model).__name__}'s vocab_size"),
                        (None if token_bytes is None else len(token_bytes), "the encoding's n_vocab")):
        if limit is not None and top >= limit:
            raise ValueError(f"the data holds token id {top} but {what} is {limit}; evaluate on data of the "
                             "model's encoding (a wrong dtype reads garbage ids too)")


def _scorer(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``score(x, y, text, **packed)``: the loss summed, in float64, over every scored target and
    over the ``text`` targets, from whatever ``model`` is.

    Models with ``target_log_probs`` (the n-gram baselines) are gathered from directly. Others give
    logits: as a tensor, the first item of a tuple (nanoGPT's ``(logits, loss)``), or ``.logits``
    (Hugging Face). One that takes ``use_cache`` (Hugging Face's) is given False. Packed batches
    pass their ``position_ids`` and ``cu_seqlens`` on. A model that takes ``position_ids`` and
    ``use_cache`` but no ``cu_seqlens`` (Hugging Face's, which without a cache reads restarting
    position ids as documents apart) is given the position ids alone, once the first batch with two
    documents in a row shows that the second one's logits are those it has alone; any other model
    is refused for them, since it would attend across documents. A forward that takes ``targets``
    (nanoGPT's) returns every position's logits only when given them, and then computes its own
    cross-entropy: see ``_own_loss``, which uses it instead of computing it twice.
    """
    direct = getattr(model, "target_log_probs", None)
    if direct is not None:  # an n-gram sees only the previous token
        return lambda x, y, text, **packed: _summed(-direct(x, y), y, text)
    forward = getattr(getattr(model, "_orig_mod", model), "forward", model)
    try:
        takes = set(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        takes = set()
    own = _own_loss(model) if "targets" in takes else None
    by_positions = "cu_seqlens" not in takes and {"position_ids", "use_cache"} <= takes
    proven: list[bool] = []

    def score(x: torch.Tensor, y: torch.Tensor, text: torch.Tensor, **packed: torch.Tensor) -> torch.Tensor:
        if packed and not {"position_ids", "cu_seqlens"} <= takes and not by_positions:
            raise ValueError(f"{type(model).__name__}.forward takes no position_ids and cu_seqlens, so on packed rows "
                             "it would attend across documents; evaluate it on TokenWindows, or give it both")
        cu_seqlens = packed.pop("cu_seqlens") if packed and by_positions else None
        if "use_cache" in takes:  # Hugging Face builds a cache before it reads position_ids: none is wanted here
            packed["use_cache"] = False
        if own is not None:
            return own(x, y, text, **packed)
        out = model(x, **packed)
        if cu_seqlens is not None and not proven:
            _prove_apart(model, x, packed, cu_seqlens, out, proven)
        return _summed(_token_losses(model, out, x, y), y, text)

    return score


def _logits(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else getattr(out, "logits", out)


def _prove_apart(model: torch.nn.Module, x: torch.Tensor, packed: dict[str, Any], cu_seqlens: torch.Tensor,
                 out: Any, proven: list[bool]) -> None:
    """Refuse a model that, given position ids alone, attends across documents: the second segment
    of a row scored alone must give the logits it got packed (one extra forward of one segment)."""
    T = x.shape[1]
    starts = [s for s in cu_seqlens.tolist() if s < x.numel()]
    for row in range(x.shape[0]):
        inside = [s - row * T for s in starts if row * T <= s < (row + 1) * T] + [T]
        if len(inside) < 3:
            continue
        lo, hi = inside[1], inside[2]
        alone = model(x[row:row + 1, lo:hi], position_ids=packed["position_ids"][row:row + 1, lo:hi], use_cache=False)
        if not torch.allclose(_logits(alone).float(), _logits(out)[row:row + 1, lo:hi].float(), rtol=1e-3, atol=1e-3):
            raise ValueError(f"{type(model).__name__} attends across documents when given position ids alone (a "
                             "document's logits change with the one packed before it); evaluate it without "
                             "--documents, on TokenWindows")
        proven.append(True)
        return


def _token_losses(model: torch.nn.Module, out: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each position's cross-entropy (0 where ignored), in float32 or wider, from a model's output."""
    logits = _logits(out)
    if logits.shape[:2] != x.shape:
        raise ValueError(f"{type(model).__name__} gave logits of shape {tuple(logits.shape)} for inputs of "
                         f"shape {tuple(x.shape)}; evaluate needs logits for every position")
    flat, targets = logits.flatten(0, 1), y.flatten()
    # Half precision is too coarse to sum; float64 stays exact.
    losses = torch.empty(targets.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=flat.device)
    # A slice of positions at a time: each row's loss is the same, but the softmax's scratch is a
    # few MB that is reused, where the whole batch's (B * T * vocabulary floats) is fresh memory.
    budget = CE_ELEMENTS if flat.device.type == "cpu" else CE_ELEMENTS_ACCELERATOR
    step = max(1, budget // max(1, flat.shape[-1]))
    for lo in range(0, len(targets), step):
        losses[lo:lo + step] = F.cross_entropy(flat[lo:lo + step].to(losses.dtype), targets[lo:lo + step],
                                               ignore_index=IGNORE_INDEX, reduction="none")
    return losses.view(y.shape)


def _summed(losses: torch.Tensor, y: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    scored = torch.where(y != IGNORE_INDEX, losses, 0)
    return torch.stack([scored.sum(dtype=torch.float64), torch.where(text, scored, 0).sum(dtype=torch.float64)])


def _own_loss(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """Scoring through a model that computes its own loss (nanoGPT's ``forward(idx, targets)``:
    the mean cross-entropy over targets that are not -1). It is given the text targets alone, so
    its loss times their count is their sum, and only the few other targets (end of text) are
    scored here: one cross-entropy over the vocabulary a position, not two. Trusted only once the
    first batch shows its loss to be that plain mean (a loss with other terms, label smoothing or
    an auxiliary loss, is then scored position by position, as any model)."""
    trusted: list[bool] = []

    def score(x: torch.Tensor, y: torch.Tensor, text: torch.Tensor, **packed: torch.Tensor) -> torch.Tensor:
        given = y.masked_fill(~text, -1) if trusted != [False] else y.masked_fill(y == IGNORE_INDEX, -1)
        out = model(x, targets=given, **packed)
        loss = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if trusted == [False] or not (torch.is_tensor(loss) and loss.dim() == 0):
            return _summed(_token_losses(model, out, x, y), y, text)
        logits = out[0]
        n = text.sum()
        text_sum = torch.where(n > 0, loss.double() * n, 0)
        rest = (y != IGNORE_INDEX) & ~text
        rest_sum = F.cross_entropy(logits[rest].double(), y[rest], reduction="sum")  # 0 where there is none
        if not trusted:
            exact = _summed(_token_losses(model, out, x, y), y, text)
            trusted.append(bool(torch.isclose(text_sum, exact[1], rtol=1e-4, atol=1e-6)))
            if not trusted[0]:
                return exact
        return torch.stack([text_sum + rest_sum, text_sum])

    return score


def _on_device(loader: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """The loader's batches on ``device``: (x, y) pairs, window batches or packed batches."""
    for batch in loader:
        if isinstance(batch, dict):
            raise ValueError("evaluate takes (x, y) batches (TokenWindows, or PackedDocuments with form='rows' or "
                             "'flat'), not a dict of model inputs")
        yield to_device(batch if isinstance(batch, tuple) else tuple(batch), device)


def _sums(score: Callable[..., torch.Tensor], batches: Iterator[Any], device: torch.device,
          lengths: torch.Tensor | None, progress: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The loss summed over every target and over text targets, the tokens and bytes scored, and
    the windows; the sums stay on the device."""
    loss_sums = torch.zeros(2, dtype=torch.float64, device=device)  # every target, text targets
    counts = torch.zeros(2, dtype=torch.int64, device=device)  # tokens, bytes
    windows = 0
    for batch in batches:
        x, y = batch[0], batch[1]
        # A batch of packed documents carries them to the model (PackedBatch's fields).
        packed = ({"position_ids": batch.position_ids, "cu_seqlens": batch.cu_seqlens}
                  if hasattr(batch, "cu_seqlens") else {})
        scored = y != IGNORE_INDEX
        if lengths is not None:
            nbytes = lengths[y.clamp(min=0)].masked_fill(~scored, 0)
            text = nbytes > 0
            counts[1] += nbytes.sum()
        else:
            text = scored
        loss_sums += score(x, y, text, **packed)
        counts[0] += scored.sum()
        windows += x.shape[0]
        if progress is not None:
            progress(x.shape[0])
    return loss_sums, counts, windows


def _endless(loader: Any) -> bool:
    """Whether the loader's sampler never ends an epoch (training windows, packed training rows)."""
    for sampler in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        per_epoch = getattr(sampler, "batches_per_epoch", None)
        if callable(per_epoch) and per_epoch() == math.inf:
            return True
    return False


def evaluate(model: torch.nn.Module, loader: Iterable[Any], device: str | torch.device | None = None,
             token_bytes: np.ndarray | None = None, progress: Any = None,
             max_batches: int | None = None) -> dict[str, Any]:
    """Loss, ppl, bits per token and per byte over every scored label the loader yields.

    ``model`` may return logits, ``(logits, loss)`` or an object with ``.logits``. Sums stay on
    the device and are read once at the end (after one all-reduce under torch.distributed), so
    the loop never waits on the host (but for one wait a batch with a nanoGPT-style model, to pick
    out its few end-of-text targets: see ``_own_loss``). ``token_bytes`` (bytes per token id) defaults to the
    encoding in meta.json beside the loader's files; without it, bits_per_byte is None.

    Two conventions: ``loss`` (and ppl, bits_per_token) is the mean over every scored target,
    end-of-text targets included, as a trainer's loss is; ``bits_per_byte`` sums the loss over text
    targets only and divides by their UTF-8 bytes, special tokens counting 0 bytes (nanochat's
    ``evaluate_bpb``), so that it compares across tokenizers.
    ``progress`` is called with each batch size. ``max_batches`` stops after that many batches;
    without it an endless loader (training windows) is refused, since the sweep would never end.
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches={max_batches} must be at least 1, or None for the whole loader")
    if max_batches is None and _endless(loader):
        raise ValueError("evaluate needs a finite loader, and this one's sampler is endless (training windows or "
                         "rows); build it with stride=, as TokenWindows(path, T, stride=T) or PackedDocuments(path, "
                         "T, rows=EvalRows(T)), or pass max_batches=")
    device = torch.device(device) if device is not None else next(model.parameters(), torch.empty(0)).device
    if token_bytes is None:
        token_bytes = _byte_lengths_for(loader)
    _check_ids(model, loader, token_bytes)
    lengths = torch.from_numpy(token_bytes).to(device) if token_bytes is not None else None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            batches = itertools.islice(_on_device(loader, device), max_batches)
            loss_sums, counts, windows = _sums(_scorer(model), batches, device, lengths, progress)
    finally:
        model.train(was_training)
    sums = torch.cat([loss_sums, counts.double(), torch.tensor([windows], dtype=torch.float64, device=device)])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # One all-reduce after the loop: a rank with fewer windows just arrives earlier, never hangs.
        reduced = sums if torch.distributed.get_backend() == "nccl" else sums.cpu()
        torch.distributed.all_reduce(reduced)
        sums = reduced
    loss_sum, text_loss_sum, tokens, nbytes, n_windows = sums.cpu().tolist()
    if tokens == 0:
        raise ValueError("the loader yielded no scored tokens; check the split and the block size")
    loss = loss_sum / tokens
    return {
        "loss": loss,
        "ppl": math.exp(loss),
        "bits_per_token": loss / math.log(2),
        "bits_per_byte": text_loss_sum / math.log(2) / nbytes if lengths is not None and nbytes else None,
        "tokens": int(tokens),
        "windows": int(n_windows),
    }


def _models(splits: dict[str, Split], checkpoints: Sequence[str], baselines: Sequence[str], add_k: float,
            device: str, hf_models: Sequence[str] = (), llmc_models: Sequence[str] = ()
            ) -> Iterator[tuple[str, torch.nn.Module, int | None]]:
    """(name, model, its block size or None) for every checkpoint and baseline asked for, loaded one
    at a time; other trainers' models only after their tokenizer is found to be the folder's encoding."""
    from .models.checkpoints import check_llmc_tokenizer, load_hf, load_llmc
    from .models import NGram, load_gpt

    meta = splits["train"].meta
    assert meta is not None
    n_vocab = meta["encoding"]["n_vocab"]
    for path in checkpoints:
        model, _ = load_gpt(path, device)
        if model.config.vocab_size < n_vocab:
            raise ValueError(f"checkpoint {path} has vocab_size {model.config.vocab_size} but {splits['train'].folder} "
                             f"uses {meta['encoding']['name']} with n_vocab {n_vocab}; evaluate it on data of its "
                             "own encoding")
        yield Path(path).name, model, model.config.block_size
    ours = folder_encoding(meta) if llmc_models or hf_models else None  # what their tokenizers must be
    for path in llmc_models:
        model = load_llmc(path, device)
        check_llmc_tokenizer(path, model, ours)  # type: ignore[arg-type]
        yield Path(path).name, model, model.config.block_size
    for path in hf_models:
        hf, block = load_hf(path, ours, device)  # type: ignore[arg-type]
        yield Path(path).name, hf, block or None
    for name in baselines:
        order = {"unigram": 1, "bigram": 2}[name]
        yield name, NGram(splits["train"], n_vocab, order, add_k), None


def sweep(folder: str | Path, checkpoints: Sequence[str] = (), baselines: Sequence[str] = (), split: str = "val",
          block_size: int | None = None, strides: Sequence[int] | None = None, batch_size: int = 4,
          add_k: float = 0.01, device: str = "cpu", quiet: bool = False,
          documents: bool = False, hf_models: Sequence[str] = (), llmc_models: Sequence[str] = ()
          ) -> list[dict[str, Any]]:
    """One result row per (model, stride), and with ``documents`` a second one scoring each
    document alone (packed rows with a document mask, ``PackedDocuments(rows=EvalRows(S))``).

    Args:
        checkpoints: scripts/train_gpt.py's or nanoGPT's checkpoints.
        hf_models: local Hugging Face causal LM folders (``tokpack.models.checkpoints.load_hf``).
        llmc_models: llm.c GPT-2 checkpoints (``tokpack.models.checkpoints.load_llmc``).
    """
    splits = open_splits(folder)
    if split not in splits:
        raise ValueError(f"split {split!r} is not in {folder}; choose one of {', '.join(splits)}")
    if not checkpoints and not baselines and not hf_models and not llmc_models:
        raise ValueError("nothing to evaluate; pass --checkpoint CKPT, --hf-model DIR, --llmc-model FILE or "
                         "--model bigram")
    meta = splits[split].meta
    assert meta is not None
    token_bytes = token_byte_lengths(meta)
    rank = rank_world()[0]
    rows = []
    from tqdm import tqdm

    for name, model, model_block in _models(splits, checkpoints, baselines, add_k, device, hf_models, llmc_models):
        T = block_size if block_size is not None else model_block or 256
        if T < 1:
            raise ValueError(f"--block-size {T} must be at least 1")
        if model_block is not None and T > model_block:
            raise ValueError(f"--block-size {T} is longer than {name}'s block size {model_block}; "
                             f"use --block-size {model_block} or less")
        for S in strides or [T]:
            scopes = {"stream": TokenWindows(splits[split], T, stride=S)}
            if documents:
                scopes["documents"] = PackedDocuments(splits[split], T, rows=EvalRows(S))
            for scope, dataset in scopes.items():
                loader = build_loader(dataset, batch_size)
                with tqdm(total=len(loader), unit="batch", desc=f"{name} T={T} S={S} {scope}",
                          disable=quiet or rank != 0, file=sys.stderr, leave=False) as bar:
                    result = evaluate(model, loader, device, token_bytes, progress=lambda _: bar.update())
                rows.append({"model": name, "split": split, "block_size": T, "stride": S, "scope": scope, **result})
    return rows


def draw_run(run_dir: str | Path, path: str | Path, device: str = "cpu") -> dict[str, Any]:
    """Draw a run's losses into ``path``: the train loss of every step (ranks merged), the val loss
    of every evaluation in ``ckpt.pt``, and the bigram and unigram baselines as lines.

    Returns {"train": {step: loss}, "val": {step: loss}, "baselines": {name: loss}}: what was drawn.
    """
    from .models import load_gpt
    from .plot import plot_losses, png_path, read_losses, run_folder

    run_dir = run_folder(run_dir)
    png_path(path)  # a missing extra or a bad name is one line before the work
    train = read_losses(run_dir)
    model, ckpt = load_gpt(run_dir / "ckpt.pt", device)
    val = {int(e["step"]): float(e["loss"]) for e in ckpt.get("evals", []) if "scope" not in e}
    data_dir = ckpt.get("config", {}).get("data_dir")
    if not isinstance(data_dir, str):
        raise ValueError(f"{run_dir / 'ckpt.pt'} names no data_dir in its config; pass a scripts/train_gpt.py run")
    rows = sweep(data_dir, baselines=["bigram", "unigram"], block_size=model.config.block_size, quiet=True)
    baselines = {row["model"]: row["loss"] for row in rows}
    plot_losses(train, val, baselines, path,
                f"{run_dir}: {model.num_params():,} parameters, block size {model.config.block_size}")
    return {"train": train, "val": val, "baselines": baselines}


def describe_losses(drawn: dict[str, Any]) -> str:
    """One line of what ``draw_run`` drew: the last val loss and the baselines."""
    val = drawn["val"]
    last = f", val {val[max(val)]:.4f} at step {max(val)}" if val else ""
    base = ", ".join(f"{name} {loss:.4f}" for name, loss in drawn["baselines"].items())
    return f"{max(drawn['train'], default=0)} steps{last}; baselines {base}"


def _guarded(folder: str) -> str:
    """How the folder's val was guarded, beside its losses: what the number can be compared with."""
    from .format import describe_guard
    from .storage.folder import as_folder, published

    return f"{folder}: {describe_guard(published(as_folder(folder))[0])}"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("evaluate", __doc__)
    p.add_argument("folder", help="a folder written by python -m tokpack.prepare")
    p.add_argument("--checkpoint", action="append", default=[],
                   help="a checkpoint of scripts/train_gpt.py or nanoGPT's train.py; repeatable")
    p.add_argument("--hf-model", action="append", default=[], metavar="DIR",
                   help="a local Hugging Face causal LM folder with its tokenizer.json (needs transformers); repeatable")
    p.add_argument("--llmc-model", action="append", default=[], metavar="FILE",
                   help="an llm.c GPT-2 checkpoint (gpt2_124M.bin); repeatable")
    p.add_argument("--model", action="append", default=[], choices=["bigram", "unigram"],
                   help="an add-k n-gram baseline estimated from train.bin; repeatable")
    p.add_argument("--split", default="val", help="split to score (default: val)")
    p.add_argument("--block-size", type=int, help="window length T (default: the checkpoint's, 256 for baselines)")
    p.add_argument("--stride", type=int, nargs="+", help="strides S <= T to sweep (default: T, no overlap)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per batch (default: 4)")
    p.add_argument("--add-k", type=float, default=0.01, help="n-gram smoothing constant (default: 0.01)")
    p.add_argument("--device", default="auto", help="device (default: auto, cuda when present, else cpu)")
    p.add_argument("--documents", action="store_true",
                   help="also score each document alone: packed rows, document-masked attention (default: off)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    p.add_argument("--plot", help="also draw loss and bits/byte against stride into this PNG (needs tokpack[plot])")
    args = p.parse_args(argv)

    def body() -> int:
        if args.plot:
            from .plot import png_path

            png_path(args.plot)  # a missing extra or a bad name is one line before the sweep, not after it
        with process_group(args.device) as place:
            rows = sweep(args.folder, args.checkpoint, args.model, args.split, args.block_size, args.stride,
                         args.batch_size, args.add_k, place.device, args.quiet, args.documents, args.hf_model,
                         args.llmc_model)
        if place.leader:
            print(table(rows, ["model", "split", "block_size", "stride", "scope", "loss", "ppl", "bits_per_token",
                               "bits_per_byte", "tokens", "windows"]))
            print(_guarded(args.folder))
            if args.plot:
                from .plot import plot_sweep

                plot_sweep(rows, args.plot)
            print(json.dumps(rows))
        return 0

    return run_cli(body)

