"""`moecore plan`'s bytes per collective equal the communicator's counters (issue 17, item 3).

Each layout trains 2 steps under mpirun (balanced routing, as the planner plans) and every rank
writes out_dir/rank_stats/rank<r>.json: bytes per "group.op" over the training loop. The float
payloads (gradient all-reduce / reduce-scatter / all-gather, expert all-to-all-v or puts and gets,
pipeline sends) must equal the plan's prediction for the rank's stage exactly, and no float
collective may appear that the plan does not know. The memory side is bench/plan_validation.py's
(it needs a model large enough to dwarf the process baseline).
"""
from __future__ import annotations

import json

import pytest

from test_parallel import mpirun
from test_training_job import run, write_config

FLOAT_OPS = {"allreduce", "reduce_scatter", "allgather", "alltoallv", "put", "get", "send"}
STEPS = 2

LAYOUTS = {  # name: (ranks, [--set ...])
    "dp2-ep2-sync-zero": (2, ["parallel.ep=2", "parallel.zero=1"]),
    "dp2-ep2-rowwise": (2, ["parallel.ep=2", "parallel.dispatch=\"rowwise\""]),
    "pp2-1f1b-m2": (2, ["parallel.pp=2", "train.microbatches=2"]),
    "pp2-interleaved-m2": (2, ["parallel.pp=2", "parallel.schedule=\"interleaved-1f1b\"",
                               "train.microbatches=2"]),
    "pp2-dp2-ep2-rowwise-zero-gpipe": (4, ["parallel.pp=2", "parallel.ep=2", "parallel.zero=1",
                                           "parallel.dispatch=\"rowwise\"",
                                           "parallel.schedule=\"gpipe\"", "train.microbatches=2"]),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_collective_bytes_equal_the_plan(moecore_bin, job_data, tmp_path, name):
    ranks, sets = LAYOUTS[name]
    out = tmp_path / "run"
    # A dense first layer and a shared expert, so every kind of layer is in the traffic.
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       model={"routing": "balanced", "num_experts": 4, "num_hidden_layers": 4,
                              "first_k_dense_replace": 1, "shared_expert_intermediate_size": 16},
                       train={"max_steps": STEPS, "batch_size": 8, "threads": 1, "log_every": 1,
                              "eval_every": 0})
    set_args = [a for s in sets for a in ("--set", s)]
    plan = json.loads(run(moecore_bin, "plan", cfg, "--json", "--ranks", str(ranks),
                          *set_args).stdout)
    r = mpirun(moecore_bin, ranks, cfg, *sets)
    assert r.returncode == 0, r.stderr[-2000:]
    dp = plan["layout"]["dp"]
    seen_ops = set()
    for rank in range(ranks):
        stats = json.loads((out / "rank_stats" / f"rank{rank}.json").read_text())
        assert stats["steps"] == STEPS
        stage = plan["stages"][rank // dp]
        assert stats["stage"] == stage["stage"]
        predicted = {f"{c['group']}.{c['op']}": c["bytes"]
                     for c in stage["collective_bytes_per_step"]}
        measured = {k: v["bytes"] / STEPS for k, v in stats["traffic"].items()
                    if k.split(".")[-1] in FLOAT_OPS}
        assert measured == predicted, f"rank {rank}"
        seen_ops |= {k.split(".")[-1] for k in measured}
    # The layout exercised what it is meant to (the test cannot pass on an empty run).
    assert seen_ops, seen_ops
    if "rowwise" in name:
        assert {"put", "get"} <= seen_ops
    if "sync" in name:
        assert "alltoallv" in seen_ops
    if "pp2" in name:
        assert "send" in seen_ops
    if "zero" in name:
        assert {"reduce_scatter", "allgather"} <= seen_ops
