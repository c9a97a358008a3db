"""tokpack.dedup: words, n-grams, signatures and clusters against plain Python written from their rules."""

import random
import re
import unicodedata

import numpy as np
import pytest
import regex

from tokpack.dedup.clusters import candidates, clusters, components
from tokpack.dedup.minhash import Shingling, grams, sign, words
from tokpack.dedup.ngrams import NgramIndex

M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _word_hash(word: str) -> int:
    """The rule: the sum of code point x BASE**i over the word's characters, modulo 2**64, mixed."""
    return _mix(sum(ord(c) * pow(0x100000001B3, i, 1 << 64) for i, c in enumerate(word)) & M64)


ALONE = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]")


def _words(text: str) -> list[str]:
    """The rule, a character at a time: format characters dropped, NFKC, case folded, NFKC; runs
    of letters, marks and digits, each character of a script written without spaces alone."""
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    out, run = [], ""
    for c in text:
        if ALONE.match(c) or unicodedata.category(c)[0] not in "LMN":
            out += [run] if run else []
            run = ""
            if ALONE.match(c):
                out.append(c)
        else:
            run += c
    return out + ([run] if run else [])


def jaccard(a: str, b: str, n: int = 5) -> float:
    def shingles(t: str) -> set:
        w = _words(t)
        return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)} or {tuple(w)}

    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def test_words_are_runs_of_letters_and_digits_lowercased_hashed_as_the_rule_says():
    texts = ["Hello, World! naïve CAFÉ 42x", "", "...", "東京 tokyo\x00ZERO", "abcdefgh abcdefghi " + "x" * 64 + " " + "y" * 65]
    found = words(texts)
    expected = [w for t in texts for w in _words(t)]
    assert found.hashes.tolist() == [_word_hash(w) for w in expected]
    assert found.count.tolist() == [len(_words(t)) for t in texts]
    assert found.text.tolist() == [i for i, t in enumerate(texts) for _ in _words(t)]
    # Texts without a word are told apart by their bytes.
    assert found.bare[1] != found.bare[2]


# Text a user would call the same as its plain-ASCII twin, and scripts written without spaces.
UNICODE = [
    "Which\u00a0of\u202fthese\u3000describes\u2028the\u2009interpreter",  # Unicode spaces
    "words\u2014joined\u2013by dashes, \u201ccurly\u201d and \u2018single\u2019 quotes don\u2019t glue",
    "NA\u00cfVE na\u00efve Nai\u0308ve CAFE\u0301 caf\u00e9 \u00c5ngstr\u00f6m A\u030angstro\u0308m STRASSE stra\u00dfe",
    "zero\u200bwidth soft\u00adhyphen \ufeffbom join\u2060er \u200dzwj",
    "\uff26\uff55\uff4c\uff4c-\uff37\uff49\uff44\uff54\uff48 \uff11\uff12\uff13 \ufb01ne",  # full-width, a ligature
    "\u6211\u4eec\u4eca\u5929\u5728\u5317\u4eac\u89c1\u9762\uff0c\u5929\u6c14\u5f88\u597d\u3002",  # Chinese
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3001\u30ab\u30bf\u30ab\u30ca\u30fc\u3002\uff76\uff9e",  # Japanese
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0939\u093f\u0928\u094d\u0926\u0940 \ud840\udc00\ud83d\ude00x",
    "MiXeD ascii THEN \u00e9 and so on\u2026 \u2025 \u00bd",
    # characters that fold only beside their neighbours: Hangul's letters, an Oriya vowel that
    # composes with the one before it, Devanagari's virama; and Greek's final sigma
    "\ud55c\uad6d\uc5b4 \u1112\u1161\u11ab \u3131\u314f\u3134 \u0b13\u0b47\u0b3e \u0939\u093f\u0928\u094d\u0926\u0940 \u039f\u0394\u039f\u03a3 \u03bf\u03b4\u03bf\u03c2",
    "\U0001d400\U0001d401 \U0001f600 \U00020000\U00020001 astral",
]


