"""The split guard, dedup and decontamination of a prepare run, read back from what it wrote."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (cli_run, kill, make_chats, make_docs, paused_at, prepare_cmd, write_jsonl, write_nanochat_spec,
                     write_spec)
from tokpack.bench.chat import chat_documents
from tokpack.format import SIGN, read_meta
from tokpack.prepare import PrepareConfig, prepare
from tokpack.prepare.__main__ import main
from tokpack.prepare import GuardOptions
from tokpack.prepare.guard.signatures import DOC, HIT
from tokpack.tokenizer import load_encoding
from tokpack.format import describe_guard
from tokpack.verify import main as verify_main, verify_folder

_SENTENCES = None


def _sentences() -> list[str]:
    global _SENTENCES
    if _SENTENCES is None:
        from pydoc_data.topics import topics

        _SENTENCES = sorted({s.strip() for t in topics.values() for s in re.split(r"(?<=[.!?])\s+", t)
                             if len(s.split()) >= 8})
    return _SENTENCES


def corpus(count: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int]]]:
    """Documents of sentences, some followed by a near copy (a word in 30 to 100 changed) or an
    exact one; and the (original, copy) pairs planted."""
    rng = random.Random(seed)
    docs, planted = [], []
    while len(docs) < count:
        docs.append(" ".join(rng.sample(_sentences(), rng.randint(4, 12))))
        if rng.random() < 0.3:
            words = docs[-1].split(" ")
            for _ in range(len(words) // rng.randint(30, 100) + 1):
                words[rng.randrange(len(words))] = "changed"
            docs.append(" ".join(words) if rng.random() < 0.7 else docs[-1])
            planted.append((len(docs) - 2, len(docs) - 1))
    return docs, planted


def grams(text: str, n: int = 5) -> set:
    w = re.findall(rb"[a-z0-9\x80-\xff]+", text.encode().lower())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)} or {tuple(w)}


def jaccard(a: str, b: str) -> float:
    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def texts(folder: Path, split: str, encoding: str = "gpt2") -> list[str]:
    """A flat folder's documents of ``split``, decoded, each without its end-of-text token."""
    meta = read_meta(folder)
    tokens = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
    starts = np.fromfile(folder / f"{split}.idx", dtype="<u8").astype(np.int64).tolist() + [len(tokens)]
    enc = load_encoding(encoding)
    return [enc.decode(tokens[a:b - 1].tolist()) for a, b in zip(starts, starts[1:])]


def run(tmp_path: Path, docs: list[str], name: str, *files: str, **guard) -> Path:
    source = write_jsonl(tmp_path / f"{name}.jsonl", [{"text": d} for d in docs])
    out = tmp_path / f"out-{name}"
    # Unguarded unless asked: each test names the guard it compares with a plain run.
    prepare(PrepareConfig(inputs=(str(source), *files), out_dir=str(out), quiet=True,
                          guard=GuardOptions(**{"near_split": False, **guard})))
    return out


def straddling(val: list[str], train: list[str], at_least: float) -> int:
    """How many (val, train) pairs are at least ``at_least`` alike, by exact Jaccard."""
    train_grams = [grams(t) for t in train]
    count = 0
    for v in val:
        x = grams(v)
        count += sum(1 for y in train_grams if len(x & y) >= at_least * len(x | y))
    return count


def test_near_split_leaves_val_no_near_copy_of_a_train_document(tmp_path):
    docs, planted = corpus(400)
    plain = run(tmp_path, docs, "plain")
    guarded = run(tmp_path, docs, "guarded", near_split=True)
    before = [texts(plain, s) for s in ("val", "train")]
    after = [texts(guarded, s) for s in ("val", "train")]
    assert straddling(*before, 0.85) > 0  # the hazard is there without the guard
    assert straddling(*after, 0.85) == 0
    assert sorted(before[0] + before[1]) == sorted(after[0] + after[1])  # moved, never dropped
    record = read_meta(guarded)["guard"]["near"]
    moved_in, moved_out = set(after[0]) - set(before[0]), set(before[0]) - set(after[0])
    assert (record["moved_to_val"], record["moved_to_train"]) == (len(moved_in), len(moved_out)) != (0, 0)
    # A document with no near copy stays where its own hash put it.
    near = {docs[i] for pair in planted for i in pair}
    assert [d for d in before[0] if d not in near] == [d for d in after[0] if d not in near]


def test_a_plain_prepare_guards_its_val_by_default_and_says_so(tmp_path, capsys):
    # As a new user types it: no flag, and val holds no near-copy of a train document; the
    # summary says what the guard did, meta.json which guard the folder has.
    docs, _ = corpus(400)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    assert main([str(source), "--out-dir", str(tmp_path / "default")]) == 0
    shown = capsys.readouterr().out
    record = read_meta(tmp_path / "default")["guard"]["near"]
    assert record["split"] and record["split_threshold"] == 0.725
    assert record["clusters"] > 1
    assert (f"guard {record['clusters']:,} clusters of near-copies (Jaccard >= 0.8); {record['moved_to_val']:,} "
            f"documents moved to val, {record['moved_to_train']:,} to train") in shown
    assert straddling(texts(tmp_path / "default", "val"), texts(tmp_path / "default", "train"), 0.85) == 0
    assert verify_main([str(tmp_path / "default")]) == 0
    assert "tokpack.verify: val: no near-copy of a train document" in capsys.readouterr().out
    # --no-near-split is today's unguarded folder, and says so.
    assert main([str(source), "--out-dir", str(tmp_path / "off"), "--no-near-split"]) == 0
    assert "guard off" in capsys.readouterr().out and "guard" not in read_meta(tmp_path / "off")
    assert verify_main([str(tmp_path / "off")]) == 0
    assert "tokpack.verify: val: not guarded against near-copies" in capsys.readouterr().out
    assert straddling(texts(tmp_path / "off", "val"), texts(tmp_path / "off", "train"), 0.85) > 0


def test_a_token_budget_for_val_is_guarded_too_its_clusters_whole(tmp_path):
    # --val-tokens (modded-nanogpt's fixed budget) with the default guard: the budget's documents,
    # each cluster whole on the side of its first document; without the guard, the same budget leaks.
    docs, _ = corpus(400, seed=3)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    for name, flags in (("guarded", []), ("plain", ["--no-near-split"])):
        assert main([str(source), "--out-dir", str(tmp_path / name), "--val-tokens", "20000", "--quiet", *flags]) == 0
    guarded, plain = read_meta(tmp_path / "guarded"), read_meta(tmp_path / "plain")
    assert plain["splits"]["val"]["tokens"] >= 20000
    assert straddling(texts(tmp_path / "plain", "val"), texts(tmp_path / "plain", "train"), 0.85) > 0
    assert straddling(texts(tmp_path / "guarded", "val"), texts(tmp_path / "guarded", "train"), 0.85) == 0
    moved = guarded["guard"]["near"]["moved_to_val"] - guarded["guard"]["near"]["moved_to_train"]
    assert guarded["splits"]["val"]["documents"] == plain["splits"]["val"]["documents"] + moved != \
        plain["splits"]["val"]["documents"]
    assert sorted(texts(tmp_path / "guarded", "val") + texts(tmp_path / "guarded", "train")) == \
        sorted(texts(tmp_path / "plain", "val") + texts(tmp_path / "plain", "train"))


def test_near_split_with_val_inputs_removes_the_train_near_copies_of_val(tmp_path):
    # The user's val stays whole; a train document that is a near-copy of one of its documents is
    # removed (no document moves), and the reports say so, as verify checks.
    docs, planted = corpus(300, seed=5)
    pairs = [(a, b) for a, b in planted if jaccard(docs[a], docs[b]) >= 0.85]
    val_docs = [docs[a] for a, _ in pairs[:12]]
    train_docs = [d for i, d in enumerate(docs) if i not in {a for a, _ in pairs[:12]}]
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": d} for d in val_docs])
    source = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in train_docs])
    out, plain = tmp_path / "fixed", tmp_path / "plain"
    for folder, guard in ((out, GuardOptions(near_split=True)), (plain, GuardOptions(near_split=False))):
        prepare(PrepareConfig(inputs=(str(source), str(val)), val_inputs=(str(val),), out_dir=str(folder),
                              quiet=True, guard=guard))
    for folder in (out, plain):  # val as given
        assert texts(folder, "val") == val_docs
    assert straddling(texts(plain, "val"), texts(plain, "train"), 0.85) >= 12  # the hazard is there
    assert straddling(texts(out, "val"), texts(out, "train"), 0.85) == 0
    gone = set(texts(plain, "train")) - set(texts(out, "train"))
    assert gone and all(max(jaccard(d, v) for v in val_docs) >= 0.75 for d in gone)
    meta = read_meta(out)
    near = meta["guard"]["near"]
    assert near["removed_from_train"] == len(gone) and (near["moved_to_val"], near["moved_to_train"]) == (0, 0)
    rows = [json.loads(line) for line in (out / "train.guard.jsonl").read_text().splitlines()]
    assert sum(row["removed"] == "near-copy of val" for row in rows) == len(gone)
    assert verify_folder(out)
    assert f"{len(gone)} train documents removed" in describe_guard(meta)  # what evaluate prints beside a loss


