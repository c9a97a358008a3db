"""Checkpoints of other trainers, scored as tokpack's own: llm.c's GPT-2 files and local Hugging Face models.

    python -m tokpack.evaluate data/sample --llmc-model gpt2_124M.bin
    python -m tokpack.evaluate data/sample --hf-model path/to/model       # pip install transformers

A model's tokenizer must be the folder's, or every number is wrong with nothing to show it: each
loader here checks it against the folder's encoding, id by id (every token's bytes, the special
ids), and refuses a difference in one line. llm.c: the ``gpt2_tokenizer.bin`` that llm.c writes
beside its checkpoints, or where there is none, the folder's encoding must be GPT-2's itself (the
only vocabulary of llm.c's GPT-2 files). Hugging Face: the model folder's ``tokenizer.json``.
Nothing is unpickled: llm.c's files are raw arrays, Hugging Face's are read offline, with no
remote code, by transformers' weights-only loading.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import GPT, GPTConfig
from ..tokenizer import Encoder, load_encoding
from ..tokenizer.vocab import read_file

LLMC_MODEL_MAGIC = 20240326
LLMC_TOKENIZER_MAGIC = 20240328
LLMC_VERSIONS = {3: np.dtype("<f4"), 5: np.dtype("<u2")}  # float32, bfloat16 (read as its bit pattern)
LLMC_HEADER_WORDS = 256
LLMC_TOKENIZER = "gpt2_tokenizer.bin"
MAX_MODEL_BYTES = 1 << 40  # no real checkpoint comes near; a forged header may claim anything


def _llmc_shapes(L: int, C: int, Vp: int, maxT: int) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors of an llm.c GPT-2 file in their order, as nanoGPT names them (layers stacked)."""
    per_layer = [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (3 * C, C)),
                 ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                 ("ln_2.weight", (C,)), ("ln_2.bias", (C,)), ("mlp.c_fc.weight", (4 * C, C)),
                 ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (C, 4 * C)), ("mlp.c_proj.bias", (C,))]
    return ([("transformer.wte.weight", (Vp, C)), ("transformer.wpe.weight", (maxT, C))]
            + [(f"h.{name}", (L, *shape)) for name, shape in per_layer]
            + [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))])


def _header(path: Path, magic: int, what: str, fix: str, limit: int | None) -> tuple[np.ndarray, bytes]:
    raw = read_file(path, what, fix, limit)
    if len(raw) < LLMC_HEADER_WORDS * 4:
        raise ValueError(f"{path} is shorter than llm.c's {LLMC_HEADER_WORDS * 4}-byte header; {fix}")
    header = np.frombuffer(raw[:LLMC_HEADER_WORDS * 4], dtype="<i4")
    if header[0] != magic:
        raise ValueError(f"{path} starts with {int(header[0])}, not llm.c's {what} magic {magic}; {fix}")
    return header, raw


def load_llmc(path: str | Path, device: str | torch.device = "cpu") -> GPT:
    """A GPT from llm.c's GPT-2 checkpoint (``write_model``: version 3 float32 or 5 bfloat16, the
    vocabulary padded), with llm.c's tanh GELU, so it computes what llm.c computes."""
    path = Path(path)
    fix = "pass a GPT-2 checkpoint written by llm.c (gpt2_124M.bin, or one of its training runs)"
    header, raw = _header(path, LLMC_MODEL_MAGIC, "llm.c model", fix, MAX_MODEL_BYTES)
    version, maxT, V, L, NH, C, Vp = (int(v) for v in header[1:8])
    if version not in LLMC_VERSIONS:
        raise ValueError(f"{path} is llm.c checkpoint version {version}; tokpack reads versions "
                         f"{', '.join(map(str, LLMC_VERSIONS))} (GPT-2, float32 or bfloat16); {fix}")
    if min(maxT, V, L, NH, C) < 1 or C % NH or not V <= Vp:
        raise ValueError(f"{path} declares block {maxT}, vocab {V} (padded {Vp}), {L} layers, {NH} heads, {C} "
                         f"channels, which is no GPT-2; {fix}")
    dtype, shapes = LLMC_VERSIONS[version], _llmc_shapes(L, C, Vp, maxT)
    sizes = [int(np.prod(shape)) for _, shape in shapes]
    if len(raw) != LLMC_HEADER_WORDS * 4 + sum(sizes) * dtype.itemsize:
        raise ValueError(f"{path} is {len(raw):,} bytes where its header's shapes take "
                         f"{LLMC_HEADER_WORDS * 4 + sum(sizes) * dtype.itemsize:,}; it is cut short or not llm.c's")
    flat = np.frombuffer(raw, dtype=dtype, offset=LLMC_HEADER_WORDS * 4)
    if version == 5:
        flat = (flat.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is float32's upper half
    model = GPT(GPTConfig(vocab_size=V, block_size=maxT, n_layer=L, n_head=NH, n_embd=C, bias=True, gelu="tanh"))
    state, at = {}, 0
    for (name, shape), size in zip(shapes, sizes):
        tensor = torch.from_numpy(flat[at:at + size].astype(np.float32).reshape(shape))
        at += size
        if name.startswith("h."):
            for layer in range(L):
                state[f"transformer.h.{layer}.{name[2:]}"] = tensor[layer]
        else:
            state[name] = tensor[:V] if name == "transformer.wte.weight" else tensor
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)
    return model.to(device).eval()


