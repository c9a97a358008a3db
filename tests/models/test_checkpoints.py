"""Other trainers' checkpoints scored exactly: llm.c's GPT-2 files (written here by llm.c's rule) and
a real Hugging Face causal LM saved locally, each refused unless its tokenizer is the folder's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch.nn import functional as F

import tokpack
from helpers import cli_run, make_docs, prepare_docs, write_llmc_model, write_llmc_tokenizer
from tokpack.models.checkpoints import load_llmc
from tokpack.data.loader import build_loader
from tokpack.data.layouts import EvalRows
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows
from tokpack.evaluation import main, sweep
from tokpack.models import GPT, GPTConfig
from tokpack.split import open_split, read_index

T = 32


def _gpt(gelu: str = "tanh") -> GPT:
    return GPT(GPTConfig(vocab_size=50257, block_size=T, n_layer=1, n_head=2, n_embd=16, gelu=gelu), seed=3)


def _cli(capsys, *argv) -> tuple[int, str]:
    return cli_run(main, capsys, *argv, "--quiet")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_llmc_checkpoint_scores_as_the_gpt_it_was_written_from(prepared, tmp_path, dtype):
    model = _gpt()
    mlp = model.transformer.h[0].mlp
    with torch.no_grad():  # GELU inputs of order one, where the tanh approximation and the exact GELU part
        mlp.c_fc.weight.mul_(100)
    seen = []
    hook = mlp.c_fc.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    model(torch.from_numpy(open_split(prepared, "val").open()[0][:T].astype("int64"))[None])
    hook.remove()
    # The premise: on this model's own GELU inputs the two GELUs give other numbers.
    assert (F.gelu(seen[0]) - F.gelu(seen[0], approximate="tanh")).abs().max() > 1e-4
    path = write_llmc_model(model, tmp_path / "gpt2_124M.bin", dtype)
    if dtype == "bfloat16":  # the file holds the weights rounded; the reference is rounded the same way
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    [row] = sweep(prepared, llmc_models=[str(path)], quiet=True)
    expected = tokpack.evaluate(model, build_loader(TokenWindows(prepared, T, split="val", stride=T), 4))
    assert row["block_size"] == T and row["tokens"] == expected["tokens"] > 0
    assert row["loss"] == expected["loss"] and row["bits_per_byte"] == expected["bits_per_byte"]
    exact_gelu = _gpt("none")
    exact_gelu.load_state_dict(model.state_dict())
    assert tokpack.evaluate(exact_gelu, build_loader(TokenWindows(prepared, T, split="val", stride=T), 4))[
        "loss"] != row["loss"]  # llm.c's tanh GELU is what was loaded, not the exact one


def test_llmcs_tokenizer_file_beside_the_model_is_compared_token_by_token(prepared, tmp_path, capsys):
    path = write_llmc_model(_gpt(), tmp_path / "gpt2_124M.bin")
    write_llmc_tokenizer(tokpack.load_encoding("gpt2").library, tmp_path / "gpt2_tokenizer.bin")
    assert _cli(capsys, prepared, "--llmc-model", path)[0] == 0
    raw = bytearray((tmp_path / "gpt2_tokenizer.bin").read_bytes())
    raw[1024 + 1] ^= 1  # token 0's one byte, "!", becomes another
    (tmp_path / "gpt2_tokenizer.bin").write_bytes(bytes(raw))
    code, err = _cli(capsys, prepared, "--llmc-model", path)
    assert code == 2 and "spells token 0" in err and "\n" not in err, err


LLMC_BAD = [  # (the fragment of the one line, how the file is spoiled)
    ("is shorter than llm.c's 1024-byte header", lambda raw: raw[:100]),
    ("not llm.c's llm.c model magic", lambda raw: b"\0" * 4 + raw[4:]),
    ("is llm.c checkpoint version 4", lambda raw: raw[:4] + (4).to_bytes(4, "little") + raw[8:]),
    ("which is no GPT-2", lambda raw: raw[:24] + (7).to_bytes(4, "little") + raw[28:]),  # 7 channels, 2 heads
    ("where its header's shapes take", lambda raw: raw[:-4]),
    ("where its header's shapes take", lambda raw: raw[:16] + (10**9).to_bytes(4, "little") + raw[20:]),  # layers
]


@pytest.mark.parametrize("fragment, spoil", LLMC_BAD)
def test_spoiled_llmc_checkpoints_are_one_line(prepared, tmp_path, capsys, fragment, spoil):
    path = write_llmc_model(_gpt(), tmp_path / "model.bin")
    path.write_bytes(spoil(path.read_bytes()))
    code, err = _cli(capsys, prepared, "--llmc-model", path)
    assert code == 2 and fragment in err and "\n" not in err, err


def test_an_llmc_checkpoint_path_that_is_a_folder_is_one_line(prepared, tmp_path, capsys):
    code, err = _cli(capsys, prepared, "--llmc-model", tmp_path)
    assert code == 2 and f"{tmp_path} is a folder; " in err and "Errno" not in err and "\n" not in err, err


# -- Hugging Face -----------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _tokenizer(folder, seed_words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(make_docs(40, words=seed_words), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """A folder prepared with a byte-level BPE, and a tiny random Llama saved beside its tokenizer."""
    root = tmp_path_factory.mktemp("hf")
    tokenizer = _tokenizer(root / "tok", 60)
    data = prepare_docs(root, make_docs(30, words=25), encoding=str(tokenizer), val_fraction=0.4)
    n_vocab = json.loads((data / "meta.json").read_text())["encoding"]["n_vocab"]
    config = transformers.LlamaConfig(vocab_size=n_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)  # transformers initialises from the global generator; the test only needs some weights
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "model")
    shutil.copy(tokenizer, root / "model" / "tokenizer.json")
    return data, root / "model"


def test_a_hugging_face_model_is_scored_as_its_own_logits_say(hf_pair):
    data, folder = hf_pair
    [row] = sweep(data, hf_models=[str(folder)], block_size=64, quiet=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    total = count = 0
    with torch.no_grad():
        for x, y in build_loader(TokenWindows(data, 64, split="val", stride=64), 4):
            logits = model(x, use_cache=False).logits.double()
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum").item()
            count += int((y != -100).sum())
    assert row["tokens"] == count > 0 and row["loss"] == pytest.approx(total / count, rel=1e-6)


def test_a_hugging_face_model_scores_each_document_alone_on_packed_rows(hf_pair):
    data, folder = hf_pair
    rows = sweep(data, hf_models=[str(folder)], block_size=128, documents=True, quiet=True)
    documents = next(r for r in rows if r["scope"] == "documents")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    split = open_split(data, "val")
    tokens, starts = split.open()[0], read_index(split)
    bos = json.loads((data / "meta.json").read_text())["encoding"]["eot_id"]
    total = count = 0
    with torch.no_grad():
        for s, e in zip(starts, [*starts[1:], len(tokens)]):
            seq = torch.tensor([bos, *tokens[s:e].tolist()])[None]
            assert seq.shape[1] <= 129  # each document is whole in one row
            logits = model(seq[:, :-1], use_cache=False).logits.double()
            total += F.cross_entropy(logits[0], seq[0, 1:], reduction="sum").item()
            count += seq.shape[1] - 1
    assert documents["tokens"] == count and documents["loss"] == pytest.approx(total / count, rel=1e-5)


def test_a_model_that_attends_across_documents_given_position_ids_is_refused(prepared):
    class Unmasked(torch.nn.Module):  # takes position ids and use_cache, as Hugging Face's do, but ignores them
        def __init__(self):
            super().__init__()
            self.gpt = GPT(GPTConfig(vocab_size=50304, block_size=T, n_layer=1, n_head=2, n_embd=16))

        def forward(self, input_ids, position_ids=None, use_cache=None):
            return self.gpt(input_ids)

    loader = build_loader(PackedDocuments(prepared, T, split="val", rows=EvalRows(T)), 4)
    with pytest.raises(ValueError, match="attends across documents when given position ids alone"):
        tokpack.evaluate(Unmasked(), loader)


def test_a_hugging_face_models_tokenizer_must_be_the_folders(hf_pair, tmp_path, capsys):
    data, folder = hf_pair
    other = shutil.copytree(folder, tmp_path / "other")
    _tokenizer(other, 30)  # another training: another vocabulary
    code, err = _cli(capsys, data, "--hf-model", other)
    assert code == 2 and "the folder's tok" in err and "model's own tokenizer" in err and "\n" not in err, err
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same size and specials, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(spec))
    code, err = _cli(capsys, data, "--hf-model", other)
    assert code == 2 and "spells token 300" in err and "\n" not in err, err
    (other / "tokenizer.json").unlink()
    code, err = _cli(capsys, data, "--hf-model", other)
    assert code == 2 and "has no tokenizer.json" in err, err
    code, err = _cli(capsys, data, "--hf-model", tmp_path)
    assert code == 2 and "is not a Hugging Face model folder" in err, err
    code, err = _cli(capsys, data, "--llmc-model", write_llmc_model(_gpt(), tmp_path / "m.bin"))
    assert code == 2 and "not gpt2" in err, err


class _Payload:
    """What a hostile pickle carries: a call made when it is unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _config_edit(**changes):
    def spoil(folder, tmp_path):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return spoil