def test_dedup_exact_writes_each_text_once_and_counts_the_copies_by_input(tmp_path):
    docs, _ = corpus(200, seed=1)
    other = write_jsonl(tmp_path / "other.jsonl", [{"text": d} for d in docs[:40] + ["a new one, " * 5]])
    out = run(tmp_path, docs, "a", str(other), dedup="exact")
    written = texts(out, "train") + texts(out, "val")
    assert len(written) == len(set(written)) == len(set(docs) | {"a new one, " * 5})
    copies_in_a = len(docs) - len(set(docs))
    assert read_meta(out)["guard"]["dedup"]["removed"] == [copies_in_a, 40]
    # The first in stored order is kept: the train split keeps the corpus's order of first copies.
    train = texts(out, "train")
    assert train == sorted(train, key=docs.index)


def test_dedup_near_drops_the_later_near_copies(tmp_path):
    docs, planted = corpus(300, seed=2)
    out = run(tmp_path, docs, "near", dedup="near")
    written = texts(out, "train") + texts(out, "val")
    found = [b for a, b in planted if jaccard(docs[a], docs[b]) >= 0.85]
    assert len(found) > 20
    assert not any(docs[b] in written and docs[a] != docs[b] for a, b in planted if b in found)
    assert all(docs[a] in written for a, _ in planted)  # the first of each cluster stays
    assert sum(read_meta(out)["guard"]["dedup"]["removed"]) == len(docs) - len(written)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_guarded_folder_is_the_same_for_any_processes_tasks_and_order(tmp_path):
    docs, _ = corpus(300, seed=3)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    common = [str(source), "--quiet", "--near-split", "--dedup", "near", "--shard-tokens", "20000", "--unit-mb", "0.03"]
    assert main([*common, "--out-dir", str(tmp_path / "one")]) == 0
    for task in (2, 0, 1):
        assert main([*common, "--out-dir", str(tmp_path / "tasks"), "--tasks", "3", "--task", str(task)]) == 0
    assert main([*common, "--out-dir", str(tmp_path / "procs"), "--processes", "2"]) == 0
    one = _files(tmp_path / "one")
    assert len([n for n in one if n.startswith("train_")]) > 3
    assert _files(tmp_path / "tasks") == one == _files(tmp_path / "procs")  # no signature left behind either
    flat = [str(source), "--quiet", "--near-split", "--dedup", "near", "--unit-mb", "0.03"]
    assert main([*flat, "--out-dir", str(tmp_path / "flat")]) == 0
    assert main([*flat, "--out-dir", str(tmp_path / "flat2"), "--processes", "2"]) == 0
    assert _files(tmp_path / "flat") == _files(tmp_path / "flat2")


def test_the_split_and_the_drops_are_the_same_whatever_the_tokenizer(tmp_path):
    docs, _ = corpus(200, seed=4)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    spec = write_spec(tmp_path / "tok")
    folders = {}
    for name, encoding in (("gpt2", "gpt2"), ("spec", str(spec))):
        folders[name] = tmp_path / name
        prepare(PrepareConfig(inputs=(str(source),), out_dir=str(folders[name]), encoding=encoding, quiet=True,
                              guard=GuardOptions(near_split=True, dedup="near")))
    for split in ("train", "val"):
        assert texts(folders["gpt2"], split) == texts(folders["spec"], split, str(spec))
    assert read_meta(folders["gpt2"])["guard"] == read_meta(folders["spec"])["guard"]


QUESTION = "Which of these describes how the interpreter resolves a name inside a nested function body at run time"


def test_decontaminate_drops_train_documents_holding_an_evaluation_ngram(tmp_path):
    docs, _ = corpus(150, seed=5)
    holders = [f"Intro. {QUESTION.upper()}, as asked. {d}" for d in docs[:12]]
    short = ["The quick brown fox"]  # shorter than 13 words: matched whole
    evaluation = write_jsonl(tmp_path / "eval.jsonl", [{"question": QUESTION}, {"question": "unrelated words here"}])
    lines = tmp_path / "short.txt"
    lines.write_text(short[0] + "\n\n")
    corpus_docs = docs[12:] + holders + ["we saw the quick, brown fox jump", "the quick fox, brown"]
    plain = run(tmp_path, corpus_docs, "plain")
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in corpus_docs])
    out = tmp_path / "clean"
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(out), quiet=True, guard=GuardOptions(
        near_split=False, decontaminate=(str(evaluation), str(lines)), decontaminate_key="question")))
    train, val = texts(out, "train"), texts(out, "val")
    plain_train, plain_val = texts(plain, "train"), texts(plain, "val")
    assert val == plain_val  # val is never cut
    dropped = [d for d in plain_train if d not in train]
    expected = [d for d in plain_train if d in holders or d == "we saw the quick, brown fox jump"]
    assert dropped == expected and len(expected) > 5
    record = read_meta(out)["guard"]["decontaminate"]
    assert [f["removed"] for f in record["files"]] == [len(expected) - 1, 1]
    assert record["removed"] == len(expected)
    rows = [json.loads(line) for line in (out / "train.guard.jsonl").read_text().splitlines()]
    named = {corpus_docs[r["document"]]: r["evaluation"] for r in rows if r["removed"] == "evaluation"}
    assert named == {d: [str(lines)] if "fox" in d else [str(evaluation)] for d in expected}
    # Units signed apart (two processes, small units) number their hits as one unit does.
    flags = ["--decontaminate", str(evaluation), str(lines), "--decontaminate-key", "question", "--quiet",
             "--no-near-split"]
    assert main([str(source), "--out-dir", str(tmp_path / "units"), "--processes", "2", "--unit-mb", "0.03", *flags]) == 0
    apart, whole = _files(tmp_path / "units"), _files(out)
    assert json.loads(apart.pop("meta.json"))["guard"] == json.loads(whole.pop("meta.json"))["guard"]
    assert apart == whole  # --unit-mb is an option of the record: meta.json differs there
    report = tmp_path / "report"
    prepare(PrepareConfig(inputs=(str(source),), out_dir=str(report), quiet=True, guard=GuardOptions(
        near_split=False, decontaminate=(str(evaluation), str(lines)), decontaminate_key="question", report_only=True)))
    assert texts(report, "train") == plain_train
    assert read_meta(report)["guard"]["decontaminate"]["found"] == len(expected)


def test_other_evaluation_sets_redo_the_units(tmp_path):
    docs, _ = corpus(120, seed=6)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs + [QUESTION]])
    evaluation = tmp_path / "eval.txt"
    common = [str(source), "--quiet", "--shard-tokens", "5000", "--out-dir", str(tmp_path / "o"), "--force"]
    evaluation.write_text("nothing of the corpus is in here at all, not one run of words\n")
    assert main([*common, "--decontaminate", str(evaluation)]) == 0
    kept = read_meta(tmp_path / "o")["splits"]["train"]["documents"]
    evaluation.write_text(QUESTION.lower() + "\n")
    assert main([*common, "--decontaminate", str(evaluation)]) == 0
    meta = read_meta(tmp_path / "o")
    assert meta["guard"]["decontaminate"]["removed"] == 1 == kept - meta["splits"]["train"]["documents"]


def test_conversations_are_guarded_by_their_messages(tmp_path):
    spec = write_nanochat_spec(tmp_path / "tok")
    chats = make_chats(120, seed=3)
    records = chats + chats[:30]
    source = write_jsonl(tmp_path / "chats.jsonl", records)
    common = [str(source), "--chat", "nanochat", "--encoding", str(spec), "--quiet"]
    assert main([*common, "--out-dir", str(tmp_path / "all")]) == 0
    assert main([*common, "--out-dir", str(tmp_path / "once"), "--dedup", "exact"]) == 0
    everything = chat_documents(tmp_path / "all", "train") + chat_documents(tmp_path / "all", "val")
    once = chat_documents(tmp_path / "once", "train") + chat_documents(tmp_path / "once", "val")
    assert len(everything) == 150 and len(once) == len({json.dumps(c) for c in chats}) == 120
    assert sorted(map(str, once)) == sorted({str(d) for d in everything})
    meta = read_meta(tmp_path / "once")
    assert meta["guard"]["dedup"]["removed"] == [30] and meta["chat"]["conversations"] == 120


def _near_sharded(tmp_path: Path, count: int, seed: int, unit_mb: str) -> tuple[list[str], list[str]]:
    """A corpus of near-duplicates and the options of a sharded guarded run of it; one process's
    folder of it is ``tmp_path / "one"``."""
    docs, _ = corpus(count, seed=seed)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    common = [str(source), "--quiet", "--near-split", "--dedup", "near", "--shard-tokens", "20000", "--unit-mb", unit_mb]
    assert main([*common, "--out-dir", str(tmp_path / "one")]) == 0
    return docs, common


