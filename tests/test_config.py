from __future__ import annotations

import pytest

from tokpack.config import build_config, default_of, load_toml, table
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
        load_toml(cfg, PrepareConfig)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_toml(tmp_path / "none.toml", PrepareConfig)
    (tmp_path / "bad.toml").write_text("val_fraction = = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_toml(tmp_path / "bad.toml", PrepareConfig)
    (tmp_path / "range.toml").write_text("val_fraction = 2.0")
    with pytest.raises(ValueError, match="--val-fraction 2.0 must lie strictly between 0 and 1"):
        build_config(PrepareConfig, tmp_path / "range.toml", {})


def test_table_aligns_columns():
    text = table([{"a": "x", "b": 1.5}, {"a": "longer", "b": 12345}], ["a", "b"])
    lines = text.splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1 and "12,345" in text
