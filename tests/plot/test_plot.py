"""The figures: each drawn from a tiny run into a PNG of the stated size, the numbers behind it
checked against the data; a missing matplotlib is one line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from helpers import run_bounded
from tokpack import plot
from tokpack.plot.__main__ import main as plot_main
from tokpack.evaluation import draw_run
from tokpack.evaluation import main as evaluate_main
from tokpack.evaluation import sweep
from tokpack.inspect import main as inspect_main
from tokpack.models import GPT, GPTConfig, gpt_checkpoint
from tokpack.split import open_splits

SIZE = (800, 450)  # FIGSIZE at DPI


def test_the_sweep_figure_draws_the_rows_the_table_prints(prepared, tmp_path, capsys):
    png = tmp_path / "sweep.png"
    argv = [str(prepared), "--model", "bigram", "--model", "unigram", "--block-size", "32", "--stride", "32", "8",
            "--quiet", "--plot", str(png)]
    assert evaluate_main(argv) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plot.png_size(png) == SIZE and not list(tmp_path.glob(".*tokpack-tmp"))
    drawn = plot.plot_sweep(rows, tmp_path / "again.png")
    assert drawn == {r["model"]: {s["stride"]: (s["loss"], s["bits_per_byte"]) for s in rows if s["model"] == r["model"]}
                     for r in rows}
    direct = sweep(prepared, baselines=["unigram"], block_size=32, strides=[8], quiet=True)[0]
    assert drawn["unigram"][8] == (direct["loss"], direct["bits_per_byte"])


def _training_run(run, prepared, ranks=2, steps=6):
    """What scripts/train_gpt.py leaves in out_dir: a loss log per rank and ckpt.pt with its evals."""
    run.mkdir()
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        lines = [json.dumps({"step": s, "loss": float(10 - s + rng.random())}) for s in range(1, steps + 1)]
        (run / f"losses-rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    model = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=16))
    evals = [{"step": 3, "loss": 8.5}, {"step": 6, "loss": 7.25}]
    torch.save(gpt_checkpoint(model, step=steps, evals=evals, config={"data_dir": str(prepared)}), run / "ckpt.pt")


def test_the_loss_figure_merges_ranks_and_draws_the_baselines(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    _training_run(run, prepared)
    drawn = draw_run(run, tmp_path / "losses.png")
    logs = [[json.loads(line) for line in (run / f"losses-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert drawn["train"] == pytest.approx({a["step"]: (a["loss"] + b["loss"]) / 2 for a, b in zip(*logs)})
    assert drawn["val"] == {3: 8.5, 6: 7.25}
    baselines = {r["model"]: r["loss"] for r in sweep(prepared, baselines=["bigram", "unigram"], block_size=32,
                                                      quiet=True)}
    assert drawn["baselines"] == baselines and baselines["bigram"] < baselines["unigram"]
    assert plot.png_size(tmp_path / "losses.png") == SIZE
    assert plot_main([str(run)]) == 0  # the command: RUN_DIR/losses.png by default
    assert plot.png_size(run / "losses.png") == SIZE and "val 7.2500 at step 6" in capsys.readouterr().out


def test_the_lengths_are_printed_without_the_extra_and_drawn_with_it(prepared, tmp_path, capsys, monkeypatch):
    assert inspect_main([str(prepared), "--lengths", str(tmp_path / "lengths.png"), "--block-size", "64"]) == 0
    out = capsys.readouterr().out
    assert plot.png_size(tmp_path / "lengths.png") == SIZE
    for name, split in open_splits(prepared).items():
        starts = np.fromfile(prepared / f"{name}.idx", dtype="<u8").astype(np.int64)
        lengths = np.diff(np.append(starts, int(split.lengths.sum())))
        share = lengths[lengths > 65].sum() / lengths.sum()
        assert 0 < share < 1
        assert f"{name:5s} {len(lengths):>9,} documents  min {lengths.min():,}" in out
        assert f"{share:.1%} of tokens in {int((lengths > 65).sum()):,} documents longer than 65" in out
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the extra is not installed
    assert inspect_main([str(prepared), "--lengths", "--block-size", "64"]) == 0
    assert capsys.readouterr().out.strip() == out.strip().rsplit("\n", 1)[0]  # the same text, no figure
    for command in (lambda: inspect_main([str(prepared), "--lengths", str(tmp_path / "x.png")]),
                    lambda: evaluate_main([str(prepared), "--model", "bigram", "--plot", str(tmp_path / "x.png")]),
                    lambda: plot_main([str(tmp_path)])):
        with pytest.raises(SystemExit) as exc:
            command()
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err == 'tokpack: plotting needs matplotlib; pip install "tokpack[plot]"', err
    assert not (tmp_path / "x.png").exists()


def test_figures_are_written_whole_and_only_as_png(prepared, tmp_path, capsys):
    rows = sweep(prepared, baselines=["unigram"], block_size=16, quiet=True)
    with pytest.raises(ValueError, match="does not end in .png"):
        plot.plot_sweep(rows, tmp_path / "sweep.jpg")
    (tmp_path / "sweep.png").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_text("keep")
    plot.plot_sweep(rows, tmp_path / "sweep.png")  # the link is replaced by the figure, not written through
    assert (tmp_path / "elsewhere.txt").read_text() == "keep" and not (tmp_path / "sweep.png").is_symlink()
    assert plot.png_size(tmp_path / "sweep.png") == SIZE
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_bad_figure_name_is_one_line_before_any_work(prepared, tmp_path, capsys, monkeypatch):
    import tokpack.evaluation

    monkeypatch.setattr(tokpack.evaluation, "sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    for name, fragment in (("sweep.jpg", "does not end in .png"), ("missing/sweep.png", "does not exist")):
        with pytest.raises(SystemExit) as exc:
            evaluate_main([str(prepared), "--model", "bigram", "--plot", str(tmp_path / name)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and fragment in err and "\n" not in err


def _run_with_log(tmp_path, lines):
    run = tmp_path / "run"
    run.mkdir()
    (run / "losses-rank0.jsonl").write_bytes(b"".join(lines))
    return run


def test_hostile_loss_logs_are_read_in_bounded_lines_skipping_what_cannot_be_drawn(tmp_path):
    good = [json.dumps({"step": s, "loss": 5.0 - s / 10}).encode() + b"\n" for s in range(1, 6)]
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"  # recursion, and a line far past the cap
    nested = b"[" * 2000 + b"]" * 2000 + b"\n"  # recursion inside the cap
    bad = [deep, nested, b'{"step": 9, "loss": NaN}\n', b'{"step": 10, "loss": Infinity}\n', b"not json\n"]
    run = _run_with_log(tmp_path, good[:2] + bad + good[2:])
    with pytest.warns(UserWarning, match="5 lines of .* are not drawn"):
        assert plot.read_losses(run) == pytest.approx({s: 5.0 - s / 10 for s in range(1, 6)})


@pytest.mark.parametrize("kind", ["fifo", "link to a device", "link to a file"])
def test_a_log_that_is_not_a_regular_file_of_the_run_is_refused_not_read(tmp_path, kind):
    import os

    run = tmp_path / "run"
    run.mkdir()
    log = run / "losses-rank0.jsonl"
    if kind == "fifo":
        os.mkfifo(log)  # read naively, this would wait for a writer forever
    elif kind == "link to a device":
        log.symlink_to("/dev/zero")  # read naively, this would fill the memory
    else:
        (tmp_path / "other.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
        log.symlink_to(tmp_path / "other.jsonl")
    # In a fresh process with a time limit: a FIFO read naively would wait forever, a device fill memory.
    code = "import sys; from tokpack.plot import read_losses; read_losses(sys.argv[1])"
    done = run_bounded(code, str(run))
    assert done.returncode == 1 and "ValueError" in done.stderr and "losses-rank0.jsonl" in done.stderr.splitlines()[-1]


def test_a_long_log_is_drawn_in_bounded_buckets(tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "MAX_POINTS", 100)
    run = _run_with_log(tmp_path, [json.dumps({"step": s, "loss": float(s % 7)}).encode() + b"\n"
                                   for s in range(1, 1001)])
    curve = plot.read_losses(run)
    assert 50 <= len(curve) <= 100
    width = sorted(curve)[1] - sorted(curve)[0]
    first = sorted(curve)[1]  # a whole bucket: the mean of its steps' losses
    assert curve[first] == pytest.approx(np.mean([s % 7 for s in range(first, first + width)]))


def test_a_missing_run_folder_and_a_folder_as_the_figure_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plot_main([str(tmp_path / "nowhere")])
    assert f"run folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    (tmp_path / "figs.png").mkdir()
    with pytest.raises(ValueError, match="figs.png is a folder; name the PNG file"):
        plot.png_path(tmp_path / "figs.png")