def test_forged_or_broken_signatures_are_signed_again(tmp_path):
    docs, common = _near_sharded(tmp_path, 200, 7, "0.02")
    out = tmp_path / "tasks"
    assert main([*common, "--out-dir", str(out), "--tasks", "3", "--task", "0"]) == 0  # signs every unit
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not yours")
    prints = out / SIGN.format(1, "prints")
    prints.write_bytes(bytes(len(prints.read_bytes())))  # same size, other bytes
    record = json.loads((out / SIGN.format(2, "json")).read_text())
    (out / SIGN.format(2, "json")).write_text(json.dumps({**record, "slots": [10**9]}))
    (out / SIGN.format(3, "docs")).unlink()
    os.symlink(outside, out / SIGN.format(3, "docs"))
    # A record that is a link to a copy of itself: never read through, so its unit is signed again.
    copy = tmp_path / "record-copy.json"
    copy.write_bytes((out / SIGN.format(6, "json")).read_bytes())
    (out / SIGN.format(6, "json")).unlink()
    os.symlink(copy, out / SIGN.format(6, "json"))
    # Files whose record is forged to match them, naming what their unit does not hold.
    from tokpack.dedup.minhash import Shingling
    from tokpack.prepare.guard.signatures import load_unit

    def loads(unit: int, files: set[int]) -> bool:
        record = json.loads((out / SIGN.format(unit, "json")).read_text())
        return load_unit(out, unit, record["fingerprint"], Shingling(), files, 0) is not None

    slots = json.loads((out / SIGN.format(0, "json")).read_text())["slots"]
    for unit, name, change in ((0, "docs", lambda docs: docs["number"].__setitem__(-1, slots[docs["read"][-1]])),
                               (4, "docs", lambda docs: docs["file"].__setitem__(0, 99)),  # not the unit's file
                               (5, "hits", lambda hits: np.array([(0, 0)], dtype=hits.dtype))):  # no such set
        files = set(np.fromfile(out / SIGN.format(unit, "docs"), dtype=DOC)["file"].tolist())
        assert loads(unit, files)
        _forge(out, unit, name, change)
        assert not loads(unit, files)
    for task in (1, 2):
        assert main([*common, "--out-dir", str(out), "--tasks", "3", "--task", str(task)]) == 0
    assert _files(out) == _files(tmp_path / "one")
    assert outside.read_bytes() == b"not yours" and not os.path.lexists(out / SIGN.format(6, "json"))


def _matched_by(out: Path) -> dict[str, tuple[int, int]]:
    """Each part of the match in ``out``: the first unit of the task that matched it, and when."""
    from tokpack.format import PAIRS
    from tokpack.prepare.guard.match import Kind, PARTS

    records = {f"{kind}{p:02d}": out / PAIRS.format(kind, p, "json") for kind in Kind for p in range(PARTS)}
    return {part: (json.loads(path.read_text())["by"], path.stat().st_mtime_ns) for part, path in records.items()}


def test_each_part_of_the_match_is_matched_once_whatever_the_tasks_and_a_lost_one_is_redone(tmp_path, monkeypatch):
    from tokpack.format import PAIRS, PLACED
    from tokpack.prepare.guard import Guard

    decided = []
    real = Guard._decide
    monkeypatch.setattr(Guard, "_decide", lambda self, *a: (real(self, *a), decided.append(1))[0])  # those decided whole
    docs, common = _near_sharded(tmp_path, 300, 3, "0.03")
    assert len(decided) == 1  # one process: decided once, for its units and its finish alike
    decided.clear()
    out = tmp_path / "tasks"
    tasks = ["--tasks", "4", "--task"]
    assert main([*common, "--out-dir", str(out), *tasks, "2"]) == 0
    matched = _matched_by(out)
    own = {by for by, _ in matched.values()}
    assert len(matched) == 32 and len(own) == 1 and own != {0}  # every part, all by the first task to run
    assert len(decided) == 1 and (out / PLACED.format("json")).exists()
    import tokpack.prepare.guard as stage

    loaded = []
    real_load = stage.load_unit
    monkeypatch.setattr(stage, "load_unit", lambda *a: loaded.append(1) or real_load(*a))
    assert main([*common, "--out-dir", str(out), *tasks, "0"]) == 0
    # The placement read: no unit's signatures loaded, nothing matched or decided again.
    assert _matched_by(out) == matched and len(decided) == 1 and not loaded
    # A decider killed before the placement's record: the next task signs what it must, matches
    # what no part's record holds, and decides again.
    (out / PLACED.format("json")).unlink()
    # A matcher killed after a part's pairs and before its record: that part alone is redone.
    (out / PAIRS.format("near", 5, "json")).unlink()
    # And one whose pairs do not hash as recorded: as many, in order, one of them another pair.
    forged = max((n for n in range(16) if n != 5), key=lambda n: (out / PAIRS.format("near", n, "bin")).stat().st_size)
    pairs = np.fromfile(out / PAIRS.format("near", forged, "bin"), dtype="<i8")
    at = next(i for i in range(len(pairs)) if pairs[i] % len(docs) < len(docs) - 1
              and (i + 1 == len(pairs) or pairs[i] + 1 < pairs[i + 1]))
    pairs[at] += 1
    (out / PAIRS.format("near", forged, "bin")).write_bytes(pairs.tobytes())
    # A unit's entries of that part lost by a crash of the machine (the same size, other bytes):
    # read as it is matched again, the unit is signed again.
    entries = out / SIGN.format(1, "near05")
    signed_at = (out / SIGN.format(1, "json")).stat().st_mtime_ns
    entries.write_bytes(bytes(entries.stat().st_size))
    assert main([*common, "--out-dir", str(out), *tasks, "3"]) == 0
    assert (out / SIGN.format(1, "json")).stat().st_mtime_ns != signed_at
    again = _matched_by(out)
    redone = {part for part in matched if again[part] != matched[part]}
    assert redone == {"near05", f"near{forged:02d}"} and {again[part][0] for part in redone} != own
    assert len(decided) == 2
    assert main([*common, "--out-dir", str(out), *tasks, "1"]) == 0  # the last: it finishes, deciding whole
    assert _files(out) == _files(tmp_path / "one")  # the pairs go with the signatures


def test_an_input_changed_between_tasks_is_signed_again_and_every_unit_it_moves_is_redone(tmp_path, capsys):
    docs = [f"document {i:03d} " + "lorem ipsum dolor sit amet " * 30 + f"tail {i:03d}" for i in range(200)]
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    common = [str(source), "--quiet", "--dedup", "exact", "--shard-tokens", "20000", "--unit-mb", "0.03"]
    out = tmp_path / "tasks"
    for task in (0, 1, 2):  # three tasks of four done: their units stand, signed and matched
        assert main([*common, "--out-dir", str(out), "--tasks", "4", "--task", str(task)]) == 0
    # An early document becomes a copy of a late one, the file its size: the late one, in a unit
    # whose input did not change, is now the later copy.
    lines = source.read_text().splitlines()
    lines[10] = json.dumps({"text": docs[80]})
    source.write_text("\n".join(lines) + "\n")
    # The task of the changed unit signs it again and decides anew (the placement decided from
    # its old bytes goes with the unit's signatures), with a warning.
    code, err = cli_run(main, capsys, *common, "--out-dir", out, "--tasks", "4", "--task", 0)
    assert code == 0 and "it is signed again" in err, err
    for _ in range(3):  # as a user would: run the same commands again until the folder is whole
        for task in (0, 1, 2, 3):
            code, err = cli_run(main, capsys, *common, "--out-dir", out, "--tasks", "4", "--task", task)
            assert code in (0, 2) and "Traceback" not in err, err
        if (out / "meta.json").exists():
            break
    assert main([*common, "--out-dir", str(tmp_path / "one")]) == 0
    assert _files(out) == _files(tmp_path / "one") and read_meta(out)["guard"]["dedup"]["removed"] == [1]


