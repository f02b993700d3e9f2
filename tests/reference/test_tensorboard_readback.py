"""TensorBoard event files written by `moecore train`, read back by the tensorboard package (issue 3,
item 5).

A tiny run (d 32, 1 layer, 4 experts top-2, batch 2 x 16 tokens, 6 steps) writes
<out_dir>/metrics.jsonl and <out_dir>/tb/events.out.tfevents.*. Its data is made with the CLI by the
session fixture `job_data`: a ~50 KB generated text (one document per line) -> `moecore tokenizer
train` (byte-level BPE, vocab 320; the model's vocab_size is the tokenizer's) -> `moecore prepare`
(OLMo-core .npy token files, 10 % validation). The events are
read with tensorboard's own EventAccumulator (the reader TensorBoard itself uses, which also checks
every TFRecord CRC) and with tbparse, and checked against each other and against metrics.jsonl:
  * the tags train/loss and train/lr exist with steps exactly 1..6 and finite values;
  * every tag is in the documented namespaces (train/, val/, moe/);
  * every value in metrics.jsonl appears in TensorBoard under the same tag and step (TensorBoard
    stores float32; a JSON null stands for NaN/Inf);
  * the first event of every file carries file_version "brain.Event:2".

Run: /opt/moecore/venv/bin/python -m pytest -q tests/reference/test_tensorboard_readback.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

import moecore_harness as H

STEPS = 6
# throughput/: an evaluation's cost under OLMo-core's names (throughput/in-loop eval ...).
TAG_PREFIXES = ("train/", "val/", "moe/", "throughput/")

TOKENIZER_VOCAB = 320
MODEL = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "intermediate_size": 128,
    "router_z_loss_coef": 0.001,
}


def write_corpus(path: Path, n_bytes: int = 50_000) -> Path:
    """Deterministic English-like text, one "document" per line."""
    rng = random.Random(0)
    words = ("the of and to in that he shall unto for his a lord they be is him not them it with all "
             "thou was which my me said but ye their have will thee from as are when this out were "
             "upon man by you israel king son up there hath then people came had house into her on "
             "god land day one before").split()
    lines, size = [], 0
    while size < n_bytes:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(5, 25))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def job_data(moecore_bin, tmp_path_factory) -> dict:
    """Corpus, tokenizer.json and prepared token files, all made with the moecore CLI."""
    root = tmp_path_factory.mktemp("tb_data")
    corpus = write_corpus(root / "corpus.txt")
    tokenizer = root / "tokenizer.json"
    H.run_moecore("tokenizer", "train", "--input", corpus, "--vocab-size", TOKENIZER_VOCAB,
                  "--out", tokenizer)
    tokens = root / "tokens"
    H.run_moecore("prepare", "--tokenizer", tokenizer, "--input", corpus, "--out", tokens,
                  "--val-fraction", "0.1")
    meta = json.loads((tokens / "meta.json").read_text())
    assert meta["train"]["tokens"] > 0 and meta["val"]["tokens"] > 0, meta
    return {"tokenizer": tokenizer, "train": tokens / "train", "val": tokens / "val",
            "vocab_size": int(meta["vocab_size"])}


def write_train_config(path: Path, data: dict) -> Path:
    tables = {
        "model": H.model_table({**MODEL, "vocab_size": data["vocab_size"]}),
        "optim": {**H.OPTIM_DEFAULTS, "warmup_steps": 2},
        "train": {
            "seed": 0,
            "max_steps": 1000,  # overridden on the command line
            "batch_size": 2,
            "seq_len": 16,
            "threads": 1,
            "log_every": 1,
            "eval_every": 3,
            "eval_batches": 2,
            "max_seconds": 0.0,
            # No end-of-run sample: it is not what this file tests, and the harness reads stdout
            # as strict UTF-8 (tests/train checks the sample's encoding).
            "sample_tokens": 0,
            "out_dir": "unused",  # overridden on the command line
        },
    }
    # [data] holds lists, which H.toml_text does not write; JSON strings are TOML basic strings.
    data_table = (f'[data]\ntrain = [{json.dumps(str(data["train"]))}]\n'
                  f'val = [{json.dumps(str(data["val"]))}]\n'
                  f'tokenizer = {json.dumps(str(data["tokenizer"]))}\n')
    path.write_text(H.toml_text(tables) + "\n" + data_table)
    return path


@pytest.fixture(scope="module")
def run_dir(moecore_bin, job_data, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("tb_run")
    config = write_train_config(work / "tiny.toml", job_data)
    out = work / "run"
    H.run_moecore("train", config, "--set", f"train.max_steps={STEPS}", "--set", f"train.out_dir={out}",
                  "--set", "train.log_every=1")
    return out


def load_accumulator(tb_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return acc


def tb_scalars(tb_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} as TensorBoard shows them (orphaned steps of restarts purged)."""
    acc = load_accumulator(tb_dir)
    out: dict[str, dict[int, float]] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert steps == sorted(steps), f"{tag}: steps out of order {steps}"
        assert len(set(steps)) == len(steps), f"{tag}: a step logged twice {steps}"
        out[tag] = {e.step: e.value for e in events}
    return out


