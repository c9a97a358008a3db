"""``python -m tokpack.export olmo``: OLMo-core's layout, read back by a miniature of its reading rule."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from helpers import make_docs, prepare_docs
from tokpack.data.documents import DocumentIndex
from tokpack.export import main
from tokpack.format import read_meta
from tokpack.split import open_split


def olmo_documents(npy: str, dtype) -> list[list[int]]:
    """OLMo-core's metadata path, as a miniature: the raw array at ``*.npy`` memory-mapped with the
    configured dtype, and the ``start,end`` lines of the ``.csv.gz`` named by replacing ``.npy``
    in the file name, each checked to lie inside the array."""
    tokens = np.memmap(npy, mode="r", dtype=dtype)
    metadata = os.path.join(os.path.dirname(npy), os.path.basename(npy).replace(".npy", ".csv.gz"))
    out = []
    with gzip.open(metadata, "rt") as f:
        for line in f:
            start, end, *_ = line.split(",")
            assert 0 <= int(start) < int(end) <= len(tokens)
            out.append(tokens[int(start):int(end)].tolist())
    return out


def _documents(folder, split):
    index = DocumentIndex(open_split(folder, split))
    return [index.span(s, e).tolist() for s, e in zip(index.starts.tolist(), index.ends.tolist())]


@pytest.mark.parametrize("options", [{"eot": "prepend"}, {"eot": "append"},
                                     {"format": "llmc", "shard_tokens": 3000}])
def test_olmo_reads_the_folders_documents(tmp_path, capsys, options):
    folder = prepare_docs(tmp_path, make_docs(40, words=120), val_fraction=0.2, **options)
    assert main(["olmo", str(folder)]) == 0
    out = capsys.readouterr().out
    meta = read_meta(folder)
    assert f"eos_token_id={meta['encoding']['eot_id']}" in out and "use_array_if_local=False" in out
    for split in ("train", "val"):
        files = sorted((folder / "olmo").glob(f"*{split}*.npy"))
        assert files and all(f.stat().st_size % 2 == 0 for f in files)
        pieces = [olmo_documents(str(f), np.uint16) for f in files]
        ours = _documents(folder, split)
        joined = [doc for file in pieces for doc in file]
        if len(files) == 1:
            assert joined == ours
        else:  # a document cut across shards is a piece in each: joined again, the same documents
            assert sum(map(len, joined)) == sum(map(len, ours))
            glued, at = [], 0
            for doc in ours:
                glued.append([])
                while len(glued[-1]) < len(doc):
                    glued[-1] += joined[at]
                    at += 1
            assert glued == ours and at == len(joined)


def test_the_export_links_the_tokens_and_is_the_same_bytes_each_time(tmp_path):
    folder = prepare_docs(tmp_path, make_docs(20), val_fraction=0.2)
    main(["olmo", str(folder)])
    first = {p.name: p.read_bytes() for p in (folder / "olmo").iterdir()}
    assert os.path.samefile(folder / "olmo" / "train.npy", folder / "train.bin")
    main(["olmo", str(folder)])
    assert {p.name: p.read_bytes() for p in (folder / "olmo").iterdir()} == first
    assert not [p for p in (folder / "olmo").iterdir() if "tmp" in p.name]


def test_hostile_export_targets_are_one_line_and_touch_nothing_outside(tmp_path, capsys):
    folder = prepare_docs(tmp_path, make_docs(20, words=100), val_fraction=0.2)
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "olmo").symlink_to(outside)
    with pytest.raises(SystemExit) as exc:
        main(["olmo", str(folder)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "is not a folder of its own" in err and "\n" not in err
    assert not list(outside.iterdir())
    (folder / "olmo").unlink()
    (folder / "olmo").mkdir()
    (folder / "olmo" / "train.npy").symlink_to(outside / "victim")  # a link where a file goes: replaced, not followed
    (outside / "victim").write_bytes(b"keep")
    assert main(["olmo", str(folder)]) == 0
    assert (outside / "victim").read_bytes() == b"keep" and not (folder / "olmo" / "train.npy").is_symlink()
    (folder / "meta.json").unlink()
    with pytest.raises(SystemExit) as exc:
        main(["olmo", str(folder)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "meta.json" in err and "\n" not in err


def test_olmo_cores_own_datasets_read_the_printed_way_give_the_folders_documents(tmp_path, capsys, monkeypatch):
    numpy_dataset = pytest.importorskip("olmo_core.data.numpy_dataset")
    folder = prepare_docs(tmp_path, make_docs(40, words=60), val_fraction=0.2, eot="prepend")
    assert main(["olmo", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL=false" in printed and "wrong for this folder (--eot prepend)" in printed
    meta = read_meta(folder)
    eot = meta["encoding"]["eot_id"]
    args = dict(sequence_length=512, pad_token_id=eot, eos_token_id=eot, vocab_size=meta["encoding"]["n_vocab"],
                dtype=np.uint16)
    path = str(folder / "olmo" / "train.npy")
    ours = sorted(_documents(folder, "train"))
    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")

    def padded_documents() -> list[list[int]]:
        data = numpy_dataset.NumpyPaddedFSLDataset(path, **args)
        data.work_dir = tmp_path / f"work-{len(os.environ.get('OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL', ''))}"
        data.prepare()
        return sorted(data[i]["input_ids"][data[i]["label_mask"]].tolist() for i in range(len(data)))

    with pytest.raises(TypeError):  # the argument that only the packed dataset takes
        numpy_dataset.NumpyPaddedFSLDataset(path, **args, use_array_if_local=False)
    assert padded_documents() != ours  # found from eos_token_id: wrong where documents start with it
    monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", "false")
    assert padded_documents() == ours
    packed = numpy_dataset.NumpyPackedFSLDataset(path, **args, use_array_if_local=False, generate_doc_lengths=True)
    packed.work_dir = tmp_path / "packed"
    packed.prepare()
    lengths = []
    for i in range(len(packed)):
        real, taken = int(packed[i]["label_mask"].sum()), 0
        for n in packed[i]["doc_lens"].tolist():  # the documents, then the padding's own segments
            if taken < real:
                lengths.append(n)
                taken += n
    assert sorted(lengths) == sorted(map(len, ours))  # each document whole, as the .csv.gz gives them