def _forge(out: Path, unit: int, name: str, change) -> None:
    """Change a unit's signature file (``change`` edits docs in place, returns hits) and its record to match."""
    path = out / SIGN.format(unit, name)
    array = np.fromfile(path, dtype=DOC if name == "docs" else HIT).copy()
    changed = change(array)
    path.write_bytes((array if changed is None else changed).tobytes())
    record = json.loads((out / SIGN.format(unit, "json")).read_text())
    record["files"][name] = {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (out / SIGN.format(unit, "json")).write_text(json.dumps(record))


@pytest.mark.parametrize("flags,says", [
    (["--threshold", "0"], "--threshold 0.0 must lie in (0, 1]"),
    (["--threshold", "1.5"], "--threshold 1.5 must lie in (0, 1]"),
    (["--ngram", "0"], "--ngram 0 must lie in 1..64"),
    (["--dedup", "near", "--hashes", "100", "--bands", "32"], "--hashes 100 --bands 32"),
    (["--report-only"], "--report-only applies only with --decontaminate FILE"),
    (["--no-near-split", "--threshold", "0.7"], "--threshold applies only with --near-split or --dedup near"),
    (["--no-near-split", "--dedup", "exact", "--hashes", "128", "--bands", "16"],
     "--hashes and --bands apply only with --near-split"),
    (["--decontaminate-min-words", "5"], "--decontaminate-min-words applies only with --decontaminate FILE"),
    (["--near-split", "--hashes", "1", "--bands", "1"], "--hashes 1 estimates a similarity of 0.8 with a standard "
                                                         "error of 0.40"),
    (["--dedup", "near", "--hashes", "32", "--bands", "8", "--threshold", "0.5"], "pass --hashes 104 or more"),
    (["--dedup", "fuzzy"], "invalid choice: 'fuzzy' (choose from 'none', 'exact', 'near')"),
    (["--decontaminate", "MISSING.jsonl"], "MISSING.jsonl does not exist"),
    (["--decontaminate", "EMPTY.txt"], "holds no text"),
    (["--decontaminate", "EVAL.jsonl", "--decontaminate-key", "question"], "pass --decontaminate-key with the text"),
    (["--decontaminate", "NUMBERS.jsonl"], "has 'text' of type int, not a string; fix the record or pass "
                                            "--decontaminate-key"),
    (["--decontaminate", "ftp://127.0.0.1:9/q.txt"], "ftp://127.0.0.1:9/q.txt cannot be reached (Connection refused)"),
    (["--decontaminate", "nosuch://bucket/q.txt"], "names a nosuch:// store, which no installed fsspec library reads"),
])
def test_bad_guard_input_is_one_line_and_writes_nothing(tmp_path, capsys, flags, says):
    docs, _ = corpus(30, seed=8)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    (tmp_path / "EMPTY.txt").write_text("\n  \n")
    write_jsonl(tmp_path / "EVAL.jsonl", [{"text": "a b c"}])
    write_jsonl(tmp_path / "NUMBERS.jsonl", [{"text": 4}])
    flags = [str(tmp_path / f) if f in ("MISSING.jsonl", "EMPTY.txt", "EVAL.jsonl", "NUMBERS.jsonl") else f for f in flags]
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "out", "--quiet", *flags)
    assert code == 2 and err.startswith("tokpack: ") and says in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_one_document_keeps_its_tail_split_and_is_not_decontaminated(tmp_path, capsys):
    one = tmp_path / "one.txt"
    one.write_text("a single long document, said twice. " * 100 + "a single long document, said twice. " * 100)
    assert main([str(one), "--out-dir", str(tmp_path / "plain"), "--quiet"]) == 0
    # The default (--near-split on) writes a one-document corpus byte for byte as an unguarded run.
    assert main([str(one), "--out-dir", str(tmp_path / "unguarded"), "--quiet", "--no-near-split"]) == 0
    assert _files(tmp_path / "plain") == _files(tmp_path / "unguarded")
    assert main([str(one), "--out-dir", str(tmp_path / "guarded"), "--quiet", "--near-split", "--dedup", "near"]) == 0
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "guarded" / name).read_bytes()
    assert "guard" not in read_meta(tmp_path / "guarded")
    (tmp_path / "q.txt").write_text("a single long document\n")
    code, err = cli_run(main, capsys, one, "--out-dir", tmp_path / "out", "--decontaminate", tmp_path / "q.txt")
    assert code == 2 and "is one document; pass --doc-sep" in err and not (tmp_path / "out").exists()


def test_the_guard_table_of_a_config_file(tmp_path, capsys):
    docs, _ = corpus(60, seed=9)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs + docs[:5]])
    config = tmp_path / "c.toml"
    config.write_text('[guard]\ndedup = "exact"\n')
    assert main([str(source), "--config", str(config), "--out-dir", str(tmp_path / "o"), "--quiet"]) == 0
    assert read_meta(tmp_path / "o")["guard"]["dedup"]["removed"] == [len(docs) + 5 - len(set(docs))]
    config.write_text('[guard]\ndedupe = "exact"\n')
    code, err = cli_run(main, capsys, source, "--config", config, "--out-dir", tmp_path / "p")
    assert code == 2 and "unknown key 'guard.dedupe'" in err
    config.write_text('[guard]\nthreshold = "high"\n')
    code, err = cli_run(main, capsys, source, "--config", config, "--out-dir", tmp_path / "p")
    assert code == 2 and "guard.threshold = 'high'" in err


def test_the_reports_list_each_move_and_removal_and_verify_and_inspect_read_them(tmp_path, capsys, monkeypatch):
    from tokpack.inspect import main as inspect_main
    from tokpack.prepare import guard
    from tokpack.prepare.guard import match
    from tokpack.verify import VerifyError, verify_folder

    monkeypatch.setattr(guard, "_BLOCK", 7)  # documents counted in blocks, and matched in many spill files
    monkeypatch.setattr(match, "_SPILL_BYTES", 4096)
    docs, planted = corpus(200, seed=12)
    out = run(tmp_path, docs, "r", near_split=True, dedup="exact")
    meta = read_meta(out)
    rows = {s: [json.loads(line) for line in (out / f"{s}.guard.jsonl").read_text().splitlines()] for s in ("train", "val")}
    removed = [r for s in rows for r in rows[s] if r["removed"]]
    assert len(removed) == sum(meta["guard"]["dedup"]["removed"]) > 0 and all(r["removed"] == "copy" for r in removed)
    moved = [r for r in rows["val"] if r["own_split"] == "train" and not r["removed"]]
    assert len(moved) == meta["guard"]["near"]["moved_to_val"] > 0
    # A row's index is where the document was written: its text is there.
    for split in ("train", "val"):
        written = texts(out, split)
        shown = [r for r in rows[split] if r["index"] is not None]
        came = min(r["document"] for r in shown if r["own_split"] != split)  # rows after it count it
        assert any(r["document"] > came for r in shown)
        assert all(written[r["index"]] == docs[r["document"]] for r in shown)
    capsys.readouterr()
    assert inspect_main([str(out), "--guard", f"val:{moved[0]['index']}"]) == 0
    shown = capsys.readouterr().out
    cluster = [r for s in rows for r in rows[s] if r["cluster"] == moved[0]["cluster"]]
    assert len(cluster) >= 2 and all(f"document {r['document']} of" in shown for r in cluster)
    verify_folder(out)
    # A report that does not agree with meta.json's counts, or is not a report, is refused.
    report = out / "val.guard.jsonl"
    good = report.read_text()
    for forged in (good.replace('"own_split": "train"', '"own_split": "val"', 1), good + "not json\n"):
        report.write_text(forged)
        entry = meta["splits"]["val"]["guard"]
        meta["splits"]["val"]["guard"] = {**entry, "bytes": len(forged.encode()),
                                          "sha256": hashlib.sha256(forged.encode()).hexdigest()}
        (out / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(VerifyError, match="guard report"):
            verify_folder(out)
    meta["splits"]["val"]["guard"]["file"] = "../elsewhere.jsonl"
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VerifyError, match="not the name of a file tokpack writes"):
        verify_folder(out)


def test_evaluate_says_how_val_was_guarded(tmp_path, capsys):
    from tokpack.evaluation import main as evaluate_main

    docs, _ = corpus(120, seed=11)
    for name, guard in (("plain", {}), ("guarded", {"near_split": True, "decontaminate": (str(tmp_path / "q.txt"),)})):
        (tmp_path / "q.txt").write_text(QUESTION + "\n")
        out = run(tmp_path, docs, name, **guard)
        assert evaluate_main([str(out), "--model", "unigram", "--block-size", "32", "--quiet"]) == 0
        shown = capsys.readouterr().out
        if guard:
            assert ("val: no near-copy of a train document (Jaccard of word 5-grams >= 0.8: pairs estimated at "
                    "0.725 or more kept on one side" in shown)
            assert f"train decontaminated (13-grams) of {tmp_path / 'q.txt'}" in shown
        else:
            assert "val: not guarded against near-copies" in shown and "train not decontaminated" in shown


def _matched(folder, bands, hashes, prints, threshold=0.8, first=0):
    """``match.matched`` of units given as arrays: each unit's entries routed into its part files
    as signing routes them, and matched into a fresh folder."""
    from tokpack.prepare.guard import match

    signed, routed, counts = folder / "signed", [], []
    signed.mkdir(parents=True)
    for u, (band, text) in enumerate(zip(bands, hashes)):
        files = {}
        for kind, values in ((match.Kind.COPIES, np.asarray(text)[:, None]), (match.Kind.NEAR, np.asarray(band))):
            if prints is None and kind == match.Kind.NEAR:
                continue
            for part, entries in match.routed(kind, values, np.arange(len(text))):
                path = signed / f"{u}.{part.name}"
                path.write_bytes(entries.tobytes())
                files[part.name] = (path, hashlib.sha256(entries.tobytes()).hexdigest())
        routed.append(files)
        counts.append(len(text))
    out = folder / "matched"
    out.mkdir()
    found = match.matched(out, routed, counts, prints, threshold, bands[0].shape[1] if prints is not None else 0,
                          "the signatures' digest", first)
    assert all(p.name.startswith(".tokpack-sign-pairs-") for p in out.iterdir())  # no spill file is left
    return found


