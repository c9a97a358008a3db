"""Hugging Face tokenizers: a ``tokenizer.json`` behind the interface prepare and the readers use.

    pip install "tokpack[hf]"
    python -m tokpack.prepare corpus/ --tokenizer path/to/tokenizer.json --out-dir data/mine

A document's ids are ``Tokenizer.encode(document, add_special_tokens=False).ids``, exactly, plus
the end-of-text (or, with ``--eot prepend``, beginning-of-text) id the tokenizer names. Only
GPT-2's own pipeline is proven cut-safe (tests/tokenizer/test_hf.py); with any other, documents are never
cut inside. Pieces are encoded in batches by the library's own ``encode_batch``, which releases
the GIL and uses every core.

See docs/tokenizers.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..format import load_json
from .bpe import gpt2_byte_decoder
from .encoder import encode_marked_stretches, flat_lists
from .fast import without_surrogates
from .templates import read_template, refuse_links_out, template_source
from .vocab import read_file


TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers saves a tokenizer's template


def _batch(library: Any, texts: list[str]) -> list[list[int]]:
    """Every text's ids, by the library's batch encoding (its own threads, without the GIL): its
    ``encode_batch_fast`` where it has one (tokenizers >= 0.21), which skips the offsets. A lone
    surrogate, which the library refuses, becomes U+FFFD first, as tiktoken makes it."""
    encode = getattr(library, "encode_batch_fast", library.encode_batch)
    valid = texts if all(map(str.isascii, texts)) else [without_surrogates(text) for text in texts]
    return [e.ids for e in encode(valid, add_special_tokens=False)]


def _token_text(value: Any) -> str | None:
    """A config's token entry as text: a string, or an added token's ``{"content": ...}``."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _unicode_form(normalizer: Any) -> str | None:
    """The Unicode normal form a tokenizer's normalizer is and nothing else (Qwen's NFC; a
    sequence of that one alone too), or None: none, or one that does more."""
    while isinstance(normalizer, dict) and normalizer.get("type") == "Sequence" and \
            len(normalizer.get("normalizers") or ()) == 1:
        normalizer = normalizer["normalizers"][0]
    form = normalizer.get("type") if isinstance(normalizer, dict) else None
    return form if form in ("NFC", "NFD", "NFKC", "NFKD") else None


def _byte_level_table() -> dict[int, int]:
    """str.translate's table from GPT-2's alphabet to the bytes it stands for (as latin-1
    characters), with every other character below 256 sent past latin-1, so it fails to encode."""
    table = {ord(ch): b for ch, b in gpt2_byte_decoder().items()}
    table.update({c: 0x100 for c in range(256) if c not in table})
    return table


_BYTE_LEVEL = _byte_level_table()


