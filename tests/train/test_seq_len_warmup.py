"""train.seq_len_warmup_* across ranks and resumes (the cut and the micro-batches against OLMo-core's
own SequenceLengthSchedulerCallback functions: tests/reference/test_olmo_core_training_run.py).

Instances of 32 tokens melted over the first 5 updates (rows of 8, then 16) or truncated (to
multiples of 8: 8, 16, 16, 24, 24): two data-parallel ranks and two pipeline stages (whose schedule is
made anew for the warm-up's micro-batch counts) train as the single process does; a run stopped
inside the warm-up and resumed replays the uninterrupted run's every row.

Tolerance: test_pipeline's and test_parallel's, losses within 1e-5 relative per step over 20
steps; a resume replays exactly (every logged number equal).
"""
from __future__ import annotations

import pytest

from test_parallel import STEPS, TOL, losses, max_rel, mpirun
from test_training_job import train, train_rows, without_timing, write_config

MELT = {"seq_len_warmup_steps": 6, "seq_len_warmup_min": 8}
TRUNCATE = {"seq_len_warmup_steps": 6, "seq_len_warmup_min": 8, "seq_len_warmup_truncate": True,
            "seq_len_warmup_multiple": 8}


def config(tmp_path, job, name: str, warmup: dict, **train_changes):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        model={"num_hidden_layers": 4, "router_z_loss_coef": 0.001},
                        train={"max_steps": STEPS, "batch_size": 4, "microbatches": 2,
                               "seq_len": 32, "threads": 1, "log_every": 1, "eval_every": 0,
                               "z_loss_multiplier": 1e-4, **warmup, **train_changes})


@pytest.mark.parametrize("warmup", [MELT, TRUNCATE], ids=["melt", "truncate"])
@pytest.mark.parametrize("layout,sets", [("dp2", []), ("pp2", ["parallel.pp=2"])])
def test_ranks_train_the_warmup_as_the_single_process(moecore_bin, job_data, tmp_path, warmup,
                                                      layout, sets):
    r = train(moecore_bin, config(tmp_path, job_data, "single", warmup))
    first = "each instance melted into 4 rows" if warmup is MELT else \
        "each instance truncated to its first 8 tokens"
    assert f"sequence length: 8 from update 1 ({first};" in r.stdout, r.stdout[-2000:]
    assert "sequence length: 32 from update 6 (the warm-up is over" in r.stdout, r.stdout[-2000:]
    ranks = config(tmp_path, job_data, layout, warmup)
    r = mpirun(moecore_bin, 2, ranks, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    single_rows, rank_rows = train_rows(tmp_path / "single"), train_rows(tmp_path / layout)
    assert [single_rows[s]["train/seq_len"] for s in sorted(single_rows)] == \
        [rank_rows[s]["train/seq_len"] for s in sorted(rank_rows)]
    ours, ref = losses(tmp_path / layout), losses(tmp_path / "single")
    assert len(ours) == STEPS and max_rel(ours, ref) <= TOL


def test_a_run_resumed_inside_the_warmup_replays(moecore_bin, job_data, tmp_path):
    train(moecore_bin, config(tmp_path, job_data, "whole", MELT))
    stopped = config(tmp_path, job_data, "stopped", MELT, hard_stop_steps=3)
    train(moecore_bin, stopped)
    train(moecore_bin, stopped, "train.hard_stop_steps=0", resume=True)
    ref, rows = train_rows(tmp_path / "whole"), train_rows(tmp_path / "stopped")
    assert sorted(rows) == sorted(ref) == list(range(1, STEPS + 1))
    # min + 24 x step / 6 = 12, 16, 20, 24, 28, 32: 8 x 2^floor(log2(that // 8)).
    assert [ref[s]["train/seq_len"] for s in sorted(ref)][:7] == [8, 16, 16, 16, 16, 32, 32]
    for step in ref:
        assert without_timing(rows[step]) == without_timing(ref[step]), step


def test_a_pipeline_schedule_the_warmup_cannot_take_is_refused_at_start(moecore_bin, job_data,
                                                                        tmp_path):
    """Melted into 4 rows, the two micro-batches of 2 become one (OLMo-core's split): the
    interleaved schedule of two stages needs an even count, refused before the run starts."""
    cfg = config(tmp_path, job_data, "interleaved", MELT)
    r = mpirun(moecore_bin, 2, cfg, "parallel.pp=2", "parallel.schedule=interleaved-1f1b")
    assert r.returncode != 0
    assert "the sequence-length warm-up's updates take 1" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "interleaved" / "metrics.jsonl").exists()
