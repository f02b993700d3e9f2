"""Activation recompute (train.recompute, issue 17 item 7) across ranks: with expert parallelism
the recomputed forward of a MoE layer re-does its exchange in the backward, and the run must stay
the run of recompute = "none" exactly: every logged metric (losses, gradient norm, drop rate,
router statistics; the recomputed forward must not count its routes or drops a second time) equal,
and the final weights byte-identical. No tolerance: recompute re-runs the same deterministic kernels
on the same rows in the same order, so any difference is a defect. The expert exchange's traffic
(rank_stats) is real and grows by the re-run forward: 1.5x the rows of "none" (forward out and back,
backward out and back, forward again) when the MoE is recomputed, as `moecore plan` predicts.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_parallel import dp_config, final_weights, mpirun
from test_training_job import train, train_rows, without_timing

STEPS = 4
MEASURED_TIME = {"pipeline/bubble"}  # the pipeline's measured idle share, besides tokens/s


def ep_traffic(out_dir: Path) -> dict:
    """Expert-exchange float payload bytes per rank: {rank: {collective: bytes}}."""
    stats = [json.loads(p.read_text()) for p in sorted((out_dir / "rank_stats").glob("rank*.json"))]
    return {i: {k: v["bytes"] for k, v in s["traffic"].items()
                if k in ("ep.put", "ep.get", "ep.alltoallv", "ep.alltoall")}
            for i, s in enumerate(stats)}


def run(moecore_bin, job_data, tmp_path: Path, name: str, *sets: str) -> tuple[dict, dict]:
    cfg = dp_config(tmp_path, job_data, name, max_steps=STEPS)
    r = mpirun(moecore_bin, 2, cfg, *sets, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = {step: {k: v for k, v in without_timing(row).items() if k not in MEASURED_TIME}
            for step, row in train_rows(tmp_path / name).items()}
    return rows, final_weights(tmp_path / name)


@pytest.mark.parametrize("mode,layout", [
    # with the auxiliary-loss-free selection bias: its route tally must be counted once
    ("full", ["parallel.ep=2", "parallel.zero=1", "parallel.dispatch=rowwise",
              "parallel.capacity_factor=2.0", "model.router_score=sigmoid",
              "model.router_bias_update_rate=0.01"]),
    # capacity 0.5 drops routes: the drop rate of the recomputed run is the same, not doubled
    ("moe", ["parallel.ep=2", "parallel.zero=1", "parallel.dispatch=rowwise",
             "parallel.capacity_factor=0.5"]),
    # the padded transport re-plans on the device in the recomputed forward: the same drops
    ("moe", ["parallel.ep=2", "parallel.zero=1", "parallel.dispatch=rowwise",
             "parallel.capacity_factor=0.5", "parallel.rowwise_transport=padded"]),
    ("attention", ["parallel.ep=2", "parallel.zero=0"]),
    ("full", ["parallel.pp=2", "train.microbatches=2"]),
], ids=["full-ep2-rowwise-zero-bias", "moe-ep2-rowwise-drops", "moe-ep2-padded-drops",
        "attention-ep2-sync", "full-pp2"])
def test_recompute_trains_exactly_like_none(moecore_bin, job_data, tmp_path, mode, layout):
    ref_rows, ref_w = run(moecore_bin, job_data, tmp_path, "none", *layout)
    our_rows, our_w = run(moecore_bin, job_data, tmp_path, mode, *layout,
                          f"train.recompute={mode}")
    assert len(our_rows) == STEPS
    assert our_rows == ref_rows
    if "parallel.capacity_factor=0.5" in layout:
        assert any(row["moe/drop_rate"] > 0.0 for row in ref_rows.values())  # the case is real
    assert ref_w.keys() == our_w.keys()
    for name in ref_w:
        assert ref_w[name].tobytes() == our_w[name].tobytes(), name
    ref_t, our_t = ep_traffic(tmp_path / "none"), ep_traffic(tmp_path / mode)
    factor = 1.5 if mode in ("full", "moe") else 1.0
    for rank, ops in ref_t.items():
        for op, sent in ops.items():
            assert our_t[rank][op] == factor * sent, (rank, op)


def test_bad_recompute_value_is_one_line_naming_the_key(moecore_bin, job_data, tmp_path):
    cfg = dp_config(tmp_path, job_data, "bad")
    r = train(moecore_bin, cfg, "train.recompute=everything", check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.recompute" in lines[0] and "everything" in lines[0], r.stderr
