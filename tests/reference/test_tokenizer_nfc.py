"""The NFC normalizer (OLMoE's and Qwen3's tokenizers) against Hugging Face `tokenizers` 0.22.1.

moecore normalizes with utf8proc (Unicode 15.0); `tokenizers` with the Rust crate
unicode-normalization-alignments 0.1.12 (Unicode 9.0), whose later marks and compositions moecore
leaves as tokenizers does (src/data/unicode_additions.h's kNfcInertRanges). Driven
through `moecore tokenizer encode` on tokenizers that tokenizers itself trains and saves:
- every Unicode scalar value, each alone between spaces, through a tokenizer whose pre-tokenizer
  splits only at spaces (a Split on the string " ", then ByteLevel without its regex), so the ids
  differ exactly where the normalized bytes do;
- seeded random sequences of Latin letters, Hangul jamo and syllables, kana, Indic, Tibetan and
  combining marks (canonical reordering and composition, both directions of Hangul);
- seeded random sequences over every mark of Unicode 16.0 and every part of its compositions;
- the same text through a Qwen2-style pre-tokenizer (its Split regex, then ByteLevel);
- normalized added tokens, which tokenizers matches in their NFC form (U+212A KELVIN SIGN matches
  the K that NFC makes of it; a non-normalized one only its own code point);
- text that is not UTF-8: refused with its offset (tokenizers takes a Python str).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import unicodedata2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import moecore_harness as H

# Qwen2's (and Qwen3's) pre-tokenizer regex, from its tokenizer.json.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
CORPUS = (
    "naïve café résumé Ångström Kelvin 한국어 텍스트 日本語のかな ガギグ हिन्दी ཀྵ Ελληνικά \n" * 40
)

# Starters and combining marks that exercise NFC: Latin letters with precomposed forms, Hangul
# leading/vowel/trailing jamo and syllables (composition and its algorithmic decomposition), kana
# with the voiced marks, Devanagari and Oriya with nukta/virama, Tibetan's reordered vowels, and
# marks of several combining classes (reordered canonically).
BASES = (
    list(range(0x41, 0x7B)) + list(range(0xC0, 0x250)) + list(range(0x1100, 0x1113))
    + list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3)) + list(range(0xAC00, 0xAC40))
    + list(range(0x3041, 0x3097)) + list(range(0x0900, 0x0980)) + list(range(0x0B00, 0x0B80))
    + list(range(0x1E00, 0x1F00)) + list(range(0x0F40, 0x0F90))
)  # fmt: skip
MARKS = list(range(0x300, 0x370)) + [
    0x1AB0, 0x1DC0, 0x20D0, 0x302A, 0x3099, 0x309A, 0x05B0, 0x0651, 0x093C, 0x094D, 0x0BCD,
    0x0E38, 0x0F71, 0x0F72, 0x0F80,
]  # fmt: skip


def train_nfc_tokenizer(pre_tokenizer) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()  # readable text in failure messages
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator([CORPUS], trainer)
    return tok


def space_split_tokenizer() -> Tokenizer:
    return train_nfc_tokenizer(
        pre_tokenizers.Sequence(
            [pre_tokenizers.Split(" ", "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    )


def qwen2_style_tokenizer() -> Tokenizer:
    return train_nfc_tokenizer(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    )


def moecore_encode(moecore_bin: Path, tok: Tokenizer, text: str, where: Path) -> list[int]:
    tok.save(str(where / "tok.json"))
    (where / "in.txt").write_text(text, encoding="utf-8", newline="")
    return H.tokenizer_encode(moecore_bin, where / "tok.json", where / "in.txt", where / "ids.npy")


def assert_same_ids(ours: list[int], ref: list[int], tok: Tokenizer, what: str) -> None:
    H.assert_same_ids(ours, ref, tok.decode, what)


def random_sequences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(chr(rng.choice(BASES if rng.random() < 0.5 else MARKS)) for _ in range(rng.randint(1, 12)))
        for _ in range(count)
    ]


def test_every_code_point_normalizes_as_tokenizers(moecore_bin: Path, tmp_path):
    tok = space_split_tokenizer()
    scalars = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    text = " ".join(chr(c) for c in scalars)
    # Not vacuous: NFC alone changes 1,120 code points (singletons such as U+212A, Hangul, the
    # composition exclusions), and their ids with them.
    changed = sum(1 for c in scalars if normalizers.NFC().normalize_str(chr(c)) != chr(c))
    assert changed > 1000, changed
    assert_same_ids(
        moecore_encode(moecore_bin, tok, text, tmp_path),
        tok.encode(text, add_special_tokens=False).ids, tok, "every code point",
    )  # fmt: skip


def test_random_combining_sequences_normalize_as_tokenizers(moecore_bin: Path, tmp_path):
    texts = random_sequences(20000, seed=5)
    nfc = normalizers.NFC()
    assert sum(nfc.normalize_str(t) != t for t in texts) > 5000  # about half of them change
    text = " ".join(texts)
    for tok, what in ((space_split_tokenizer(), "space split"), (qwen2_style_tokenizer(), "Qwen2 regex")):
        assert_same_ids(
            moecore_encode(moecore_bin, tok, text, tmp_path),
            tok.encode(text, add_special_tokens=False).ids, tok, f"random sequences, {what}",
        )  # fmt: skip


def canonical_pair_parts() -> list[int]:
    """The code points of Unicode 16.0's two-part canonical decompositions that compose."""
    parts = set()
    for c in range(0x110000):
        d = unicodedata2.decomposition(chr(c))
        if d and not d.startswith("<") and " " in d:
            a, b = (chr(int(x, 16)) for x in d.split())
            if unicodedata2.normalize("NFC", a + b) == chr(c):
                parts.update((ord(a), ord(b)))
    return sorted(parts)


