"""scripts/lab.py in its own process, as a user runs it: stderr goes to a file because a forkserver
would inherit the pipe, and reading it to EOF would wait on the server."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT


def test_lab_shows_duplicates_sharding_reproducibility_and_bucketing(tmp_path):
    with open(tmp_path / "stderr.txt", "w") as err:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lab.py"), "--seed", "0"],
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=600)
    assert done.returncode == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    d, a, b = results["duplicates"], results["augmentation"], results["bucketing"]
    assert d["unsharded"] == 2000 and d["unsharded_distinct"] == 2000  # every item twice on 2 workers
    assert d["sharded"] == 0 and d["sharded_distinct"] == 2000  # exactly once
    assert a["reproducible"] and a["augmented"]
    assert b["random_padded"] > 0.40 and b["bucketed_padded"] < 0.05
    assert set(results["throughput"]) == {"workers_0_samples_per_s", "workers_2_samples_per_s"}
