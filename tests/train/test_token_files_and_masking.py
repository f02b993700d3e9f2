"""Training jobs on OLMo-core token files and with intra-document masking (issue 12, items 1 and 6).

- The same corpus prepared three ways (headerless uint16, the default; headerless uint32; NumPy
  files with a header) gives the same instances (`moecore data instances`) and the same training
  run, metric for metric: the default format change moves no token.
- data.document_masking: the run starts with `document masking (EOS n)` (n from meta.json), its
  losses differ from the unmasked run's, and `moecore eval` on its checkpoint scores the validation
  set with the mask (its loss equals the run's own val/loss, and differs once the checkpoint's
  config turns masking off).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from test_training_job import run, train, train_rows, without_timing, write_config

STEPS = 4


def prepare(moecore_bin, job, out: Path, *flags: str) -> Path:
    run(moecore_bin, "prepare", "--tokenizer", job.tokenizer, "--input", job.corpus, "--out", out,
        "--val-fraction", "0.1", *flags)
    return out


def instances(moecore_bin, data: Path, vocab: int, tmp: Path) -> np.ndarray:
    out = tmp / f"inst_{data.parent.name}_{data.name}.npy"
    run(moecore_bin, "data", "instances", "--data", data, "--seq-len", 32, "--vocab-size", vocab,
        "--out", out)
    return np.load(out)


def test_formats_give_the_same_instances_and_run(moecore_bin, job_data, tmp_path):
    corpora = {
        "raw_uint16": prepare(moecore_bin, job_data, tmp_path / "raw16"),
        "raw_uint32": prepare(moecore_bin, job_data, tmp_path / "raw32", "--dtype", "uint32"),
        "npy_uint16": prepare(moecore_bin, job_data, tmp_path / "npy16", "--npy-header"),
    }
    sizes = {name: (c / "train" / "part-00000.npy").stat().st_size for name, c in corpora.items()}
    tokens = json.loads((corpora["raw_uint16"] / "meta.json").read_text())["train"]["tokens"]
    assert sizes == {"raw_uint16": 2 * tokens, "raw_uint32": 4 * tokens, "npy_uint16": 2 * tokens + 128}

    ref = instances(moecore_bin, corpora["raw_uint16"] / "train", job_data.vocab_size, tmp_path)
    assert ref.shape[0] > 100
    for name, c in corpora.items():
        np.testing.assert_array_equal(instances(moecore_bin, c / "train", job_data.vocab_size, tmp_path),
                                      ref, err_msg=name)

    rows = {}
    for name, c in corpora.items():
        out = tmp_path / f"run_{name}"
        cfg = write_config(tmp_path / f"{name}.toml", job_data, out,
                           train={"max_steps": STEPS, "log_every": 1},
                           data={"train": [str(c / "train")], "val": [str(c / "val")]})
        train(moecore_bin, cfg)
        rows[name] = {s: without_timing(r) for s, r in train_rows(out).items()}
    assert sorted(rows["raw_uint16"]) == list(range(1, STEPS + 1))
    assert rows["raw_uint32"] == rows["raw_uint16"] and rows["npy_uint16"] == rows["raw_uint16"]


def val_loss(out: Path, step: int) -> float:
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == step and "val/loss" in row:
            return row["val/loss"]
    raise AssertionError(f"no val/loss at step {step} in {out}")


def eval_loss(moecore_bin, ckpt: Path, data: Path, max_instances: int) -> float:
    r = run(moecore_bin, "eval", "--checkpoint", ckpt, "--data", data, "--max-instances", max_instances)
    return float(re.search(r"loss (\S+)", r.stdout).group(1))


def test_document_masking_in_training_and_evaluation(moecore_bin, job_data, tmp_path):
    train_cfg = {"max_steps": STEPS, "log_every": 1, "eval_every": STEPS, "save_every": STEPS}
    runs = {}
    for masking in (False, True):
        out = tmp_path / f"run_{masking}"
        cfg = write_config(tmp_path / f"m{masking}.toml", job_data, out, train=train_cfg,
                           data={"document_masking": masking})
        r = train(moecore_bin, cfg)
        assert (f"document masking (EOS {job_data.eos_id})" in r.stdout) == masking, r.stdout[:400]
        runs[masking] = out
    plain, masked = (train_rows(runs[m]) for m in (False, True))
    # Step 1 runs the same weights on the same batch: only the attention mask differs.
    assert plain[1]["train/loss"] != masked[1]["train/loss"]

    ckpt = runs[True] / "checkpoints" / f"step_{STEPS:08d}"
    eval_instances = 2 * 4  # train.eval_batches x batch_size in write_config
    masked_eval = eval_loss(moecore_bin, ckpt, job_data.val, eval_instances)
    assert masked_eval == pytest.approx(val_loss(runs[True], STEPS), rel=1e-5)
    # The same checkpoint scored without the mask gives another loss: eval applied it.
    config = (ckpt / "config.toml").read_text()
    assert "document_masking = true" in config
    # The EOS resolved from meta.json is saved: the checkpoint scores files without a meta.json.
    assert f"eos_id = {job_data.eos_id}" in config
    bare = tmp_path / "bare_val.npy"
    bare.write_bytes(next(job_data.val.glob("*.npy")).read_bytes())
    r = run(moecore_bin, "eval", "--checkpoint", ckpt, "--data", bare, "--dtype", job_data.dtype,
            "--max-instances", eval_instances)
    assert float(re.search(r"loss (\S+)", r.stdout).group(1)) == pytest.approx(
        val_loss(runs[True], STEPS), rel=1e-5)
    # Scored without the mask by editing the config: eval checks the files against checksums.json
    # (a changed config.toml is refused), so the hand-edited copy goes without its manifest.
    (ckpt / "config.toml").write_text(config.replace("document_masking = true", "document_masking = false"))
    r = run(moecore_bin, "eval", "--checkpoint", ckpt, "--data", job_data.val, check=False)
    assert r.returncode == 1 and "config.toml" in r.stderr and "when it was written" in r.stderr, r
    (ckpt / "checksums.json").unlink()
    unmasked_eval = eval_loss(moecore_bin, ckpt, job_data.val, eval_instances)
    assert unmasked_eval != pytest.approx(masked_eval, rel=1e-4)


def test_explicit_eos_must_match_meta_json(moecore_bin, job_data, tmp_path):
    other = (job_data.eos_id + 1) % job_data.vocab_size
    cfg = write_config(tmp_path / "bad.toml", job_data, tmp_path / "run",
                       data={"document_masking": True, "eos_id": other})
    r = train(moecore_bin, cfg, check=False)
    assert r.returncode != 0 and f"data.eos_id={other}" in r.stderr and "meta.json" in r.stderr, r.stderr


@pytest.mark.parametrize("ranks,sets", [(2, ["parallel.pp=2"]), (2, [])], ids=["pp2", "dp2"])
def test_document_masking_under_pipeline_and_data_parallelism(moecore_bin, job_data, tmp_path,
                                                              ranks, sets):
    """Every pipeline stage masks (each computes the documents from the step's tokens) and every
    data-parallel rank masks its own rows: the losses follow the single process with masking."""
    from test_parallel import TOL, losses, max_rel, mpirun

    def config(name):
        return write_config(tmp_path / f"{name}.toml", job_data, tmp_path / name,
                            model={"num_hidden_layers": 4},
                            train={"max_steps": STEPS, "batch_size": 8, "microbatches": 2,
                                   "threads": 1, "log_every": 1, "eval_every": 0},
                            data={"document_masking": True})
    train(moecore_bin, config("single"))
    r = mpirun(moecore_bin, ranks, config("multi"), *sets)
    assert r.returncode == 0, r.stderr[-2000:]
    single, multi = losses(tmp_path / "single"), losses(tmp_path / "multi")
    assert len(single) == STEPS and max_rel(multi, single) <= TOL, (multi, single)
    # And masking is on in these runs: without it the first loss differs.
    plain = write_config(tmp_path / "plain.toml", job_data, tmp_path / "plain",
                         model={"num_hidden_layers": 4},
                         train={"max_steps": 1, "batch_size": 8, "microbatches": 2, "threads": 1,
                                "log_every": 1, "eval_every": 0})
    train(moecore_bin, plain)
    assert losses(tmp_path / "plain")[0] != single[0]
