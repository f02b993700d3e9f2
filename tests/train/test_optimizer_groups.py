"""optim.group_overrides (OLMo-core's optimizer groups) in every layout: each rank's optimizer
holds the groups of the tensors it keeps (its ZeRO-1 slices, its experts, its stages), so data,
expert and pipeline parallel runs train as the single process does, to test_parallel's
tolerances (losses 1e-5 relative). The groups' arithmetic is held to OLMo-core's AdamW in
tests/reference/test_olmo_core_training_run.py, bit for bit to [optim]'s own update in
tests/cpp/test_optimizer_groups.cpp. The groups here move the run far from the one without them
(the test checks that too), so a rank that lost its groups would be seen.
"""
from __future__ import annotations

import pytest

import json

from test_parallel import STEPS, TOL, losses, max_rel, mpirun
from test_training_job import run, train, train_rows, write_config

# The experts at a fifth of the rate with other betas (OLMo-core's names); the first layer's
# attention (moecore's names) without decay at twice the rate; the embedding without decay.
GROUPS = [
    {"params": ["blocks.*.routed_experts.*"], "lr": 6e-4, "beta1": 0.5, "beta2": 0.99},
    {"params": ["model.layers.0.self_attn.*"], "lr": 6e-3, "weight_decay": 0.0, "eps": 1e-6},
    {"params": ["embeddings.weight"], "weight_decay": 0.0},
]


def config(tmp_path, job, name: str, groups=True, **train_changes):
    optim = {"no_decay": "none", "group_overrides": GROUPS} if groups else {}
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name, optim=optim,
                        model={"num_hidden_layers": 2},
                        train={"max_steps": STEPS, "batch_size": 8, "microbatches": 2,
                               "threads": 1, "log_every": 1, "eval_every": 0, **train_changes})


def assert_lr_schedule_lists_the_rates(moecore_bin, cfg, out_dir):
    """`moecore lr-schedule --json` gives train/lr and every train/lr_override{k} of the run, bit
    for bit."""
    listed = json.loads(run(moecore_bin, "lr-schedule", cfg, "--json").stdout)
    rows = train_rows(out_dir)
    assert listed["step"] == sorted(rows)
    for key in ["lr"] + [f"lr_override{k}" for k in range(len(GROUPS))]:
        assert listed[key] == [rows[s][f"train/{key}"] for s in sorted(rows)], key


@pytest.fixture(scope="module")
def single(moecore_bin, job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("groups_single")
    r = train(moecore_bin, config(tmp, job_data, "single"))
    assert r.returncode == 0, r.stderr
    assert "optimizer group optim.group_overrides[0]: " in r.stdout, r.stdout[-2000:]
    rows = train_rows(tmp / "single")
    # Each group's own rate is logged: the experts' a fifth of train/lr, the attention's twice.
    for row in rows.values():
        assert row["train/lr_override0"] == pytest.approx(row["train/lr"] / 5, rel=1e-12)
        assert row["train/lr_override1"] == pytest.approx(row["train/lr"] * 2, rel=1e-12)
        assert row["train/lr_override2"] == row["train/lr"]
    assert_lr_schedule_lists_the_rates(moecore_bin, tmp / "single.toml", tmp / "single")
    plain = tmp / "plain"
    r = train(moecore_bin, config(tmp, job_data, "plain", groups=False))
    assert r.returncode == 0, r.stderr
    assert max_rel(losses(tmp / "single"), losses(plain)) > 100 * TOL
    return tmp / "single"


@pytest.mark.parametrize("layout,ranks,sets", [
    ("dp2", 2, []),
    ("dp2_zero", 2, ["parallel.zero=1"]),
    ("ep2_zero_dp4", 4, ["parallel.ep=2", "parallel.zero=1"]),
    ("pp2", 2, ["parallel.pp=2"]),
])
def test_layouts_train_as_the_single_process(moecore_bin, job_data, tmp_path, single, layout,
                                             ranks, sets):
    r = mpirun(moecore_bin, ranks, config(tmp_path, job_data, "run"), *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ours, ref = losses(tmp_path / "run"), losses(single)
    assert len(ours) == STEPS and max_rel(ours, ref) <= TOL, (ours, ref)


def test_batch_size_changes_move_every_groups_rate(moecore_bin, job_data, tmp_path):
    """Under train.batch_sizes each group's initial_lr moves as optim.lr's does (OLMo-core's
    callback multiplies every group's by sqrt(new / old)); lr-schedule lists the same rates."""
    cfg = config(tmp_path, job_data, "run", batch_size=4, batch_sizes=[4, 8],
                 batch_size_starts=[0, 6], max_steps=12)
    r = train(moecore_bin, cfg)
    assert r.returncode == 0, r.stderr
    rows = train_rows(tmp_path / "run")
    after = [s for s in sorted(rows) if s > 6]
    assert after and all(rows[s]["train/lr_override1"] == pytest.approx(2 * rows[s]["train/lr"],
                                                                         rel=1e-12) for s in after)
    assert_lr_schedule_lists_the_rates(moecore_bin, cfg, tmp_path / "run")