class HFEncoder:
    """A Hugging Face ``Tokenizer`` behind the ``Encoder`` interface (``library`` is the Tokenizer)."""

    kind = "huggingface"
    parallel = True  # the library's encode_batch runs on every core without the GIL

    def __init__(self, path: Path, eot_token: str | None = None, raw: bytes | None = None,
                 special_text: str = "ordinary", prepend: bool = False):
        """Args:
            path: a tokenizer.json (whatever its name) or its folder.
            eot_token: the end-of-text token, where the tokenizer's config does not name it.
            raw: the file's bytes, when the caller has read them already.
            special_text: "ordinary" encodes a special token's text inside a document as text, so
                the end-of-text id appears only where tokpack puts it; "special", as the library
                does by default, gives its special id.
            prepend: documents are led by the token (``--eot prepend``): the config's BOS token,
                where it names one, rather than its end-of-sequence token.
        """
        try:
            import tokenizers
        except ImportError:
            raise ValueError(f'reading {path} needs the tokenizers library; pip install "tokpack[hf]"') from None
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if raw is None:
            raw = read_file(file, "tokenizer file", "pass a tokenizer.json or its folder")
        try:
            self.library = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
            spec = json.loads(raw)
        except Exception as exc:  # the library raises its own types for a file it cannot read
            raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({exc}); pass the tokenizer's own "
                             "file") from None
        self.library.encode_special_tokens = special_text == "ordinary"
        self.file, self.vocab_sha256 = file, hashlib.sha256(raw).hexdigest()
        self.version = tokenizers.__version__
        self.name = file.parent.name if file.name == TOKENIZER_FILE else file.name.removesuffix(".json")
        self.n_vocab = self.library.get_vocab_size(with_added_tokens=True)
        added = self.library.get_added_tokens_decoder()
        self.specials = {token.content: int(i) for i, token in added.items() if token.special}
        self.added = {token.content: int(i) for i, token in added.items() if not token.special}
        self.special_ids = frozenset(self.specials.values())
        self.byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
        self.normal_form = _unicode_form(spec.get("normalizer"))
        self.eot_name = self._eot(eot_token, prepend)
        self.eot_token = self.library.token_to_id(self.eot_name)
        # GPT-2's own pipeline (no normalizer; byte-level pre-tokenizing with GPT-2's regex, no prefix
        # space) splits text as tiktoken's gpt2 pattern does, whose cut points are proven safe; any
        # other pipeline has no pattern here, and its documents are never cut.
        gpt2_like = spec.get("normalizer") is None and spec.get("pre_tokenizer") == {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        self.can_cut = gpt2_like

    def _eot(self, asked: str | None, prepend: bool = False) -> str:
        """The end-of-text token: asked for, or the config's bos_token (documents led by it) or
        eos_token, or ``<|endoftext|>``, or the one special token."""
        if asked is not None:
            if self.library.token_to_id(asked) is None:
                raise ValueError(f"--eot-token {asked!r} is not a token of {self.file}; its special tokens: "
                                 f"{', '.join(self.specials) or 'none'}")
            if asked not in self.specials:
                warnings.warn(f"--eot-token {asked!r} is an ordinary token of {self.file}, not a special one: text "
                              "encodes to it too, so it does not mark document boundaries alone; its special "
                              f"tokens: {', '.join(self.specials) or 'none'}", stacklevel=6)
            return asked
        settings = self.settings
        for key in ("bos_token", "eos_token") if prepend else ("eos_token",):
            named = _token_text(settings.get(key))
            if isinstance(named, str) and self.library.token_to_id(named) is not None:
                return named
        if "<|endoftext|>" in self.specials:
            return "<|endoftext|>"
        if len(self.specials) == 1:
            return next(iter(self.specials))
        raise ValueError(f"{self.file} names no end-of-text token unambiguously (special tokens: "
                         f"{', '.join(self.specials) or 'none'}); pass --eot-token NAME")

    @cached_property
    def settings(self) -> dict[str, Any]:
        """tokenizer_config.json beside the tokenizer (its special tokens name the end of text and
        feed a chat template), or {} where there is none; one that is no JSON object is refused."""
        config = self.file.parent / CONFIG_FILE
        if not config.is_file():
            return {}
        fix = "fix it, or move it away from the tokenizer"
        refuse_links_out(config, "tokenizer config")
        settings = load_json(read_file(config, "tokenizer config", fix), str(config), fix)
        if not isinstance(settings, dict):
            raise ValueError(f"{config} holds {type(settings).__name__}, not a JSON object; {fix}")
        return settings

    def chat_template(self) -> tuple[str, str] | None:
        """chat_template.jinja beside the tokenizer, else its config's ``chat_template``."""
        file = self.file.parent / TEMPLATE_FILE
        if file.is_file():
            return read_template(file), str(file)
        where = str(self.file.parent / CONFIG_FILE)
        source = template_source(self.settings, where)
        return None if source is None else (source, where)

    def template_variables(self) -> dict[str, str]:
        """The special tokens the config names, as transformers hands them to any template."""
        return {key: text for key, value in self.settings.items()
                if key.endswith("_token") and (text := _token_text(value)) is not None}

    def encode_ordinary(self, text: str) -> list[int]:
        return self.library.encode(without_surrogates(text), add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint32) for ids in _batch(self.library, texts)]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat_lists(_batch(self.library, texts))

    def encode_marked(self, texts: list[str], marks: frozenset[str],
                      held: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        whole = self._whole
        if whole is None:
            return encode_marked_stretches(self, texts, marks)
        return flat_lists(_batch(whole, texts))

    @cached_property
    def _whole(self) -> Any:
        """The library reading special tokens' text as them, for whole texts, where it cuts a text
        at them just as ``encode_marked_stretches`` does: no special token strips whitespace,
        matches whole words alone, or is matched after normalizing; else None. Its own copy, since
        the setting is the library's."""
        added = self.library.get_added_tokens_decoder().values()
        normalizes = self.library.normalizer is not None
        if any(t.special and (t.lstrip or t.rstrip or t.single_word or (t.normalized and normalizes)) for t in added):
            return None
        whole = type(self.library).from_str(self.library.to_str())
        whole.encode_special_tokens = False
        return whole

    def decode(self, ids: list[int]) -> str:
        return self.library.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token: int) -> bytes:
        """The bytes of the text a token stands for: byte-level tokens mapped back through GPT-2's
        alphabet; SentencePiece-style ``▁`` as a space and ``<0xNN>`` as its byte."""
        piece = self.library.id_to_token(token)
        if piece is None:
            raise KeyError(token)
        if self.byte_level:
            try:  # every character of GPT-2's alphabet becomes its byte; any other fails latin-1
                return piece.translate(_BYTE_LEVEL).encode("latin-1")
            except UnicodeEncodeError:
                pass
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def flush(self) -> None:
        """Nothing runs in the background here."""

    def with_controls(self, names: Iterable[str]) -> HFEncoder:
        """A copy of this encoder that reads the added tokens ``names`` as special tokens: placed
        by id where a chat template writes them, text where a message holds them."""
        names = [name for name in names if name in self.added]
        if not names:
            return self
        import tokenizers

        controls = copy.copy(self)
        controls.__dict__.pop("_whole", None)  # made again from the new library
        controls.library = type(self.library).from_str(self.library.to_str())
        found = {t.content: t for t in self.library.get_added_tokens_decoder().values()}
        controls.library.add_special_tokens([tokenizers.AddedToken(
            name, single_word=found[name].single_word, lstrip=found[name].lstrip, rstrip=found[name].rstrip,
            normalized=found[name].normalized, special=True) for name in names])
        controls.library.encode_special_tokens = self.library.encode_special_tokens
        controls.specials = {**self.specials, **{name: self.added[name] for name in names}}
        controls.special_ids = frozenset(controls.specials.values())
        controls.added = {name: i for name, i in self.added.items() if name not in names}
        return controls

    def with_backend(self, asked: str, check_fraction: float, seed: int) -> HFEncoder:
        if asked != "auto":
            raise ValueError(f"--backend {asked} applies to tiktoken encodings; {self.file} is encoded by the "
                             "Hugging Face tokenizers library itself: drop --backend")
        return self

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "ranks_sha256": self.vocab_sha256, "n_vocab": self.n_vocab,
                "eot_id": self.eot_token, "backend": {"name": "tokenizers", "version": self.version}}

    def __repr__(self) -> str:
        return f"<HFEncoder {self.name!r} from {self.file}>"
