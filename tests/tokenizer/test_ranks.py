"""The .tiktoken form: a canonical file is read in bulk to exactly the ranks that reading it line
by line gives, any other file (every kind of fault) line by line, so its error names the line;
written and read back, ranks are unchanged, and hashed, equal vocabularies hash equal."""

from __future__ import annotations

import base64
import hashlib

from hypothesis import given, settings, strategies as st

from tokpack.tokenizer import PINNED_RANKS_SHA256, load_encoding
from tokpack.tokenizer.ranks import _in_bulk, _line_by_line, ranks_file, ranks_sha256, tiktoken_lines

_PAIRS = st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.integers(0, 2**31 - 1)), min_size=1, max_size=12,
                  unique_by=(lambda pair: pair[0], lambda pair: pair[1]))
# What can be wrong with one line of a file (or, for the last three, with the file).
_DEFECTS = {
    "tab": lambda t, r: t + b"\t" + r, "two spaces": lambda t, r: t + b"  " + r, "no rank": lambda t, r: t,
    "no token": lambda t, r: b" " + r, "bad base64": lambda t, r: t[:-1] + b"@ " + r,
    "unpadded": lambda t, r: t.rstrip(b"=") + b" " + r, "junk inside": lambda t, r: b"@" + t + b" " + r,
    "negative": lambda t, r: t + b" -" + r,
    "too large": lambda t, r: t + b" 2147483648", "largest": lambda t, r: t + b" 2147483647",
    "not a number": lambda t, r: t + b" 1x", "signed": lambda t, r: t + b" +" + r,
    "underscored": lambda t, r: t + b" 1_0", "extra field": lambda t, r: t + b" " + r + b" 7",
    "trailing space": lambda t, r: t + b" " + r + b" ", "leading space": lambda t, r: b" " + t + b" " + r,
    "crlf": lambda t, r: t + b" " + r + b"\r", "blank line after": lambda t, r: t + b" " + r + b"\n",
    "repeat token": None, "repeat rank": None, "no final newline": None,
}


@settings(max_examples=200, deadline=None)
@given(_PAIRS, st.sampled_from([None, *_DEFECTS]), st.integers(0, 11))
def test_a_file_read_in_bulk_gives_what_reading_it_line_by_line_gives_or_goes_line_by_line(pairs, defect, at):
    lines = [[base64.b64encode(token), b"%d" % rank] for token, rank in pairs]
    at %= len(lines)
    if defect == "repeat token" and len(lines) > 1:
        lines[at][0] = lines[at - 1][0]
    elif defect == "repeat rank" and len(lines) > 1:
        lines[at][1] = lines[at - 1][1]
    written = [t + b" " + r for t, r in lines]
    if _DEFECTS.get(defect):
        written[at] = _DEFECTS[defect](*lines[at])
    data = b"\n".join(written) + (b"" if defect == "no final newline" else b"\n")
    try:
        expected = _line_by_line("r.tiktoken", data)
    except ValueError:
        expected = None
    found = _in_bulk(data)
    assert found is None or found == expected
    if defect is None:
        assert found == dict(pairs)  # the common file is read in bulk


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.integers(0, 2**31 - 1)), min_size=1, max_size=30,
                unique_by=(lambda pair: pair[0], lambda pair: pair[1])))
def test_ranks_written_are_read_back_in_bulk(pairs):
    ranks = dict(pairs)
    data = tiktoken_lines(ranks)
    assert _in_bulk(data) == ranks == _line_by_line("r.tiktoken", data)


def test_the_file_form_is_the_one_tiktoken_pins():
    enc = load_encoding("gpt2").library
    data = ranks_file(enc)
    assert ranks_sha256(enc) == hashlib.sha256(data).hexdigest() == PINNED_RANKS_SHA256["gpt2"]
    assert _in_bulk(data) == enc._mergeable_ranks