@pytest.mark.parametrize("spill_bytes, fanout", [(4096, 64), (1024, 2)])
def test_matching_spread_over_spill_files_finds_what_one_file_finds(tmp_path, monkeypatch, spill_bytes, fanout):
    from tokpack.dedup.clusters import clusters
    from tokpack.dedup.minhash import Shingling, sign
    from tokpack.prepare.guard import match

    docs, planted = corpus(300, seed=12)
    signed = sign(docs, Shingling())
    text = np.array([int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest()) for d in docs], dtype=np.uint64)
    cuts = [0, 90, 91, 300]  # three units, one of a single document, pairs straddling them
    bands = [signed.bands[a:b] for a, b in zip(cuts, cuts[1:])]
    hashes = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    whole = _matched(tmp_path / "whole", bands, hashes, signed.fingerprints)
    monkeypatch.setattr(match, "_SPILL_BYTES", spill_bytes)
    monkeypatch.setattr(match, "_FANOUT", fanout)
    routed = []
    route = match._route
    monkeypatch.setattr(match, "_route", lambda *a: routed.append(len(files := route(*a))) or files)
    spread = _matched(tmp_path / "spread", bands, hashes, signed.fingerprints)
    assert len(routed) > 1 and 1 < max(routed) <= fanout  # files too large were routed again
    assert all(np.array_equal(a, b) for a, b in zip(whole, spread))
    copies = {(docs.index(d), b) for b, d in enumerate(docs) if docs.index(d) < b}
    assert {divmod(int(k), len(docs)) for k in spread[1]} == copies and copies
    nodes, first = match.firsts(spread[0], len(docs))
    labels = np.arange(len(docs))
    labels[nodes] = first
    assert np.array_equal(labels, clusters(signed.fingerprints, signed.bands, 0.8)) and len(nodes) >= len(planted)
    # Without near-duplicates the text hashes alone are matched: the copies.
    only = _matched(tmp_path / "only", bands, hashes, None)
    assert np.array_equal(only[0], spread[1]) and np.array_equal(only[1], spread[1])


def _guarded_corpus(tmp_path: Path) -> Path:
    docs, _ = corpus(700, seed=13)
    return write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])


GUARDED = ["--near-split", "--dedup", "near", "--shard-tokens", "20000", "--unit-mb", "0.05", "--workers", "1"]


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["signing", "writing"])
def test_a_guarded_run_killed_resumes_to_the_same_folder_keeping_its_signatures(tmp_path, stage):
    source = _guarded_corpus(tmp_path)
    assert main([str(source), "--out-dir", str(tmp_path / "one"), "--quiet", *GUARDED]) == 0
    out = tmp_path / "out"
    records = {"signing": ".tokpack-sign-*.json", "writing": ".tokpack-unit-*.json"}[stage]
    kill(paused_at(prepare_cmd(source, out, *GUARDED), lambda: len(list(out.glob(records))) >= 2))
    assert not (out / "meta.json").exists()
    signed = {p.name: p.stat().st_mtime_ns for p in out.glob(".tokpack-sign-*.json")}
    written = len(list(out.glob(".tokpack-unit-*.json")))
    assert signed
    again = paused_at(prepare_cmd(source, out, *GUARDED), lambda: len(list(out.glob(".tokpack-unit-*.json"))) > written)
    # Paused once it writes a unit: the signatures it found whole were kept, not signed again.
    assert {n: t for n, t in signed.items() if (out / n).exists() and (out / n).stat().st_mtime_ns == t} == signed
    os.kill(again.pid, signal.SIGCONT)
    assert again.wait(timeout=300) == 0, again.stderr.read()[-2000:]
    assert _files(out) == _files(tmp_path / "one")


@pytest.mark.e2e
def test_a_guarded_run_under_torchrun_is_one_processs_folder(tmp_path):
    source = _guarded_corpus(tmp_path)
    assert main([str(source), "--out-dir", str(tmp_path / "one"), "--quiet", *GUARDED]) == 0
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "tokpack.prepare", str(source), "--out-dir", str(tmp_path / "ranks"), "--quiet",
                           *GUARDED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _files(tmp_path / "ranks") == _files(tmp_path / "one")


def test_a_mixtures_epochs_are_repeats_not_duplicates(tmp_path):
    spec = write_nanochat_spec(tmp_path / "tok")
    chats = make_chats(60, seed=4)
    first, second = write_jsonl(tmp_path / "a.jsonl", chats + chats[:5]), write_jsonl(tmp_path / "b.jsonl", chats[30:40])
    common = [str(first), str(second), "--chat", "nanochat", "--encoding", str(spec), "--quiet",
              "--mixture", f"{second}=3"]
    assert main([*common, "--out-dir", str(tmp_path / "mixed"), "--dedup", "exact"]) == 0
    meta = read_meta(tmp_path / "mixed")
    # a.jsonl's 5 copies and b.jsonl's 10 (copies of a's) are removed once; b's epochs are not copies.
    assert meta["guard"]["dedup"]["removed"] == [5, 10]
    assert meta["chat"]["conversations"] == 60


def test_the_splits_own_val_may_be_named_as_an_evaluation_set(tmp_path):
    docs = make_docs(80, seed=22, words=60)
    leaked = "As quoted: " + docs[70]
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in docs[:60] + [leaked]])
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": d} for d in docs[60:]])
    out = tmp_path / "out"
    assert main([str(train), str(val), "--val-inputs", str(val), "--decontaminate", str(val), "--out-dir", str(out),
                 "--quiet", "--no-near-split"]) == 0
    meta = read_meta(out)
    assert meta["guard"]["decontaminate"]["removed"] == 1 and meta["splits"]["val"]["documents"] == 20
    assert meta["splits"]["train"]["documents"] == 60  # the leaked one removed, val whole


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), unique=True, max_size=12), st.data())
def test_a_documents_verdict_is_found_in_any_order_of_lookups(members, data):
    # The verdicts of the members (sorted numbers) looked up by (read, document): in order, again,
    # or going back, members and their neighbours, each answer is what a plain table gives.
    from tokpack.prepare.guard.placement import Placement, Verdict

    numbers = np.array(sorted(members), dtype=np.int64)
    verdicts = np.array([1 + n % 3 for n in numbers.tolist()], dtype=np.uint8)
    starts = [0, 20, 40]
    decided = Placement(starts, numbers, verdicts, [], [], Path("."))
    table = dict(zip(numbers.tolist(), verdicts.tolist()))
    near = sorted({max(0, n + d) for n in members for d in (-1, 0, 1)}) or [0]
    for number in data.draw(st.lists(st.one_of(st.sampled_from(near), st.integers(0, 70)), max_size=40)):
        read = max(i for i, start in enumerate(starts) if start <= number)
        expected = table.get(number)
        assert decided.verdict(read, number - starts[read]) == (None if expected is None else Verdict(expected))


def test_clusters_are_counted_once_and_an_exact_copy_is_a_copy_under_dedup_near(tmp_path):
    docs, planted = corpus(200, seed=21)
    near = next(b for a, b in planted if docs[a] != docs[b] and jaccard(docs[a], docs[b]) >= 0.85)
    docs += [docs[0], docs[0], docs[1]]  # a cluster of three texts the same, and one of two
    out = run(tmp_path, docs, "c", near_split=True, dedup="near")
    rows = [json.loads(line) for s in ("train", "val") for line in (out / f"{s}.guard.jsonl").read_text().splitlines()]
    clusters = {r["cluster"] for r in rows if r["cluster"] is not None}
    later = [r for r in rows if r["cluster"] is not None and r["cluster"] != r["document"]]
    assert read_meta(out)["guard"]["near"]["clusters"] == len(clusters) < len(later)
    by_document = {r["document"]: r for r in rows}
    n = len(docs)
    assert [by_document[d]["removed"] for d in (n - 3, n - 2, n - 1)] == ["copy"] * 3
    assert by_document[near]["removed"] == "near-copy"
    assert verify_folder(out)


def _forged(out: Path, split: str, rows=None, meta_edit=None, count_rows: bool = True) -> None:
    """The folder's ``split`` report rewritten with ``rows`` (and meta.json edited), meta.json
    rehashed to match: what a forger who knows the format writes."""
    meta = json.loads((out / "meta.json").read_text())
    if rows is not None:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (out / f"{split}.guard.jsonl").write_text(text)
        entry = meta["splits"][split]["guard"]
        entry.update(bytes=len(text.encode()), sha256=hashlib.sha256(text.encode()).hexdigest())
        if count_rows:
            entry["rows"] = len(rows)
    if meta_edit is not None:
        meta_edit(meta)
    (out / "meta.json").write_text(json.dumps(meta))


