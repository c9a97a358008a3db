"""The benchmarks run end to end on tiny sizes; their figures are printed, never asserted. One
runs as the command, the others call its main in process (the same code, without a start-up)."""

from __future__ import annotations

import json

import pytest

from helpers import make_docs, prepare_docs, run_module, write_gpt2_tokenizer
from tokpack.bench.__main__ import main


def _figures(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bench_prepare_runs_and_reports_ratios(tmp_path):
    tokenizer = write_gpt2_tokenizer(tmp_path / "gpt2-hf")
    done = run_module("tokpack.bench", "prepare", "--mb", "0.5", "--repeat", "1", "--no-peers",
                      "--tokenizer", str(tokenizer), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"prepare_vs_allcore", "prepare_vs_1thread", "prepare_peak_rss_mb", "resume_check_over_prepare",
            "hf_prepare_vs_encode_batch", "hf_prepare_peak_rss_mb", "splintr_prepare_vs_best_raw",
            "splintr_one_document_vs_raw"} <= set(figures)
    assert figures["tokens"] > 100_000 and "tokpack time / this" in done.stdout
    floor = figures["splintr_floor"]  # what a prepare computes beyond the encoder, each stage timed
    assert floor["encoder_cpu_s"] > 0 and all(v > 0 for k, v in floor.items() if k.endswith("(for a resume)"))
    assert floor["time_over_raw_at_least"] > 0 and "beyond the encoder" in done.stdout
    end = figures["end_of_run"]  # the fsync at close, with write-back and without, and the final verify
    assert end["megabytes"] > 0 and end["close_wait_none_s"] > 0 and end["verify_wall_s"] > 0
    assert "the end of a run" in done.stdout
    assert figures["load_time_over_tiktoken"] > 0 and "loading gpt2: tokpack takes" in done.stdout


def test_bench_loader_runs_on_tiny_sizes(capsys):
    figures = _figures(capsys, ["loader", "--tokens", "200000", "--block-size", "64", "--batch-size", "8",
                                "--batches", "5", "--memory-batches", "20", "--work", "1", "--rounds", "1",
                                "--no-peers", "--start-methods", "fork"])
    assert {"loader_vs_nanogpt", "loader_vs_raw", "loader_vs_slice", "worker_anon_growth_mb",
            "loader_hidden"} <= set(figures)
    assert figures["memory_batches"] == 20


def test_bench_train_needs_a_prepared_folder(tmp_path, prepared, capsys):
    with pytest.raises(SystemExit) as missing:
        main(["train", "--folder", str(tmp_path / "none")])
    assert missing.value.code == 2 and "run python -m tokpack.prepare" in capsys.readouterr().err
    config = tmp_path / "t.toml"
    config.write_text("batch_size = 2\n[model]\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n")
    assert _figures(capsys, ["train", "--folder", str(prepared), "--config", str(config), "--steps", "2"])["steps"] == 2


def test_bench_open_reports_the_cost_per_shard_and_of_a_state(capsys):
    figures = _figures(capsys, ["open", "--shards", "5", "20", "--shard-tokens", "16", "--rounds", "1"])
    assert [row["shards"] for row in figures["rows"]] == [5, 20]
    assert {"open_per_shard_growth", "state_dict_growth"} <= set(figures)


def test_bench_packing_runs_and_matches_nanochats_rows(capsys):
    figures = _figures(capsys, ["packing", "--tokens", "60000", "--mean-length", "80", "--block-size", "64",
                                "--batch-size", "4", "--batches", "3", "--buffer-size", "16", "--rounds", "1"])
    assert figures["identical_to_nanochat"] is True
    assert {"packed_vs_nanochat", "packed_vs_windows", "packed_vs_windows_2_workers",
            "int64_from_workers_vs_rows"} <= set(figures)
    assert set(figures["stages_us"]) == {"best fit", "gather", "widen"} and min(figures["stages_us"].values()) > 0
    assert [p["packing"] for p in figures["packings"]][:2] == ["aligned", "bestfit"]
    assert all(p["utilisation"] == 1.0 for p in figures["packings"][:3])


def test_bench_resume_serves_the_batch_after_far_positions(capsys):
    figures = _figures(capsys, ["resume", "--at", "10", "1000", "--block-size", "16", "--batch-size", "2",
                                "--buffer-size", "8", "--documents", "50", "--replay-limit", "0.5"])
    assert [row["batch"] for row in figures["rows"]] == [10, 1000]
    assert all(row["resume s"] > 0 and row["replay s (before)"] > 0 for row in figures["rows"])


def test_bench_tokenizer_trains_both_ways_and_compares(capsys):
    pytest.importorskip("rustbpe")
    figures = _figures(capsys, ["tokenizer", "--mb", "0.3", "--vocab-size", "400", "--rounds", "1",
                                "--compression-vocab", "300"])
    assert figures["speed_vs_rustbpe"] > 0 and len(figures["runs"]) == 2
    assert [row["tokenizer"] for row in figures["compression"]] == ["trained here (300)", "gpt2", "cl100k_base"]


def test_every_bench_states_the_machine_and_each_ratios_range(capsys):
    import re

    assert main(["packing", "--tokens", "30000", "--mean-length", "80", "--block-size", "64", "--batch-size", "4",
                 "--batches", "2", "--buffer-size", "8", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["machine"]["cores"] >= 1 and len(figures["machine"]["load_average"]) == 3
    assert re.match(r"\d+ cores, load average [\d.]+ [\d.]+ [\d.]+", out)
    ranges = re.findall(r"(\d+\.\d\d)-(\d+\.\d\d)", out)
    assert len(ranges) >= 5 and all(float(lo) <= float(hi) for lo, hi in ranges)


def test_bench_evaluate_compares_with_estimate_loss(tmp_path, capsys):
    # A val split of a few hundred tokens: each run scores them all against 50,304 logits.
    folder = prepare_docs(tmp_path, make_docs(16), val_fraction=0.2)
    figures = _figures(capsys, ["evaluate", "--folder", str(folder), "--block-size", "16", "--batch-size", "4",
                                "--n-layer", "1", "--n-embd", "16", "--rounds", "1"])
    assert [row["run"] for row in figures["rows"]][:2] == ["nanoGPT estimate_loss (batches built)",
                                                           "nanoGPT estimate_loss (get_batch)"]
    assert figures["tokens"] > 0 and all(row["vs built"] > 0 and row["vs get_batch"] > 0 for row in figures["rows"])


def test_bench_chat_matches_nanochats_rendering_and_rows(capsys):
    figures = _figures(capsys, ["chat", "--mb", "0.2", "--block-size", "2048", "--batch-size", "2", "--batches", "5",
                                "--rounds", "1", "--processes", "2", "--processes-mb", "0.3"])
    assert figures["identical"] is True and figures["rows_identical"] is True
    # the whole commands: two processes write the one process's folder
    assert figures["processes_identical"] is True and figures["processes2_vs_nanochat"] > 0
    assert figures["command_vs_nanochat"] > 0
    assert figures["prepare_vs_nanochat"] > 0 and figures["rows_vs_nanochat"] > 0 and figures["peak_rss_mb"] > 0
    assert figures["tiktoken_alone_vs_nanochat"] > 0 and figures["prepare_tiktoken_vs_nanochat"] > 0
    assert figures.get("tokenizer_alone_vs_transformers", 1) > 0
    assert 0 <= figures["padding"] < 1 and figures["conversations"] > 10


@pytest.mark.parametrize("argv", [["--processes", "-1"], ["--processes-mb", "5"], ["--processes", "2", "--processes-mb", "0"],
                                  ["--processes", "2", "--processes-mb", "nan"], ["--processes", "2", "--processes-mb", "inf"]])
def test_bench_chat_refuses_a_processes_option_that_measures_nothing(argv, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["chat", "--mb", "0.01", *argv])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and err.startswith("tokpack: --processes") and len(err.splitlines()) == 1


def test_bench_dedup_compares_with_exact_jaccard_and_reports_its_cost(capsys):
    figures = _figures(capsys, ["dedup", "--mb", "0.1", "--rounds", "1", "--real-docs", "30", "--duplicated", "2000",
                                "--tasks", "1", "3"])
    for corpus in ("planted", "installed packages"):
        quality = figures["quality"][corpus]
        assert quality["documents"] > 10 and 0 <= quality["found"] <= 1 and 0 <= quality["merged"] <= 1
    assert figures["quality"]["planted"]["pairs_above"] > 0  # planted near-copies are there to be found
    assert figures["split"]["--near-split"]["val_with_a_near_copy_in_train"] == 0
    assert figures["signatures"]["tokpack"]["mb_per_s"] > 0 and figures["decontamination"]["hits"] > 0
    assert set(figures["prepare"]) == {f"{guard} ({backend})" for guard in ("--near-split", "--dedup near")
                                       for backend in ("auto", "tiktoken")} and figures["peak_rss_mb"] > 0
    assert set(figures["words"]) == {"ASCII", "as written", "web Unicode", "decomposed accents", "Chinese"}
    assert figures["words"]["ASCII"]["of_ascii"] == 1
    assert all(w["mb_per_s"] > 0 for w in figures["words"].values())
    assert figures["duplicated"]["documents"] == 2000 and figures["duplicated"]["guarded_mb"] > 0
    shared = figures["shared"]  # every part of the match matched once, by one task or shared by three
    assert set(shared) == {"1", "3"} and shared["1"]["parts"] == shared["3"]["parts"] == 32
    assert shared["1"]["most_by_one_task"] == 32 and shared["3"]["units"] >= 3


def test_bench_dedup_refuses_too_few_duplicated_documents(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["dedup", "--mb", "0.01", "--duplicated", "9"])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and err.startswith("tokpack: --duplicated 9 must be at least 10") and "\n" not in err
