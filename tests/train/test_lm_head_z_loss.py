"""OLMo-core's LM-head z-loss in the job (train.z_loss_multiplier, its train module's
z_loss_multiplier): the step's loss adds multiplier * the mean over counted targets of
logsumexp(logits)^2, reported unscaled as train/lm_z (also when the multiplier is 0, untrained),
and its gradient trains the model; data-parallel ranks with the chunked head train as the single
process with the whole head; a negative or non-finite multiplier is a one-line error. The oracle
for the values is OLMo-core itself (tests/reference/test_olmo_core_oracle.py); resume refuses a
changed multiplier (tests/train/test_run_safety.py), the pipeline stages sum it as the single
process does (tests/train/test_pipeline.py runs with it).

Tolerances: train/loss is the sum of its parts in double, logged as a double: 1e-12 relative.
The first step's ce and lm_z are the same forward with and without the multiplier (the weights
are the same until the first update): equal. The chunked, data-parallel run: as
test_lm_head_chunks.py (1e-6 on the first step, 1e-3 over the run).
"""
from __future__ import annotations

import pytest

from test_parallel import STEPS, dp_config, mpirun
from test_training_job import train, train_rows

MULTIPLIER = 0.01  # lse ~ 8.5 over a 4096-token vocabulary: lm_z ~ 70, its term ~ 0.7


def test_z_loss_is_in_the_loss_and_trained(moecore_bin, job_data, tmp_path):
    rows = {}
    for name, m in (("with", MULTIPLIER), ("without", 0.0)):
        cfg = dp_config(tmp_path, job_data, name, max_steps=3, threads=2)
        train(moecore_bin, cfg, f"train.z_loss_multiplier={m}")
        rows[name] = train_rows(tmp_path / name)
    with_z, without = rows["with"], rows["without"]
    assert sorted(with_z) == sorted(without) == [1, 2, 3]
    for step, row in with_z.items():
        parts = (row["train/ce"] + 0.01 * row["train/lb"] + 0.001 * row["train/z"]
                 + MULTIPLIER * row["train/lm_z"])
        assert row["train/loss"] == pytest.approx(parts, rel=1e-12), step
        assert row["train/lm_z"] > 1.0, step
    for row in without.values():
        assert row["train/loss"] == pytest.approx(
            row["train/ce"] + 0.01 * row["train/lb"] + 0.001 * row["train/z"], rel=1e-12)
    # The same first forward; then the z-loss's gradient has moved the weights.
    assert with_z[1]["train/ce"] == without[1]["train/ce"]
    assert with_z[1]["train/lm_z"] == without[1]["train/lm_z"]
    assert with_z[2]["train/ce"] != without[2]["train/ce"]
    assert abs(with_z[3]["train/lm_z"] - without[3]["train/lm_z"]) > 1e-3
    assert "z_loss_multiplier = 0.01" in (tmp_path / "with" / "config.toml").read_text()


def test_ranks_with_the_chunked_head_train_as_the_single_process(moecore_bin, job_data, tmp_path):
    single_cfg = dp_config(tmp_path, job_data, "single", microbatches=2,
                           z_loss_multiplier=MULTIPLIER)
    train(moecore_bin, single_cfg)
    cfg = dp_config(tmp_path, job_data, "ranks", microbatches=2, z_loss_multiplier=MULTIPLIER,
                    lm_head_chunk_tokens=24)
    r = mpirun(moecore_bin, 2, cfg)
    assert r.returncode == 0, r.stderr[-2000:]
    single, ranks = train_rows(tmp_path / "single"), train_rows(tmp_path / "ranks")
    assert len(single) == len(ranks) == STEPS
    for key in ("train/loss", "train/lm_z"):
        ours, ref = [ranks[s][key] for s in sorted(ranks)], [single[s][key] for s in sorted(single)]
        assert ours[0] == pytest.approx(ref[0], rel=1e-6), key
        assert ours == pytest.approx(ref, rel=1e-3), key


@pytest.mark.parametrize("value", ["-0.001", "nan", "inf"])
def test_bad_multiplier_is_one_line_error(moecore_bin, job_data, tmp_path, value):
    cfg = dp_config(tmp_path, job_data, "bad")
    r = train(moecore_bin, cfg, f"train.z_loss_multiplier={value}", check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.z_loss_multiplier" in lines[0], r.stderr
    assert not (tmp_path / "bad").exists()
