"""train.batch_sizes across ranks (the schedule itself, its rates, data position and resumes, against
OLMo-core's own callback: tests/reference/test_olmo_core_batch_size_schedule.py).

A batch of 4 sequences in micro-batches of 2 grows to 8 after 6 updates and shrinks to 2 after 14:
two data-parallel ranks (under OLMo-core's order, each reading its share of every global batch)
and two pipeline stages (whose 1F1B schedule is made anew for 2, 4 and 1 micro-batches) train as
the single process does, and log the same batch sizes and learning rates.

Tolerance: test_pipeline's and test_parallel's, losses within 1e-5 relative per step over 20 steps
(the ranks sum their reductions in another order; pure pipelines are bit-identical); batch sizes,
tokens and rates exactly.
"""
from __future__ import annotations

import pytest

from test_parallel import STEPS, TOL, losses, max_rel, mpirun
from test_training_job import train, train_rows, write_config

SCHEDULE = {"max_steps": STEPS, "batch_size": 4, "microbatches": 2, "batch_sizes": [4, 8, 2],
            "batch_size_starts": [0, 6, 14], "threads": 1, "log_every": 1, "eval_every": 0,
            "z_loss_multiplier": 1e-4}


def config(tmp_path, job, name: str, data=None):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        model={"num_hidden_layers": 4, "router_z_loss_coef": 0.001},
                        train=SCHEDULE, data=data)


def schedule_rows(out) -> list[tuple]:
    rows = train_rows(out)
    return [(s, rows[s]["train/batch_size"], rows[s]["train/tokens_seen"], rows[s]["train/lr"])
            for s in sorted(rows)]


@pytest.mark.parametrize("layout,sets,data", [
    ("dp2", [], {"order": "olmo-core"}),
    ("pp2", ["parallel.pp=2"], None),
])
def test_ranks_train_the_schedule_as_the_single_process(moecore_bin, job_data, tmp_path, layout,
                                                        sets, data):
    single = config(tmp_path, job_data, "single", data)
    r = train(moecore_bin, single)
    assert "batch size: 4 -> 8 sequences (4 micro-batch(es) of 2) before update 7" in r.stdout, \
        r.stdout[-2000:]
    ranks = config(tmp_path, job_data, layout, data)
    r = mpirun(moecore_bin, 2, ranks, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "batch size: 8 -> 2 sequences (1 micro-batch(es) of 2) before update 15" in r.stdout
    assert schedule_rows(tmp_path / layout) == schedule_rows(tmp_path / "single")
    assert [row[1] for row in schedule_rows(tmp_path / "single")] == [4] * 6 + [8] * 8 + [2] * 6
    ours, ref = losses(tmp_path / layout), losses(tmp_path / "single")
    assert len(ours) == STEPS and max_rel(ours, ref) <= TOL
