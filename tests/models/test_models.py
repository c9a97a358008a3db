"""The GPT's document mask: packed rows give each document the logits it gets alone."""

from __future__ import annotations

import warnings

import pytest
import torch

from tokpack.models import GPT, GPTConfig, document_ids


def _packed(seed=0, B=3, T=24):
    """Random rows cut into random segments: ids (B, T), position_ids and cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 97, (B, T), generator=g)
    bounds = sorted({0, *(torch.randint(1, B * T, (7,), generator=g).tolist()), *range(0, B * T, T)})
    cu = torch.tensor([*bounds, B * T], dtype=torch.int32)
    pos = torch.arange(B * T) - torch.repeat_interleave(cu[:-1].long(), torch.diff(cu).long())
    return x, pos.view(B, T), cu


def test_document_masked_logits_equal_each_segment_alone():
    model = GPT(GPTConfig(vocab_size=97, block_size=24, n_layer=2, n_head=2, n_embd=16), seed=1, attention="sdpa").double()
    x, pos, cu = _packed()
    assert document_ids(cu, x.shape).max() == len(cu) - 2
    with torch.no_grad():
        packed = model(x, pos, cu).reshape(-1, 97)
        flat = x.reshape(-1)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            alone = model(flat[s:e][None])[0]
            assert torch.allclose(packed[s:e], alone, rtol=1e-12, atol=1e-12)
        plain = model(x).reshape(-1, 97)
    assert not torch.allclose(plain, packed)  # without the mask, later segments see the earlier ones


def test_flex_attention_gives_the_sdpa_mask_s_logits():
    config = GPTConfig(vocab_size=97, block_size=24, n_layer=1, n_head=2, n_embd=16)
    sdpa, flex = GPT(config, seed=2, attention="sdpa"), GPT(config, seed=2, attention="flex")
    x, pos, cu = _packed(seed=4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's note that it is not compiled here
        assert torch.allclose(flex(x, pos, cu), sdpa(x, pos, cu), atol=1e-5)
    with pytest.raises(ValueError, match="attention 'xformers' is not one of auto, sdpa, flex"):
        GPT(config, attention="xformers")
