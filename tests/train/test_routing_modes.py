"""Routing modes for capacity benchmarks (issue 4 item 6): model.routing = "learned" (default),
"random" (uniform random expert choice per (seed, step, micro-batch, layer, global token), the
weights still the router's scores so the router still trains) and "balanced" (global token g takes
experts (g k + j) mod E: exactly even when tokens x k is a multiple of E).

The model here has 8 experts top-3 and micro-batches of 8 x 31 tokens: 744 routes, 93 per expert,
while each half of the batch (372 routes) cannot be even on its own, so a rank that routed its
slice without its global token offset would not reproduce the single process. MPI runs are
oversubscribed on two cores with one thread per rank; tolerance as in test_parallel.py.
"""
from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from test_parallel import TOL, losses, max_rel, mpirun
from test_training_job import ENV, checkpoints, train, train_rows, write_config

MODES = ("learned", "random", "balanced")
STEPS = 12
MODEL = {"num_experts": 8, "num_experts_per_tok": 3, "router_z_loss_coef": 0.001}
ROUTER = "model.layers.0.mlp.gate.weight"


def mode_config(tmp_path: Path, job, name: str, routing: str, **train_changes) -> Path:
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        model={**MODEL, "routing": routing},
                        train={"max_steps": STEPS, "batch_size": 8, "seq_len": 31, "threads": 1,
                               "log_every": 1, "eval_every": 0, "save_every": STEPS,
                               **train_changes})


@pytest.fixture(scope="module")
def single_runs(moecore_bin, job_data, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("routing_single")
    out = {}
    for mode in MODES:
        r = train(moecore_bin, mode_config(tmp, job_data, mode, mode, eval_every=6))
        assert r.returncode == 0, r.stderr
        out[mode] = tmp / mode
    return out


def test_every_mode_trains(single_runs):
    for mode, out in single_runs.items():
        rows = train_rows(out)
        assert sorted(rows) == list(range(1, STEPS + 1)), mode
        loss = [rows[s]["train/loss"] for s in sorted(rows)]
        assert all(np.isfinite(loss)), (mode, loss)
        assert loss[-1] < loss[0], (mode, loss)
        saved = tomllib.loads((out / "config.toml").read_text())
        assert saved["model"]["routing"] == mode
    # The modes really route differently.
    runs = {mode: losses(out) for mode, out in single_runs.items()}
    assert runs["random"] != runs["learned"] and runs["balanced"] != runs["learned"]
    assert runs["random"] != runs["balanced"]


def test_balanced_routing_is_perfectly_even(single_runs):
    for row in train_rows(single_runs["balanced"]).values():
        assert row["moe/load_imbalance"] == 1.0
        assert row["moe/max_load_imbalance"] == 1.0
        counts = [v for k, v in row.items() if "tokens_expert" in k]
        assert counts and set(counts) == {31 * 8 * 3 / 8}


def test_random_routing_is_near_even(single_runs):
    # 744 routes over 8 experts: mean 93, sd ~8.9; the max over 8 experts and 2 layers stays
    # well under +50 %.
    rows = train_rows(single_runs["random"]).values()
    imbalance = [row["moe/max_load_imbalance"] for row in rows]
    assert all(1.0 < x < 1.5 for x in imbalance), imbalance
    # Another step draws other routes.
    counts = [tuple(v for k, v in row.items() if "layer0/tokens_expert" in k) for row in rows]
    assert len(set(counts)) > 1


@pytest.mark.parametrize("mode", ["random", "balanced"])
def test_the_router_still_learns(moecore_bin, single_runs, job_data, tmp_path, mode):
    """Gradients reach the router through the routing weights and the auxiliary losses: its weights
    move away from their initial values."""
    init = tmp_path / "init.safetensors"
    cfg = mode_config(tmp_path, job_data, "x", mode)
    r = subprocess.run([str(moecore_bin), "init", "--config", str(cfg), "--seed", "0", "--out",
                        str(init)], capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 0, r.stderr
    before = load_file(str(init))[ROUTER]
    after = load_file(str(checkpoints(single_runs[mode])[-1] / "model.safetensors"))[ROUTER]
    assert np.max(np.abs(after - before)) > 1e-3
    config_json = json.loads((checkpoints(single_runs[mode])[-1] / "config.json").read_text())
    assert config_json["model_type"] == "moecore" and config_json["architectures"] == []
    assert config_json["routing"] == mode


def test_learned_checkpoint_still_claims_olmoe(single_runs):
    config_json = json.loads((checkpoints(single_runs["learned"])[-1] / "config.json").read_text())
    assert config_json["model_type"] == "olmoe"


@pytest.mark.parametrize("mode", ["random", "balanced"])
def test_same_seed_same_run_and_resume_is_exact(moecore_bin, single_runs, job_data, tmp_path,
                                                mode):
    """The random draws come from (train.seed, step, micro-batch, layer, token): a run interrupted
    and resumed half-way gives the losses of the run that never stopped (a constant learning-rate
    schedule, so that the shorter first half has the same learning rates)."""
    constant = "optim.schedule=constant"
    whole = mode_config(tmp_path, job_data, "whole", mode)
    assert train(moecore_bin, whole, constant).returncode == 0
    cfg = mode_config(tmp_path, job_data, "resumed", mode, save_every=STEPS // 2)
    assert train(moecore_bin, cfg, constant, f"train.max_steps={STEPS // 2}").returncode == 0
    r = train(moecore_bin, cfg, constant, resume=True)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    assert losses(tmp_path / "resumed") == losses(tmp_path / "whole")
    other = mode_config(tmp_path, job_data, "seed1", mode, seed=1)
    assert train(moecore_bin, other).returncode == 0
    if mode == "random":
        assert losses(tmp_path / "seed1") != losses(single_runs[mode])


def test_unknown_routing_is_a_one_line_error(moecore_bin, job_data, tmp_path):
    r = train(moecore_bin, mode_config(tmp_path, job_data, "bad", "uniform"), check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.routing=\"uniform\"" in lines[0], r.stderr
    assert "\"learned\", \"random\", \"balanced\"" in lines[0]


@pytest.mark.parametrize("ranks,ep", [(2, 2), (2, 1), (4, 2)])
@pytest.mark.parametrize("mode", ["random", "balanced"])
def test_parallel_layouts_match_single_process(moecore_bin, single_runs, job_data, tmp_path,
                                               ranks, ep, mode):
    cfg = mode_config(tmp_path, job_data, "mpi", mode)
    r = mpirun(moecore_bin, ranks, cfg, f"parallel.ep={ep}", "parallel.dispatch=sync")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"dp={ranks} ep={ep}" in r.stdout  # dense weights over every rank, experts over ep
    ours, ref = losses(tmp_path / "mpi"), losses(single_runs[mode])
    assert len(ours) == STEPS == len(ref)
    assert max_rel(ours, ref) <= TOL, (ours, ref)
