"""Tokenizer parity with Hugging Face `tokenizers` (issue 3, item 3).

Drives the CLI:
  moecore tokenizer train  --input FILES --vocab-size N --out tokenizer.json
  moecore tokenizer encode --tokenizer T --input FILE --out ids.npy
`encode` is expected to encode the file's whole text as one string, adding no special tokens, and
to write a 1-D uint32 .npy; the reference is `Tokenizer.encode(text, add_special_tokens=False)`.

Checks, on the KJV corpus (data/kjv.txt, made by scripts/prepare_kjv.sh when missing):
- moecore's trained tokenizer.json loads in `tokenizers` with the requested vocab size;
- its merges and vocab equal those of tokenizers' own BpeTrainer (ByteLevel, same special tokens,
  initial_alphabet = ByteLevel.alphabet()) trained on the same file;
- moecore's encodings equal tokenizers' token for token, for moecore's tokenizer and for one
  trained by tokenizers itself (vocab 2048), on the corpus and on a file of awkward text;
- the ids decode (by tokenizers) back to the exact text.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tokenizers import (AddedToken, ByteLevelBPETokenizer, Tokenizer, decoders, models, pre_tokenizers,
                        trainers)

import moecore_harness as H

SPECIALS = ["<|endoftext|>"]
OURS_VOCAB = 4096
HF_VOCAB = 2048

AWKWARD_TEXT = (
    "Hello world!  It's 1611; they're   here\t\ttoo.\n\n\n"
    "naïve café — “quotes” ½ ٣٤ ① 中文字 日本語 Ελληνικά\n"
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 🂡🂡\n"
    "odd spaces:\u00a0nbsp \u2028line-sep \u3000ideographic \u0085nel \u200bzwsp\r\n"
    "<|endoftext|>after the special token<|endoftext|><|endoftext|>\n"
    "    indented code:\n        return x  # trailing   \n"
)


def run_cli(moecore_bin: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(moecore_bin), *args], capture_output=True, text=True, timeout=H.BIN_TIMEOUT_S
    )
    assert proc.returncode == 0, f"moecore {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="session")
def kjv_path() -> Path:
    path = H.repo_root() / "data" / "kjv.txt"
    if not path.is_file():
        subprocess.run(
            ["bash", str(H.repo_root() / "scripts" / "prepare_kjv.sh"), str(path)],
            check=True,
            cwd=H.repo_root(),
        )
    return path


@pytest.fixture(scope="session")
def kjv_text(kjv_path: Path) -> str:
    return kjv_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tokenizer_parity")


def hf_train(path: Path, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(path)], trainer)
    return tok


@pytest.fixture(scope="session")
def ours_json(moecore_bin: Path, kjv_path: Path, work_dir: Path) -> Path:
    out = work_dir / "ours.json"
    run_cli(
        moecore_bin, "tokenizer", "train", "--input", str(kjv_path),
        "--vocab-size", str(OURS_VOCAB), "--out", str(out),
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def hf_json(kjv_path: Path, work_dir: Path) -> Path:
    out = work_dir / "hf.json"
    hf_train(kjv_path, HF_VOCAB).save(str(out))
    return out


def moecore_encode(moecore_bin: Path, tokenizer_json: Path, text_path: Path, out: Path) -> list[int]:
    return H.tokenizer_encode(moecore_bin, tokenizer_json, text_path, out)


def assert_same_ids(ours: list[int], ref: list[int], tok: Tokenizer, what: str) -> None:
    H.assert_same_ids(ours, ref, lambda ids: [tok.id_to_token(i) for i in ids], what)


@pytest.fixture(scope="session")
def hf_same_vocab(kjv_path: Path) -> Tokenizer:
    """tokenizers' trainer on the KJV at moecore's vocabulary size."""
    return hf_train(kjv_path, OURS_VOCAB)


def test_trained_tokenizer_loads_in_tokenizers(ours_json: Path, hf_same_vocab: Tokenizer):
    tok = Tokenizer.from_file(str(ours_json))
    assert tok.get_vocab_size(with_added_tokens=True) == OURS_VOCAB
    assert tok.token_to_id("<|endoftext|>") == 0
    doc = json.loads(ours_json.read_text(encoding="utf-8"))
    # The sections of tokenizers' own byte-level BPE tokenizer, so that tokenizers gives the same
    # offsets too (a post-processor trimming them moved every offset after a space).
    reference = json.loads(ByteLevelBPETokenizer()._tokenizer.to_str())
    for section in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert doc[section] == reference[section], section
    assert doc["model"]["type"] == "BPE"
    text = "And God said,  Let there be light:\n\tand there was light."
    ours, ref = tok.encode(text), hf_same_vocab.encode(text)
    assert ours.ids == ref.ids and ours.offsets == ref.offsets, (ours.offsets, ref.offsets)
    assert doc["added_tokens"][0]["content"] == "<|endoftext|>" and doc["added_tokens"][0]["special"]


def test_trained_merges_equal_tokenizers_trainer(ours_json: Path, hf_same_vocab: Tokenizer):
    ours = json.loads(ours_json.read_text(encoding="utf-8"))["model"]
    ref = json.loads(hf_same_vocab.to_str())["model"]
    n = next(
        (i for i, (a, b) in enumerate(zip(ours["merges"], ref["merges"])) if list(a) != list(b)),
        None,
    )
    assert n is None, f"merge {n} differs: moecore {ours['merges'][n]} vs tokenizers {ref['merges'][n]}"
    assert len(ours["merges"]) == len(ref["merges"])
    assert ours["vocab"] == ref["vocab"]


@pytest.fixture(scope="session", params=["ours", "hf"])
def tokenizer_case(request, ours_json: Path, hf_json: Path) -> tuple[str, Path]:
    return request.param, ours_json if request.param == "ours" else hf_json


def test_kjv_encoding_matches_tokenizers(
    tokenizer_case, moecore_bin: Path, kjv_path: Path, kjv_text: str, work_dir: Path
):
    name, tok_json = tokenizer_case
    tok = Tokenizer.from_file(str(tok_json))
    ours = moecore_encode(moecore_bin, tok_json, kjv_path, work_dir / f"kjv_{name}.npy")
    ref = tok.encode(kjv_text, add_special_tokens=False).ids
    assert_same_ids(ours, ref, tok, f"KJV with the {name} tokenizer")
    assert tok.decode(ours, skip_special_tokens=False) == kjv_text


def test_awkward_text_matches_tokenizers(tokenizer_case, moecore_bin: Path, work_dir: Path):
    name, tok_json = tokenizer_case
    tok = Tokenizer.from_file(str(tok_json))
    text_path = work_dir / "awkward.txt"
    text_path.write_text(AWKWARD_TEXT, encoding="utf-8", newline="")
    ours = moecore_encode(moecore_bin, tok_json, text_path, work_dir / f"awkward_{name}.npy")
    ref = tok.encode(AWKWARD_TEXT, add_special_tokens=False).ids
    assert_same_ids(ours, ref, tok, f"awkward text with the {name} tokenizer")
    assert ours.count(tok.token_to_id("<|endoftext|>")) == 3
    assert tok.decode(ours, skip_special_tokens=False) == AWKWARD_TEXT


# ------------------------------------------------------------------------------------------------
# Added tokens and Split regexes, on a small tokenizer trained by tokenizers (vocab 300), with
# tokenizers 0.22.1's Tokenizer.encode(s, add_special_tokens=False) as the oracle. Each case below
# differed before moecore matched added tokens as AddedVocabulary does (two passes, leftmost-longest
# with refused matches skipped, Unicode \w for single_word) and compiled Oniguruma's line anchors.

SMALL_CORPUS = "hello world, the quick brown fox jumps over the lazy dog  \n" * 50


@pytest.fixture(scope="session")
def small_base_json(work_dir: Path) -> str:
    corpus = work_dir / "small_corpus.txt"
    corpus.write_text(SMALL_CORPUS, encoding="utf-8")
    return hf_train(corpus, 300).to_str()


def small_tokenizer(base_json: str, specials=(), plain=()) -> Tokenizer:
    tok = Tokenizer.from_str(base_json)
    tok.add_special_tokens(list(specials))
    tok.add_tokens(list(plain))
    return tok


def encode_each(moecore_bin: Path, tok: Tokenizer, texts: list[str], where: Path) -> list[list[int]]:
    """moecore's encoding of each text: one `tokenizer encode` per text (texts may hold newlines)."""
    tok_json = where / "tok.json"
    tok.save(str(tok_json))
    out = []
    for text in texts:
        (where / "in.txt").write_text(text, encoding="utf-8", newline="")
        out.append(moecore_encode(moecore_bin, tok_json, where / "in.txt", where / "ids.npy"))
    return out