def _report(out: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{split}.guard.jsonl").read_text().splitlines()]


def test_verify_holds_the_reports_and_meta_json_to_each_other_field_by_field(tmp_path):
    from tokpack.verify import VerifyError

    docs, _ = corpus(300, seed=22)
    docs += [docs[0], docs[0], "a document holding the question: " + QUESTION, "and another: " + QUESTION]
    (tmp_path / "q.txt").write_text(QUESTION + "\n")
    out = run(tmp_path, docs, "v", near_split=True, decontaminate=(str(tmp_path / "q.txt"),))
    pristine = {p.name: p.read_bytes() for p in out.iterdir()}
    assert verify_folder(out)
    train, val = _report(out, "train"), _report(out, "val")
    members = {}
    for r in train + val:
        if r["cluster"] is not None:
            members.setdefault(r["cluster"], []).append(r)
    pair = next(m for m in members.values() if len(m) == 2 and m[1]["removed"] is None and m[1] in train)
    head = next(r for r in train + val if r["document"] == 0)  # the first of three
    head_split = "train" if head in train else "val"
    assert len(members[0]) == 3
    gone = [r for r in train if r["index"] is None]
    assert len(gone) == 2 and gone == train[-2:]  # the two holding the question, removed
    kept = max((r for r in train if r["index"] is not None), key=lambda r: r["index"])
    train_documents = read_meta(out)["splits"]["train"]["documents"]

    def edit(path, value):
        def change(meta):
            *keys, last = path
            target = meta
            for key in keys:
                target = target[key]
            target[last] = value(target[last])
        return change

    forgeries = {
        "index past the split": ("train", [{**r, "index": train_documents} if r is kept else r for r in train], None),
        "a kept later member deleted": ("train", [r for r in train if r is not pair[1]], None),
        "a cluster's first deleted": (head_split, [r for r in _report(out, head_split) if r != head], None),
        "a row deleted, the count kept": ("train", train[1:], "rows kept"),
        "a similarity off the grid": ("train", [{**r, "similarity": 0.81} if r is pair[1] else r for r in train], None),
        "a similarity above one": ("train", [{**r, "similarity": 1.0039} if r is pair[1] else r for r in train], None),
        "a first's similarity below one": (head_split, [{**r, "similarity": 0.9961} if r == head else r
                                                        for r in _report(out, head_split)], None),
        "removed rows out of order": ("train", [*train[:-2], train[-1], train[-2]], None),
        "a similarity below the rule": ("train", [{**r, "similarity": 0.5} if r is pair[1] else r for r in train], None),
        "rows out of order": ("train", [train[1], train[0], *train[2:]], None),
        "an index out of order": ("train", [{**r, "index": 0} if r is kept else r for r in train], None),
        "clusters": (None, None, edit(("guard", "near", "clusters"), lambda n: n + 1)),
        "moved to val": (None, None, edit(("guard", "near", "moved_to_val"), lambda n: n + 1)),
        "an evaluation file's count": (None, None, edit(("guard", "decontaminate", "files"),
                                                        lambda f: [{**f[0], "removed": f[0]["removed"] + 1}])),
        "threshold in the record": (None, None, edit(("guard", "near", "threshold"), lambda t: 0.5)),
        "threshold in both": (None, None, lambda m: (edit(("guard", "near", "threshold"), lambda t: 0.99)(m),
                                                     edit(("options", "guard", "threshold"), lambda t: 0.99)(m))),
        "no guard options": (None, None, lambda m: m["options"].pop("guard")),
        "dedup added to the record": (None, None, edit(("guard",), lambda g: {**g, "dedup": {"mode": "exact",
                                                                                              "removed": [0]}})),
        "a report's row count gone": (None, None, lambda m: m["splits"]["val"]["guard"].pop("rows")),
    }
    for name, (split, rows, meta_edit) in forgeries.items():
        for file, data in pristine.items():
            (out / file).write_bytes(data)
        _forged(out, split, rows, meta_edit if callable(meta_edit) else None, count_rows=meta_edit != "rows kept")
        with pytest.raises(VerifyError):
            verify_folder(out)
            pytest.fail(f"verify accepted a forgery: {name}")
    # Without signatures a cluster is of copies: a copy's row deleted, and meta.json's count with it,
    # leaves its first alone.
    out = run(tmp_path, docs, "exact", dedup="exact")
    train = _report(out, "train")
    copy = next(r for r in train if r["removed"] == "copy")
    assert verify_folder(out) and sum(r["cluster"] == copy["cluster"] for r in train + _report(out, "val")) == 2

    def fewer(meta):
        meta["guard"]["dedup"]["removed"][0] -= 1
    _forged(out, "train", [r for r in train if r is not copy], fewer)
    with pytest.raises(VerifyError, match=f"cluster {copy['cluster']} with its first document, its closest later one "
                                          "agreeing on no bins"):
        verify_folder(out)


def test_verify_compares_the_train_near_copies_of_a_users_val_with_the_reports(tmp_path):
    from tokpack.verify import VerifyError

    docs, planted = corpus(200, seed=23)
    pairs = [(a, b) for a, b in planted if jaccard(docs[a], docs[b]) >= 0.85][:6]
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": docs[a]} for a, _ in pairs])
    source = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for i, d in enumerate(docs)
                                                     if i not in {a for a, _ in pairs}])
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=(str(source), str(val)), val_inputs=(str(val),), out_dir=str(out), quiet=True,
                          guard=GuardOptions(near_split=True)))
    assert read_meta(out)["guard"]["near"]["removed_from_train"] > 0 and verify_folder(out)
    for change in (1, -1):
        def edit(meta, change=change):
            meta["guard"]["near"]["removed_from_train"] += change
        _forged(out, "train", meta_edit=edit)
        with pytest.raises(VerifyError, match="near-copy of val"):
            verify_folder(out)
        _forged(out, "train", meta_edit=lambda meta, change=change: meta["guard"]["near"].update(
            removed_from_train=meta["guard"]["near"]["removed_from_train"] - change))
        assert verify_folder(out)


def test_a_copy_holding_an_evaluation_ngram_is_counted_once_as_a_copy(tmp_path):
    docs, _ = corpus(120, seed=24)
    quoting = "a document holding the question: " + QUESTION
    docs += [quoting, quoting]
    (tmp_path / "q.txt").write_text(QUESTION + "\n")
    out = run(tmp_path, docs, "q", dedup="exact", decontaminate=(str(tmp_path / "q.txt"),))
    rows = {r["document"]: r for s in ("train", "val") for r in _report(out, s)}
    first, copy = rows[len(docs) - 2], rows[len(docs) - 1]
    assert copy["removed"] == "copy" and copy["evaluation"] == first["evaluation"] == [str(tmp_path / "q.txt")]
    record = read_meta(out)["guard"]
    assert record["decontaminate"]["removed"] == (first["removed"] == "evaluation") == 1
    assert sum(record["dedup"]["removed"]) == len(docs) - len(set(docs))
    assert verify_folder(out)


FRENCH = ("Quelle est la capitale de la Bourgogne-Franche-Comté et combien d'habitants compte sa préfecture "
          "aujourd'hui selon le dernier recensement")
# The same words as a user would call them, in other Unicode dress.
DRESSED = {
    "no-break spaces": QUESTION.replace(" ", "\u00a0"),
    "narrow and ideographic spaces": QUESTION.replace(" ", "\u202f", 5).replace(" ", "\u3000"),
    "em dashes": QUESTION.replace(" ", "\u2014"),
    "capitals, curly apostrophes and decomposed accents": FRENCH.upper().replace("'", "\u2019").replace(
        "É", "E\u0301"),
    "zero-width spaces and soft hyphens": QUESTION.replace(" ", " \u200b").replace("interpreter", "inter\u00adpreter"),
    "full-width letters": "".join(chr(ord(c) + 0xFEE0) if c.isalpha() else c for c in QUESTION),
}


@pytest.mark.parametrize("dress", list(DRESSED))
def test_decontamination_sees_the_same_words_in_any_unicode_dress(tmp_path, dress):
    docs, _ = corpus(60, seed=25)
    docs += [f"notes: {DRESSED[dress]}, and more"] * 2  # one of the two lands in train whatever the hashes
    (tmp_path / "q.jsonl").write_text(json.dumps({"text": QUESTION}) + "\n" + json.dumps({"text": FRENCH}) + "\n")
    out = run(tmp_path, docs, "u", decontaminate=(str(tmp_path / "q.jsonl"),))
    rows = [r for r in _report(out, "train") + _report(out, "val")]
    held = [r for r in rows if r["document"] >= len(docs) - 2]
    assert len(held) == 2 and all(r["evaluation"] for r in held), dress
    assert [r["removed"] for r in held if r["own_split"] == "train"] == ["evaluation"] * sum(
        r["own_split"] == "train" for r in held) and verify_folder(out)


