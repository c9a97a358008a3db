"""``python -m tokpack.bench dedup``: the split guard's quality, speed and memory, against exact
Jaccard, datasketch, datatrove and a plain Python n-gram scan.

    python -m tokpack.bench dedup [--mb 16] [--rounds 3] [--rss-mb 300]

- Quality: on a corpus with planted near-duplicates at known edit rates, and on a real one (the
  licence and package description files of this Python's installed packages: MIT and BSD texts
  that differ by a name and a year, templated READMEs), every pair's exact Jaccard of word 5-grams
  is computed by brute force and compared with the clusters: the share of pairs at or above the
  threshold + 0.05 found, and of pairs below threshold - 0.05 merged. Then the real corpus is
  prepared as a user would, with and without ``--near-split``, and the val documents holding a
  near-copy (exact Jaccard >= the threshold) of a train document are counted in what was written.
- Speed, in interleaved rounds on the same documents and parameters (5-grams, 256 hashes in 32
  bands, threshold 0.8): tokpack's signatures and clusters against datasketch's ``MinHash`` +
  ``MinHashLSH`` and datatrove's MinHash signature stage; the 13-gram decontamination against a
  plain Python set of n-grams; and a whole jsonl prepare with ``--near-split`` against one without.
- Memory: the peak RSS of a fresh process preparing ``--rss-mb`` of jsonl with ``--near-split``,
  ``--dedup near`` and ``--decontaminate``.

The peers are installed beside tokpack, never as its requirements:
``pip install datasketch`` and ``pip install --no-deps datatrove && pip install loguru humanize spacy``.

See docs/dedup.md.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import regex

from ..cli import table
from ..dedup.clusters import clusters
from ..dedup.minhash import Shingling, folded, sign, words
from ..dedup.ngrams import NgramIndex
from ..format import INDEX_DTYPE
from ..prepare import PrepareConfig, prepare
from ..prepare.memory import fix_mmap_threshold
from ..tokenizer import load_encoding
from .peers import missing, quiet
from .timing import interleaved, ratio, ratio_range

THRESHOLD = 0.8
_ALONE = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
_WORD = regex.compile(rf"{_ALONE}|(?:(?!{_ALONE})[\p{{L}}\p{{M}}\p{{N}}])+")


def word_list(text: str) -> list[str]:
    """A text's words by tokpack's rule, found by a regular expression: the brute force's."""
    return _WORD.findall(folded(text))


def word_grams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """A text's word n-grams by tokpack's rule, in plain Python: the brute force's sets."""
    found = word_list(text)
    return {tuple(found[i:i + n]) for i in range(len(found) - n + 1)} or {tuple(found)}


def near_pairs(texts: list[str], n: int = 5) -> dict[tuple[int, int], float]:
    """Every pair's exact Jaccard similarity, where it is above zero."""
    sets = [word_grams(t, n) for t in texts]
    holding: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(sets):
        for gram in s:
            holding.setdefault(gram, []).append(i)
    shared: dict[tuple[int, int], int] = {}
    for docs in holding.values():
        if len(docs) > 200:  # a boilerplate line every document holds: counted pair by pair below
            continue
        for a in range(len(docs)):
            for b in range(a + 1, len(docs)):
                shared[docs[a], docs[b]] = shared.get((docs[a], docs[b]), 0) + 1
    common = [g for g, docs in holding.items() if len(docs) > 200]
    out = {}
    for (a, b), count in shared.items():
        count += sum(1 for g in common if g in sets[a] and g in sets[b])
        out[a, b] = count / (len(sets[a]) + len(sets[b]) - count)
    return out


