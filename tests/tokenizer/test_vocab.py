"""Local vocabulary files read by tokpack itself: no shared cache, hostile spec files refused in
one line without their content, built-in names never hijacked, recorded paths found again."""

from __future__ import annotations

import base64
import os

import pytest

from helpers import make_docs, run_bounded, write_docs, write_gpt2_tokenizer, write_spec
from tokpack import tokenizer
from tokpack.prepare import PrepareConfig, prepare
from tokpack.tokenizer import load_encoding

def _fresh(name: str):
    tokenizer._load_encoding.cache_clear()  # as a new process would: only the files decide
    return load_encoding(name)


def test_a_replaced_vocabulary_file_is_read_again_not_served_from_tiktokens_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "shared-cache"))
    spec = write_spec(tmp_path / "tok", "mine", "r50k_base", {"<|endoftext|>": 50256})
    first = _fresh(str(spec))
    ranks = (tmp_path / "tok" / "mine.tiktoken").read_bytes().splitlines()
    swapped = [ranks[1].split()[0] + b" 0", ranks[0].split()[0] + b" 1", *ranks[2:]]  # two ranks swapped
    (tmp_path / "tok" / "mine.tiktoken").write_bytes(b"\n".join(swapped) + b"\n")
    second = _fresh(str(spec))
    assert second.vocab_sha256 != first.vocab_sha256
    assert second.encode_ordinary("!") == [1] and first.encode_ordinary("!") == [0]
    assert not (tmp_path / "shared-cache").exists()  # nothing of ours went into tiktoken's cache


def test_the_same_path_in_two_folders_gives_each_folders_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "shared-cache"))
    hashes = []
    for folder, specials in (("a", {"<|endoftext|>": 50256}), ("b", {"<|endoftext|>": 50257})):
        write_spec(tmp_path / folder, "mine", "r50k_base", specials)
        lines = (tmp_path / folder / "mine.tiktoken").read_bytes().splitlines()
        if folder == "b":
            lines.append(base64.b64encode(b"zz-new-token") + b" 50256")
        (tmp_path / folder / "mine.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
        monkeypatch.chdir(tmp_path / folder)
        hashes.append(_fresh("./mine.toml").vocab_sha256)
    assert hashes[0] != hashes[1]


@pytest.mark.parametrize("case", ["empty pattern", "pattern of nothing", "same rank twice", "same token twice",
                                  "special id 4e9", "special id 5e9", "empty ranks", "ranks link to a secret",
                                  "ranks are a fifo", "special ids twice", "a byte without a rank",
                                  "a pattern that drops text"])
def test_hostile_spec_files_are_one_line_without_file_content(tmp_path, case):
    spec = write_spec(tmp_path, "mine", "r50k_base", {"<|endoftext|>": 50256})
    ranks = tmp_path / "mine.tiktoken"
    lines = ranks.read_bytes().splitlines()
    body = spec.read_text()
    if case == "empty pattern":
        spec.write_text(body.replace('pattern = "r50k_base"', 'pattern = ""'))
    elif case == "pattern of nothing":
        spec.write_text(body.replace('pattern = "r50k_base"', 'pattern = "x*"'))
    elif case == "same rank twice":
        ranks.write_bytes(b"\n".join([*lines, base64.b64encode(b"zz-extra") + b" 7"]) + b"\n")
    elif case == "same token twice":
        ranks.write_bytes(b"\n".join([*lines, lines[7].split()[0] + b" 50300"]) + b"\n")
    elif case == "special id 4e9":
        spec.write_text(body.replace("50256", "4000000000"))
    elif case == "special id 5e9":
        spec.write_text(body.replace("50256", "5000000000"))
    elif case == "special ids twice":
        spec.write_text(body + '"<|other|>" = 50256\n')
    elif case == "empty ranks":
        ranks.write_bytes(b"")
    elif case == "a byte without a rank":  # tiktoken would fail on "z", an accelerated backend drop it
        ranks.write_bytes(b"\n".join(line for line in lines if line.split()[0] != base64.b64encode(b"z")) + b"\n")
    elif case == "a pattern that drops text":  # tiktoken leaves out what no pre-token matches
        spec.write_text(body.replace('pattern = "r50k_base"', "pattern = '\\w+'"))
    elif case == "ranks link to a secret":
        secret = tmp_path / "secret.txt"
        secret.write_text("password=hunter2\nmore\n")
        ranks.unlink()
        ranks.symlink_to(secret)
    elif case == "ranks are a fifo":
        ranks.unlink()
        os.mkfifo(ranks)
    code = ("import sys; from tokpack.cli import run_cli; from tokpack.tokenizer import load_encoding; "
            "run_cli(lambda: load_encoding(sys.argv[1]) and 0)")
    # In a fresh process, with a time limit: a panic, a hang or a loop over 4e9 ids is a failure.
    done = run_bounded(code, str(spec))
    assert done.returncode == 2, done.stderr[-2000:]
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("tokpack: ") and "hunter2" not in line, line
    assert str(tmp_path) in line


def test_a_folder_named_like_an_encoding_never_hijacks_it(tmp_path, monkeypatch):
    write_gpt2_tokenizer(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "tokenizer.json").write_text('{"model": {"type": "BPE"}, "broken": true}')
    monkeypatch.chdir(tmp_path)
    enc = _fresh("gpt2")
    assert enc.kind == "tiktoken" and enc.describe()["backend"]["name"] in ("tiktoken", "splintr")


def test_a_relative_tokenizer_path_is_recorded_absolute_and_found_from_elsewhere(tmp_path, monkeypatch):
    write_spec(tmp_path / "tok", "sw2", "r50k_base", {"<|endoftext|>": 50256})
    write_docs(tmp_path / "corpus", make_docs(30))
    monkeypatch.chdir(tmp_path)
    result = prepare(PrepareConfig(inputs=("corpus",), out_dir="out", encoding="tok/sw2.toml", quiet=True))
    assert result["options"]["encoding"] == str(tmp_path / "tok" / "sw2.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from tokpack.evaluation import token_byte_lengths
    from tokpack.format import read_meta

    assert token_byte_lengths(read_meta(tmp_path / "out")).sum() > 0
    (tmp_path / "tok" / "sw2.toml").unlink()
    tokenizer._load_encoding.cache_clear()
    with pytest.raises(FileNotFoundError, match=f"the tokenizer this folder was prepared with, "
                                                f"{tmp_path / 'tok' / 'sw2.toml'}, is gone"):
        tokenizer.folder_encoding(read_meta(tmp_path / "out"))