def test_marks_and_compositions_tokenizers_does_not_know_normalize_as_tokenizers(moecore_bin: Path, tmp_path):
    """tokenizers' NFC has Unicode 9.0's tables, utf8proc 15.0's: a mark assigned since is a starter
    to tokenizers (never reordered), a pair assigned since never composes. Every mark of Unicode 16.0
    and every part of its compositions, in seeded random sequences with Latin letters."""
    marks = [c for c in range(0x110000) if unicodedata2.combining(chr(c))]
    parts = canonical_pair_parts()
    rng = random.Random(9)
    texts = ["a\u0898\u0334", "\U00011935\U00011930", "e\u0301\u07fd\u0334"]
    for _ in range(20000):
        pools = rng.choices([BASES, marks, parts], weights=[3, 5, 2], k=rng.randint(1, 8))
        texts.append("".join(chr(rng.choice(pool)) for pool in pools))
    text = " ".join(texts)
    tok = space_split_tokenizer()
    assert_same_ids(
        moecore_encode(moecore_bin, tok, text, tmp_path),
        tok.encode(text, add_special_tokens=False).ids, tok, "marks and compositions since Unicode 9",
    )  # fmt: skip


ADDED_TOKEN_TEXTS = [
    "K \u212a k", "cafe\u0301 café", "e\u0301", "\u212aelvin", "A\u030a \u212b \u00c5",
    "\u1100\u1161\u11a8 \uac01", "x\u0323\u0307 x\u0307\u0323",
]  # fmt: skip


def test_normalized_added_tokens_match_in_their_nfc_form(moecore_bin: Path, tmp_path):
    tok = space_split_tokenizer()
    tok.add_tokens(
        [AddedToken("\u212a", normalized=True), AddedToken("cafe\u0301", normalized=True),
         AddedToken("\u212b", normalized=False), AddedToken("\u1100\u1161\u11a8", normalized=True),
         AddedToken("x\u0307\u0323", normalized=True)]
    )  # fmt: skip
    for text in ADDED_TOKEN_TEXTS:
        ref = tok.encode(text, add_special_tokens=False).ids
        assert_same_ids(moecore_encode(moecore_bin, tok, text, tmp_path), ref, tok, repr(text))
    # The oracle itself matches the Kelvin sign's NFC form "K", so the test can fail.
    kelvin = tok.token_to_id("\u212a")
    assert tok.encode("K", add_special_tokens=False).ids == [kelvin]


def test_added_tokens_with_one_nfc_form_match_special_first(moecore_bin: Path, tmp_path):
    """K and U+212A have one NFC form: tokenizers' trie holds the special tokens before the others,
    so the special one wins whatever the ids' order."""
    tok = space_split_tokenizer()
    tok.add_tokens([AddedToken("K", normalized=True)])
    tok.add_special_tokens([AddedToken("\u212a", normalized=True)])
    tok.save(str(tmp_path / "saved.json"))
    reloaded = Tokenizer.from_file(str(tmp_path / "saved.json"))
    special = reloaded.token_to_id("\u212a")
    assert special > reloaded.token_to_id("K")
    for text in ("K", "\u212a", "aKb"):
        ref = reloaded.encode(text, add_special_tokens=False).ids
        assert special in ref
        assert_same_ids(moecore_encode(moecore_bin, reloaded, text, tmp_path), ref, reloaded, repr(text))


def test_text_that_is_not_utf8_is_refused(moecore_bin: Path, tmp_path):
    tok = space_split_tokenizer()
    tok.save(str(tmp_path / "tok.json"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes("caf\u00e9 ok\n".encode() + b"x\xc3(\n")  # the bad byte at offset 10
    proc = subprocess.run(
        [str(moecore_bin), "tokenizer", "encode", "--tokenizer", str(tmp_path / "tok.json"),
         "--input", str(bad), "--out", str(tmp_path / "ids.npy")],
        capture_output=True, text=True, timeout=H.BIN_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{bad}: not UTF-8 at byte 10" in proc.stderr
    assert not (tmp_path / "ids.npy").exists()
