"""train.init_seed: the initial weights' seed apart from train.seed's data order (OLMo-core's model
init_seed and data-loader seed). Runs that share init_seed start from the same weights bit for bit
whatever train.seed; a run without init_seed initialises from train.seed (as before the key); two
data seeds over the same weights read other batches (the first step's loss differs)."""
from __future__ import annotations

import numpy as np

from test_parallel import final_weights
from test_training_job import train, train_rows, write_config


def run(moecore_bin, job_data, tmp_path, name: str, steps: int, **seeds) -> tuple:
    out = tmp_path / name
    cfg = write_config(tmp_path / f"{name}.toml", job_data, out,
                       train={"max_steps": steps, "eval_every": 0, "log_every": 1, **seeds})
    train(moecore_bin, cfg)
    return out


def test_init_seed_fixes_the_weights_and_seed_the_data(moecore_bin, job_data, tmp_path):
    a = final_weights(run(moecore_bin, job_data, tmp_path, "a", 0, seed=1, init_seed=7))
    b = final_weights(run(moecore_bin, job_data, tmp_path, "b", 0, seed=2, init_seed=7))
    c = final_weights(run(moecore_bin, job_data, tmp_path, "c", 0, seed=7))
    d = final_weights(run(moecore_bin, job_data, tmp_path, "d", 0, seed=1))
    assert a.keys() == b.keys() == c.keys() == d.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k
    assert any(not np.array_equal(a[k], d[k]) for k in a)  # train.seed 1's own weights differ
    # Same weights, other data: the first step's loss differs.
    one = train_rows(run(moecore_bin, job_data, tmp_path, "one", 1, seed=1, init_seed=7))
    two = train_rows(run(moecore_bin, job_data, tmp_path, "two", 1, seed=2, init_seed=7))
    assert one[1]["train/ce"] != two[1]["train/ce"]


def test_negative_init_seed_is_one_line_error(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       train={"max_steps": 1, "init_seed": -2})
    r = train(moecore_bin, cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.init_seed=-2" in lines[0], r.stderr
