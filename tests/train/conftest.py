"""pytest set-up for tests/train: the `moecore_bin` fixture and a tiny prepared corpus.

The binary is $MOECORE_BIN (relative paths are taken from the repo root), default
<repo>/build/bin/moecore. A missing binary is a FAILURE (as in tests/reference), unless
MOECORE_ALLOW_MISSING_BIN=1 is set, in which case the tests that need it are skipped.

`job_data` (session): a ~60 KB generated English-like text (one document per line), a byte-level
BPE tokenizer trained on it with `moecore tokenizer train` (vocab 384), and OLMo-core token files
written by `moecore prepare` (10 % validation). Everything is made with the CLI, so a broken
tokenizer or prepare step fails every test that depends on it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_VOCAB = 384
SETUP_TIMEOUT_S = 60


def binary_path() -> Path:
    env = os.environ.get("MOECORE_BIN")
    if env:
        p = Path(env)
        return p if p.is_absolute() else REPO / p
    return REPO / "build" / "bin" / "moecore"


@pytest.fixture(scope="session")
def moecore_bin() -> Path:
    p = binary_path()
    reason = None
    if not p.is_file():
        reason = f"moecore binary not found at {p} (build it with `make build`, or set MOECORE_BIN)"
    elif not os.access(p, os.X_OK):
        reason = f"moecore binary at {p} is not executable"
    if reason:
        if os.environ.get("MOECORE_ALLOW_MISSING_BIN") == "1":
            pytest.skip(reason + " [skipped: MOECORE_ALLOW_MISSING_BIN=1]")
        pytest.fail(reason + " (set MOECORE_ALLOW_MISSING_BIN=1 to skip tests that need it)")
    return p


WORDS = ("the of and to in that he shall unto for his a lord they be is him not them it with all "
         "thou was which my me said but ye their have will thee from as are when this out were "
         "upon man by you israel king son up there hath then people came had house into her on "
         "god land day one before").split()


def write_corpus(path: Path, n_bytes: int = 60_000, seed: int = 0) -> Path:
    """Deterministic English-like text, one document per line. Each word is followed by its own
    fixed successor 60 % of the time (else by a random word), so a trained model has something to
    learn and greedy decoding continues for many tokens instead of ending every line at once."""
    rng = random.Random(seed)
    successor = dict(zip(WORDS, rng.sample(WORDS, len(WORDS))))
    lines, size = [], 0
    while size < n_bytes:
        words = [rng.choice(WORDS)]
        for _ in range(rng.randint(5, 25) - 1):
            words.append(successor[words[-1]] if rng.random() < 0.6 else rng.choice(WORDS))
        line = " ".join(words).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class JobData:
    root: Path
    corpus: Path
    tokenizer: Path
    tokens: Path  # the prepared directory (train/, val/, meta.json)
    train: Path  # tokens/train
    val: Path  # tokens/val
    vocab_size: int  # the tokenizer's
    eos_id: int
    small_train: Path  # 40 instances of 32 tokens: a few steps cross epoch boundaries
    dtype: str  # element type of the headerless parts, from meta.json ("uint16")

    def read_part(self, part: Path) -> np.ndarray:
        """A prepared part as OLMo-core reads it: a headerless memmap of meta.json's dtype."""
        return np.memmap(part, dtype=np.dtype(self.dtype).newbyteorder("<"), mode="r")


def _cli(bin_path: Path, *args) -> subprocess.CompletedProcess:
    cmd = [str(bin_path), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
    assert r.returncode == 0, f"set-up command failed: {' '.join(cmd)}\n{r.stderr}"
    return r


@pytest.fixture(scope="session")
def job_data(moecore_bin, tmp_path_factory) -> JobData:
    root = tmp_path_factory.mktemp("job_data")
    corpus = write_corpus(root / "corpus.txt")
    tokenizer = root / "tokenizer.json"
    _cli(moecore_bin, "tokenizer", "train", "--input", corpus, "--vocab-size", TOKENIZER_VOCAB,
         "--out", tokenizer)
    tokens = root / "tokens"
    _cli(moecore_bin, "prepare", "--tokenizer", tokenizer, "--input", corpus, "--out", tokens,
         "--val-fraction", "0.1")
    meta = json.loads((tokens / "meta.json").read_text())
    assert meta["train"]["tokens"] > 10_000 and meta["val"]["tokens"] > 1_000, meta
    vocab = int(meta["vocab_size"])
    assert 256 < vocab <= TOKENIZER_VOCAB, meta
    train_parts = sorted((tokens / "train").glob("*.npy"))
    assert train_parts, f"no train .npy in {tokens}"
    assert meta["header"] == "none" and meta["dtype"] == "uint16", meta
    first = np.memmap(train_parts[0], dtype="<u2", mode="r")
    small = root / "small_train.npy"  # a NumPy file (with header): says its own type
    np.save(small, np.asarray(first[: 40 * 32]).astype(first.dtype))
    return JobData(root, corpus, tokenizer, tokens, tokens / "train", tokens / "val", vocab,
                   int(meta["eos_id"]), small, str(meta["dtype"]))
