"""Models that ``tokpack.evaluate`` and ``scripts/train_gpt.py`` share: a small GPT and n-gram baselines.

    python scripts/train_gpt.py --config configs/train_sample.toml     # trains GPT, writes checkpoints
    python -m tokpack.evaluate data/sample --model bigram               # the n-gram baselines

The GPT maps token ids (B, T) to logits (B, T, V) in nanoGPT's layout and parameter names (pre-norm
causal self-attention, GELU MLP, tied embedding and head, optional biases), so nanoGPT
checkpoints load into it; its weights are initialised from an explicit ``torch.Generator``, never
the global RNG. The n-gram models give exact float64 log-probabilities of the targets.

See docs/evaluation.md.
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..options import option
from ..split import Split, open_split


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape, declared once: ``[model]`` in a training config, ``model_args`` in a checkpoint."""

    vocab_size: int = 50257
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    gelu: str = option("none", "the MLP's GELU: exact (none), or GPT-2's tanh approximation as llm.c computes it",
                       ("none", "tanh"))


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        if c.n_embd % c.n_head:
            raise ValueError(f"n_embd {c.n_embd} is not divisible by n_head {c.n_head}; change one of them")
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head, self.dropout = c.n_head, c.dropout

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if isinstance(mask, torch.Tensor) or mask is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            y = _flex_attention()(q, k, v, block_mask=mask)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU(approximate=c.gelu)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c.n_embd, bias=c.bias), SelfAttention(c)
        self.ln_2, self.mlp = nn.LayerNorm(c.n_embd, bias=c.bias), MLP(c)

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