def test_words_follow_the_rule_in_every_script():
    found = words(UNICODE)
    expected = [w for t in UNICODE for w in _words(t)]
    assert found.hashes.tolist() == [_word_hash(w) for w in expected]
    assert found.count.tolist() == [len(_words(t)) for t in UNICODE]
    # what the rule promises, read from the reference itself
    assert _words(UNICODE[0]) == "which of these describes the interpreter".split()
    assert _words(UNICODE[1])[:4] == ["words", "joined", "by", "dashes"] and "don" in _words(UNICODE[1])
    assert len(set(_words(UNICODE[2])[:3])) == len(set(_words(UNICODE[2])[3:5])) == 1
    assert _words(UNICODE[2])[-2:] == ["strasse"] * 2 and _words(UNICODE[2])[5] == _words(UNICODE[2])[6]
    assert _words(UNICODE[3]) == ["zerowidth", "softhyphen", "bom", "joiner", "zwj"]
    assert _words(UNICODE[4]) == ["full", "width", "123", "fine"]
    assert len(_words(UNICODE[5])) == 13 and all(len(w) == 1 for w in _words(UNICODE[5]))
    assert all(len(w) == 1 for w in _words(UNICODE[6]))
    # The same text in ASCII and in Unicode dress has the same words.
    plain, dressed = "Which of these describes the interpreter", UNICODE[0]
    assert words([plain]).hashes.tolist() == words([dressed]).hashes.tolist()


def test_a_text_longer_than_a_chunk_has_the_words_of_its_pieces():
    rng = random.Random(0)
    for sep in (" ", "\u00a0\u00e9 "):  # ASCII, and a text read a code point at a time
        text = sep.join(f"w{rng.randrange(10**6)}" for _ in range(200_000))  # about 1.6 MB: several chunks
        found = words([text, "tail words"])
        assert found.hashes.tolist()[:-2] == words(text.split(" ")).hashes.tolist()
        assert found.count.tolist() == [200_000 * (1 + (sep != " ")) - (sep != " "), 2]


def test_grams_stay_inside_a_text_and_a_short_text_is_one_gram():
    texts = ["a b c d e f", "g h", "i j k l m"]
    found = words(texts)
    hashes, owner = grams(found, 5)
    assert owner.tolist() == [0, 0, 2, 1]  # runs first, then the short texts whole
    # The same run of words in another text hashes the same; one word moved does not.
    again, _ = grams(words(["x b c d e f"]), 5)
    assert hashes[1] == again[1] and hashes[0] not in again
    shuffled, _ = grams(words(["a b c e d"]), 5)
    assert shuffled[0] != hashes[0]


