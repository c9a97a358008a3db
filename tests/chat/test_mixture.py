"""--mixture: each split written as nanochat's TaskMixture serves its tasks (a faithful miniature:
tasks listed with their epochs, every (task, conversation) shuffled by random.Random(seed)), read
by nanochat's SFT loader batch for batch, each input's share of the supervised tokens reported."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from helpers import cli_run, make_chats, write_jsonl, write_nanochat_spec
from tokpack.bench.chat import chat_documents, nanochat_render, nanochat_sft_batches
from tokpack.data.loader import build_loader
from tokpack.data.packing import PackedDocuments
from tokpack.format import read_meta
from tokpack.prepare.__main__ import main as prepare_main
from tokpack.tokenizer import load_encoding


def task_mixture(tasks: list[list[dict]], seed: int) -> list[dict]:
    """nanochat's TaskMixture: every (task, conversation) of the tasks in order, shuffled."""
    index_map = [(t, i) for t, task in enumerate(tasks) for i in range(len(task))]
    random.Random(seed).shuffle(index_map)
    return [tasks[t][i] for t, i in index_map]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    chats = make_chats(64, seed=21)
    smol, identity, val = chats[:36], chats[36:48], chats[48:]
    return (root, write_nanochat_spec(root / "tok"), write_jsonl(root / "smol.jsonl", smol),
            write_jsonl(root / "identity.jsonl", identity), write_jsonl(root / "val.jsonl", val), smol, identity)


def _prepare(capsys, inputs, out, *extra):
    root, spec, smol, identity, val = inputs[:5]
    return cli_run(prepare_main, capsys, smol, identity, val, "--chat", "nanochat", "--encoding", spec, "--val-inputs",
                   val, "--out-dir", out, "--quiet", *extra)


@pytest.mark.parametrize("seed", [42, 7])
def test_a_split_is_nanochats_task_mixture_and_its_sft_loader_reads_it(inputs, tmp_path, capsys, seed):
    root, spec, smol_file, identity_file, _, smol, identity = inputs
    code, err = _prepare(capsys, inputs, tmp_path / "out", "--mixture", f"{identity_file}=2", "--seed", str(seed))
    assert code == 0, err
    enc = load_encoding(str(spec))
    expected = [nanochat_render(enc, c) for c in task_mixture([smol, identity, identity], seed)]
    assert chat_documents(tmp_path / "out", "train") == expected
    # nanochat's SFT loader over its mixture, and tokpack's over the folder, batch for batch.
    T = max(len(ids) for ids, _ in expected)  # every conversation fits a row, where nanochat never clogs
    rows = PackedDocuments(tmp_path / "out", T, split="train", rows="nanochat-sft", ignore_index=-1)
    for batch, (x, y) in itertools.islice(zip(build_loader(rows, 2, seed=0),
                                              nanochat_sft_batches(enc, expected, 2, T, rendered=True)), 12):
        assert np.array_equal(batch.x.numpy(), x) and np.array_equal(batch.y.numpy(), y)
    report = read_meta(tmp_path / "out")["chat"]["mixture"]
    assert report["seed"] == seed
    smol_entry, identity_entry, val_entry = report["inputs"]
    assert (smol_entry["epochs"], identity_entry["epochs"], val_entry["epochs"]) == (1, 2, 1)
    assert identity_entry["train"]["conversations"] == 2 * len(identity)
    supervised = [sum(sum(nanochat_render(enc, c)[1]) for c in task) for task in (smol, identity)]
    assert [smol_entry["train"]["supervised"], identity_entry["train"]["supervised"]] == \
        [supervised[0], 2 * supervised[1]]
    share = identity_entry["train"]["supervised_share"]
    assert share == pytest.approx(2 * supervised[1] / (supervised[0] + 2 * supervised[1]), abs=1e-6)
    assert val_entry["val"]["supervised_share"] == 1 and val_entry["train"]["conversations"] == 0


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