def test_a_val_document_copied_into_train_with_no_break_spaces_is_removed_from_train(tmp_path):
    docs, _ = corpus(80, seed=26)
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": d} for d in docs[:5]])
    copy = docs[0].replace(" ", "\u00a0").replace("'", "\u2019")
    source = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in docs[5:] + [copy]])
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=(str(source), str(val)), val_inputs=(str(val),), out_dir=str(out), quiet=True,
                          guard=GuardOptions(near_split=True)))
    assert copy not in texts(out, "train") and texts(out, "val") == docs[:5]
    # the copy, at similarity 1: the same words
    assert [r["similarity"] for r in _report(out, "train") if r["removed"] == "near-copy of val"] == [1.0]
    assert verify_folder(out)


def _unspaced(count: int, copies: int, alphabet: list[str], seed: int) -> tuple[list[str], list[int]]:
    """Documents of about 300 characters of a script written without spaces, ``copies`` of them
    followed by a near-copy with 4 characters changed; and where the near-copies are."""
    rng = random.Random(seed)
    docs, planted = [], []
    while len(docs) < count:
        docs.append("".join(rng.choice(alphabet) for _ in range(300)))
        if len(planted) < copies and rng.random() < copies / count * 1.5:
            chars = list(docs[-1])
            for at in rng.sample(range(300), 4):
                chars[at] = rng.choice(alphabet)
            docs.append("".join(chars))
            planted.append(len(docs) - 1)
    return docs, planted


@pytest.mark.parametrize("script", ["chinese", "japanese"])
def test_near_copies_in_scripts_written_without_spaces_are_found(tmp_path, script):
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
    kana = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
    alphabet = han + ["，", "。"] if script == "chinese" else han[:500] + kana + ["、", "。"]
    docs, planted = _unspaced(400, 100, alphabet, seed=27)
    out = run(tmp_path, docs, script, near_split=True, dedup="near")
    removed = {r["document"] for s in ("train", "val") for r in _report(out, s) if r["removed"] == "near-copy"}
    assert len(planted) == 100 and len(removed & set(planted)) >= 97 and removed <= set(planted)
    assert verify_folder(out)


def test_an_answer_column_is_counted_not_matched_and_a_wipe_out_refused_in_one_line(tmp_path, capsys):
    docs, _ = corpus(120, seed=28)
    docs = [d + (" Yes, it is 4. No." if i % 3 else " A: Paris.") for i, d in enumerate(docs)]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"answer": a}) + "\n" for a in ("Yes", "No", "4", "A", "Paris", "it is 4")))
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    flags = ["--decontaminate", str(answers), "--decontaminate-key", "answer", "--quiet"]
    # The default: answers of fewer than 3 words are counted, not matched; "it is 4" removes what holds it.
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "kept", *flags,
                        "--decontaminate-max-share", "1")
    assert code == 0, err
    record = read_meta(tmp_path / "kept")["guard"]["decontaminate"]
    assert record["files"] == [{"path": str(answers), "removed": record["removed"], "too_short": 5}]
    assert record["min_words"] == 3 and 0 < record["removed"] < len(docs) and verify_folder(tmp_path / "kept")
    # At the default share, a run that would remove most of train stops, naming the file and its shortest texts.
    for extra in ([], ["--decontaminate-min-words", "1"]):
        code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "wiped", *flags, *extra)
        assert code == 2 and "\n" not in err.strip(), err
        assert f"more than --decontaminate-max-share 0.2: {answers} matches" in err, err
        assert ("'Yes', 'No', '4'" in err) == bool(extra) and ("'it is 4'" in err) != bool(extra), err
        assert not (tmp_path / "wiped").exists() and not list(tmp_path.rglob(".tokpack-sign-*"))


@pytest.mark.parametrize("guard", [{"dedup": "near"}, {"dedup": "exact"}, {"dedup": "near", "near_split": True}])
def test_the_users_val_stays_as_given_whatever_dedup_finds_in_it(tmp_path, guard):
    docs, planted = corpus(80, seed=29)
    near = next(b for a, b in planted if docs[a] != docs[b])
    val_docs = [docs[0], docs[0], docs[near - 1], docs[near], docs[3]]  # a copy and a near-copy inside val
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": d} for d in val_docs])
    source = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in docs[5:] + [docs[3]]])
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=(str(source), str(val)), val_inputs=(str(val),), out_dir=str(out), quiet=True,
                          guard=GuardOptions(**guard)))
    assert texts(out, "val") == val_docs and verify_folder(out)
    assert docs[3] not in texts(out, "train")  # val's copy in train is the later copy, and goes


def test_a_split_the_guard_empties_is_refused_naming_the_guard(tmp_path, capsys):
    docs, _ = corpus(40, seed=30)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": f"{d} {QUESTION}"} for d in docs])
    (tmp_path / "q.txt").write_text(QUESTION + "\n")
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "out", "--decontaminate", tmp_path / "q.txt",
                        "--decontaminate-max-share", "1")
    assert code == 2 and "\n" not in err.strip(), err
    assert "the train split would be empty: the guard removed all" in err and "as evaluation" in err, err
    assert "--val-fraction" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("line,says", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"document": 1, "file": "x.jsonl", "own_split": "train", "cluster": null, "similarity": null, '
     '"removed": null}', "is not a guard report's row"),  # no index
    ('{"document": "1", "file": 2, "own_split": "test", "index": -1, "cluster": null, "similarity": null, '
     '"removed": "gone"}', "is not a guard report's row"),
    ('{"document": 1, "file": "' + "x" * (2 << 20) + '"}', "more than the 1,048,576 tokpack reads"),
])
def test_inspect_and_verify_refuse_a_report_line_that_is_no_row_in_one_line(tmp_path, capsys, line, says):
    from tokpack.inspect import main as inspect_main
    from tokpack.verify import VerifyError

    docs, _ = corpus(60, seed=31)
    out = run(tmp_path, docs, "h", near_split=True)
    _forged(out, "val", [], None)
    report = out / "val.guard.jsonl"
    report.write_text(line + "\n")
    _forged(out, "val", None, lambda meta: meta["splits"]["val"]["guard"].update(
        bytes=report.stat().st_size, sha256=hashlib.sha256(report.read_bytes()).hexdigest(), rows=1))
    code, err = cli_run(inspect_main, capsys, out, "--guard", "--split", "val")
    assert code == 2 and says in err and "\n" not in err.strip() and "Traceback" not in err, err
    with pytest.raises(VerifyError):
        verify_folder(out)


def test_the_split_joins_below_the_threshold_and_dedup_removes_only_at_it(tmp_path):
    from tokpack.dedup.minhash import Shingling, sign

    docs, _ = corpus(60, seed=32)
    rng = random.Random(32)
    first = " ".join(_sentences()[:40])
    words = first.split(" ")
    while True:  # a near-copy estimated between the split's join (0.725) and the threshold (0.8)
        words[rng.randrange(len(words))] = f"edit{rng.randrange(10**6)}"
        second = " ".join(words)
        signed = sign([first, second], Shingling())
        estimate = float((signed.fingerprints[0] == signed.fingerprints[1]).mean())
        if estimate < 0.8:
            break
    assert 0.725 <= estimate
    docs += [first, second]
    out = run(tmp_path, docs, "m", near_split=True, dedup="near")
    near = read_meta(out)["guard"]["near"]
    assert near["split_threshold"] == 0.725 and near["threshold"] == 0.8
    rows = {r["document"]: r for s in ("train", "val") for r in _report(out, s)}
    pair = rows[len(docs) - 1]
    assert pair["cluster"] == len(docs) - 2 and pair["similarity"] == round(estimate, 4)
    assert pair["removed"] is None and second in texts(out, "train") + texts(out, "val")  # not a near-copy to dedup
    assert (second in texts(out, "val")) == (first in texts(out, "val")) and verify_folder(out)


def test_a_later_copys_bands_are_not_matched_again(tmp_path, monkeypatch):
    from tokpack.dedup.clusters import clusters
    from tokpack.dedup.minhash import Shingling, sign
    from tokpack.prepare.guard import match

    docs, _ = corpus(50, seed=33)
    docs = docs + [docs[7]] * 2000 + docs[:3]  # a text copied 2,000 times, and three copied once
    signed = sign(docs, Shingling())
    text = np.array([int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest()) for d in docs], dtype=np.uint64)
    routed = []
    real = match._matched
    monkeypatch.setattr(match, "_matched", lambda folder, blocks, *rest: real(
        folder, (routed.append(len(b)) or b for b in blocks), *rest))
    near, copies = _matched(tmp_path, [signed.bands], [text], signed.fingerprints)
    distinct = len(set(docs))
    assert sum(routed) == len(docs) + distinct * 32  # every text hash, then the bands of each text's first copy
    assert len(np.unique(copies % len(docs))) == len(docs) - distinct
    nodes, first = match.firsts(near, len(docs))
    labels = np.arange(len(docs))
    labels[nodes] = first
    assert np.array_equal(labels, clusters(signed.fingerprints, signed.bands, 0.8))


def test_a_corpus_of_copies_says_what_the_guard_removed_beside_the_empty_split(tmp_path, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "the same boilerplate line, page after page"}] * 300)
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "out", "--dedup", "exact", "--quiet")
    assert code == 2 and "\n" not in err.strip(), err
    assert "all 1 documents went to the other split with --val-fraction 0.1 (the guard removed 299 others)" in err


