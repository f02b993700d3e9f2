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
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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
    run_cli(
        moecore_bin, "tokenizer", "encode", "--tokenizer", str(tokenizer_json),
        "--input", str(text_path), "--out", str(out),
    )  # fmt: skip
    ids = np.load(out)
    assert ids.dtype == np.uint32 and ids.ndim == 1, f"{out}: dtype {ids.dtype}, shape {ids.shape}"
    return ids.tolist()


def assert_same_ids(ours: list[int], ref: list[int], tok: Tokenizer, what: str) -> None:
    if ours == ref:
        return
    n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    lo = max(0, n - 5)
    pytest.fail(
        f"{what}: encodings differ at token {n} (moecore {len(ours)} ids, tokenizers {len(ref)}); "
        f"moecore {[tok.id_to_token(i) for i in ours[lo:n + 5]]} vs "
        f"tokenizers {[tok.id_to_token(i) for i in ref[lo:n + 5]]}"
    )


def test_trained_tokenizer_loads_in_tokenizers(ours_json: Path):
    tok = Tokenizer.from_file(str(ours_json))
    assert tok.get_vocab_size(with_added_tokens=True) == OURS_VOCAB
    assert tok.token_to_id("<|endoftext|>") == 0
    doc = json.loads(ours_json.read_text(encoding="utf-8"))
    assert doc["pre_tokenizer"] == {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True,
    }  # fmt: skip
    assert doc["decoder"]["type"] == "ByteLevel"
    assert doc["model"]["type"] == "BPE"
    assert doc["added_tokens"][0]["content"] == "<|endoftext|>" and doc["added_tokens"][0]["special"]


def test_trained_merges_equal_tokenizers_trainer(ours_json: Path, kjv_path: Path):
    ours = json.loads(ours_json.read_text(encoding="utf-8"))["model"]
    ref = json.loads(hf_train(kjv_path, OURS_VOCAB).to_str())["model"]
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