def _flex_attention() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def document_ids(cu_seqlens: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Each token's segment, from boundaries over the flattened (B, T) tokens."""
    positions = torch.arange(shape.numel(), device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return (torch.searchsorted(cu_seqlens, positions, right=True) - 1).view(shape)


def document_mask(cu_seqlens: torch.Tensor, shape: torch.Size, attention: str = "sdpa") -> Any:
    """Block-diagonal causal attention: a token sees the earlier tokens of its own segment only.

    ``"sdpa"``: a (B, 1, T, T) boolean mask for ``scaled_dot_product_attention`` (O(B * T^2) memory,
    any device); ``"flex"``: a FlexAttention ``BlockMask``, which skips the blocks outside documents.
    """
    doc = document_ids(cu_seqlens, shape)
    if attention == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        def same_document(b: Any, h: Any, q: Any, k: Any) -> Any:
            return (q >= k) & (doc[b, q] == doc[b, k])

        return create_block_mask(same_document, shape[0], None, shape[1], shape[1], device=str(doc.device))
    causal = torch.ones(shape[1], shape[1], dtype=torch.bool, device=doc.device).tril()
    return (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]


class GPT(nn.Module):
    """A decoder-only transformer: ids (B, T) -> logits (B, T, vocab_size).

    Parameter names and layout are nanoGPT's (``transformer.h.0.attn.c_attn.weight``, ...), so its
    checkpoints load as they are; the forward contract is plain: logits for every position. Packed
    rows pass ``position_ids`` (positions restart in each document) and ``cu_seqlens`` (document
    boundaries over the flattened tokens), which makes attention block-diagonal: no token sees
    another document. ``attention`` builds that mask: ``"sdpa"`` (any device), ``"flex"``
    (FlexAttention), or ``"auto"``, flex on CUDA and SDPA elsewhere.
    """

    def __init__(self, config: GPTConfig, seed: int = 0, attention: str = "auto"):
        super().__init__()
        if attention not in ("auto", "sdpa", "flex"):
            raise ValueError(f"attention {attention!r} is not one of auto, sdpa, flex")
        if config.gelu not in ("none", "tanh"):
            raise ValueError(f"gelu {config.gelu!r} is not one of none, tanh")
        self.config, self.attention = config, attention
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied embedding and head
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            # Residual projections are scaled down with depth (GPT-2's initialisation).
            std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, 0.0, std, generator=g)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.block_size and position_ids is None:
            raise ValueError(f"sequence of {T} tokens is longer than the model's block_size {self.config.block_size}")
        t = self.transformer
        positions = torch.arange(T, device=idx.device) if position_ids is None else position_ids
        mask = None
        if cu_seqlens is not None:
            flex = self.attention == "flex" or (self.attention == "auto" and idx.is_cuda)
            mask = document_mask(cu_seqlens, idx.shape, "flex" if flex else "sdpa")
        x = t.drop(t.wte(idx) + t.wpe(positions))
        for block in t.h:
            x = block(x, mask)
        return self.lm_head(t.ln_f(x))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_gpt(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, dict[str, Any]]:
    """A GPT and its checkpoint dict, from scripts/train_gpt.py or nanoGPT's train.py.

    Both store ``model`` (a state dict) and ``model_args``; nanoGPT's ``torch.compile`` prefix
    ``_orig_mod.`` is removed, and keys a GPT does not have are refused with their names.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; train one with scripts/train_gpt.py")
    fix = "pass a checkpoint written by scripts/train_gpt.py or nanoGPT's train.py"
    try:
        # weights_only: a checkpoint is data; a pickle that names any other callable is refused
        # rather than run. Tensors, containers and numbers cover both trainers' checkpoints.
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if not found:
            raise ValueError(f"{path} is not a GPT checkpoint (UnpicklingError); {fix}") from None
        raise ValueError(f"{path} holds {found.group(1)}, which tokpack does not load (checkpoints are read with "
                         f"weights_only=True and may hold tensors, numbers, strings and containers); {fix}") from None
    except Exception as exc:  # torch.load raises many types for a file that is not a checkpoint
        raise ValueError(f"{path} is not a GPT checkpoint ({type(exc).__name__}); {fix}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict) or not isinstance(ckpt.get("model_args"), dict):
        raise ValueError(f"{path} is not a GPT checkpoint (no 'model' and 'model_args'); {fix}")
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(ckpt["model_args"]) - known)
    if unknown:
        raise ValueError(f"{path} has model_args {unknown} that a GPT does not take (it takes {sorted(known)}); {fix}")
    model = GPT(GPTConfig(**ckpt["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise ValueError(f"{path} does not fit a GPT of its model_args ({first}); {fix}") from None
    return model.to(device), ckpt


def gpt_checkpoint(model: nn.Module, **extra: Any) -> dict[str, Any]:
    raw = getattr(model, "module", model)  # unwrap DDP
    return {"model": raw.state_dict(), "model_args": asdict(raw.config), **extra}


class NGram(nn.Module):
    """Add-k smoothed unigram (order 1) or bigram (order 2) model estimated from a token file.

    Scored through ``target_log_probs``: float64 log-probabilities gathered from the counts for the
    targets alone, so the evaluation is exact and never builds (B, T, V) logits.
    """

    def __init__(self, train_path: str | Path | Sequence[str | Path] | Split, vocab_size: int, order: int = 2,
                 add_k: float = 0.01):
        """Args:
            train_path: the token files it is estimated from (see ``tokpack.split.open_split``).
            vocab_size: the encoding's n_vocab.
            order: 1 for unigram, 2 for bigram.
            add_k: the smoothing constant added to every count.
        """
        super().__init__()
        if order not in (1, 2):
            raise ValueError(f"order {order} is not 1 (unigram) or 2 (bigram)")
        if not 0 < add_k < math.inf:
            raise ValueError(f"add_k {add_k} must be a positive finite number, so that no token has probability 0 "
                             "and the counts still count")
        # Shards are counted apart: a pair never spans two files, as windows never do.
        files = [t.astype(np.int64) for t in open_split(train_path).open()]
        self.order, self.vocab_size, self.add_k = order, vocab_size, add_k
        unigram = sum(np.bincount(t, minlength=vocab_size) for t in files).astype(np.float64)
        self.unigram_logp = np.log((unigram + add_k) / (unigram.sum() + add_k * vocab_size))
        if order == 2:
            keys = np.concatenate([t[:-1] * vocab_size + t[1:] for t in files])
            self.pairs, counts = np.unique(keys, return_counts=True)
            self.counts = counts.astype(np.float64)
            self.row_total = np.bincount(self.pairs // vocab_size, weights=self.counts, minlength=vocab_size)

    def target_log_probs(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(targets[b, t] | idx[b, t]) for every position; targets < 0 (ignored) score 0's row."""
        prev, nxt = idx.cpu().numpy(), targets.clamp(min=0).cpu().numpy()
        if self.order == 1:
            out = self.unigram_logp[nxt]
        else:
            key = prev * self.vocab_size + nxt
            pos = np.minimum(np.searchsorted(self.pairs, key), len(self.pairs) - 1)
            count = np.where(self.pairs[pos] == key, self.counts[pos], 0.0)
            out = np.log((count + self.add_k) / (self.row_total[prev] + self.add_k * self.vocab_size))
        return torch.from_numpy(out).to(idx.device)