@pytest.mark.parametrize("layout", [(), ("--format", "megatron")], ids=["flat", "megatron"])
def test_a_mixture_of_processes_is_one_processs_folder(inputs, tmp_path, capsys, layout):
    # Each process renders its units in input order, recording each run of conversations' input;
    # the run's process copies them out in mixture order: one process's bytes, meta.json included.
    identity_file = inputs[3]
    mixture = ("--mixture", f"{identity_file}=3", "--seed", "5", "--unit-mb", "0.002", *layout)
    code, err = _prepare(capsys, inputs, tmp_path / "one", *mixture)
    assert code == 0, err
    for n in (2, 3) if not layout else (2,):
        code, err = _prepare(capsys, inputs, tmp_path / f"p{n}", *mixture, "--processes", str(n))
        assert code == 0, err
        assert _files(tmp_path / f"p{n}") == _files(tmp_path / "one"), n
        assert not [p.name for p in (tmp_path / f"p{n}").iterdir() if p.name.startswith(".")
                    and p.name != ".tokpack.lock"]


def test_a_unit_whose_record_misnames_its_conversations_inputs_is_redone(inputs, tmp_path):
    from tokpack.format import UNIT_RECORD
    from tokpack.prepare import LaunchOptions, PrepareConfig
    from tokpack.prepare.plan import processes_plan
    from tokpack.prepare.publish.ledger import keep, this_run
    from tokpack.prepare.tokenize import run_unit

    root, spec, smol, identity, val = inputs[:5]
    config = PrepareConfig(inputs=(str(smol), str(identity), str(val)), chat="nanochat", encoding=str(spec),
                           val_inputs=(str(val),), mixture=(f"{identity}=2",), unit_mb=0.01, launch=LaunchOptions(processes=2),
                           out_dir=str(tmp_path / "out"), quiet=True)
    plan = processes_plan(config, 0.0)
    (tmp_path / "out").mkdir()
    unit = plan.units - 1
    keep(plan, run_unit(plan, unit, None))
    raw = (tmp_path / "out" / UNIT_RECORD.format(unit)).read_bytes()
    record = json.loads(raw)
    sources = record["chat"]["sources"]
    held = next(split for split, runs in sources.items() if runs)  # val's input is all val
    other = "train" if held == "val" else "val"
    assert sum(n for _, n in sources[held]) == record["splits"][held]["info"]["documents"] > 0
    assert all(a[0] != b[0] for a, b in zip(sources[held], sources[held][1:]))  # a run an input: O(files)
    assert this_run(plan, unit, raw, "r", None, proven=True) is not None
    for forged in ({**sources, held: sources[held] + [[0, 1]]},  # one conversation too many
                   {**sources, held: [[3, n] for _, n in sources[held]]},  # an input the run has not
                   {held: sources[held]},  # a split left out
                   {**sources, held: [[float(kind), n] for kind, n in sources[held]]},
                   {**sources, other: [[0, 0]]}):  # an empty run
        changed = json.dumps({**record, "chat": {**record["chat"], "sources": forged}}).encode()
        assert this_run(plan, unit, changed, "r", None, proven=True) is None, forged


def test_bad_mixtures_are_one_line_and_leave_nothing(inputs, tmp_path, capsys):
    root, spec, smol_file, identity_file = inputs[:4]
    for entries, reason in (((f"{root / 'other.jsonl'}=2",), "names no input"), ((f"{identity_file}=0",), "epochs"),
                            ((f"{identity_file}=two",), "epochs"), ((f"{identity_file}=\u00b2",), "'\u00b2' epochs"),
                            ((f"{identity_file}=101",), "from 1 to 100"), ((f"{identity_file}=1000000000",), "from 1"),
                            ((f"{identity_file}=2", f"{identity_file}=3"), f"names {identity_file} twice")):
        code, err = _prepare(capsys, inputs, tmp_path / "out", *[a for e in entries for a in ("--mixture", e)])
        assert code == 2 and reason in err and "\n" not in err, err
    assert [e for e in (tmp_path / "out").parent.iterdir() if e.name == "out"] == []
    code, err = cli_run(prepare_main, capsys, smol_file, "--mixture", f"{smol_file}=2", "--out-dir", tmp_path / "t")
    assert code == 2 and "applies to conversations" in err, err
    # A bad record found while the conversations are staged: nothing is left, staged or written.
    bad = write_jsonl(root / "bad" / "identity.jsonl", [{"messages": []}])
    code, err = cli_run(prepare_main, capsys, smol_file, bad, "--chat", "nanochat", "--encoding", spec,
                        "--mixture", f"{bad}=3", "--out-dir", tmp_path / "o", "--quiet")
    assert code == 2 and "empty conversation" in err, err
    assert not (tmp_path / "o").exists()
