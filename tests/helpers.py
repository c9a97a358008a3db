"""What the tests share: tiny corpora, client-format files, commands run as a user runs them,
and runs paused at an observed event."""

from __future__ import annotations

import base64
import json
import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType
from pathlib import Path

import numpy as np
import pytest

from tokpack.prepare import GuardOptions, PrepareConfig, prepare

ROOT = Path(__file__).resolve().parents[1]

WORDS = ("the quick brown fox jumps over the lazy dog while 42 cats don't sleep; "
         "naïve café — 東京 ünïcode! (tabs)\tand\nnewlines\n\n  spaces   ").split(" ")


def make_docs(n: int, seed: int = 0, words: int = 60) -> list[str]:
    """Deterministic small documents of varied length and content."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, words))) + f" doc{i}" for i in range(n)]


def write_docs(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_text(doc, "utf-8")
    return folder


def run_module(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m tokpack.<tool> ...`` in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=None)


def bare_file(path: Path, n: int, dtype=np.uint16, seed: int = 0) -> np.ndarray:
    """``n`` random ids written as a bare token file (no header), as nanoGPT's prepare writes them."""
    tokens = np.random.default_rng(seed).integers(0, 50000, n).astype(dtype)
    tokens.tofile(path)
    return tokens


def shard_file(path: Path, tokens, version: int = 1) -> Path:
    """A shard in llm.c's published layout: 256 little-endian int32 header words (magic, version,
    token count), then the tokens: magic 20240520 / version 1 with uint16, 20240801 / 7 with uint32."""
    magic, dtype = {1: (20240520, "<u2"), 7: (20240801, "<u4")}[version]
    header = np.zeros(256, dtype="<i4")
    header[:3] = (magic, version, len(tokens))
    path.write_bytes(header.tobytes() + np.asarray(tokens).astype(dtype).tobytes())
    return path


def write_tiktoken_file(path: Path) -> Path:
    """gpt2's ranks as a .tiktoken file (base64 token, rank per line) named ``path``."""
    from tokpack.tokenizer import load_encoding

    enc = load_encoding("gpt2")
    lines = [base64.b64encode(enc.token_bytes(rank)) + b" %d" % rank for rank in range(50256)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


# For cut-safety proofs: runs of spaces and newlines, digits, punctuation, contractions, marks
# and non-Latin scripts.
ADVERSARIAL_ATOMS = [" ", "  ", "\n", "\n\n", "\r\n", "\t", " \n ", "'s", "'ll", "'VE", "don't", "123", "4567890",
                     "!", "?!", "...", "—", "(", ")", "$", "a", "Word", "ünï", "東京", "привет", "ا", "\u0301",
                     "\u00a0", "\u3000", "<|endoftext|>", "😀", "x1", "_", "#", "//", "\u2028"]


def write_gpt2_tokenizer(folder: Path) -> Path:
    """GPT-2's byte-level BPE as a Hugging Face tokenizer.json in ``folder`` (nothing downloaded)."""
    from tokpack.bench.chat import gpt2_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    gpt2_tokenizer(["<|endoftext|>"]).save(str(folder / "tokenizer.json"))
    return folder


def write_spec(folder: Path, name: str = "mytok", pattern: str = "cl100k_base",
               special_tokens: dict[str, int] | None = None, eot: str = "<|endoftext|>") -> Path:
    """A spec file ``folder/NAME.toml`` over gpt2's ranks (written beside it as ``NAME.tiktoken``)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tiktoken_file(folder / f"{name}.tiktoken")
    specials = special_tokens or {"<|endoftext|>": 100257}
    table = "\n".join(f'"{k}" = {v}' for k, v in specials.items())
    spec = folder / f"{name}.toml"
    spec.write_text(f'ranks = "{name}.tiktoken"\npattern = {json.dumps(pattern)}\neot = "{eot}"\n'
                    f"[special_tokens]\n{table}\n")
    return spec


def prepare_docs(folder: Path, docs: list[str], **options) -> Path:
    """``docs`` written as files under ``folder/corpus`` and prepared into ``folder/prepared``: a
    folder for the readers' tests, unguarded unless ``guard`` is given (the guard's signing is the
    prepare tests' to pay for; a folder's token files are read the same either way)."""
    corpus = write_docs(folder / "corpus", docs)
    out = folder / "prepared"
    options.setdefault("guard", GuardOptions(near_split=False))
    prepare(PrepareConfig(inputs=(str(corpus),), out_dir=str(out), quiet=True, **options))
    return out


def prepare_cmd(corpus: Path, out: Path, *extra: str) -> list[str]:
    """``python -m tokpack.prepare corpus --out-dir out --quiet ...`` as a user types it."""
    return [sys.executable, "-m", "tokpack.prepare", str(corpus), "--out-dir", str(out), "--quiet", *extra]


def signals_as_a_terminal_leaves_them() -> None:
    """In a child before it runs its command: Ctrl-C and SIGTERM at their default actions, whatever
    this test run inherited (a background job, ``nohup`` and some CI runners ignore SIGINT, and an
    ignored signal stays ignored across exec), so a command stopped by a test sees them as a user's
    terminal sends them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def paused_at(cmd: list[str], event: Callable[[], bool]) -> subprocess.Popen:
    """``cmd`` stopped (SIGSTOP) the moment ``event()`` is seen, so that what the test does next
    happens at that point however loaded the machine is; a run that ends first is started again,
    three times at most. The caller continues (SIGCONT) or kills it."""
    for _ in range(3):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=signals_as_a_terminal_leaves_them)
        while proc.poll() is None and not event():
            time.sleep(0.001)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGSTOP)
            if proc.poll() is None:
                return proc
        proc.communicate()
    pytest.fail(f"{' '.join(cmd)} never reached the awaited point")


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate()


