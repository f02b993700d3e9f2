"""The chunked LM head in the job (train.lm_head_chunk_tokens, model/chunked_lm_head.h): two
data-parallel ranks with gradient accumulation train as with the whole head up to fp32 rounding
of the head's sums, the key is saved with the run and read back on resume, `moecore diff` shows
the chunked pass against the whole one tensor by tensor (the logits and their gradient assembled
from the chunks), and a negative value is a one-line error.

Tolerance: the first step's loss is the same forward (its logits rows go through a GEMM over fewer
rows, rounding the length-d dot products in another order, ~d u relative; the loss adds the
chunks' shares in double), so 1e-6 relative is >10x that. Later steps start from weights that
differ by the rounding of the head's weight gradient (the chunks' products added in turn), which
training amplifies; over the STEPS (20) steps the losses stay within 1e-3 relative (measured
6.4e-9 at worst, AMD EPYC), where a wrong gradient (a lost chunk, the loss scale applied twice)
moves the second step's loss by more than 1e-2.
"""
from __future__ import annotations

import json
import tomllib

import pytest

from test_parallel import STEPS, dp_config, losses, mpirun
from test_training_job import run, train

CHUNK = "train.lm_head_chunk_tokens=24"  # 2 sequences of 32 tokens per rank and micro-batch


def test_chunked_head_trains_as_the_whole_head(moecore_bin, job_data, tmp_path):
    whole_cfg = dp_config(tmp_path, job_data, "whole", microbatches=2)
    chunked_cfg = dp_config(tmp_path, job_data, "chunked", microbatches=2)
    r = mpirun(moecore_bin, 2, whole_cfg)
    assert r.returncode == 0, r.stderr[-2000:]
    r = mpirun(moecore_bin, 2, chunked_cfg, CHUNK)
    assert r.returncode == 0, r.stderr[-2000:]
    whole, chunked = losses(tmp_path / "whole"), losses(tmp_path / "chunked")
    assert len(whole) == len(chunked) == STEPS
    assert chunked[0] == pytest.approx(whole[0], rel=1e-6)
    assert chunked == pytest.approx(whole, rel=1e-3)
    assert "lm_head_chunk_tokens = 24" in (tmp_path / "chunked" / "config.toml").read_text()


def test_resume_keeps_the_chunks(moecore_bin, job_data, tmp_path):
    cfg = dp_config(tmp_path, job_data, "run", max_steps=2, save_every=1)
    r = train(moecore_bin, cfg, CHUNK)
    assert r.returncode == 0, r.stderr
    # Without the chunks the run would go on off its path (the head's sums in another order):
    # refused, naming the key (test_run_safety.py covers the refusal's other guarantees).
    r = train(moecore_bin, cfg, "train.max_steps=3", resume=True, check=False)
    assert r.returncode != 0 and "train.lm_head_chunk_tokens: 24 -> 0" in r.stderr, r.stderr
    r = train(moecore_bin, cfg, CHUNK, "train.max_steps=3", resume=True)
    assert r.returncode == 0, r.stderr
    assert len(losses(tmp_path / "run")) == 3


def test_chunk_above_the_micro_batch_is_one_chunk_of_it(moecore_bin, job_data, tmp_path):
    """A chunk larger than the micro-batch is the micro-batch in one chunk: the same bits as a
    chunk of exactly its tokens, and no workspace sized by the setting (2^40 tokens of logits was
    an out-of-memory error, 2^62 a failed GEMM naming no key)."""
    runs = {}
    for name in ("exact", "huge"):
        cfg = dp_config(tmp_path, job_data, name, max_steps=3)
        t = tomllib.loads(cfg.read_text())["train"]
        tokens = t["batch_size"] // t.get("microbatches", 1) * t["seq_len"]
        chunk = tokens if name == "exact" else 1 << 62
        train(moecore_bin, cfg, f"train.lm_head_chunk_tokens={chunk}")
        runs[name] = losses(tmp_path / name)
    assert len(runs["exact"]) == 3 and runs["huge"] == runs["exact"], runs


def test_negative_chunk_is_one_line_error(moecore_bin, job_data, tmp_path):
    cfg = dp_config(tmp_path, job_data, "bad")
    r = train(moecore_bin, cfg, "train.lm_head_chunk_tokens=-4", check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.lm_head_chunk_tokens=-4 must be >= 0" in lines[0], r.stderr
    assert not (tmp_path / "bad").exists()


def test_diff_shows_the_chunked_pass_against_the_whole(moecore_bin, job_data, tmp_path):
    # The config's batch (8 sequences of 32 tokens) in chunks of 24: the last one 16 rows. Within
    # diff's threshold (2^-18 normalised, fp32 sums in another order); the head's weight gradient
    # is where the order changes (measured 2.4e-7 on the default model, every other tensor 0 on
    # AMD EPYC).
    cfg = dp_config(tmp_path, job_data, "diff")
    r = run(moecore_bin, "diff", cfg, "--b-set", CHUNK, "--json", check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    by_name = {t["name"]: t for t in report["tensors"]}
    assert {"lm_head", "grad.lm_head", "grad.lm_head.weight"} <= by_name.keys()
    assert report["a"]["run"]["batch_shape"] == [8, 32]
    assert not report["parted"]
    assert by_name["grad.lm_head.weight"]["normalised_error"] > 0.0  # the chunks did run
