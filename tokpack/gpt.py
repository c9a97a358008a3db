"""Models that ``tokpack.evaluate`` and ``scripts/train_gpt.py`` share: a small GPT and n-gram baselines.

    python scripts/train_gpt.py --config configs/train_sample.toml     # trains GPT, writes checkpoints
    python -m tokpack.evaluate data/sample --model bigram               # the n-gram baselines

Every model maps token ids (B, T) to logits (B, T, V). The GPT follows the usual pre-norm
transformer layout (causal self-attention, GELU MLP, tied embedding and head); its weights are
initialised from an explicit ``torch.Generator``, never the global RNG. The n-gram models return
log-probabilities, which cross-entropy scores exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .format import open_tokens


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        if c.n_embd % c.n_head:
            raise ValueError(f"n_embd {c.n_embd} is not divisible by n_head {c.n_head}; change one of them")
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = nn.Linear(c.n_embd, c.n_embd)
        self.n_head, self.dropout = c.n_head, c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c.n_embd), SelfAttention(c)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd),
                                 nn.Dropout(c.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer: ids (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, config: GPTConfig, seed: int = 0):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            # Residual projections are scaled down with depth (GPT-2's initialisation).
            std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
            nn.init.normal_(p, 0.0, std, generator=g)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than the model's block_size {self.config.block_size}")
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied head

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_gpt(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, dict[str, Any]]:
    """A GPT and its checkpoint dict from a file written by scripts/train_gpt.py."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; train one with scripts/train_gpt.py")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:  # torch.load raises many types for a file that is not a checkpoint
        raise ValueError(f"{path} is not a tokpack GPT checkpoint ({type(exc).__name__}); "
                         "pass a file written by scripts/train_gpt.py") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a tokpack GPT checkpoint (no 'model' and 'model_args'); "
                         "pass a file written by scripts/train_gpt.py")
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device), ckpt


def gpt_checkpoint(model: nn.Module, **extra: Any) -> dict[str, Any]:
    raw = getattr(model, "module", model)  # unwrap DDP
    return {"model": raw.state_dict(), "model_args": asdict(raw.config), **extra}


class NGram(nn.Module):
    """Add-k smoothed unigram (order 1) or bigram (order 2) model estimated from a token file.

    Its logits are float64 log-probabilities, so the evaluation's cross-entropy is exact.
    """

    def __init__(self, train_path: str | Path, vocab_size: int, order: int = 2, add_k: float = 0.01):
        super().__init__()
        if order not in (1, 2):
            raise ValueError(f"order {order} is not 1 (unigram) or 2 (bigram)")
        if add_k <= 0:
            raise ValueError(f"add_k {add_k} must be positive so that no token has probability 0")
        tokens = np.asarray(open_tokens(train_path), dtype=np.int64)
        self.order, self.vocab_size, self.add_k = order, vocab_size, add_k
        unigram = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
        self.unigram_logp = torch.from_numpy(np.log((unigram + add_k) / (unigram.sum() + add_k * vocab_size)))
        if order == 2:
            pairs, counts = np.unique(tokens[:-1] * vocab_size + tokens[1:], return_counts=True)
            self.prev, self.next = pairs // vocab_size, pairs % vocab_size
            self.counts = counts.astype(np.float64)
            self.starts = np.searchsorted(self.prev, np.arange(vocab_size + 1))
            self.row_total = np.bincount(self.prev, weights=self.counts, minlength=vocab_size)

    def log_prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """log p(next | prev) straight from the counts, for checking the model's logits."""
        if self.order == 1:
            return self.unigram_logp.numpy()[nxt]
        key = prev * self.vocab_size + nxt
        pos = np.clip(np.searchsorted(self.prev * self.vocab_size + self.next, key), 0, len(self.prev) - 1)
        seen = (self.prev[pos] == prev) & (self.next[pos] == nxt)
        count = np.where(seen, self.counts[pos], 0.0)
        return np.log((count + self.add_k) / (self.row_total[prev] + self.add_k * self.vocab_size))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        V, k = self.vocab_size, self.add_k
        if self.order == 1:
            return self.unigram_logp.expand(B, T, V).to(idx.device)
        flat = idx.reshape(-1).cpu().numpy()
        denom = self.row_total[flat] + k * V
        out = torch.from_numpy(np.log(k / denom))[:, None].repeat(1, V)
        for prev in np.unique(flat):
            lo, hi = self.starts[prev], self.starts[prev + 1]
            if lo == hi:
                continue
            rows = torch.from_numpy(np.flatnonzero(flat == prev))
            values = torch.from_numpy(np.log((self.counts[lo:hi] + k) / (self.row_total[prev] + k * V)))
            out[rows[:, None], torch.from_numpy(self.next[lo:hi])[None, :]] = values
        return out.view(B, T, V).to(idx.device)