def script(name: str) -> ModuleType:
    """``scripts/NAME.py`` imported as a module, as a user's code would import it."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def megatron_indexed() -> ModuleType:
    """megatron-core's indexed dataset module (CI installs it with --no-deps), or a skip naming it."""
    return pytest.importorskip("megatron.core.datasets.indexed_dataset",
                               reason="megatron-core is not installed: pip install --no-deps megatron-core==0.16.1")


def run_bounded(code: str, *args: str, memory: int = 4 << 30, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -c code args`` in a fresh process whose address space is capped and whose run is
    limited: a check against hangs and runaway reads fails instead of taking the machine."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap)


def byte_unigram(enc, byte_logp: np.ndarray):
    """A character-level reference seen through a tokenizer: a token's log-probability is the sum
    of its bytes' log-probabilities, so any tokenization of a text gets the same total (and so the
    same bits per byte)."""
    import math

    import torch

    class ByteUnigram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            table = np.full(enc.n_vocab, math.log(0.5))  # special tokens: any value, bits/byte leaves them out
            for token in range(enc.n_vocab):
                if token not in enc.special_ids:
                    table[token] = sum(byte_logp[b] for b in enc.token_bytes(token))
            self.table = torch.from_numpy(table)

        def target_log_probs(self, idx, targets):
            return self.table[targets.clamp(min=0)]

    return ByteUnigram()


def write_llmc_model(model, path: Path, dtype: str = "float32") -> Path:
    """A GPT written as llm.c's train_gpt2.py writes its checkpoints: a 256-word header (magic
    20240326, version 3 float32 or 5 bfloat16, block, vocab, layers, heads, channels, padded vocab),
    then wte padded to a multiple of 128 rows, wpe, and each per-layer tensor for all layers in turn."""
    import torch

    c = model.config
    params = {name: p.detach().cpu() for name, p in model.named_parameters()}
    wte = params["transformer.wte.weight"]
    padded = -(-wte.shape[0] // 128) * 128
    params["transformer.wte.weight"] = torch.cat([wte, wte.new_zeros(padded - wte.shape[0], wte.shape[1])])
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, {"float32": 3, "bfloat16": 5}[dtype], c.block_size, c.vocab_size, c.n_layer, c.n_head,
                  c.n_embd, padded]
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for part in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias"):
        names += [f"transformer.h.{i}.{part}" for i in range(c.n_layer)]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name in names:
            t = params[name].float()
            f.write((t.numpy() if dtype == "float32" else t.to(torch.bfloat16).view(torch.int16).numpy()).tobytes())
    return path


def write_llmc_tokenizer(enc, path: Path) -> Path:
    """llm.c's tokenizer file (version 2): a 256-word header (magic 20240328, 2, tokens, end of
    text), then each token's length as one byte and its bytes."""
    header = np.zeros(256, dtype="<i4")
    header[:4] = [20240328, 2, enc.n_vocab, enc.eot_token]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for token in range(enc.n_vocab):
            b = enc.decode_single_token_bytes(token)
            f.write(bytes([len(b)]) + b)
    return path


class RangeServer:
    """An HTTP server on 127.0.0.1 (a free port) serving ``files`` by path with Range requests,
    ETags and conditional requests (``If-Match``: 412 when the object is another now), as object
    stores and CDNs do, with faults injected per path: ``faults[path]`` is a queue of "503" (a
    transient error), "403", and for requests of a body, "reset" (the connection dropped halfway
    through it), "stall" (no answer until the server stops), "gone" (404: the object deleted since
    it was listed) or "change" (served, then the object is replaced by ``changed[path]``).
    ``validators=False`` serves neither ETag nor Last-Modified, as some plain web servers do, and
    ``validators="last-modified"`` Last-Modified alone (honouring ``If-Unmodified-Since``);
    ``gzip_paths`` are sent with ``Content-Encoding: gzip``; ``conditional=False`` ignores ``If-Match``, as
    some servers do. ``requests`` records (method, path, range)."""

    def __init__(self, files: dict[str, bytes], validators: bool | str = True, gzip_paths: tuple[str, ...] = (),
                 conditional: bool = True):
        import gzip
        import hashlib
        import http.server
        import threading

        import email.utils

        self.files, self.faults, self.requests, self.changed = files, {}, [], {}
        edits: dict[str, int] = {}
        self.stopping = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _answer(self, body: bool) -> None:
                path = self.path.split("?")[0]
                server.requests.append((self.command, path, self.headers.get("Range")))
                queue = server.faults.get(path) or [None]
                fault = queue.pop(0) if body or queue[0] not in ("reset", "stall", "gone", "change") else None
                if fault == "stall":
                    server.stopping.wait()
                    return
                if fault in ("503", "403", "gone") or path not in server.files:
                    self.send_response(int(fault) if fault in ("503", "403") else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = server.files[path]
                if path in gzip_paths:
                    data = gzip.compress(data, mtime=0)
                etag = f'"{hashlib.sha1(data).hexdigest()}"'
                modified = email.utils.formatdate(1e9 + edits.get(path, 0), usegmt=True)
                since = self.headers.get("If-Unmodified-Since")
                if conditional and (self.headers.get("If-Match") not in (None, "*", etag)
                                    or since not in (None, modified)):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lo, hi = 0, len(data) - 1
                ranged = self.headers.get("Range", "").startswith("bytes=")
                if ranged:
                    a, _, b = self.headers["Range"][6:].partition("-")
                    lo, hi = int(a or 0), min(int(b) if b else len(data) - 1, len(data) - 1)
                self.send_response(206 if ranged else 200)
                self.send_header("Content-Length", str(hi - lo + 1))
                self.send_header("Accept-Ranges", "bytes")
                if validators == "last-modified":
                    self.send_header("Last-Modified", modified)
                elif validators:
                    self.send_header("ETag", etag)
                if path in gzip_paths:
                    self.send_header("Content-Encoding", "gzip")
                if ranged:
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                chunk = data[lo:hi + 1]
                if fault == "change":
                    server.files[path] = server.changed[path]
                    edits[path] = edits.get(path, 0) + 1
                if fault == "reset":
                    self.wfile.write(chunk[:len(chunk) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)

            def do_GET(self):
                self._answer(True)

            def do_HEAD(self):
                self._answer(False)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                import sys

                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up on a body is no error
                    super().handle_error(request, client_address)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "RangeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_run(main: Callable[[list[str]], int], capsys, *argv) -> tuple[int, str]:
    """A CLI's ``main`` run on ``argv`` as the command line gives it: its exit code (0, or the
    SystemExit's) and what it wrote to stderr."""
    try:
        code = main([*map(str, argv)])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip()


def write_web_jsonl(path: Path, megabytes: int = 10) -> Path:
    """``megabytes`` lines of 1 MB, about 200 documents of random words each."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(50_000)] + [".\n\n"])
    with open(path, "w") as f:
        for _ in range(megabytes):
            words = vocab[rng.integers(0, len(vocab), 160_000)]
            for doc in np.array_split(words, 200):
                f.write(json.dumps({"text": " ".join(doc.tolist())}) + "\n")
    return path


def peak_rss_mb_of_prepare(source: str, out: Path | str, *extra: str) -> float:
    """Peak RSS of ``python -m tokpack.prepare SOURCE ...`` in a fresh process, as the kernel counts
    it (VmHWM)."""
    code = ("import sys; from tokpack.prepare.__main__ import main; from tokpack.prepare.memory import peak_rss_mb; "
            "assert main(sys.argv[1:]) == 0; print(peak_rss_mb())")
    done = subprocess.run([sys.executable, "-c", code, source, "--out-dir", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def write_nanochat_spec(folder: Path) -> Path:
    """A tokenizer with nanochat's nine special tokens (gpt2's ranks, ``<|bos|>`` its document start)."""
    from tokpack.bench.chat import nanochat_tokenizer

    return nanochat_tokenizer(folder)


def make_chats(n: int, seed: int = 0, long_every: int = 0) -> list[dict]:
    """``n`` conversations in nanochat's record form: a system message now and then, one to three
    user/assistant turns, tool calls and outputs, special-token text typed by a user, and every
    ``long_every``-th one long."""
    rng = random.Random(seed)
    words = [w for w in WORDS if w.strip()] + ["naïve", "café", "日本語", "<|assistant_start|>", "<|bos|>", "don't"]

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    chats = []
    for i in range(n):
        messages = [{"role": "system", "content": text(2, 6)}] if i % 4 == 0 else []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": text(2, 40 if not long_every or i % long_every else 400)})
            if i % 5 == 2:
                messages.append({"role": "assistant", "content": [
                    {"type": "text", "text": text(1, 5)}, {"type": "python", "text": "print(6 * 7)"},
                    {"type": "python_output", "text": "42"}, {"type": "text", "text": text(1, 8)}]})
            else:
                messages.append({"role": "assistant", "content": text(1, 50)})
        chats.append({"messages": messages})
    return chats


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