def planted(count: int, seed: int = 0) -> list[str]:
    """Documents of sentences drawn from the Python docs, a fifth of them followed by an edited
    copy of themselves (a word in 20 to 200 changed, so their similarities spread across the
    threshold)."""
    from pydoc_data.topics import topics

    sentences = [s.strip() for text in topics.values() for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 40]
    rng = random.Random(seed)
    docs: list[str] = []
    while len(docs) < count:
        doc = " ".join(rng.choice(sentences) for _ in range(rng.randint(3, 30)))
        docs.append(doc)
        if rng.random() < 0.2:
            words = doc.split(" ")
            for _ in range(max(1, len(words) // rng.randint(20, 200))):
                words[rng.randrange(len(words))] = rng.choice(["alpha", "beta", "gamma", "delta"])
            docs.append(" ".join(words))
    return docs


def installed_texts(limit: int) -> list[str]:
    """The licences and package descriptions of this Python's installed packages, in name order."""
    site = Path(sysconfig.get_paths()["purelib"])
    found = sorted(p for pattern in ("*.dist-info/LICEN[CS]E*", "*.dist-info/licenses/*", "*.dist-info/METADATA")
                   for p in site.glob(pattern) if p.is_file())
    texts = []
    for path in found:
        text = path.read_text("utf-8", errors="replace")
        if len(text.split()) >= 20:
            texts.append(text)
    return texts[:limit]


def quality(texts: list[str], threshold: float = THRESHOLD) -> dict[str, Any]:
    """The clusters' agreement with exact Jaccard on ``texts``."""
    signed = sign(texts, Shingling())
    first = clusters(signed.fingerprints, signed.bands, threshold)
    pairs = near_pairs(texts)
    above = [(a, b) for (a, b), j in pairs.items() if j >= threshold + 0.05]
    below = [(a, b) for (a, b), j in pairs.items() if j < threshold - 0.05]
    # Pairs of zero similarity are below too, and none of them may be merged.
    together = {i for i in range(len(texts)) if (first == first[i]).sum() > 1}
    merged_zero = sum(1 for a in together for b in together if a < b and first[a] == first[b]
                      and (a, b) not in pairs)
    found = sum(first[a] == first[b] for a, b in above)
    merged = sum(first[a] == first[b] for a, b in below) + merged_zero
    total_below = len(texts) * (len(texts) - 1) // 2 - len(pairs) + len(below)
    return {"documents": len(texts), "pairs_above": len(above), "found": found / max(len(above), 1),
            "pairs_below": total_below, "merged": merged / max(total_below, 1)}


def split_leaks(texts: list[str], tmp: Path, threshold: float = THRESHOLD) -> dict[str, Any]:
    """Prepare ``texts`` as jsonl with and without ``--near-split``: the val documents written with
    a near-copy in train (exact Jaccard >= ``threshold``)."""
    corpus = tmp / "real.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), "utf-8")
    enc = load_encoding("gpt2")
    out = {}
    for name, near in (("hash split", False), ("--near-split", True)):
        folder = tmp / f"real-{near}"
        with quiet():
            prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(folder), quiet=True, force=True,
                                  guard=_guard(near_split=near)))
        val, train = (prepared_texts(folder, split, enc.decode) for split in ("val", "train"))
        pairs = near_pairs(val + train)
        leaking = {a for (a, b), j in pairs.items() if j >= threshold and a < len(val) <= b}
        out[name] = {"val": len(val), "val_with_a_near_copy_in_train": len(leaking)}
    return out


def prepared_texts(folder: Path, split: str, decode: Callable[[list[int]], str]) -> list[str]:
    """A flat prepared split's documents, decoded, the end-of-text token dropped."""
    tokens = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)
    starts = np.fromfile(folder / f"{split}.idx", dtype=INDEX_DTYPE).astype(np.int64).tolist() + [len(tokens)]
    return [decode(tokens[a:b - 1].tolist()) for a, b in zip(starts, starts[1:])]


def _guard(**options: Any) -> Any:
    from ..prepare import GuardOptions

    return GuardOptions(**options)


def _peers(texts: list[str]) -> dict[str, Callable[[], Any]]:
    """datasketch's and datatrove's signatures (and datasketch's LSH) of ``texts``, where installed."""
    runs: dict[str, Callable[[], Any]] = {}
    if missing("datasketch") is None:
        from datasketch import MinHash, MinHashLSH

        def datasketch() -> None:
            lsh = MinHashLSH(threshold=THRESHOLD, num_perm=256, params=(32, 8))
            for i, text in enumerate(texts):
                found = word_list(text)
                m = MinHash(num_perm=256)
                m.update_batch([" ".join(found[j:j + 5]).encode() for j in range(max(len(found) - 4, 1))])
                lsh.insert(str(i), m)

        runs["datasketch"] = datasketch
    if missing("datatrove") is None and missing("spacy") is None:
        import xxhash
        from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

        stage = MinhashDedupSignature("/dev/null", MinhashConfig(n_grams=5, num_buckets=32, hashes_per_bucket=8))
        stage._hash_func = lambda text: xxhash.xxh64_intdigest(text.encode())  # xxhash 4 takes bytes only

        def datatrove() -> None:
            for text in texts:
                shingles = stage.get_shingles(text)
                if shingles.size:
                    stage.get_signature(shingles)

        runs["datatrove"] = datatrove
    return runs


