"""Prepared folders read from moto's S3 server through the local cache: the local folder's batches
and resume, the partial-folder rule, objects replaced after publishing, the cache limit, and two
processes sharing one cache folder."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, make_docs, prepare_docs
from tokpack.data.loader import build_loader
from tokpack.data.layouts import EvalRows
from tokpack.data.packing import PackedDocuments
from tokpack.data.windows import TokenWindows
from tokpack.evaluation import main as evaluate_main
from tokpack.inspect import describe
from tokpack.split import open_split
from tokpack.storage import cache as cache_module
from tokpack.verify import main as verify_main

BUCKET = "published-folders"


@pytest.fixture(scope="module")
def published(s3_server, tmp_path_factory):
    """A prepared folder uploaded whole, meta.json last, as ``s3://published-folders/a``; and one
    whose meta.json never arrived (``.../unpublished``)."""
    local = prepare_docs(tmp_path_factory.mktemp("pub"), make_docs(80, words=120), val_fraction=0.2,
                         shard_tokens=4000)
    s3_server.create_bucket(Bucket=BUCKET)
    names = sorted(p.name for p in local.iterdir() if not p.name.startswith("."))
    for prefix in ("a", "unpublished", "replaced"):
        for name in names:
            if prefix == "unpublished" and name == "meta.json":
                continue
            s3_server.upload_file(str(local / name), BUCKET, f"{prefix}/{name}")
    shard = next(n for n in names if n.startswith("train_"))
    body = bytearray((local / shard).read_bytes())
    body[0] ^= 1  # the same size, another token: replaced after meta.json recorded it
    s3_server.put_object(Bucket=BUCKET, Key=f"replaced/{shard}", Body=bytes(body))
    return local


def _take(loader, n):
    return [tuple(t.tolist() for t in b[:2]) for b in itertools.islice(loader, n)]


def _batches(data, n, **kwargs):
    return _take(build_loader(data, 4, seed=3, **kwargs), n)


def test_a_remote_folder_gives_the_local_folders_batches_and_resumes_them(published, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/a"
    remote, local = TokenWindows(url, 32, split="train"), TokenWindows(published, 32, split="train")
    assert remote.split.fingerprint == local.split.fingerprint
    for workers in (0, 2):
        assert _batches(remote, 6, num_workers=workers) == _batches(local, 6, num_workers=workers)
    loader = build_loader(remote, 4, seed=3)
    list(itertools.islice(loader, 3))
    resumed = build_loader(local, 4, seed=3)  # a state taken on the remote folder resumes on the local one
    resumed.load_state_dict(loader.state_dict())
    assert _take(resumed, 2) == _batches(local, 5)[3:]
    packed = PackedDocuments(url, 32, split="val", rows=EvalRows(32))
    assert [b.x.tolist() for b in build_loader(packed, 4)] == [
        b.x.tolist() for b in build_loader(PackedDocuments(published, 32, split="val", rows=EvalRows(32)), 4)]


def test_the_commands_read_a_remote_folder(published, s3_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path / "cache"))
    assert verify_main([f"s3://{BUCKET}/a"]) == 0
    assert "is whole" in capsys.readouterr().out
    remote_peek = describe(f"s3://{BUCKET}/a", "train", at=3990, count=20)  # across two shards
    assert remote_peek.splitlines()[1:] == describe(published, "train", at=3990, count=20).splitlines()[1:]
    assert not (tmp_path / "cache").exists()  # verify and inspect stream: nothing is stored
    assert verify_main([f"s3://{BUCKET}/replaced"]) == 1
    assert "has sha256" in capsys.readouterr().err
    llmc = prepare_docs(tmp_path / "llmc", make_docs(30, words=100), val_fraction=0.2, format="llmc")
    for f in sorted(p for p in llmc.iterdir() if not p.name.startswith(".")):
        s3_server.upload_file(str(f), BUCKET, f"llmc/{f.name}")
    assert verify_main([f"s3://{BUCKET}/llmc"]) == 0  # llm.c's headers skipped as locally
    assert evaluate_main([f"s3://{BUCKET}/a", "--model", "unigram", "--block-size", "32", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])[0]["tokens"] > 0
    assert verify_main([f"s3://{BUCKET}/unpublished"]) == 1
    assert "meta.json is missing: s3://published-folders/unpublished is not a complete prepared folder" in capsys.readouterr().err


def _read_all(split):
    files = split.open()
    return sum(int(files[i].size) for i in range(len(files)))


def test_unpublished_and_replaced_remote_folders_are_refused_in_one_line(published, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="meta.json is missing"):
        open_split(f"s3://{BUCKET}/unpublished", "train", cache_dir=cache)
    replaced = open_split(f"s3://{BUCKET}/replaced", "train", cache_dir=cache)
    with pytest.raises(ValueError, match="does not match meta.json .* replaced after the folder was published"):
        _read_all(replaced)
    assert not [p for p in cache.rglob("*") if p.is_file() and p.suffix == ".bin"]  # nothing unverified kept
    with pytest.raises(ValueError, match="apply to a folder's URL, and .* is local: drop them"):
        open_split(published, "train", cache_dir=cache)  # they would do nothing
    with pytest.raises(ValueError, match=r"cache_limit 1,000 bytes is smaller than .*train_.*\.bin .* the least the "
                                         "cache must hold"):
        open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache, cache_limit=1000)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    if os.access(read_only, os.W_OK):  # root writes anyway: a file where the folder should be says the same
        read_only = tmp_path / "file"
        read_only.write_text("")
    with pytest.raises(ValueError, match="is not writable"):
        open_split(f"s3://{BUCKET}/a", "train", cache_dir=read_only / "cache")


def test_a_full_cache_disk_is_one_line_and_keeps_nothing(published, tmp_path, monkeypatch):
    real = cache_module.open_new

    def on_a_full_disk(path):  # the operating system's own ENOSPC: writes to /dev/full fail with it
        return open("/dev/full", "r+b") if path.name.endswith(".tokpack-tmp") and ".bin." in path.name else real(path)

    monkeypatch.setattr(cache_module, "open_new", on_a_full_disk)
    split = open_split(f"s3://{BUCKET}/a", "train", cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="the local disk is full: free space"):
        _read_all(split)
    assert not [p for p in (tmp_path / "cache").rglob("*.bin")]


OPEN = ("import sys; from tokpack.split import open_split; "
        "s = open_split(sys.argv[1], 'train', cache_dir=sys.argv[2], cache_limit=int(sys.argv[3])); "
        "f = s.open(); print(sum(int(f[i].sum()) for i in range(len(f))))")


def _open_in(url: str, cache: Path, limit: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", OPEN, url, str(cache), str(limit)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _cached_bins(cache: Path) -> list[Path]:
    return [f for f in cache.rglob("*.bin") if not f.name.startswith(".")]


def _disk(cache: Path) -> int:
    """Bytes in the cache now; a file that goes while they are summed (a lease rewritten, a
    temporary renamed by a worker) counts nothing."""
    total = 0
    for f in cache.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += f.stat().st_size if f.is_file() else 0
    return total


def _upload(s3_server, folder: Path, prefix: str) -> None:
    for name in sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")):
        s3_server.upload_file(str(folder / name), BUCKET, f"{prefix}/{name}")


def test_processes_share_one_cache_and_its_limit_evicts_the_least_recently_used(published, s3_server, tmp_path):
    cache = tmp_path / "cache"
    _upload(s3_server, published, "b")
    meta = json.loads((published / "meta.json").read_text())
    split_bytes = sum(e["bytes"] for e in meta["splits"]["train"]["shards"])
    limit = int(split_bytes * 1.5)  # one folder's train split fits, two do not
    both = [_open_in(f"s3://{BUCKET}/a", cache, limit) for _ in range(2)]  # at once, into one cache
    outs = [p.communicate() for p in both]
    assert all(p.returncode == 0 and not err for p, (_, err) in zip(both, outs)), outs  # nothing said at exit either
    assert outs[0][0] == outs[1][0]
    assert len(_cached_bins(cache)) == len(meta["splits"]["train"]["shards"])  # each fetched into one place
    assert not [f for f in cache.rglob("*.tokpack-tmp")]
    done = _open_in(f"s3://{BUCKET}/b", cache, limit)  # the first folder's processes have ended: it goes
    assert done.wait() == 0, done.communicate()
    assert len(_cached_bins(cache)) == len(meta["splits"]["train"]["shards"]) and _disk(cache) <= limit
    # While this process holds the second folder's files, reading the first cannot push them out.
    held = open_split(f"s3://{BUCKET}/b", "train", cache_dir=cache, cache_limit=limit).open()
    assert [held[i].tolist() for i in range(len(held))] == [t.tolist() for t in open_split(published, "train").open()]
    # The leases of the processes that ended are swept; this one's names the files it holds.
    assert [p.name for p in cache.rglob(".tokpack-lease-*")] == [f".tokpack-lease-{os.getpid()}"]
    with pytest.raises(ValueError, match="held by files in use"):
        _read_all(open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache, cache_limit=limit))
    del held  # a reader let go: its files may go now
    gc.collect()
    assert _read_all(open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache, cache_limit=limit)) > 0
    assert _disk(cache) <= limit


def test_a_training_loop_walks_a_split_larger_than_the_limit_within_it(published, s3_server, tmp_path):
    folder = prepare_docs(tmp_path / "walk", make_docs(200, words=120), val_fraction=0.2, shard_tokens=1000)
    _upload(s3_server, folder, "walk")  # into the bucket the published folders are in
    meta = json.loads((folder / "meta.json").read_text())
    shards = meta["splits"]["train"]["shards"]
    # Three shards with the index and meta.json (a file open in each worker, one fetched ahead): less than the split.
    limit = 3 * max(e["bytes"] for e in shards) + meta["splits"]["train"]["idx"]["bytes"] + 8192
    assert limit < sum(e["bytes"] for e in shards)
    cache = tmp_path / "cache"
    split = open_split(f"s3://{BUCKET}/walk", "train", cache_dir=cache, cache_limit=limit)
    assert not split.fits
    remote, local = TokenWindows(split, 32, stride=32), TokenWindows(folder, 32, split="train", stride=32)
    for workers in (0, 2):
        batches = []
        for batch in build_loader(remote, 8, num_workers=workers):
            assert _disk(cache) <= limit  # checked after every batch, while the workers fetch ahead
            batches.append(batch.x.tolist())
        assert batches == [b.x.tolist() for b in build_loader(local, 8)]


def test_objects_deleted_while_a_loader_runs(published, s3_server, tmp_path):
    _upload(s3_server, published, "gone")
    _upload(s3_server, published, "kept")
    meta = json.loads((published / "meta.json").read_text())
    limit = 2 * max(e["bytes"] for e in meta["splits"]["train"]["shards"]) + \
        meta["splits"]["train"]["idx"]["bytes"] + 8192
    fits = TokenWindows(open_split(f"s3://{BUCKET}/kept", "train", cache_dir=tmp_path / "a"), 32, stride=32)
    small = TokenWindows(open_split(f"s3://{BUCKET}/gone", "train", cache_dir=tmp_path / "b", cache_limit=limit), 32,
                         stride=32)
    fits.tokens()[0]  # the first file read: the rest follow in the background
    fits.split.cache.wait()
    for prefix in ("gone", "kept"):
        for key in [o["Key"] for o in s3_server.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]]:
            s3_server.delete_object(Bucket=BUCKET, Key=key)
    seen = sum(int((b.y != -100).sum()) for b in build_loader(fits, 8))
    assert seen == fits.scored_tokens  # fetched ahead: the deletion no longer matters
    with pytest.raises(ValueError, match=rf"s3://{BUCKET}/gone/train_\d+\.bin"):
        list(build_loader(small, 8))
    with pytest.raises(ValueError, match="meta.json is missing"):  # deleted: a new open sees it gone
        open_split(f"s3://{BUCKET}/kept", "train", cache_dir=tmp_path / "other")


def test_a_remote_meta_json_naming_files_outside_the_folder_is_refused(published, s3_server, tmp_path):
    meta = json.loads((published / "meta.json").read_text())
    meta["splits"]["train"]["shards"][0]["file"] = "../../outside.bin"
    s3_server.put_object(Bucket=BUCKET, Key="forged/meta.json", Body=json.dumps(meta).encode())
    with pytest.raises(ValueError, match="not the name of a file tokpack writes"):
        open_split(f"s3://{BUCKET}/forged", "train", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "outside.bin").exists()


def test_the_cache_touches_only_its_own_files(published, s3_server, tmp_path):
    """A folder of someone else's in the cache folder, even one dressed as tokpack's, is never
    evicted; a link planted where a fetched file goes is replaced, not written through."""
    cache, outside = tmp_path / "cache", tmp_path / "outside.bin"
    outside.write_bytes(b"not yours")
    theirs = cache / "theirs"
    theirs.mkdir(parents=True)
    (theirs / "x.bin").write_bytes(b"\0" * 50_000)
    (theirs / ".tokpack-fetched.json").write_text(json.dumps({"x.bin": "0" * 64}))
    split = open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache)
    first = split.files[0].path
    first.symlink_to(outside)  # where the first shard is fetched to
    meta = json.loads((published / "meta.json").read_text())
    limit = sum(e["bytes"] for e in meta["splits"]["train"]["shards"]) + meta["splits"]["train"]["idx"]["bytes"] + \
        len((published / "meta.json").read_bytes()) + 8192
    squeezed = open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache, cache_limit=limit)
    local = open_split(published, "train").open()
    files = squeezed.open()
    assert [files[i].tolist() for i in range(len(files))] == [local[i].tolist() for i in range(len(local))]
    assert outside.read_bytes() == b"not yours" and not first.is_symlink()
    assert (theirs / "x.bin").stat().st_size == 50_000


def test_a_shard_planted_in_the_cache_with_a_forged_record_is_not_served(published, tmp_path):
    cache = tmp_path / "cache"
    url = f"s3://{BUCKET}/a"
    split = open_split(url, "train", cache_dir=cache)
    first = split.files[0].path
    meta = json.loads((published / "meta.json").read_text())
    entry = meta["splits"]["train"]["shards"][0]
    body = bytearray((published / entry["file"]).read_bytes())
    body[-1] ^= 1  # the same size, another token
    first.write_bytes(bytes(body))
    (first.parent / ".tokpack-fetched.json").write_text(json.dumps({entry["file"]: entry["sha256"]}))  # vouching for it
    served = open_split(url, "train", cache_dir=cache).open()
    local = open_split(published, "train").open()
    assert [served[i].tolist() for i in range(len(served))] == [local[i].tolist() for i in range(len(local))]
    assert first.read_bytes() == (published / entry["file"]).read_bytes()  # fetched again over the planted copy


def test_a_cache_over_a_limit_lowered_since_is_trimmed_when_opened(published, s3_server, tmp_path):
    cache = tmp_path / "cache"
    _upload(s3_server, published, "trim")
    _read_all(open_split(f"s3://{BUCKET}/a", "train", cache_dir=cache))  # no limit: the whole split stays
    gc.collect()
    raw = (published / "meta.json").read_bytes()
    val = json.loads(raw)["splits"]["val"]
    limit = max(e["bytes"] for e in val["shards"]) + val["idx"]["bytes"] + len(raw) + 4096  # what the val split needs
    assert _disk(cache) > limit
    open_split(f"s3://{BUCKET}/trim", "val", cache_dir=cache, cache_limit=limit)
    assert _disk(cache) <= limit
