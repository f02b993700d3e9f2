"""model.lb_loss_scope and model.lb_loss_granularity in the trainer (their losses against
OLMo-core's: tests/reference/test_olmo_core_lb_scope.py).

- Expert parallelism and pipeline stages train as plain data parallelism under "rank".
- Two data-parallel ranks with auxiliary-loss-free balancing: the passes tally each rank's routes
  under "rank", and the selection-bias update sums them over the group first, so the bias after
  a step equals the single process's (as OLMo-core, whose bias update sums its routes over the
  group either way); the losses then differ from "global"'s only in the load-balancing term.
- Under granularity "instance" an instance's term is the same on whichever rank it is: one
  process, two data-parallel ranks under either scope, expert parallelism and pipeline stages
  train alike, selection bias included.
- A resume under another scope or granularity is refused (the loss would change under the run).
"""
from __future__ import annotations

import pytest

from test_parallel import dp_config, load_parts, mpirun
from test_training_job import assert_one_line_error, train, train_rows, without_timing

BIAS = "model.router_bias_update_rate=0.01"


def biases(out) -> dict:
    weights = load_parts(out / "checkpoints" / "step_00000001", "model")
    found = {n: t for n, t in weights.items() if n.endswith("e_score_correction_bias")}
    assert found, "no selection bias in the checkpoint"
    return found


def test_rank_scope_trains_alike_in_every_layout(moecore_bin, job_data, tmp_path):
    """Under "rank" the routers' losses are the data-parallel ranks' own, summed: expert
    parallelism (experts moved, the routes not) and pipeline stages (each stage's layers summed
    over its dp group, the stages' rows added) give the dp = 2 run's losses (test_parallel's
    tolerance for reordered sums), and the scope is in force in each (not "global"'s lb)."""
    scope = "model.lb_loss_scope=rank"
    runs = {}
    for name, ranks, extra in [("dp", 2, []), ("dp_ep", 2, ["parallel.ep=2"]),
                               ("pp_dp", 4, ["parallel.pp=2"]),
                               ("global", 2, ["model.lb_loss_scope=global"])]:
        cfg = dp_config(tmp_path, job_data, name, max_steps=3, microbatches=2)
        r = mpirun(moecore_bin, ranks, cfg, scope, *extra)
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
        rows = train_rows(tmp_path / name)
        runs[name] = [rows[s] for s in sorted(rows)]
    for name in ("dp_ep", "pp_dp"):
        for key in ("train/loss", "train/lb", "train/ce"):
            ours = [row[key] for row in runs[name]]
            ref = [row[key] for row in runs["dp"]]
            assert ours == pytest.approx(ref, rel=1e-5), (name, key, ours, ref)
    assert runs["global"][0]["train/lb"] != pytest.approx(runs["dp"][0]["train/lb"], rel=1e-5)


def test_ranks_update_the_selection_bias_from_the_groups_routes(moecore_bin, job_data, tmp_path):
    one_step = dict(max_steps=1, save_every=1)
    train(moecore_bin, dp_config(tmp_path, job_data, "single", **one_step), BIAS)
    runs = {}
    for scope in ("rank", "global"):
        cfg = dp_config(tmp_path, job_data, scope, **one_step)
        r = mpirun(moecore_bin, 2, cfg, BIAS, f"model.lb_loss_scope={scope}")
        assert r.returncode == 0, r.stderr[-2000:]
        runs[scope] = train_rows(tmp_path / scope)[1]
    single = biases(tmp_path / "single")
    for name, value in single.items():
        assert (value != 0).any(), f"{name}: the step moved no bias"
    for scope in ("rank", "global"):
        ours = biases(tmp_path / scope)
        for name, value in single.items():
            assert (ours[name] == value).all(), f"{scope}: {name}"
    # The same forward: the same cross-entropy; another load-balancing loss.
    assert runs["rank"]["train/ce"] == pytest.approx(runs["global"]["train/ce"], rel=1e-6)
    assert runs["rank"]["train/lb"] != pytest.approx(runs["global"]["train/lb"], rel=1e-6)


def test_instance_granularity_trains_alike_in_every_layout(moecore_bin, job_data, tmp_path):
    """Two steps with micro-batches of two instances per rank and auxiliary-loss-free balancing:
    the losses of every layout equal the single process's (test_parallel's tolerance for
    reordered sums), the selection bias after them too, and the micro-batch's loss
    (local_batch) is another."""
    instance = "model.lb_loss_granularity=instance"
    steps = dict(max_steps=2, save_every=2, microbatches=2)
    runs, bias = {}, {}
    for name, ranks, extra in [("single", 1, []), ("dp", 2, []),
                               ("dp_rank", 2, ["model.lb_loss_scope=rank"]),
                               ("dp_ep", 2, ["parallel.ep=2"]), ("pp_dp", 4, ["parallel.pp=2"]),
                               ("batch", 2, ["model.lb_loss_granularity=local_batch"])]:
        cfg = dp_config(tmp_path, job_data, name, **steps)
        if ranks == 1:
            train(moecore_bin, cfg, BIAS, instance)
        else:
            r = mpirun(moecore_bin, ranks, cfg, BIAS, instance, *extra)
            assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
        rows = train_rows(tmp_path / name)
        runs[name] = [rows[s] for s in sorted(rows)]
        weights = load_parts(tmp_path / name / "checkpoints" / "step_00000002", "model")
        bias[name] = {n: t for n, t in weights.items() if n.endswith("e_score_correction_bias")}
    assert any((t != 0).any() for t in bias["single"].values()), "the steps moved no bias"
    for name in ("dp", "dp_rank", "dp_ep", "pp_dp"):
        for key in ("train/loss", "train/lb", "train/ce"):
            ours = [row[key] for row in runs[name]]
            ref = [row[key] for row in runs["single"]]
            assert ours == pytest.approx(ref, rel=1e-5), (name, key, ours, ref)
        for n, value in bias["single"].items():
            assert (bias[name][n] == value).all(), f"{name}: {n}"
    assert runs["batch"][0]["train/lb"] != pytest.approx(runs["single"][0]["train/lb"], rel=1e-3)


def test_resume_under_another_scope_is_refused(moecore_bin, job_data, tmp_path):
    cfg = dp_config(tmp_path, job_data, "run", max_steps=2, save_every=1)
    train(moecore_bin, cfg)
    r = train(moecore_bin, cfg, "train.max_steps=3", "model.lb_loss_scope=rank", resume=True,
              check=False)
    assert_one_line_error(r, "model.lb_loss_scope")
    r = train(moecore_bin, cfg, "train.max_steps=3", "model.lb_loss_granularity=instance",
              resume=True, check=False)
    assert_one_line_error(r, "model.lb_loss_granularity")