class LlmcVocabulary:
    """The tokens of llm.c's tokenizer file (``write_tokenizer``: version 2, each token's bytes)."""

    def __init__(self, path: Path):
        fix = "pass the gpt2_tokenizer.bin llm.c wrote with the checkpoint"
        header, raw = _header(path, LLMC_TOKENIZER_MAGIC, "llm.c tokenizer", fix, None)
        n, self.eot_token = int(header[2]), int(header[3])
        self.tokens, at = [], LLMC_HEADER_WORDS * 4
        for _ in range(n):
            if at >= len(raw) or at + 1 + raw[at] > len(raw):
                raise ValueError(f"{path} ends inside its token list; {fix}")
            self.tokens.append(raw[at + 1:at + 1 + raw[at]])
            at += 1 + raw[at]
        self.n_vocab, self.special_ids = n, frozenset([self.eot_token])

    def token_bytes(self, token: int) -> bytes:
        return self.tokens[token]


def same_tokens(theirs: Any, ours: Encoder, where: str) -> None:
    """Refuse a model whose tokenizer (``n_vocab``, ``special_ids``, ``token_bytes``) is not the
    folder's encoding: every id compared, O(vocabulary)."""
    fix = "evaluate it on a folder prepared with the model's own tokenizer (--encoding)"
    if theirs.n_vocab != ours.n_vocab or set(theirs.special_ids) != set(ours.special_ids):
        raise ValueError(f"{where} has {theirs.n_vocab} tokens (special {sorted(theirs.special_ids)}), the folder's "
                         f"{ours.name} {ours.n_vocab} (special {sorted(ours.special_ids)}); {fix}")
    for token in range(ours.n_vocab):
        if token in ours.special_ids:
            continue
        try:
            mine = ours.token_bytes(token)
        except KeyError:
            mine = None
        if theirs.token_bytes(token) != mine:
            raise ValueError(f"{where} spells token {token} {theirs.token_bytes(token)!r}, the folder's {ours.name} "
                             f"{mine!r}; {fix}")


def check_llmc_tokenizer(model_path: str | Path, model: GPT, ours: Encoder) -> None:
    """An llm.c model's vocabulary against the folder's: its tokenizer file beside it, else GPT-2's."""
    beside = Path(model_path).parent / LLMC_TOKENIZER
    if beside.is_file():
        same_tokens(LlmcVocabulary(beside), ours, str(beside))
        return
    gpt2 = load_encoding("gpt2")
    if (ours.vocab_sha256, ours.n_vocab) != (gpt2.vocab_sha256, model.config.vocab_size):
        raise ValueError(f"{model_path} is an llm.c GPT-2 model of {model.config.vocab_size} tokens, and the folder "
                         f"is {ours.name}, not gpt2; put llm.c's {LLMC_TOKENIZER} beside the model to compare, or "
                         "evaluate on a folder prepared with --encoding gpt2")


def load_hf(folder: str | Path, ours: Encoder, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, int]:
    """A local Hugging Face causal LM and its context length, after its ``tokenizer.json`` is found
    to be the folder's encoding. Offline, no remote code, weights-only."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json); pass the folder "
                                "save_pretrained wrote")
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder} has no tokenizer.json to check against the folder's encoding; save the "
                         "tokenizer with the model (tokenizer.save_pretrained)")
    same_tokens(load_encoding(str(folder / "tokenizer.json")), ours, str(folder / "tokenizer.json"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never a download
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ValueError(f"--hf-model {folder} needs transformers; pip install transformers") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{folder} does not load as a causal language model ({first})") from None
    config = model.config
    block = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if getattr(config, "vocab_size", ours.n_vocab) < ours.n_vocab:
        raise ValueError(f"{folder} has vocab_size {config.vocab_size}, fewer than the folder's {ours.n_vocab} ids")
    return model.to(device).eval(), int(block) if block else 0