def test_meta_json_records_evaluation_and_val_urls_without_their_secrets():
    signed = "https://reader:pa55word@example.org/{}.jsonl?X-Amz-Signature=s3cr3t"
    config = PrepareConfig(inputs=("c.jsonl",), val_inputs=(signed.format("val"),),
                           guard=GuardOptions(decontaminate=(signed.format("mmlu"), "local.jsonl")))
    recorded = json.dumps(config.output_options())
    assert "pa55word" not in recorded and "s3cr3t" not in recorded and "reader" not in recorded
    assert config.output_options()["guard"]["decontaminate"] == ["https://example.org/mmlu.jsonl", "local.jsonl"]
    assert config.output_options()["val_inputs"] == ["https://example.org/val.jsonl"]


def test_a_sign_batch_of_short_documents_holds_a_bounded_number_of_them(tmp_path, monkeypatch):
    from tokpack.prepare.guard import signatures

    sizes = []
    sign = signatures.sign
    monkeypatch.setattr(signatures, "sign", lambda texts, *rest: sizes.append(len(texts)) or sign(texts, *rest))
    run(tmp_path, [f"line {i} of the same short kind" for i in range(6000)], "short", near_split=True)
    most = signatures._BATCH_CHARS // signatures._DOCUMENT_CHARS  # each weighs its signing arrays, not its text
    assert sum(sizes) == 6000 and max(sizes) <= most < 6000


def test_a_kept_placement_is_read_only_as_this_run_wrote_it(tmp_path):
    from tokpack.format import PLACED
    from tokpack.prepare.guard.placement import Placement, Verdict, load

    numbers, verdicts = np.array([1, 4, 7], dtype=np.int64), np.array([1, 2, 3], dtype=np.uint8)
    Placement([0, 5, 9], numbers, verdicts, ["in0", "in1"], ["p0", "p1"], tmp_path).save("fp", "signed")
    kept = load(tmp_path, "fp", 2, 3)
    assert kept is not None and kept.numbers.tolist() == [1, 4, 7] and kept.verdicts.tolist() == [1, 2, 3]
    assert kept.inputs == ["in0", "in1"] and kept.placed == ["p0", "p1"]
    assert [kept.split(0, d, "val") for d in range(5)] == ["val", "val", "val", "val", "train"]
    assert [kept.split(1, d, "train") for d in range(4)] == ["train", "train", None, "train"]
    assert kept.verdict(0, 1) == Verdict.VAL and kept.verdict(1, 0) is None
    # Another run's (fingerprint, units, reads) is not this one's.
    assert load(tmp_path, "other", 2, 3) is None and load(tmp_path, "fp", 3, 3) is None
    assert load(tmp_path, "fp", 2, 4) is None
    record_path, bin_path = tmp_path / PLACED.format("json"), tmp_path / PLACED.format("bin")
    record, raw = json.loads(record_path.read_text()), bin_path.read_bytes()

    def rehashed(body: bytes, **edits):
        return body, {**record, "sha256": hashlib.sha256(body).hexdigest(), **edits}

    unsorted = np.array([4, 1, 7], dtype="<i8").tobytes() + verdicts.tobytes()
    forgeries = [
        (raw[:-1] + bytes([raw[-1] ^ 1]), record),  # a byte changed: not as recorded
        (raw[:-1], record),  # torn
        rehashed(raw, moved=4),
        rehashed(unsorted),  # numbers out of order
        rehashed(numbers.astype("<i8").tobytes() + bytes([1, 2, 4])),  # no such verdict
        rehashed(np.array([-1, 4, 7], dtype="<i8").tobytes() + verdicts.tobytes()),
        rehashed(raw, starts=[0, 9, 5]),
        rehashed(raw, placed=["p0", 1]),
        rehashed(raw, inputs=["in0"]),
        rehashed(raw, moved="3"),
    ]
    for body, forged in forgeries:
        bin_path.write_bytes(body)
        record_path.write_text(json.dumps(forged))
        assert load(tmp_path, "fp", 2, 3) is None, forged
    # The file, or its record, a link to a copy of itself: never followed.
    elsewhere, recorded = tmp_path / "elsewhere", tmp_path / "recorded"
    elsewhere.write_bytes(raw)
    recorded.write_text(json.dumps(record))
    bin_path.write_bytes(raw)
    record_path.unlink()
    record_path.symlink_to(recorded)
    assert load(tmp_path, "fp", 2, 3) is None
    record_path.unlink()
    record_path.write_text(json.dumps(record))
    assert load(tmp_path, "fp", 2, 3) is not None
    bin_path.unlink()
    bin_path.symlink_to(elsewhere)
    assert load(tmp_path, "fp", 2, 3) is None
    # Saved again from the same signatures: written anew where it is not intact, else left as it
    # is; from others: written anew.
    bin_path.unlink()
    Placement([0, 5, 9], numbers, verdicts, ["in0", "in1"], ["p0", "p1"], tmp_path).save("fp", "signed")
    assert load(tmp_path, "fp", 2, 3) is not None
    written = record_path.stat().st_mtime_ns
    Placement([0, 5, 9], numbers, verdicts, ["in0", "in1"], ["p0", "p1"], tmp_path).save("fp", "signed")
    assert record_path.stat().st_mtime_ns == written
    Placement([0, 5, 9], numbers[:2], verdicts[:2], ["in0", "in1"], ["p0", "p1"], tmp_path).save("fp", "other")
    assert load(tmp_path, "fp", 2, 3).numbers.tolist() == [1, 4] and elsewhere.read_bytes() == raw


@pytest.mark.parametrize("launch", [[], ["--processes", "2", "--unit-mb", "0.05"]])
def test_a_full_disk_while_signing_names_the_file_and_leaves_no_signatures(tmp_path, capsys, monkeypatch, launch):
    from tokpack.prepare.guard import signatures

    real = signatures.open_new

    def on_a_full_disk(path):  # the operating system's own ENOSPC: writes to /dev/full fail with it
        return open("/dev/full", "r+b") if ".tokpack-sign-00000.docs." in path.name else real(path)

    monkeypatch.setattr(signatures, "open_new", on_a_full_disk)
    docs, _ = corpus(300, seed=4)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    code, err = cli_run(main, capsys, source, "--out-dir", tmp_path / "out", "--quiet", *launch)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err and ".tokpack-sign-00000.docs" in err and "free space" in err, err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob(".tokpack-sign-*"))


def test_a_lost_tasks_spill_file_never_stays_in_the_finished_folder(tmp_path):
    # A task's worker killed mid-match (Ray runs the task again elsewhere) leaves a spill file at
    # its temporary name; the run's own process finishes the folder once every task has ended.
    docs, _ = corpus(300, seed=6)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    out = tmp_path / "out"
    proc = paused_at(prepare_cmd(source, out, "--processes", "2", "--unit-mb", "0.05"),
                     lambda: any(out.glob(".tokpack-sign-*.json")))
    lost = out / "..tokpack-match-near05-00000.999999.tokpack-tmp"  # as a killed matcher's pid names it
    lost.write_bytes(bytes(64))
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not lost.exists() and not list(out.glob(".*"))
    assert main([str(source), "--out-dir", str(tmp_path / "one"), "--quiet", "--unit-mb", "0.05"]) == 0
    assert _files(out) == _files(tmp_path / "one")


def test_a_resumed_run_whose_input_was_edited_into_a_copy_is_one_fresh_runs_folder(tmp_path, monkeypatch, capsys):
    # One process, killed after two units; an early document edited (its size and mtime kept) into
    # a copy of a late one. The rerun signs the edited unit again, decides anew and finishes by the
    # new verdicts: meta.json and the reports are a fresh run's, not the first signing's.
    from tokpack.prepare import tokenize

    docs = [f"document {i:03d} " + "lorem ipsum dolor sit amet " * 30 + f"tail {i:03d}" for i in range(200)]
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    argv = [str(source), "--quiet", "--dedup", "exact", "--shard-tokens", "20000", "--unit-mb", "0.03",
            "--out-dir", str(tmp_path / "out")]
    real, calls = tokenize.run_unit, []

    def stopped_after_two(plan, unit, placement):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(unit)
        return real(plan, unit, placement)

    monkeypatch.setattr(tokenize, "run_unit", stopped_after_two)
    with pytest.raises(SystemExit):
        main(argv)
    monkeypatch.undo()
    before = source.stat()
    lines = source.read_text().splitlines()
    lines[10] = json.dumps({"text": docs[180]})
    source.write_text("\n".join(lines) + "\n")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert source.stat().st_size == before.st_size
    capsys.readouterr()
    assert main(argv) == 0
    assert "it is signed again" in capsys.readouterr().err
    assert main([*argv[:-1], str(tmp_path / "fresh")]) == 0
    assert _files(tmp_path / "out") == _files(tmp_path / "fresh")
    assert read_meta(tmp_path / "out")["guard"]["dedup"]["removed"] == [1]
