from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
import torch

from helpers import make_docs, shard_file, write_docs
from tokpack.data.streams import TokenStream, build_stream_loader
from tokpack.tokenizer import load_encoding


def _keys(pairs) -> Counter:
    return Counter(hashlib.sha1(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest() for x, y in pairs)


def test_text_stream_windows_are_the_documents_tokens(tmp_path):
    docs = make_docs(12, words=80)
    stream = TokenStream(write_docs(tmp_path / "c", docs), block_size=16, seed=0)
    pairs = list(stream)
    assert all(x.shape == (16,) and torch.equal(x[1:], y[:-1]) for x, y in pairs)
    enc = load_encoding("gpt2")
    vocabulary = Counter(t for d in docs for t in enc.encode_ordinary(d) + [enc.eot_token])
    assert sum(len(x) for x, _ in pairs) <= sum(vocabulary.values())
    assert set(torch.cat([x for x, _ in pairs]).tolist()) <= set(vocabulary)


def test_shards_over_ranks_and_workers_cover_every_window_once(tmp_path):
    corpus = write_docs(tmp_path / "c", make_docs(40, words=120))
    whole = _keys(TokenStream(corpus, 16))
    # 2 ranks x 2 workers, simulated: a worker's shard is rank * 2 + worker of 4.
    from unittest import mock

    union: Counter = Counter()
    for rank in range(2):
        for worker in range(2):
            info = mock.Mock(id=worker, num_workers=2)
            with mock.patch("tokpack.data.streams.get_worker_info", return_value=info):
                union += _keys(TokenStream(corpus, 16, rank=rank, world_size=2))
    assert max(union.values()) == 1
    # Per-shard packing drops each shard's tail, so the union is a little smaller than the whole.
    assert len(union) > 0.8 * len(whole)


def test_bin_stream_shards_and_shuffle_buffer(prepared):
    plain = list(TokenStream(prepared / "train.bin", 32))
    shuffled = list(TokenStream(prepared / "train.bin", 32, shuffle_buffer=16, seed=1))
    assert _keys(plain) == _keys(shuffled) and [x.tolist() for x, _ in plain] != [x.tolist() for x, _ in shuffled]
    again = list(TokenStream(prepared / "train.bin", 32, shuffle_buffer=16, seed=1))
    assert [x.tolist() for x, _ in again] == [x.tolist() for x, _ in shuffled]


DUPLICATES = textwrap.dedent("""
    import hashlib, json, sys
    from collections import Counter
    from tokpack.data.streams import TokenStream, build_stream_loader

    if __name__ == "__main__":
        out = {}
        for path in sys.argv[1:]:
            for shard in (False, True):
                stream = TokenStream(path, 16, shard=shard, shuffle_buffer=8)
                seen = Counter()
                for x, y in build_stream_loader(stream, 4, num_workers=2):
                    for row in range(len(x)):
                        seen[hashlib.sha1(x[row].numpy().tobytes()).hexdigest()] += 1
                out[f"{path} {shard}"] = {"items": sum(seen.values()), "distinct": len(seen)}
        print(json.dumps(out))
""")


def test_two_workers_duplicate_unless_sharded(tmp_path):
    text = write_docs(tmp_path / "c", make_docs(30, words=150))
    shard = tmp_path / "shard.bin"  # an llm.c shard of random ids: no two windows alike
    shard_file(shard, np.random.default_rng(0).integers(0, 50000, 20_000))
    script = tmp_path / "dupes.py"
    script.write_text(DUPLICATES)
    done = subprocess.run([sys.executable, str(script), str(text), str(shard)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    for path in (text, shard):
        assert counts[f"{path} False"]["items"] == 2 * counts[f"{path} False"]["distinct"]  # every item twice
        assert counts[f"{path} True"]["items"] == counts[f"{path} True"]["distinct"]  # none twice
    assert counts[f"{shard} True"]["distinct"] == counts[f"{shard} False"]["distinct"]


def test_stream_loader_reshuffles_each_epoch(prepared):
    loader = build_stream_loader(TokenStream(prepared / "train.bin", 16, shuffle_buffer=32, seed=2), 8)
    def rows():
        return [tuple(row) for x, _ in loader for row in x.tolist()]

    first, second = rows(), rows()
    assert first != second and sorted(first) == sorted(second) and loader.epoch == 2


def test_a_stream_loader_seed_that_contradicts_the_stream_is_refused(prepared):
    stream = TokenStream(prepared / "train.bin", 16, seed=3)
    with pytest.raises(ValueError, match="seed=4 contradicts the stream's seed=3"):
        build_stream_loader(stream, 4, seed=4)
    assert build_stream_loader(stream, 4, seed=3).seed == build_stream_loader(stream, 4).seed == 3