def _pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)]
    out = []
    for _ in range(count):
        a = [rng.choice(vocab) for _ in range(rng.randint(1, 400))]
        b = list(a)
        for _ in range(rng.randint(0, max(1, len(a) // 6))):
            b[rng.randrange(len(b))] = rng.choice(vocab)
        out.append((" ".join(a), " ".join(b)))
    return out


def test_the_share_of_agreeing_bins_estimates_jaccard_whatever_the_lengths():
    pairs = _pairs(300, 1)
    signed = sign([t for pair in pairs for t in pair], Shingling())
    agree = (signed.fingerprints[0::2] == signed.fingerprints[1::2]).mean(axis=1)
    exact = np.array([jaccard(a, b) for a, b in pairs])
    error = agree - exact
    assert abs(error.mean()) < 0.01  # unbiased, short texts (mostly empty bins) too
    assert error.std() < 1.5 * np.sqrt((exact * (1 - exact) / 256).mean()) + 0.005
    short = np.array([len(a.split()) < 20 for a, _ in pairs])
    assert short.sum() > 5 and abs(error[short].mean()) < 0.05


def test_copies_share_every_band_and_strangers_none():
    texts = ["one two three four five six", "ONE two, three four five six!", "seven eight nine ten eleven twelve"]
    signed = sign(texts, Shingling(ngram=5, hashes=64, bands=16))
    assert (signed.bands[0] == signed.bands[1]).all() and (signed.fingerprints[0] == signed.fingerprints[1]).all()
    assert not (signed.bands[0] == signed.bands[2]).any()


def test_clusters_find_near_copies_and_keep_apart_the_less_similar():
    # The bar at threshold 0.8: pairs at or above 0.85 found, pairs below 0.75 not merged.
    pairs = [p for p in _pairs(600, 2) if len(p[0].split()) >= 30]
    texts = [t for pair in pairs for t in pair]
    signed = sign(texts, Shingling())
    first = clusters(signed.fingerprints, signed.bands, 0.8)
    exact = np.array([jaccard(a, b) for a, b in pairs])
    together = first[0::2] == first[1::2]
    high, low = exact >= 0.85, exact < 0.75
    assert high.sum() > 50 and low.sum() > 50
    assert together[high].mean() >= 0.95
    assert together[low].mean() <= 0.05
    # A cluster is labelled by its first member.
    assert (first[1::2][together] == np.arange(0, len(texts), 2)[together]).all()


def test_candidates_pair_each_member_of_a_bucket_with_its_first_and_the_one_before():
    band = np.array([7, 3, 7, 7, 3, 9], dtype=np.uint64)
    left, right = candidates(band)
    assert sorted(zip(left.tolist(), right.tolist())) == [(0, 2), (0, 3), (1, 4), (2, 3)]
    assert candidates(np.arange(5, dtype=np.uint64))[0].size == 0


def test_components_label_each_text_by_the_first_of_its_component():
    left, right = np.array([5, 3, 1, 6]), np.array([4, 5, 3, 7])  # 1-3-5-4 and 6-7, in any order
    assert components(9, left, right).tolist() == [0, 1, 2, 1, 1, 1, 6, 6, 8]


def test_threshold_one_joins_only_equal_signatures():
    texts = ["a b c d e f g h i j", "a b c d e f g h i k", "a b c d e f g h i j"]
    signed = sign(texts, Shingling())
    assert clusters(signed.fingerprints, signed.bands, 1.0).tolist() == [0, 1, 0]


@pytest.mark.parametrize("ngram,hashes,bands", [(0, 256, 32), (5, 256, 30), (5, 8, 16), (65, 256, 32)])
def test_a_shingling_that_cannot_be_is_refused(ngram, hashes, bands):
    with pytest.raises(ValueError, match=str(ngram) if ngram in (0, 65) else f"{hashes} hashes"):
        Shingling(ngram, hashes, bands)


def test_an_evaluation_ngram_is_found_whatever_its_case_and_punctuation():
    question = ("Which of the following best describes the primary function of mitochondria in "
                "eukaryotic cells during aerobic respiration")
    index = NgramIndex.of([(0, [question]), (1, ["What is two plus two?"])], 13)
    assert index.lengths == (5,)
    train = [
        "notes: WHICH of the following, best describes the primary function of mitochondria in... eukaryotic",
        "which of the following best describes the primary function of chloroplasts in plants",  # 12 words shared
        "a quiz. What is two plus two? Four.",
        "two plus two is four, what is",  # the short text's words, not in a row
    ]
    assert index.hits(train) == [frozenset({0}), frozenset(), frozenset({1}), frozenset()]


def test_an_ngram_of_two_sets_counts_for_the_lower_numbered():
    shared = "one two three four five six seven eight nine ten eleven twelve thirteen"
    index = NgramIndex.of([(3, [shared]), (1, [shared + " fourteen"])], 13)
    assert index.hits([shared]) == [frozenset({1})]
    assert index.digest() != NgramIndex.of([(3, [shared])], 13).digest()


def test_a_pair_joins_only_where_its_agreeing_bins_reach_the_threshold_itself():
    from tokpack.dedup.clusters import similar

    rng = np.random.default_rng(0)
    first = rng.integers(0, 1 << 16, 256, dtype=np.uint16)
    rows = [first]
    for agree in (204, 205, 191, 192):  # 204/256 = 0.797 is under 0.8; 192/256 is 0.75 exactly
        other = first.copy()
        other[agree:] ^= 1
        rows.append(other)
    prints = np.stack(rows)
    left, right = np.zeros(4, np.int64), np.arange(1, 5)
    assert similar(prints, left[:2], right[:2], 0.8).tolist() == [False, True]
    assert similar(prints, left[2:], right[2:], 0.75).tolist() == [False, True]


def test_a_short_evaluation_text_is_matched_whole_and_indexes_no_run_of_the_longer_texts():
    long = ("the quick brown fox jumps over the lazy dog while seven wise owls watch from an old oak tree "
            "beside the river")
    index = NgramIndex.of([(0, [long, "capital of France"])], 13)
    assert index.lengths == (3,)
    words_of_long = long.split()
    threes = [" ".join(words_of_long[i:i + 3]) for i in range(0, len(words_of_long) - 2, 3)]
    train = [f"a note on {run}, nothing more" for run in threes] + [
        "what is the capital of France? Paris.", "the capital of Spain"]
    assert index.hits(train) == [frozenset()] * len(threes) + [frozenset({0}), frozenset()]


def test_short_texts_of_any_lengths_are_found_in_one_pass_and_the_shortest_only_counted(monkeypatch):
    from tokpack.dedup import ngrams

    vocabulary = [f"w{i}" for i in range(200)]
    rng = random.Random(4)
    short = [" ".join(rng.sample(vocabulary, k)) for k in range(3, 13)]  # ten lengths, 3 to 12 words
    index = NgramIndex.of([(0, short[::-1] + [" ".join(vocabulary[100:114])]), (1, ["Yes", "No", "4 apples"])], 13,
                          min_words=3)
    assert index.lengths == tuple(range(3, 13)) and index.skipped == {0: 0, 1: 3}
    assert index.shortest[0] == short[:3]
    split = short[2].split()  # a short text's words across two texts is no match
    train = [f"intro {t} outro" for t in short] + ["Yes, no, 4 apples", " ".join(short[5].split()[:-1]),
                                                    " ".join(["intro", *split[:3]]), " ".join([*split[3:], "outro"])]
    passes = []
    real = ngrams.run_sums
    monkeypatch.setattr(ngrams, "run_sums", lambda found, n, *block: passes.append(n) or real(found, n, *block))
    assert index.hits(train) == [frozenset({0})] * 10 + [frozenset()] * 4
    assert passes == [13, 3]  # the 13-grams, then every short text's first 3 words: one pass each
    # A plain scan, text by text, agrees.
    words_of = [w for w in (t.lower() for t in train)]
    expected = [frozenset({0}) if any(f" {s} " in f" {t} " for s in short) else frozenset() for t in words_of]
    assert index.hits(train) == expected


def test_a_text_longer_than_the_word_pass_chunks_has_the_words_of_its_lines():
    # A long text is read in pieces cut where no word is; its words are those of its lines, in order.
    from tokpack.dedup.minhash import _CHUNK, words

    lines = [f"line {i} holds wörds like naïve and café, {i * 7} times" for i in range(3 * _CHUNK // 40)]
    text = "\n".join(lines)
    assert len(text) > 2 * _CHUNK
    whole, apart = words([text, "after it"]), words(lines + ["after it"])
    assert whole.hashes.tolist() == apart.hashes.tolist()
    assert whole.count.tolist() == [sum(apart.count[:-1].tolist()), 2]


def test_grams_a_block_at_a_time_are_the_grams_of_the_whole():
    # A long text's shingles are hashed a block of runs at a time; the blocks, in order, are the
    # whole's, whatever the block, texts of fewer words than a shingle included.
    from tokpack.dedup.minhash import gram_blocks, grams, words

    found = words(["one two three four five six seven eight nine ten eleven", "short text", "",
                   "a b c d e f g h i j k l m n o p q r s t u v w x y z"])
    whole = grams(found, 5)
    for block in (1, 2, 7, 1000):
        parts = list(gram_blocks(found, 5, block))
        assert np.concatenate([h for h, _ in parts]).tolist() == whole[0].tolist()
        assert np.concatenate([t for _, t in parts]).tolist() == whole[1].tolist()


def test_an_evaluation_index_of_blocks_of_runs_is_the_index_of_the_whole(monkeypatch):
    # The 13-grams of a long evaluation text, and of a train text, are hashed a block of runs at a
    # time; any block gives the same index and the same hits.
    from tokpack.dedup import ngrams

    texts = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(40)) for i in range(6)] + ["a b c"]
    train = [texts[2][40:], "nothing of it here at all, not one run of thirteen words", texts[5]]
    whole = ngrams.NgramIndex.of([(0, texts)], 13, 3)
    expected = whole.hits(train)
    assert expected[0] and expected[2] and not expected[1]
    for runs in (1, 5, 17):
        monkeypatch.setattr(ngrams, "_RUNS", runs)
        index = ngrams.NgramIndex.of([(0, texts)], 13, 3)
        assert index.digest() == whole.digest() and index.hits(train) == expected


def test_a_long_evaluation_text_indexed_a_piece_at_a_time_is_indexed_whole(monkeypatch):
    # An evaluation text of millions of characters is read a piece at a time, each led by the
    # last 12 words before it: the same index as the text read whole, runs across the cuts too.
    from tokpack.dedup import ngrams
    from tokpack.dedup.minhash import _CHUNK

    rng = random.Random(5)
    long = " ".join(f"Wörd{rng.randrange(10 ** 6)}" for _ in range(3 * _CHUNK // 10))
    assert len(long) > 2 * _CHUNK
    sparse = "alpha " + "." * 3000 + " beta gamma"  # long, and of too few words for a run: matched whole
    sets = [(0, [long, "too short", "one two three four five six seven eight nine ten eleven twelve thirteen",
                 sparse]),
            (1, ["only twelve words here one two three four five six seven eight"])]
    whole = ngrams.NgramIndex.of(sets, 13, 3)
    monkeypatch.setattr(ngrams, "_LONG_TEXT", 1000)
    pieces = ngrams.NgramIndex.of(sets, 13, 3)
    assert pieces.digest() == whole.digest() and pieces.skipped == whole.skipped == {0: 1, 1: 0}
    assert pieces.hits(["said: alpha... beta gamma!"]) == [frozenset({0})]
    cut = long.index(" ", _CHUNK + 10)  # a run of 13 words across the first cut, and one not in the set
    train = [long[cut - 150:cut + 150], "wörd1 wörd2 wörd3 wörd4 wörd5 wörd6 wörd7 wörd8 wörd9 wörd10 wörd11 wörd12 wörd13"]
    assert pieces.hits(train) == whole.hits(train) == [frozenset({0}), frozenset()]
