"""Conversations prepared with ``--chat nanochat``: the ids and masks of nanochat's own rendering
(a faithful miniature of it), both record forms, parquet, special-token text kept as text, the
mask written, verified and shown, and every kind of bad record one line naming it (or skipped and
counted with --skip-bad)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pytest

from helpers import cli_run, make_chats, write_jsonl, write_nanochat_spec
from tokpack.bench.chat import chat_documents, gpt2_tokenizer, nanochat_render
from tokpack.chat import NANOCHAT_TOKENS, Nanochat, messages
from tokpack.chat.records import MAX_DEPTH
from tokpack.data.windows import TokenWindows
from tokpack.format import read_meta
from tokpack.inspect import describe
from tokpack.prepare import PrepareConfig, prepare
from tokpack.prepare.__main__ import main as prepare_main
from tokpack.tokenizer import load_encoding
from tokpack.verify import VerifyError, verify_folder

CHATS = make_chats(120, seed=3)


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return write_nanochat_spec(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def chat_folder(spec, tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat")
    source = write_jsonl(folder / "chats.jsonl", CHATS)
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(folder / "out"), encoding=str(spec), chat="nanochat",
                          quiet=True))
    return folder / "out"


def test_conversations_are_nanochats_rendering_with_its_masks(chat_folder, spec):
    enc = load_encoding(str(spec))
    rendered = [nanochat_render(enc, chat) for chat in CHATS]
    train, val = chat_documents(chat_folder, "train"), chat_documents(chat_folder, "val")
    assert len(train) + len(val) == len(CHATS) and train and val
    # Each split holds its conversations in input order, and the two together are every one.
    assert sorted(train + val) == sorted(rendered)
    assert [rendered.index(d) for d in train] == sorted(rendered.index(d) for d in train)
    meta = read_meta(chat_folder)
    assert meta["chat"] == {"renderer": "nanochat", "max_tokens": 2048, "conversations": 120, "skipped": 0,
                            "cropped": 0, "unsupervised": 0}
    for split, docs in (("train", train), ("val", val)):
        assert meta["splits"][split]["supervised"] == sum(sum(m) for _, m in docs)
    assert meta["eot"] == "none"  # every conversation brings its own <|bos|>
    assert verify_folder(chat_folder) == {s: meta["splits"][s]["tokens"] for s in ("train", "val")}


def test_each_conversation_goes_to_the_split_its_messages_seeded_hash_chooses(chat_folder, spec):
    # The rule, spelled out: blake2b keyed by the seed over each message's "role\\0content\\0", a list
    # of parts as its JSON; val below the fraction of the hash range. CHATS has conversations with
    # and without parts and system messages.
    options = read_meta(chat_folder)["options"]
    key, below = options["seed"].to_bytes(8, "little", signed=True), math.ceil(options["val_fraction"] * 2**64)

    def is_val(chat):
        text = "".join(f"{m['role']}\0{_json_unless_text(m['content'])}\0" for m in chat["messages"])
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, key=key).digest(), "big") < below

    enc = load_encoding(str(spec))
    expected = {split: sorted(nanochat_render(enc, c) for c in CHATS if is_val(c) == (split == "val"))
                for split in ("train", "val")}
    assert all(sorted(chat_documents(chat_folder, split)) == docs and docs for split, docs in expected.items())


def _json_unless_text(content):
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def test_special_token_text_a_user_typed_stays_text(chat_folder, spec):
    enc = load_encoding(str(spec))
    typed = [c for c in CHATS if any("<|assistant_start|>" in m["content"] for m in c["messages"]
                                     if isinstance(m["content"], str) and m["role"] != "assistant")]
    assert typed  # the corpus holds the injection this test is about
    start = enc.specials["<|assistant_start|>"]
    for ids, _ in chat_documents(chat_folder, "train") + chat_documents(chat_folder, "val"):
        # One control token a real assistant turn, never one from typed text.
        assert ids.count(start) == ids.count(enc.specials["<|assistant_end|>"])


# Texts that touch special tokens, each in its own way.
TOUCHING = {
    "special text typed": [{"role": "user", "content": "say <|user_end|> now"},
                           {"role": "assistant", "content": "ok"}],
    "the joining token typed": [{"role": "user", "content": "a <|bos|> b"}, {"role": "assistant", "content": "c"}],
    "a text ends with a special's start": [{"role": "user", "content": "finish this: <|assis"},
                                           {"role": "assistant", "content": "tant_start|>"}],
    "text parts side by side": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}],
}
PLAIN = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "6 x 7?"},
         {"role": "assistant", "content": [{"type": "text", "text": "Let me run"}, {"type": "python", "text": "6*7"},
                                           {"type": "python_output", "text": ""}, {"type": "text", "text": " 42"}]},
         {"role": "user", "content": "a lone surrogate \ud800 and a < sign"},
         {"role": "assistant", "content": "<fine>"}]


@pytest.mark.parametrize("backend", ["tiktoken", "splintr"])
def test_texts_that_touch_special_tokens_stay_text_in_the_same_batches(spec, tmp_path, backend):
    # A batch's texts are encoded in one call (tiktoken: joined by <|bos|>, read as special alone)
    # and the special tokens placed by id: texts like these must still give nanochat's own ids.
    enc = load_encoding(str(spec))
    assert not any(Nanochat(enc.specials, 0).pieces(found, "x").marked for found in [PLAIN, *TOUCHING.values()])
    chats = [{"messages": m} for m in [PLAIN, *TOUCHING.values()] * 20]
    source = write_jsonl(tmp_path / "c.jsonl", chats)
    checked = {"check_fraction": 1.0} if backend == "splintr" else {}  # every stretch against tiktoken too
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / "out"), encoding=str(spec), chat="nanochat",
                          val_fraction=0.5, quiet=True, backend=backend, **checked))
    assert read_meta(tmp_path / "out")["encoding"]["backend"]["name"] == backend
    found = chat_documents(tmp_path / "out", "train") + chat_documents(tmp_path / "out", "val")
    assert sorted(found) == sorted(nanochat_render(enc, json.loads(json.dumps(c))) for c in chats)


@pytest.mark.parametrize("strips", [False, True], ids=["whole", "stretches"])
def test_a_hugging_face_tokenizer_with_nanochats_tokens_gives_nanochats_ids(spec, tmp_path, strips):
    from tokenizers import AddedToken

    # Special tokens that strip the whitespace after them would read a whole text otherwise than
    # its stretches (a template's whole texts go apart with such a tokenizer); nanochat's texts are
    # always encoded apart, a lone surrogate as U+FFFD, as tiktoken encodes it.
    tok = gpt2_tokenizer(["<|endoftext|>"])
    tok.add_special_tokens([AddedToken(t, special=True, rstrip=strips) for t in NANOCHAT_TOKENS])
    (tmp_path / "hf").mkdir()
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    hf, tiktoken_spec = load_encoding(str(tmp_path / "hf")), load_encoding(str(spec))
    assert [hf.specials[t] for t in NANOCHAT_TOKENS] == [tiktoken_spec.specials[t] for t in NANOCHAT_TOKENS]
    assert (hf._whole is None) == strips
    # Texts that start with whitespace, which such a special token would take.
    chats = CHATS + [{"messages": [{"role": "user", "content": f" hi {i}"}, {"role": "assistant", "content": "\n ok"}]}
                     for i in range(20)] + [{"messages": m} for m in [PLAIN, *TOUCHING.values()]]
    prepare(PrepareConfig(inputs=(str(write_jsonl(tmp_path / "chats.jsonl", chats)),), out_dir=str(tmp_path / "out"),
                          encoding=str(tmp_path / "hf"), eot_token="<|bos|>", chat="nanochat", quiet=True))
    found = chat_documents(tmp_path / "out", "train") + chat_documents(tmp_path / "out", "val")
    assert sorted(found) == sorted(nanochat_render(tiktoken_spec, c) for c in chats)


def test_trl_prompt_completion_and_parquet_give_the_same_folder(spec, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    simple = [c for c in CHATS if len(c["messages"]) == 2 and isinstance(c["messages"][1]["content"], str)][:30]
    trl = [{"prompt": c["messages"][0]["content"], "completion": c["messages"][1]["content"]} for c in simple]
    pq.write_table(pa.table({"messages": [c["messages"] for c in simple]}), tmp_path / "chats.parquet",
                   row_group_size=7)
    outs = {}
    for name, source in (("messages", write_jsonl(tmp_path / "m.jsonl", simple)),
                         ("trl", write_jsonl(tmp_path / "t.jsonl", trl)), ("parquet", tmp_path / "chats.parquet")):
        prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / name), encoding=str(spec),
                              chat="nanochat", quiet=True))
        outs[name] = [(tmp_path / name / f).read_bytes() for f in ("train.bin", "train.mask", "val.bin", "val.mask")]
    assert outs["messages"] == outs["trl"] == outs["parquet"]


def test_max_tokens_cuts_and_a_conversation_left_with_nothing_to_train_on_is_left_out(spec, tmp_path):
    chats = make_chats(40, seed=5, long_every=3)
    source = write_jsonl(tmp_path / "c.jsonl", chats)
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / "out"), encoding=str(spec), chat="nanochat",
                          max_tokens=160, quiet=True))
    enc = load_encoding(str(spec))
    rendered = [nanochat_render(enc, c, max_tokens=160) for c in chats]
    kept = [r for r in rendered if any(r[1])]
    found = chat_documents(tmp_path / "out", "train") + chat_documents(tmp_path / "out", "val")
    assert sorted(found) == sorted(kept) and len(kept) < len(rendered)
    counts = read_meta(tmp_path / "out")["chat"]
    assert counts["unsupervised"] == len(rendered) - len(kept)
    cut = sum(len(nanochat_render(enc, c, 10**9)[0]) > 160 for c in chats)
    assert counts["cropped"] == cut and 0 < cut < len(chats)



def test_nanochats_tokens_in_any_order_of_ids(spec, tmp_path):
    # The mask's steps come from four of the nine tokens: here the others' ids lie above theirs.
    text = spec.read_text()
    table = text[text.index("[special_tokens]"):].splitlines()[1:]
    ids = sorted(int(line.split("=")[1]) for line in table)
    names = [line.split("=")[0].strip().strip('"') for line in table]
    order = [n for n in names if "assistant" in n or "output" in n] + [n for n in names if not ("assistant" in n
                                                                                               or "output" in n)]
    shutil.copy(spec.parent / "chat.tiktoken", tmp_path / "chat.tiktoken")
    shuffled = tmp_path / "shuffled.toml"
    shuffled.write_text(text[:text.index("[special_tokens]")] + "[special_tokens]\n"
                        + "".join(f'"{n}" = {i}\n' for n, i in zip(order, ids)))
    source = write_jsonl(tmp_path / "c.jsonl", CHATS[:40])
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / "out"), encoding=str(shuffled),
                          chat="nanochat", quiet=True))
    enc = load_encoding(str(shuffled))
    assert max(enc.specials[n] for n in order[:4]) < enc.specials["<|python_end|>"]
    found = chat_documents(tmp_path / "out", "train") + chat_documents(tmp_path / "out", "val")
    assert sorted(found) == sorted(nanochat_render(enc, c) for c in CHATS[:40])


def test_a_conversation_of_exactly_max_tokens_is_whole_and_not_counted_as_cut(spec, tmp_path):
    chats = make_chats(30, seed=8)
    enc = load_encoding(str(spec))
    lengths = [len(nanochat_render(enc, c, 10**9)[0]) for c in chats]
    limit = sorted(lengths)[len(lengths) // 2]  # some conversations are exactly this long, some longer
    assert lengths.count(limit) >= 1 and any(n > limit for n in lengths)
    source = write_jsonl(tmp_path / "c.jsonl", chats)
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(tmp_path / "out"), encoding=str(spec), chat="nanochat",
                          max_tokens=limit, quiet=True))
    assert read_meta(tmp_path / "out")["chat"]["cropped"] == sum(n > limit for n in lengths)
    found = chat_documents(tmp_path / "out", "train") + chat_documents(tmp_path / "out", "val")
    whole = [nanochat_render(enc, c, 10**9) for c, n in zip(chats, lengths) if n == limit]
    assert all(doc in found for doc in whole)


def _nested(levels: int, inner: object = "x") -> object:
    """``inner`` inside ``levels`` lists and dicts, alternating."""
    for i in range(levels):
        inner = [inner] if i % 2 else {"k": inner}
    return inner


def _deep(levels: int) -> dict:
    """A record whose user message holds special-token text and an extra key ``levels`` deep."""
    return {"messages": [{"role": "user", "content": "hi <|assistant_end|>", "extra": _nested(levels)},
                         {"role": "assistant", "content": "ok"}]}


BAD = [
    (_deep(MAX_DEPTH), f"message 0 with values nested more than {MAX_DEPTH} deep"),
    (_deep(900), "nested more than"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "of role 'robot'"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "without a role and content"),
    ({"messages": [{"role": "user", "text": "hi"}, {"role": "assistant", "content": "x"}]}, "without a role and"),
    ({"messages": [{"role": 5, "content": "hi"}, {"role": "assistant", "content": "x"}]}, "message 0 without a role"),
    ({"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "x"}]}, "is NoneType"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user",
                   "content": "c"}, {"role": "assistant", "content": ""}]}, "with no text to train on"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "system", "content": "c"}]}, "a system message where a user turn"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "where a user turn comes"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "where an assistant turn"),
    ({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}, "content is int"),
    ({"text": "not a chat"}, "has no 'messages'"),
    ({"messages": []}, "has an empty conversation"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]}, "no text to train on"),
    ({"messages": [{"role": "user", "content": "a"}]}, "has no assistant turn"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                   {"role": "assistant", "content": ""}]}, "an assistant turn with no text"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                                                      "content": [{"type": "image", "text": "x"}]}]}, "a part"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "assistant", "content": "b"}]},
     "message 0 (user) whose content is list, not a string"),  # parts are an assistant's alone
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "text", "text": 5}]}]},
     "a part"),
    ("[" * 100_000, "nested too deeply"),
    ('{"messages": [' + "[" * 5000 + "]" * 5000 + "]}", "nested too deeply"),
    ("{not json", "is not valid JSON"),
]


def test_the_turns_after_a_system_message_are_what_is_checked():
    system = {"role": "system", "content": "s"}
    quiet_user = [system, {"role": "user", "content": ""}, {"role": "assistant", "content": "b"}]
    assert messages({"messages": quiet_user}, "r") == quiet_user  # an empty user turn has nothing to train on
    calls = [system, {"role": "user", "content": "a"},
             {"role": "assistant", "content": [{"type": "python", "text": "f()"}, {"type": "python_output", "text": ""}]}]
    assert messages({"messages": calls}, "r") == calls  # a python call is trained on, as nanochat trains it
    # A key whose value is null is dropped, as transformers drops it: a template sees it undefined.
    named = messages({"messages": [{"role": "user", "content": "a", "name": None},
                                   {"role": "assistant", "content": "b", "name": "bot"}]}, "r")
    assert named == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "name": "bot"}]
    assert messages(_deep(MAX_DEPTH - 1), "r") == _deep(MAX_DEPTH - 1)["messages"]  # as deep as may be
    for empty in ("", [{"type": "python_output", "text": "42"}]):
        with pytest.raises(ValueError, match="an assistant turn with no text"):
            messages({"messages": [system, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}, {"role": "assistant", "content": empty}]}, "r")


@pytest.mark.parametrize("record,reason", BAD, ids=[r for _, r in BAD])
def test_a_bad_record_is_one_line_naming_it_or_skipped_and_counted(spec, tmp_path, capsys, record, reason):
    good = CHATS[:6]
    lines = [json.dumps(c) for c in good[:3]] + [record if isinstance(record, str) else json.dumps(record)] + \
        [json.dumps(c) for c in good[3:]]
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, err = cli_run(prepare_main, capsys, str(source), "--chat", "nanochat", "--encoding", str(spec),
                        "--out-dir", str(out), "--quiet")
    assert code == 2 and f"{source}:4 " in err and reason in err and "\n" not in err.strip(), err
    assert not out.exists()  # nothing half-written
    code, err = cli_run(prepare_main, capsys, str(source), "--chat", "nanochat", "--encoding", str(spec),
                        "--out-dir", str(out), "--quiet", "--skip-bad", "--val-fraction", "0.5")
    assert code == 0, err
    meta = read_meta(out)
    assert meta["chat"]["skipped"] == 1 and meta["chat"]["conversations"] == 6
    assert sum(info["documents"] for info in meta["splits"].values()) == 6


def test_a_tokenizer_without_nanochats_tokens_and_options_chat_cannot_take_are_one_line(tmp_path, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", CHATS[:5])
    for extra, reason in (([], "lacks <|bos|>"), (["--val-tokens", "100"], "does not take --val-tokens"),
                          (["--eot", "append"], "does not take --eot append"),
                          (["--special-text", "special"], "never lets a message's text become them")):
        code, err = cli_run(prepare_main, capsys, str(source), "--chat", "nanochat", "--out-dir", str(tmp_path / "o"),
                            "--quiet", *extra)
        assert code == 2 and reason in err and "\n" not in err.strip(), err
    code, err = cli_run(prepare_main, capsys, str(source), "--max-tokens", "9", "--out-dir", str(tmp_path / "o"))
    assert code == 2 and "--max-tokens applies to conversations" in err


def _rehash(folder, name):
    meta = json.loads((folder / "meta.json").read_text())
    data = (folder / name).read_bytes()
    for info in meta["splits"].values():
        if info["mask"]["file"] == name:
            info["mask"].update(sha256=hashlib.sha256(data).hexdigest())
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("damage,reason", [("value", "holds value 7"), ("flip", "trains on"),
                                           ("cut", "bytes but meta.json records")])
def test_verify_checks_the_mask(chat_folder, tmp_path, damage, reason):
    folder = tmp_path / "copy"
    shutil.copytree(chat_folder, folder)
    mask = bytearray((folder / "val.mask").read_bytes())
    if damage == "cut":
        del mask[-1]
    else:
        mask[3] = 7 if damage == "value" else 1 - mask[3]
    (folder / "val.mask").write_bytes(bytes(mask))
    if damage != "cut":
        _rehash(folder, "val.mask")  # consistent but wrong: only the values can tell
    with pytest.raises(VerifyError, match=reason):
        verify_folder(folder)


def test_verify_refuses_a_mask_that_trains_on_nothing_as_every_reader_does(chat_folder, tmp_path):
    from tokpack import TokenWindows

    folder = tmp_path / "copy"
    shutil.copytree(chat_folder, folder)
    (folder / "val.mask").write_bytes(bytes((folder / "val.mask").stat().st_size))
    _rehash(folder, "val.mask")
    meta = json.loads((folder / "meta.json").read_text())
    meta["splits"]["val"]["supervised"] = 0  # consistent with its count: only the reading can tell
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="holds a target its loss mask trains on"):
        TokenWindows(folder, 8, split="val")
    with pytest.raises(VerifyError, match="val split's mask in .* trains on none of its"):
        verify_folder(folder)


def test_verify_refuses_every_mask_byte_but_0_and_1(chat_folder, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(chat_folder, folder)
    mask = bytearray((folder / "val.mask").read_bytes())
    for value in range(2, 256):  # the high half too: a mask read as signed bytes would pass those
        mask[3] = value
        (folder / "val.mask").write_bytes(bytes(mask))
        _rehash(folder, "val.mask")
        with pytest.raises(VerifyError, match=f"holds value {value} near"):
            verify_folder(folder)


def test_inspect_shows_which_tokens_are_trained_on(chat_folder, tmp_path):
    text = describe(chat_folder, "train", at=0, count=300)
    line = next(line for line in text.splitlines() if line.startswith("trained on"))
    meta = read_meta(chat_folder)
    assert f"{meta['splits']['train']['supervised']:,} of" in line
    assert "\u2591" in line and line.count("\u2591") < 300  # some tokens trained on, some not
    cut = tmp_path / "cut"  # a mask shorter than meta.json records: refused, not a shorter peek
    shutil.copytree(chat_folder, cut)
    (cut / "train.mask").write_bytes((cut / "train.mask").read_bytes()[:100])
    with pytest.raises(ValueError, match="train.mask is not the"):
        describe(cut, "train", at=0, count=300)


@pytest.mark.parametrize("hostile", ["link", "named outside"])
def test_a_hostile_mask_is_refused_by_the_readers(chat_folder, tmp_path, hostile):
    folder = tmp_path / "copy"
    shutil.copytree(chat_folder, folder)
    if hostile == "link":  # the same bytes, but outside the folder: a reader never follows it
        outside = tmp_path / "outside.mask"
        shutil.move(folder / "val.mask", outside)
        (folder / "val.mask").symlink_to(outside)
        reason = "val.mask is not the plain file"
    else:
        meta = json.loads((folder / "meta.json").read_text())
        meta["splits"]["val"]["mask"]["file"] = "../outside.mask"
        (folder / "meta.json").write_text(json.dumps(meta))
        reason = "not the name of a file tokpack writes"
    with pytest.raises(ValueError, match=reason):
        TokenWindows(folder, 16, split="val")
    with pytest.raises(VerifyError):
        verify_folder(folder)
