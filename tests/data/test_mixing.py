from __future__ import annotations

import numpy as np
import pytest
import torch

from tokpack.check import resumed, take
from tokpack.data.loader import build_loader
from tokpack.data.mixing import MixedWindows
from tokpack.data.windows import TokenWindows


@pytest.fixture
def mix(tmp_path):
    # Two corpora that can be told apart by their ids: "web" holds ids < 1000, "code" ids >= 1000.
    np.arange(0, 1000, dtype=np.uint16).repeat(3).tofile(tmp_path / "web.bin")
    np.arange(1000, 1500, dtype=np.uint16).tofile(tmp_path / "code.bin")
    parts = {name: TokenWindows(tmp_path / f"{name}.bin", 8, dtype="uint16") for name in ("web", "code")}
    return MixedWindows(parts, weights={"web": 0.7, "code": 0.3}, block_size=8)


def build(mix, num_samples=32 * 200):
    return build_loader(mix, 32, seed=4, num_samples=num_samples)


def test_mixture_follows_the_weights_and_reports_them(mix):
    loader = build(mix)
    batches = iter(loader)
    firsts = torch.cat([next(batches)[0][:, 0] for _ in range(199)])  # all but the epoch's last batch
    code_share = (firsts >= 1000).float().mean().item()
    assert 0.27 < code_share < 0.33  # 6,368 draws: 3 standard deviations is 0.017
    assert loader.epoch == 0 and loader.batch == 199
    report = mix.realised(loader)
    assert report["code"] == pytest.approx(code_share) and report["web"] == pytest.approx(1 - code_share)


def test_mixture_windows_stay_inside_one_corpus(mix):
    x, y = next(iter(build(mix)))
    assert ((x < 1000).all(1) | (x >= 1000).all(1)).all()
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_mixture_is_reproducible_and_resumable(mix):
    n = 30
    fresh = take(build(mix, 32 * 12), n)
    assert take(build(mix, 32 * 12), n) == fresh
    assert all(resumed(lambda: build(mix, 32 * 12), n, at) == fresh for at in (1, 11, 13))


def test_bad_weights_are_refused(tmp_path, mix):
    with pytest.raises(ValueError, match="give one weight each"):
        MixedWindows({"web": mix.parts[0]}, {"code": 1.0}, 8)
    for weight in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="must be finite non-negative numbers with a positive sum"):
            MixedWindows({"web": mix.parts[0]}, {"web": weight}, 8)


def test_realised_never_hangs_on_an_endless_sampler(mix):
    loader = build_loader(mix, 32, seed=4)  # endless: no num_samples
    batches = iter(loader)
    firsts = torch.cat([next(batches)[0][:, 0] for _ in range(50)])
    assert loader.batch == 50 and loader.epoch == 0
    share = mix.realised(loader)
    assert share["code"] == pytest.approx((firsts >= 1000).float().mean().item())
    more = torch.cat([firsts, *(next(batches)[0][:, 0] for _ in range(10))])
    assert mix.realised(loader)["code"] == pytest.approx((more >= 1000).float().mean().item())
