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

See docs/clients.md.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import GPT, GPTConfig
from ..tokenizer import Encoder, load_encoding
from ..format import load_json
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
    check_hf_sizes(folder)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never a download
    try:
        import transformers
    except ImportError:
        raise ValueError(f"--hf-model {folder} needs transformers; pip install transformers") from None
    verbosity, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # its load report and bars are not this command's output
    transformers.logging.disable_progress_bar()
    try:
        # Mismatched shapes are reported here, below, in tokpack's words.
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False, output_loading_info=True,
            ignore_mismatched_sizes=True)
    except Exception as exc:  # the library raises its own types (and RuntimeError) for a folder it cannot load
        raise ValueError(f"{folder} does not load as a causal language model ({_first_line(exc)})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()
    unfilled = [*info.get("missing_keys", []), *info.get("mismatched_keys", [])]
    if unfilled:
        raise ValueError(f"{folder}'s weights do not fill the model its config.json describes ({len(unfilled)} "
                         f"tensors missing or of another shape, {_first(unfilled)}); save the config with its weights")
    config = model.config
    block = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if getattr(config, "vocab_size", ours.n_vocab) < ours.n_vocab:
        raise ValueError(f"{folder} has vocab_size {config.vocab_size}, fewer than the folder's {ours.n_vocab} ids")
    return model.to(device).eval(), int(block) if block else 0


MAX_HF_LAYERS = 4096  # no causal LM comes near; a forged config may claim anything, and each layer is built
MAX_HF_WIDTH = 1 << 24  # vocabulary, hidden size: 16 M, past any real model's
MAX_HEADER_BYTES = 100 << 20  # safetensors' own bound on its JSON header
# A Hugging Face model's weights, in the order transformers looks for them; an index names shards.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_HF_SHARD = re.compile(r"[\w.-]+\.(?:safetensors|bin)")
_HF_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def _first(names: list[Any]) -> str:
    return f"{names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")


def _first_line(exc: BaseException) -> str:
    """A library's error as one line: its message's first line, or its type when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_hf_sizes(folder: Path) -> None:
    """Refuse a Hugging Face model folder whose config.json disagrees with its weights (layers,
    vocabulary, width), claims sizes past any real model's, or whose weights are cut short or
    forged, before transformers builds anything: a config of 100,000 layers would take minutes to
    build. The weights' shapes come from safetensors' JSON header, or from a weights-only memory
    map of a ``pytorch_model.bin`` (a pickle that carries code is refused, never run). O(tensors)."""
    config = load_json(read_file(folder / "config.json", "config", "pass the folder save_pretrained wrote"),
                       str(folder / "config.json"), "pass the folder save_pretrained wrote")
    if not isinstance(config, dict):
        raise ValueError(f"{folder / 'config.json'} is not a JSON object; pass the folder save_pretrained wrote")
    shapes = _hf_shapes(folder)
    sizes = {key: config.get(key) for key in ("vocab_size", "num_hidden_layers", "n_layer", "num_layers",
                                              "hidden_size", "n_embd", "d_model") if config.get(key) is not None}
    for key, value in sizes.items():
        bound = MAX_HF_LAYERS if "layer" in key else MAX_HF_WIDTH
        if type(value) is not int or not 1 <= value <= bound:
            raise ValueError(f"{folder / 'config.json'} gives {key} {value!r}, outside 1..{bound:,}; it is damaged "
                             "or not a causal language model's")
    layers = next((sizes[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in sizes), None)
    found = {int(m.group(1)) for name in shapes for m in [_HF_LAYER.search(name)] if m}
    if layers is not None and found and max(found) + 1 != layers:
        raise ValueError(f"{folder / 'config.json'} gives {layers:,} layers, its weights hold {max(found) + 1:,}; "
                         "save the config with its weights")
    for key in ("vocab_size", "hidden_size", "n_embd", "d_model"):
        if key in sizes and not any(sizes[key] in shape for shape in shapes.values()):
            raise ValueError(f"{folder / 'config.json'} gives {key} {sizes[key]:,}, and no tensor of its weights has "
                             "that size; save the config with its weights")


def _hf_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the first weights transformers would load from ``folder``."""
    fix = "save the model again with save_pretrained"
    weights = next((folder / name for name in HF_WEIGHTS if (folder / name).is_file()), None)
    if weights is None:
        raise ValueError(f"{folder} has no weights ({', '.join(HF_WEIGHTS)}); {fix}")
    files = [weights]
    if weights.name.endswith(".index.json"):
        index = load_json(read_file(weights, "weights index", fix, MAX_HEADER_BYTES), str(weights), fix)
        named = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) else []
        if not named or not all(isinstance(n, str) and _HF_SHARD.fullmatch(n) for n in named):
            raise ValueError(f"{weights} names no weight files, or names that are not plain file names; {fix}")
        files = [folder / name for name in named]
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(_safetensors_shapes(file, fix) if file.suffix == ".safetensors" else _pickle_shapes(file, fix))
    return shapes


def _safetensors_shapes(path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """The shapes a safetensors file's header declares, checked to lie inside the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"{path} is not a safetensors file (its header length {n:,} does not fit its "
                                 f"{size:,} bytes); {fix}")
            header = load_json(f.read(n), str(path), fix, MAX_HEADER_BYTES)
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror}); {fix}") from None
    shapes, end = {}, 0
    for name, tensor in (header.items() if isinstance(header, dict) else [("", None)]):
        if name == "__metadata__":
            continue
        try:
            shape, (lo, hi) = tuple(tensor["shape"]), tensor["data_offsets"]
            itemsize = _SAFETENSORS_BYTES[tensor["dtype"]]
            assert all(type(d) is int and d >= 0 for d in (*shape, lo, hi)) and hi - lo == math.prod(shape) * itemsize
        except (TypeError, KeyError, ValueError, AssertionError):
            raise ValueError(f"{path} declares tensor {name!r} with no valid shape, dtype and offsets; {fix}") from None
        shapes[name], end = shape, max(end, hi)
    if 8 + n + end != size:
        raise ValueError(f"{path} is {size:,} bytes where its header's tensors take {8 + n + end:,}: it is cut short "
                         f"or not what its header says; {fix}")
    return shapes


def _pickle_shapes(path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """The shapes of a ``pytorch_model.bin``, memory-mapped with weights-only unpickling."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # pickle's, zipfile's and torch's own types for a file it refuses
        raise ValueError(f"{path} does not load as weights alone ({_first_line(exc)[:200]}): tokpack runs no code "
                         f"from a checkpoint; {fix}, as safetensors") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"{path} holds no state dict of tensors; {fix}")
    return {name: tuple(t.shape) for name, t in state.items()}