ADDED_TOKEN_CASES = {
    "single_word_class": (
        [], [AddedToken("qxz", single_word=True)],
        ["_qxz", "\u2014qxz\u2014", "😀qxz", "a\u0301qxz", "\u200dqxz", "\u2460qxz", "qxz_"],
    ),
    "single_word_after_added": (
        [], [AddedToken("qxz", single_word=True), AddedToken("<m>", single_word=True)],
        ["qxz<m>", "qxz <m>"],
    ),
    "single_word_refused_is_skipped": (
        [], [AddedToken("qxz", single_word=True), AddedToken("xzv")], ["aqxzv", "qxzv", "xzv"],
    ),
    "normalized_second_pass": (
        [], [AddedToken("hello", normalized=True), AddedToken("lo wor", normalized=False)],
        ["hello world", "hello"],
    ),
    "lstrip_before_second_pass": (
        [AddedToken("[MASK]", lstrip=True, special=True)], [AddedToken("  ", normalized=True)],
        ["a  [MASK]", "a  b", "a\u3000\t[MASK]b"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ADDED_TOKEN_CASES))
def test_added_tokens_match_tokenizers(case, small_base_json: str, moecore_bin: Path, tmp_path):
    specials, plain, texts = ADDED_TOKEN_CASES[case]
    tok = small_tokenizer(small_base_json, specials, plain)
    for text, ours in zip(texts, encode_each(moecore_bin, tok, texts, tmp_path)):
        assert_same_ids(ours, tok.encode(text, add_special_tokens=False).ids, tok, f"{case}: {text!r}")


def test_random_added_token_mix_matches_tokenizers(small_base_json: str, moecore_bin: Path, tmp_path):
    """Seeded random strings over the tokens' pieces, whitespace and non-ASCII, one document a line
    through `prepare` (one process for all); each document is followed by its EOS."""
    tok = small_tokenizer(
        small_base_json,
        [AddedToken("<|im_start|>", special=True), AddedToken("<|im", special=True),
         AddedToken("[MASK]", lstrip=True, special=True), AddedToken("</s>", rstrip=True, special=True)],
        [AddedToken("<tool>", normalized=True), AddedToken("ab", normalized=True),
         AddedToken("  ", normalized=True), AddedToken("ba", lstrip=True, rstrip=True),
         AddedToken("😀x", normalized=False), AddedToken("xa", single_word=True),
         AddedToken("b_", single_word=True, normalized=False)],
    )  # fmt: skip
    pool = ["<|im_start|>", "<|im", "|>", "[MASK]", "</s>", "<tool>", "ab", "a", "b", "ba", "xa", "b_",
            "_", " ", "  ", "\t", "\u3000", "\u00a0", "x", "😀", "é", "中", "\u0301", "'s", "1", "\u2028"]  # fmt: skip
    rng = random.Random(11)
    texts: list[str] = []
    while len(texts) < 1500:
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 14)))
        if text.strip(" \t\r\n\f\v"):  # prepare skips blank lines
            texts.append(text)
    tok_json = tmp_path / "tok.json"
    tok.save(str(tok_json))
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8", newline="")
    run_cli(
        moecore_bin, "prepare", "--tokenizer", str(tok_json), "--input", str(tmp_path / "in.txt"),
        "--out", str(tmp_path / "out"), "--dtype", "uint32", "--val-fraction", "0",
    )  # fmt: skip
    ids = np.fromfile(tmp_path / "out" / "train" / "part-00000.npy", dtype="<u4").tolist()
    eos = tok.token_to_id("<|endoftext|>")
    expected = [i for text in texts for i in tok.encode(text, add_special_tokens=False).ids + [eos]]
    if ids != expected:
        docs, start = [], 0
        for n, i in enumerate(ids):
            if i == eos:
                docs.append(ids[start:n])
                start = n + 1
        for text, ours in zip(texts, docs):
            assert_same_ids(ours, tok.encode(text, add_special_tokens=False).ids, tok, repr(text))
        pytest.fail(f"{len(ids)} ids, tokenizers gives {len(expected)}")


def gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
    U+0100, U+0101, ... in byte order."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


BYTE_LEVEL_CHARS = gpt2_byte_chars()
assert sorted(BYTE_LEVEL_CHARS.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())


def byte_level_text(text: str) -> str:
    return "".join(BYTE_LEVEL_CHARS[b] for b in text.encode("utf-8"))


# Split regexes in Oniguruma syntax where PCRE2 reads them otherwise: ^ and $ are line anchors,
# \A \z \Z are not; \h is a hex digit, \v the vertical tab, \w Unicode word (marks, not No),
# \uHHHH a code point, (?m) dot-all.
REGEX_CASES = [
    (r"\s+$", "the  \nfox  \ndog"), (r"^h", "the\nhello"), (r"^\s*$", "a\n  \nb"),
    (r"o\Z", "foo\n"), (r"o\z", "foo\nfoo"), (r"\Ah", "hh\nhh"), (r"o$", "foo\nfoo"),
    (r"\h+", "hello cafe"), (r"[\H]+", "hello world"), (r"\u0041+", "xAAy"), (r"\v", "a\x0bb\nc"),
    (r"\w+", "the\u2460the a\u0301b"), (r"\bx", "\u00e9x x \u2460x"), (r".+", "a\rb\nc\u2028d"),
    (r"(?m)a.b", "xa\nbx"), (r"[[:alpha:]\s]+", "ab c1d\n"), (r"[\S]+", "a\x85b c"),
    # Empty matches split the text where they match (`\b`, lookarounds, `x*` between the x runs).
    (r"\b", "a bc d\u00e9"), (r"(?=b)", "abab"), (r"x*", "axxbx"), (r"|a", "aab"),
    (r"(?<=a)", "aab a"), (r"\B", "ab cd"), (r"$", "ab\ncd"), (r"^", "ab\ncd"), (r"", "ab\u00e9"),
]  # fmt: skip