def speed(texts: list[str], rounds: int) -> dict[str, Any]:
    """Signatures per second, ours (signatures and clusters, in batches as prepare signs) against the peers."""
    def ours() -> None:
        signed = [sign(texts[i:i + 400], Shingling()) for i in range(0, len(texts), 400)]
        clusters(np.concatenate([s.fingerprints for s in signed]), np.concatenate([s.bands for s in signed]),
                 THRESHOLD)

    times = interleaved({"tokpack": ours, **_peers(texts)}, rounds, warmup=True)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    return {name: {"mb_per_s": megabytes / float(np.median(t)),
                   **({"ratio": ratio(times, "tokpack", name), "range": ratio_range(times, "tokpack", name)}
                      if name != "tokpack" else {})} for name, t in times.items()}


def dressed(texts: list[str]) -> dict[str, list[str]]:
    """``texts`` with their non-ASCII characters dropped, as they are, in the Unicode dress of web
    text (no-break spaces, curly quotes, an accent), and as Chinese of as many characters (each a
    word): the word pass's roads (bytes; a table of code points; the whole text folded first)."""
    rng = random.Random(3)
    chinese = ["".join(chr(rng.randrange(0x4E00, 0x9FA5)) if rng.random() < 0.9 else "\uff0c" for _ in range(len(t)))
               for t in texts]
    return {"ASCII": [t.encode("ascii", "ignore").decode() for t in texts], "as written": texts,
            "web Unicode": [t.replace(". ", ".\u00a0").replace('"', "\u201c").replace(" the ", " th\u00e9 ")
                            for t in texts],
            "decomposed accents": [t.replace(" the ", " the\u0301 ") for t in texts], "Chinese": chinese}


def word_pass(texts: list[str], rounds: int) -> dict[str, Any]:
    """The word pass's speed on each of ``dressed``'s texts, in MB of UTF-8 a second, and its ratio
    to the speed on ASCII (read a byte at a time, as every text was before the Unicode rule)."""
    kinds = dressed(texts)
    times = interleaved({name: (lambda t=t: [words(t[i:i + 400]) for i in range(0, len(t), 400)])
                         for name, t in kinds.items()}, rounds, warmup=True)
    megabytes = {name: sum(len(t.encode()) for t in found) / 1e6 for name, found in kinds.items()}
    rate = {name: megabytes[name] / float(np.median(t)) for name, t in times.items()}
    return {name: {"mb_per_s": rate[name], "of_ascii": rate[name] / rate["ASCII"]} for name in kinds}


