"""`moecore plan`'s bytes per collective equal the communicator's counters (issue 17, item 3).

Each layout trains 2 steps under mpirun (balanced routing, as the planner plans) and every rank
writes out_dir/rank_stats/rank<r>.json: bytes per "group.op" over the training loop. The float
payloads (gradient all-reduce / reduce-scatter / all-gather, expert all-to-all-v, puts and gets
or the padded transport's all-to-all of blocks, pipeline sends) must equal the plan's prediction for the rank's stage exactly, and no float
collective may appear that the plan does not know. The memory side is bench/plan_validation.py's
(it needs a model large enough to dwarf the process baseline).
"""
from __future__ import annotations

import json

import pytest

from test_parallel import mpirun
from test_training_job import run, write_config

FLOAT_OPS = {"allreduce", "reduce_scatter", "allgather", "alltoall", "alltoallv", "put", "get",
             "send"}
STEPS = 2

LAYOUTS = {  # name: (ranks, [--set ...])
    "dp2-ep2-sync-zero": (2, ["parallel.ep=2", "parallel.zero=1"]),
    "dp2-ep2-rowwise": (2, ["parallel.ep=2", "parallel.dispatch=\"rowwise\""]),
    "dp2-ep2-rowwise-padded": (2, ["parallel.ep=2", "parallel.dispatch=\"rowwise\"",
                                   "parallel.rowwise_transport=\"padded\""]),
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
    if "padded" in name:
        assert "alltoall" in seen_ops and not {"put", "get"} & seen_ops
    elif "rowwise" in name:
        assert {"put", "get"} <= seen_ops
    if "sync" in name:
        assert "alltoallv" in seen_ops
    if "pp2" in name:
        assert "send" in seen_ops
    if "zero" in name:
        assert {"reduce_scatter", "allgather"} <= seen_ops


def test_bench_collectives_feeds_the_planner(moecore_bin, job_data, tmp_path):
    """`moecore bench collectives` (mpirun -np 2) measures the gradient collectives' bus bandwidth
    by buffer size; a profile carrying it prices dp's all-reduces at those rates."""
    import subprocess

    from test_parallel import MPI_ENV

    r = subprocess.run(["mpirun", "-np", "2", str(moecore_bin), "bench", "collectives",
                        "--max-megabytes", "4", "--repeats", "2"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL, env=MPI_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    assert bench["ranks"] == 2
    assert [s["bytes"] for s in bench["sizes"]] == [2.0**20, 4 * 2.0**20]
    for s in bench["sizes"]:
        for op in ("allreduce", "reduce_scatter", "allgather"):
            assert s[f"{op}_bus_bytes_per_s"] > 0 and s["seconds_median"][op] > 0

    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run", train={"threads": 1})
    base = {"memory_gib": 16, "gemm_tflops_fp32": 0.1, "gemm_tflops_bf16": 0.2,
            "memory_bandwidth_gbs": 10, "link_bandwidth_gbs": 5, "link_latency_us": 1}

    def grad_reduce(profile: dict) -> float:
        path = tmp_path / "profile.json"
        path.write_text(json.dumps(profile))
        plan = json.loads(run(moecore_bin, "plan", cfg, "--json", "--ranks", "2",
                              "--hardware", str(path)).stdout)
        return plan["step_time"]["breakdown_seconds"]["grad_reduce"]

    def curve(scale: float) -> dict:
        return {"allreduce": [[s["bytes"], scale * s["allreduce_bus_bytes_per_s"] / 1e9]
                              for s in bench["sizes"]]}

    measured = grad_reduce({**base, "collective_bus_gbs": curve(1.0)})
    halved = grad_reduce({**base, "collective_bus_gbs": curve(0.5)})
    assert measured > 0
    # Bus time doubles with half the bandwidth; the per-message latencies stay: dense and expert
    # all-reduces, 2 (n - 1) messages each at 1 us.
    assert 2 * measured - halved == pytest.approx(4e-6, rel=1e-6)
    # One rank: a one-line error, not a hang.
    r = subprocess.run([str(moecore_bin), "bench", "collectives"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "needs at least 2 ranks" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