@pytest.mark.parametrize("pattern,text", REGEX_CASES)
def test_split_regex_matches_tokenizers(pattern, text, small_base_json: str, moecore_bin: Path, tmp_path):
    """ignore_merges and a vocabulary holding every substring of the text: each pre-token becomes
    one id, so the ids show the split itself."""
    doc = json.loads(small_base_json)
    doc["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }  # fmt: skip
    doc["model"]["ignore_merges"] = True
    vocab = doc["model"]["vocab"]
    for i in range(len(text)):
        for j in range(i + 1, len(text) + 1):
            vocab.setdefault(byte_level_text(text[i:j]), max(vocab.values()) + 1)
    tok = Tokenizer.from_str(json.dumps(doc))
    [ours] = encode_each(moecore_bin, tok, [text], tmp_path)
    assert_same_ids(ours, tok.encode(text, add_special_tokens=False).ids, tok, f"{pattern!r} on {text!r}")


def run_cli_error(moecore_bin: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(moecore_bin), *args], capture_output=True, text=True, timeout=H.BIN_TIMEOUT_S
    )
    assert proc.returncode != 0, f"moecore {' '.join(args)} succeeded"
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_input_that_is_not_utf8_is_refused(moecore_bin: Path, small_base_json: str, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("caf\u00e9 ok\n".encode() + b"x\xc3(\n")  # the bad byte at offset 10
    with pytest.raises(Exception):  # tokenizers refuses it too
        Tokenizer(models.BPE()).train([str(bad)], trainers.BpeTrainer(show_progress=False))
    message = run_cli_error(
        moecore_bin, "tokenizer", "train", "--input", str(bad), "--vocab-size", "300",
        "--out", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert f"{bad}: not UTF-8 at byte 10" in message
    tok_json = tmp_path / "base.json"
    tok_json.write_text(small_base_json, encoding="utf-8")
    message = run_cli_error(
        moecore_bin, "prepare", "--tokenizer", str(tok_json), "--input", str(bad),
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert f"{bad}: not UTF-8 at byte 10" in message
    assert not (tmp_path / "out").exists()


def test_unsupported_inputs_are_named(moecore_bin: Path, small_base_json: str, tmp_path):
    doc = json.loads(small_base_json)
    doc["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}
    tok_json = tmp_path / "lower.json"
    tok_json.write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "in.txt").write_text("hello", encoding="utf-8")
    message = run_cli_error(
        moecore_bin, "tokenizer", "encode", "--tokenizer", str(tok_json),
        "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "ids.npy"),
    )  # fmt: skip
    assert "normalizer 'Lowercase' in the normalizer Sequence is not supported" in message
    (tmp_path / "base.json").write_text(small_base_json, encoding="utf-8")
    (tmp_path / "docs").mkdir()
    message = run_cli_error(
        moecore_bin, "prepare", "--tokenizer", str(tmp_path / "base.json"),
        "--input", str(tmp_path / "docs"), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert f"{tmp_path / 'docs'}: is a directory" in message