def _pickled(folder, tmp_path):
    (folder / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": torch.zeros(3), "x": _Payload(tmp_path / "ran")},
               folder / "pytorch_model.bin")


def _truncated(folder, tmp_path):
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[:-100])


def _index_out_of_the_folder(folder, tmp_path):
    (folder / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "../outside.safetensors"}}))


HF_BAD = {  # the fragment of the one line -> how the model folder is spoiled
    "does not load as weights alone": _pickled,
    "weights do not fill the model its config.json describes": _config_edit(intermediate_size=96),
    "gives vocab_size 2147483648, outside 1..16,777,216": _config_edit(vocab_size=2**31),
    "gives num_hidden_layers 100000, outside 1..4,096": _config_edit(num_hidden_layers=100_000),
    "gives 3 layers, its weights hold 1": _config_edit(num_hidden_layers=3),
    "gives hidden_size 48, and no tensor of its weights has that size": _config_edit(hidden_size=48),
    "it is cut short": _truncated,
    "names that are not plain file names": _index_out_of_the_folder,
    "is JSON nested too deeply": lambda folder, _: (folder / "config.json").write_bytes(b"[" * 200_000),
}


@pytest.mark.parametrize("fragment", list(HF_BAD))
def test_spoiled_hugging_face_models_are_one_line_before_anything_is_built(hf_pair, tmp_path, capsys, fragment):
    data, folder = hf_pair
    spoiled = shutil.copytree(folder, tmp_path / "model")
    HF_BAD[fragment](spoiled, tmp_path)
    code, err = _cli(capsys, data, "--hf-model", spoiled)
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "ran").exists()  # the pickle's payload never ran


def test_load_llmc_needs_no_tokenizer_to_build_the_model(tmp_path):
    model = load_llmc(write_llmc_model(_gpt(), tmp_path / "m.bin"))
    assert model.config.gelu == "tanh" and model.config.vocab_size == 50257 and not model.training
