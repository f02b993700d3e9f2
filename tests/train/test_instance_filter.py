"""OLMo-core's instance filter (`data.instance_filter`) in every layout: the masks are made where
each rank reads the global batch, and the loss's divisor counts a masked instance's labels as
OLMo-core's OLMoDDP train module does, so data, expert and pipeline parallel runs (a melted
sequence-length warm-up too) train as the single process does, to test_parallel's tolerances
(losses 1e-5 relative: the reductions sum in another order). The masks themselves are held to
OLMo-core's dataset in tests/reference/test_olmo_core_instance_filter.py, the whole run's
arithmetic to OLMo-core's in tests/reference/test_olmo_core_training_run.py.

The corpus's 32-token instances repeat short periods by chance (words, spaces): periods up to 4
masked from 3 periods mask part of each batch, which the tests check (a share strictly between
0 and 1 at some step, and not the same at every step).
"""
from __future__ import annotations

import pytest

from test_parallel import STEPS, TOL, losses, max_rel, mpirun
from test_training_job import train, train_rows, write_config

FILTER = {"instance_filter": True, "repetition_max_period": 4, "repetition_max_count": 3}


def config(tmp_path, job, name: str, **train_changes):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name, data=FILTER,
                        model={"num_hidden_layers": 2, "router_z_loss_coef": 0.001},
                        train={"max_steps": STEPS, "batch_size": 8, "microbatches": 2,
                               "threads": 1, "log_every": 1, "eval_every": 0,
                               "z_loss_multiplier": 1e-4, **train_changes})


def masked_shares(out_dir) -> list[float]:
    rows = train_rows(out_dir)
    return [rows[s]["train/masked_instances"] for s in sorted(rows)]


@pytest.fixture(scope="module")
def singles(moecore_bin, job_data, tmp_path_factory):
    """The single-process runs, without and with a melted warm-up (made on first use)."""
    runs = {}

    def get(warmup: bool):
        if warmup not in runs:
            tmp = tmp_path_factory.mktemp(f"filter_single_{warmup}")
            extra = {"seq_len_warmup_steps": 6, "seq_len_warmup_min": 8} if warmup else {}
            r = train(moecore_bin, config(tmp, job_data, "single", **extra))
            assert r.returncode == 0, r.stderr
            shares = masked_shares(tmp / "single")
            assert len(shares) == STEPS and 0 < max(shares) < 1 and len(set(shares)) > 2, shares
            runs[warmup] = tmp / "single"
        return runs[warmup]
    return get


@pytest.mark.parametrize("layout,ranks,sets,warmup", [
    ("dp2_zero", 2, ["parallel.zero=1"], False),
    ("ep2", 2, ["parallel.ep=2"], False),
    ("pp2", 2, ["parallel.pp=2"], False),
    ("dp2_melt", 2, [], True),
])
def test_layouts_train_as_the_single_process(moecore_bin, job_data, tmp_path, singles, layout,
                                             ranks, sets, warmup):
    single = singles(warmup)
    extra = {"seq_len_warmup_steps": 6, "seq_len_warmup_min": 8} if warmup else {}
    cfg = config(tmp_path, job_data, "run", **extra)
    r = mpirun(moecore_bin, ranks, cfg, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "instance filter: a training instance repeating a period of 1-4 tokens 3 times" in r.stdout
    assert masked_shares(tmp_path / "run") == masked_shares(single)
    ours, ref = losses(tmp_path / "run"), losses(single)
    assert len(ours) == STEPS and max_rel(ours, ref) <= TOL, (ours, ref)
