"""The split patterns of the public tiktoken encodings, whose cut points tokpack has proven safe.

    python -c "from tokpack.tokenizer.patterns import CL100K_PATTERN; print(CL100K_PATTERN)"

See docs/tokenizers.md.
"""

ENDOFTEXT = "<|endoftext|>"

# Split patterns of the public encodings. A local .tiktoken file holds ranks only, so its
# pattern and special tokens come from the encoding its file name names.
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# GPT-4's pattern with numbers in pairs of digits, as nanochat trains its tokenizers (a smaller
# vocabulary spends fewer tokens on numbers this way).
NANOCHAT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"""
    r"""|\s+(?!\S)|\s+"""
)
# The patterns a trained tokenizer may be given by name.
NAMED_PATTERNS = {"nanochat": NANOCHAT_PATTERN, "gpt4": CL100K_PATTERN, "gpt2": R50K_PATTERN, "o200k": O200K_PATTERN}

_CL100K_SPECIALS = {
    ENDOFTEXT: 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
# Each known name's split pattern and special tokens: a local .tiktoken file holds ranks only.
KNOWN_SETTINGS = {
    "gpt2": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "r50k_base": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "p50k_base": (R50K_PATTERN, {ENDOFTEXT: 50256}),
    "cl100k_base": (CL100K_PATTERN, _CL100K_SPECIALS),
    "o200k_base": (O200K_PATTERN, {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}

# Cutting a document before a space that follows a non-space character never changes its
# tokens under these patterns: none of them has a pre-token holding a non-space character
# followed by a space, and none looks behind, so the pre-tokens on each side are exactly those of
# the whole. (cl100k joins punctuation to the *newlines* after it, so newlines are not safe.)
# The tokenizer tests check this with hypothesis on adversarial text for all four, and that
# tiktoken's own patterns for these names are these.
CUT_SAFE_PATTERNS = frozenset({R50K_PATTERN, CL100K_PATTERN, O200K_PATTERN, NANOCHAT_PATTERN})