def test_event_files_exist(run_dir):
    tb = run_dir / "tb"
    assert tb.is_dir(), f"no TensorBoard directory at {tb}"
    files = sorted(tb.glob("events.out.tfevents.*"))
    assert files, f"no events.out.tfevents.* file in {tb}"
    from tensorboard.backend.event_processing import event_file_loader

    for f in files:
        # Raw records: the TFRecord CRCs are checked by the loader; the first event is the version.
        events = list(event_file_loader.EventFileLoader(str(f)).Load())
        assert events, f"{f}: empty"
        assert events[0].file_version == "brain.Event:2", f"{f}: first event {events[0]}"


def test_loss_and_lr_for_every_step(run_dir):
    scalars = tb_scalars(run_dir / "tb")
    for tag in ("train/loss", "train/lr"):
        assert tag in scalars, f"missing tag {tag}; have {sorted(scalars)}"
        assert sorted(scalars[tag]) == list(range(1, STEPS + 1)), f"{tag}: steps {sorted(scalars[tag])}"
        values = list(scalars[tag].values())
        assert all(math.isfinite(v) for v in values), f"{tag}: {values}"
    assert all(v > 0 for v in scalars["train/lr"].values())
    # An untrained model starts near ln(V) (V = the tokenizer's vocabulary, about 320: 5.77).
    first_loss = scalars["train/loss"][1]
    assert 3.0 < first_loss < 8.0, first_loss


def test_tags_are_namespaced(run_dir):
    scalars = tb_scalars(run_dir / "tb")
    bad = [t for t in scalars if not t.startswith(TAG_PREFIXES)]
    assert not bad, f"tags outside {TAG_PREFIXES}: {bad}"


def test_tensorboard_matches_metrics_jsonl(run_dir):
    jsonl = run_dir / "metrics.jsonl"
    assert jsonl.is_file(), f"no {jsonl}"
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert rows, f"{jsonl} is empty"
    scalars = tb_scalars(run_dir / "tb")
    jsonl_steps = {name: set() for row in rows for name in row if name != "step"}
    checked = 0
    for row in rows:
        step = row["step"]
        for name, value in row.items():
            if name == "step":
                continue
            jsonl_steps[name].add(step)
            assert name in scalars and step in scalars[name], f"{name}@{step} in metrics.jsonl, not in TensorBoard"
            tb_value = scalars[name][step]
            if value is None:
                assert not math.isfinite(tb_value), f"{name}@{step}: null in jsonl, {tb_value} in TensorBoard"
            else:
                # TensorBoard's simple_value is the float32 nearest the logged double.
                assert tb_value == float(np.float32(value)), f"{name}@{step}: jsonl {value}, TensorBoard {tb_value}"
            checked += 1
    assert checked > 0
    # ... and nothing in TensorBoard that metrics.jsonl lacks.
    for tag, by_step in scalars.items():
        assert set(by_step) == jsonl_steps.get(tag, set()), f"{tag}: TensorBoard steps {sorted(by_step)}"
    assert sorted(row["step"] for row in rows if "train/loss" in row) == list(range(1, STEPS + 1))


def test_tbparse_agrees(run_dir):
    tbparse = pytest.importorskip("tbparse")
    df = tbparse.SummaryReader(str(run_dir / "tb")).scalars
    assert set(df.columns) >= {"step", "tag", "value"}, df.columns
    loss = df[df["tag"] == "train/loss"].sort_values("step")
    assert loss["step"].tolist() == list(range(1, STEPS + 1))
    ours = tb_scalars(run_dir / "tb")["train/loss"]
    assert loss["value"].tolist() == pytest.approx([ours[s] for s in range(1, STEPS + 1)], rel=0, abs=0)
