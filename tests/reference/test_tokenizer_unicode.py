"""Split regexes against Hugging Face `tokenizers` 0.22.1 on (nearly) every code point.

tokenizers runs its Split regexes with Oniguruma and Unicode 16.0 tables; moecore translates them
for PCRE2, whose Debian 12 release (10.42) has Unicode 14.0 tables. Without the code points the
categories gained since (src/data/unicode_additions.h, scripts/gen_unicode_additions.py) the
pre-tokenizers of GPT-2, Qwen2, cl100k / OLMo-core's dolma2 and o200k split 9,392 to 9,485 code
points otherwise (CJK Extension H and I among them).

Each code point stands in short probes (between letters, digits, an upper-case letter) one per
line; the pre-tokenizer is the Split followed by ByteLevel with add_prefix_space, which puts a
space in front of every piece the Split made, so the ids show where it split. All code points of
planes 0-3 (where every assigned character is) and 14 are probed, and every 4099th of the rest.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

import moecore_harness as H

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DOLMA2 = (  # cl100k_base with possessive quantifiers, as OLMo-core's dolma2 tokenizer writes it
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
O200K = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CASES = {
    "gpt2": (GPT2, "a{c}a1{c}1"),
    "dolma2": (DOLMA2, "a{c}a1{c}1"),
    "o200k": (O200K, "a{c}aA{c}a1{c}1"),
    "word": (r"\w+", "a{c}a"),
    "digit": (r"\d+", "1{c}1"),
    "long_names_and_negations": (r"\p{Letter}+|\P{Decimal_Number}+", "a{c}a1{c}1"),
}
# Oniguruma's POSIX brackets on Unicode text (PCRE2's own are other sets: 11,003 code points of
# [:alpha:] differ, 8,541 of [:punct:]): "a{c}a" is one piece or three as the code point is in
# the bracket's set as "a" is or not. A negated one stands alone in its class.
POSIX_BRACKETS = "alnum alpha blank cntrl digit graph lower print punct space upper word xdigit".split()
CASES.update({f"posix_{name}": (rf"[[:{name}:]]+", "a{c}a") for name in POSIX_BRACKETS})
CASES.update({f"posix_not_{name}": (rf"[[:^{name}:]]+", "a{c}a") for name in ("alpha", "lower")})


def code_points() -> list[int]:
    dense = list(range(0x40000)) + list(range(0xE0000, 0xE1000))
    sparse = list(range(0x40000, 0xE0000, 4099)) + list(range(0xE1000, 0x110000, 4099))
    return [c for c in dense + sparse if not 0xD800 <= c < 0xE000 and c not in (0x0A, 0x0D)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_regex_over_every_code_point_matches_tokenizers(case, moecore_bin: Path, tmp_path):
    pattern, probe = CASES[case]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=257, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(["a"], trainer)
    tok.save(str(tmp_path / "tok.json"))
    points = code_points()
    lines = [probe.format(c=chr(c)) for c in points]
    (tmp_path / "in.txt").write_text("\n".join(lines), encoding="utf-8", newline="")
    ours = H.tokenizer_encode(moecore_bin, tmp_path / "tok.json", tmp_path / "in.txt", tmp_path / "ids.npy")
    ref = tok.encode("\n".join(lines), add_special_tokens=False).ids
    if ours == ref:
        return

    # Name the code points whose probe split otherwise: per line, the pieces as text.
    def pieces_per_line(ids: list[int]) -> list[str]:
        return "".join(tok.id_to_token(i) for i in ids).split("\u010a")  # GPT-2's symbol of \n

    a, b = pieces_per_line(ours), pieces_per_line(ref)
    assert len(a) == len(b) == len(points), (len(a), len(b), len(points))
    differ = [points[n] for n in range(len(points)) if a[n] != b[n]]
    pytest.fail(
        f"{case}: {len(differ)} code points split otherwise than tokenizers, e.g. "
        + ", ".join(f"U+{c:04X}" for c in differ[:12])
    )


def test_single_word_neighbours_over_every_code_point_match_tokenizers(moecore_bin: Path, tmp_path):
    """single_word added tokens judge their neighbours with Rust regex's Unicode \\w (not
    Oniguruma's): a code point before "qxz" refuses the token exactly when it is a word character."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=257, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(["a"], trainer)
    tok.add_tokens([AddedToken("qxz", single_word=True)])
    tok.save(str(tmp_path / "tok.json"))
    points = code_points()
    text = "\n".join(f"{chr(c)}qxz" for c in points)
    (tmp_path / "in.txt").write_text(text, encoding="utf-8", newline="")
    ours = H.tokenizer_encode(moecore_bin, tmp_path / "tok.json", tmp_path / "in.txt", tmp_path / "ids.npy")
    ref = tok.encode(text, add_special_tokens=False).ids
    qxz = tok.token_to_id("qxz")
    assert ref.count(qxz) > 100000  # most code points are not word characters: the token is taken
    if ours != ref:
        newline = tok.token_to_id("\u010a")
        lines_a, lines_b, a, b = [], [], [], []
        for ids, lines, line in ((ours, lines_a, a), (ref, lines_b, b)):
            for i in ids + [newline]:
                if i == newline:
                    lines.append(tuple(line))
                    line.clear()
                else:
                    line.append(i)
        differ = [points[n] for n in range(len(points)) if lines_a[n] != lines_b[n]]
        pytest.fail(f"{len(differ)} code points judged otherwise, e.g. " + ", ".join(f"U+{c:04X}" for c in differ[:12]))


@pytest.mark.skipif(
    unicodedata.unidata_version != "14.0.0",
    reason=f"the generator compares against Unicode 14.0.0 (PCRE2 10.42's), which is Debian 12's "
    f"Python 3.11's; this Python has {unicodedata.unidata_version}",
)
def test_unicode_additions_header_is_current():
    """src/data/unicode_additions.h is what scripts/gen_unicode_additions.py writes today."""
    root = Path(__file__).resolve().parents[2]
    generated = subprocess.run(
        [sys.executable, str(root / "scripts" / "gen_unicode_additions.py")],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert generated == (root / "src" / "data" / "unicode_additions.h").read_text(encoding="utf-8"), (
        "src/data/unicode_additions.h is stale: rerun scripts/gen_unicode_additions.py"
    )
