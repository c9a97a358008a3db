from __future__ import annotations

import pytest

from tokpack.cli import table
from tokpack.options import build_config, default_of, load_toml
from tokpack.models import GPTConfig
from tokpack.prepare import PrepareConfig


def test_file_then_overrides(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('encoding = "gpt2"\nval_fraction = 0.2\nworkers = 1\n')
    config = build_config(PrepareConfig, cfg, {"workers": 3, "seed": None})
    assert (config.val_fraction, config.workers, config.seed) == (0.2, 3, default_of(PrepareConfig, "seed"))


def test_unknown_key_names_key_file_and_valid_keys(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("val_fractoin = 0.2\n")
    with pytest.raises(ValueError, match=r"unknown key 'val_fractoin' in .*c.toml; valid keys: inputs, out_dir"):
        build_config(PrepareConfig, cfg, {})


@pytest.mark.parametrize("line,fragment", [
    ('force = "no"', "force = 'no' in"),
    ('val_fraction = "0.1"', "val_fraction = '0.1' in"),
    ('workers = "2"', "workers = '2' in"),
    ("seed = 1.5", "seed = 1.5 in"),
    ("seed = 1180591620717411303424", "(64-bit)"),
    ("out_dir = 5", "out_dir = 5 in"),
    ('inputs = "a.txt"', "inputs = 'a.txt' in"),
    ("inputs = [1]", "inputs = 1 in"),
])
def test_values_are_checked_against_their_type_before_anything_runs(tmp_path, line, fragment):
    cfg = tmp_path / "c.toml"
    cfg.write_text(line + "\n")
    with pytest.raises(ValueError) as exc:
        build_config(PrepareConfig, cfg, {})
    assert fragment in str(exc.value) and str(cfg) in str(exc.value) and "\n" not in str(exc.value)


def test_nested_tables_are_checked_and_flags_reach_them(tmp_path):
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Outer:
        steps: int = 1
        model: GPTConfig = field(default_factory=GPTConfig)

    cfg = tmp_path / "c.toml"
    cfg.write_text("steps = 5\n[model]\nn_layer = 2\nbias = false\n")
    config = build_config(Outer, cfg, {"n_embd": 64, "steps": None})
    assert (config.steps, config.model.n_layer, config.model.bias, config.model.n_embd) == (5, 2, False, 64)
    cfg.write_text("[model]\nn_layers = 2\n")
    with pytest.raises(ValueError, match=r"unknown key 'model.n_layers' in .*valid keys: vocab_size"):
        build_config(Outer, cfg, {})
    cfg.write_text("[model]\nbias = 1\n")  # TOML has true: 1 is a mistake, not a bool
    with pytest.raises(ValueError, match=r"model.bias = 1 in .* is not true or false; give model.bias true or false"):
        build_config(Outer, cfg, {})
    cfg.write_text("quiet = 1\n")
    with pytest.raises(ValueError, match=rf"quiet = 1 in {cfg} is not true or false"):
        build_config(PrepareConfig, cfg, {})


def test_launch_keys_live_in_their_table_and_the_old_top_level_keys_still_work_with_a_warning(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[launch]\nprocesses = 3\n")
    assert build_config(PrepareConfig, cfg, {}).launch.processes == 3
    assert build_config(PrepareConfig, None, {"tasks": 4, "task": 1}).launch.place() == (1, 4)  # flags reach it
    cfg.write_text("tasks = 4\nfinalize = true\n[guard]\nnear_split = true\n")
    with pytest.warns(FutureWarning, match=rf"tasks, finalize at the top of {cfg} belong in its \[launch\] table now"):
        config = build_config(PrepareConfig, cfg, {"task": 2})
    assert (config.launch.tasks, config.launch.task, config.launch.finalize) == (4, 2, True)
    cfg.write_text("processes = 2\n[launch]\nprocesses = 3\n")
    with pytest.raises(ValueError, match=rf"processes is given both at the top of {cfg} and in its \[launch\] table"):
        build_config(PrepareConfig, cfg, {})
    cfg.write_text("[launch]\nprocess = 3\n")
    with pytest.raises(ValueError, match=r"unknown key 'launch.process' in .*valid keys: processes, ray"):
        build_config(PrepareConfig, cfg, {})
    cfg.write_text("[launch]\nprocesses = 2\ntasks = 4\n")  # the group's own rule, checked where it is given
    with pytest.raises(ValueError, match=r"--processes 2 runs every task of the run .* does not take --tasks"):
        build_config(PrepareConfig, cfg, {})


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_toml(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("val_fraction = = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_toml(tmp_path / "bad.toml")
    (tmp_path / "range.toml").write_text("val_fraction = 2.0")
    with pytest.raises(ValueError, match="--val-fraction 2.0 must lie strictly between 0 and 1"):
        build_config(PrepareConfig, tmp_path / "range.toml", {})


def test_table_aligns_columns():
    text = table([{"a": "x", "b": 1.5}, {"a": "longer", "b": 12345}], ["a", "b"])
    lines = text.splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1 and "12,345" in text


def test_a_flag_wins_over_the_file_but_a_wrong_value_there_is_still_refused(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("quiet = 1\nworkers = 1\n")
    with pytest.raises(ValueError, match=rf"quiet = 1 in {cfg} is not true or false"):
        build_config(PrepareConfig, cfg, {"quiet": True})
    cfg.write_text("quiet = false\nworkers = 1\n")
    assert build_config(PrepareConfig, cfg, {"quiet": True, "workers": 2}).workers == 2


def test_the_prepare_flags_are_the_config_fields(capsys):
    # One source: every PrepareConfig field is a flag whose help is the field's (a group's fields,
    # the [guard] table's, flags of their own), and no flag is extra.
    from dataclasses import fields

    from tokpack.prepare.__main__ import main
    from tokpack.prepare import GuardOptions, LaunchOptions

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--guard " not in help_text and "--launch " not in help_text
    tables = ("guard", "launch")
    for f in [f for f in fields(PrepareConfig) if f.name not in tables] + [*fields(GuardOptions), *fields(LaunchOptions)]:
        flag = "inputs" if f.name == "inputs" else f"--{f.name.replace('_', '-')}"
        assert flag in help_text, flag
        assert " ".join(f.metadata["help"].split())[:40] in help_text, f.name
    assert "--no-force" in help_text and "--no-quiet" in help_text