def decontamination(texts: list[str], rounds: int) -> dict[str, Any]:
    """13-gram hits of ``texts`` against an evaluation set of a hundredth of them: ours against a
    Python set of word tuples, the same hits asserted."""
    rng = random.Random(1)
    evaluation = [" ".join(t.split()[:60]) for t in rng.sample(texts, max(1, len(texts) // 100))]
    index = NgramIndex.of([(0, evaluation)], 13)
    grams = {g for t in evaluation for g in word_grams(t, 13)}
    found: dict[str, list[bool]] = {}

    def ours() -> None:
        found["tokpack"] = [bool(h) for i in range(0, len(texts), 400) for h in index.hits(texts[i:i + 400])]

    def python_set() -> None:
        found["python"] = [not grams.isdisjoint(word_grams(t, 13)) for t in texts]

    times = interleaved({"tokpack": ours, "python set": python_set}, rounds, warmup=True)
    if found["tokpack"] != found["python"]:
        raise AssertionError("the 13-gram hits differ from the plain Python scan's")
    return {"hits": sum(found["tokpack"]), "ratio": ratio(times, "tokpack", "python set"),
            "range": ratio_range(times, "tokpack", "python set")}


def prepare_cost(corpus: Path, tmp: Path, rounds: int) -> dict[str, Any]:
    """A whole jsonl prepare with the guard against one without, on each tiktoken backend (the
    default's accelerated one, and tiktoken's own), in interleaved rounds, in this process set as
    the command sets its own (glibc's mmap threshold fixed; see ``memory``)."""
    fix_mmap_threshold()
    def run(backend: str, **options: Any) -> Callable[[], None]:
        def go() -> None:
            prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(tmp / "cost"), quiet=True, force=True,
                                  backend=backend, guard=_guard(**options)))
        return go

    runs = {}
    for backend in ("auto", "tiktoken"):
        runs.update({f"plain ({backend})": run(backend, near_split=False),
                     f"--near-split ({backend})": run(backend, near_split=True),
                     f"--dedup near ({backend})": run(backend, near_split=True, dedup="near")})
    with quiet():
        times = interleaved(runs, rounds)
    return {name: {"cost": 1 / ratio(times, name, plain) - 1, "range": ratio_range(times, name, plain, True)}
            for name in times if not name.startswith("plain")
            for plain in [f"plain ({name.rsplit('(', 1)[1]}"]}


def shared_match(corpus: Path, tmp: Path, counts: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    """The guard stage of ``--tasks N`` as each task runs it (sign, match, decide: what its units
    need), a process each, as many at once as this machine has cores, on one corpus: the parts of
    the match each task matched (from the parts' records) and the CPU seconds of the stage in all
    the tasks (their start-up and plan aside), flat in N where no unit is signed, no part matched
    and the verdicts not decided twice."""
    from ..format import PAIRS
    from ..prepare.config.launch import cores
    from ..prepare.guard.match import Kind, PARTS

    figures = {}
    unit_mb = corpus.stat().st_size / 1e6 / max(counts)  # as many units as the most tasks
    for n in counts:
        out = tmp / f"shared-{n}"
        out.mkdir()
        code = ("import sys; from tokpack.bench.dedup import _guard; from tokpack.prepare import LaunchOptions, "
                "PrepareConfig; from tokpack.prepare.plan import make_plan; from tokpack.prepare.tasks import units_of; "
                f"n, task = {n}, int(sys.argv[1]); config = PrepareConfig(inputs=({str(corpus)!r},), "
                f"out_dir={str(out)!r}, quiet=True, unit_mb={unit_mb}, workers=1, "
                "launch=LaunchOptions(tasks=n, task=task), guard=_guard(near_split=True, dedup='near')); "
                "plan = make_plan(config, n, 0.0, independent=True); import time; cpu = time.process_time(); "
                "from tokpack.prepare import guard; guard.placed(plan, units_of(plan, task, n).start); "
                "print(plan.units, units_of(plan, task, n).start, time.process_time() - cpu)")
        told = []
        for wave in range(0, n, cores()):  # as many at once as there are cores: the work, not a crowd's waits
            running = [subprocess.Popen([sys.executable, "-c", code, str(task)], stdout=subprocess.PIPE, text=True)
                       for task in range(wave, min(wave + cores(), n))]
            told += [process.communicate()[0].split() for process in running]
            if any(process.returncode for process in running):
                raise RuntimeError(f"a task of {n} failed")
        firsts = [int(start) for _, start, _ in told]
        by = [json.loads((out / PAIRS.format(kind, p, "json")).read_text())["by"]
              for kind in Kind for p in range(PARTS)]
        figures[n] = {"units": int(told[0][0]), "parts": len(by), "most_by_one_task": max(map(by.count, firsts)),
                      "cpu_s": sum(float(cpu) for _, _, cpu in told)}
    return figures


def write_corpus(path: Path, docs: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    return path


def peak_rss(corpus: Path, evaluation: Path | None, out: Path) -> float:
    """The peak RSS in MB of a fresh ``python -m tokpack.prepare`` with every guard on (none
    without ``evaluation``)."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, from this process's own peak.
    code = ("import sys; from tokpack.prepare.__main__ import main; from tokpack.prepare.memory import peak_rss_mb; "
            "assert main(sys.argv[1:]) == 0; print(peak_rss_mb())")
    guard = [] if evaluation is None else [
        "--near-split", "--dedup", "near", "--decontaminate", str(evaluation),
        "--decontaminate-max-share", "1"]  # its texts are the corpus's own: memory, not a wipe-out
    done = subprocess.run([sys.executable, "-c", code, str(corpus), "--out-dir", str(out), "--quiet", "--force",
                           *guard], check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def near_copies(count: int, seed: int = 0) -> list[str]:
    """``count`` one-line documents of 12 to 40 words, each a near-copy (a word changed) of one of
    a tenth of them: every document is duplicated."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    bases = [[rng.choice(words) for _ in range(rng.randint(12, 40))] for _ in range(max(count // 10, 1))]
    docs = []
    for i in range(count):
        changed = list(bases[i % len(bases)])
        changed[rng.randrange(len(changed))] = f"c{i}"
        docs.append(" ".join(changed))
    return docs


def bench_dedup(tmp: Path, megabytes: float, rounds: int, rss_megabytes: float | None, real_docs: int,
                duplicated: int, tasks: tuple[int, ...] = (1, 4, 16)) -> dict[str, Any]:
    docs = planted(1)
    while sum(map(len, docs)) < megabytes * 1e6:
        docs = planted(len(docs) * 2)
    corpus = write_corpus(tmp / "planted.jsonl", docs)
    real = installed_texts(real_docs)
    figures: dict[str, Any] = {
        "quality": {"planted": quality(docs[:1500]), "installed packages": quality(real)},
        "split": split_leaks(real, tmp),
        "signatures": speed(docs, rounds),
        "words": word_pass(docs[:2000], rounds),
        "decontamination": decontamination(docs, rounds),
        "prepare": prepare_cost(corpus, tmp, rounds),
        "shared": shared_match(corpus, tmp, tasks),
    }
    evaluation = write_corpus(tmp / "evaluation.jsonl", docs[:50])
    if rss_megabytes:
        big = planted(1, seed=2)
        while sum(map(len, big)) < rss_megabytes * 1e6:
            big = planted(len(big) * 2, seed=2)
        corpus = write_corpus(tmp / "rss.jsonl", big)
    figures["peak_rss_mb"] = peak_rss(corpus, evaluation, tmp / "rss")
    near = write_corpus(tmp / "near.jsonl", near_copies(duplicated))
    figures["duplicated"] = {"documents": duplicated, "plain_mb": peak_rss(near, None, tmp / "near-plain"),
                             "guarded_mb": peak_rss(near, evaluation, tmp / "near")}
    _report(figures, megabytes, rss_megabytes or megabytes)
    return figures


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    return table([dict(zip(columns, row)) for row in rows], columns)


def _report(figures: dict[str, Any], megabytes: float, rss_megabytes: float) -> None:
    print(_table(["corpus", "documents", "pairs >= 0.85", "found", "pairs < 0.75", "merged"],
                [[name, q["documents"], q["pairs_above"], f"{q['found']:.1%}", q["pairs_below"], f"{q['merged']:.2%}"]
                 for name, q in figures["quality"].items()]))
    print(_table(["installed packages prepared with", "val documents", "with a near-copy in train"],
                [[name, s["val"], s["val_with_a_near_copy_in_train"]] for name, s in figures["split"].items()]))
    print(_table([f"signatures of {megabytes:g} MB", "MB/s", "tokpack is x faster", "range"],
                [[name, f"{s['mb_per_s']:.2f}", f"{s.get('ratio', 1):.1f}", s.get("range", "")]
                 for name, s in figures["signatures"].items()]))
    print(_table(["word pass", "MB/s", "x ASCII's speed"],
                 [[name, f"{w['mb_per_s']:.1f}", f"{w['of_ascii']:.2f}"] for name, w in figures["words"].items()]))
    d = figures["decontamination"]
    print(_table(["13-gram decontamination", "hits", "x a Python set scan", "range"],
                [["tokpack", d["hits"], f"{d['ratio']:.1f}", d["range"]]]))
    print(_table([f"prepare of {megabytes:g} MB jsonl", "extra time", "range of time ratios"],
                [[name, f"{c['cost']:+.1%}", c["range"]] for name, c in figures["prepare"].items()]))
    print(_table([f"guard stage of --tasks N, {megabytes:g} MB", "units", "parts matched",
                   "most by one task", "CPU s, all tasks"],
                  [[n, f["units"], f["parts"], f["most_by_one_task"], f"{f['cpu_s']:.2f}"]
                   for n, f in figures["shared"].items()]))
    print(f"peak RSS of a {rss_megabytes:g} MB prepare with --near-split --dedup near --decontaminate: "
          f"{figures['peak_rss_mb']:.0f} MB")
    d = figures["duplicated"]
    print(f"peak RSS of {d['documents']:,} one-line documents, every one a near-copy: {d['plain_mb']:.0f} MB plain, "
          f"{d['guarded_mb']:.0f} MB with every guard")
