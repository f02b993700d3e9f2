"""train.stability_monitor (OLMo-core's StabilityMonitorCallback): train/spike_score and
train/spike_score_total are OLMo-core's callback's "spike/SpikeScore" and "spike/SpikeScore
(total)" given the run's own per-step cross-entropy and pre-clip gradient norm (the same metrics
its trainer hands it, "train/CE loss" and "optim/total grad norm"), step by step and exactly; a
small window and threshold make spikes happen. A run stopped and resumed reports what the
uninterrupted run does (the monitor's windows travel in the checkpoint)."""
from __future__ import annotations

import shutil

import pytest

from test_training_job import train, train_rows, write_config

pytest.importorskip("olmo_core.train.callbacks", reason="ai2-olmo-core is not installed")
from olmo_core.train.callbacks import StabilityMonitorCallback  # noqa: E402

STEPS = 30
MONITOR = {"stability_monitor": True, "spike_window": 4, "spike_rolling_window": 6,
           "spike_threshold_std": 1.0}


def config(tmp_path, job, name: str, **train_changes):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        model={"num_hidden_layers": 2},
                        train={"max_steps": STEPS, "batch_size": 4, "threads": 1, "log_every": 1,
                               "eval_every": 0, "save_every": 5, "keep_last": 0, **MONITOR, **train_changes})


def olmo_core_scores(rows: dict) -> dict:
    cb = StabilityMonitorCallback(window_size=MONITOR["spike_window"],
                                  rolling_window=MONITOR["spike_rolling_window"],
                                  threshold_std=MONITOR["spike_threshold_std"])
    scores = {}
    for step in sorted(rows):
        metrics = {"train/CE loss": rows[step]["train/ce"],
                   "optim/total grad norm": rows[step]["train/grad_norm"]}
        cb.pre_log_metrics(step, metrics)
        scores[step] = {k: v for k, v in metrics.items() if k.startswith("spike/")}
    return scores


@pytest.fixture(scope="module")
def whole(moecore_bin, job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spikes")
    r = train(moecore_bin, config(tmp, job_data, "run"))
    assert r.returncode == 0, r.stderr
    return tmp, train_rows(tmp / "run")


def test_scores_are_olmo_cores(whole):
    _, rows = whole
    ref = olmo_core_scores(rows)
    for step, row in rows.items():
        assert row.get("train/spike_score") == ref[step].get("spike/SpikeScore"), step
        assert row.get("train/spike_score_total") == ref[step].get("spike/SpikeScore (total)"), step
    totals = [ref[s]["spike/SpikeScore (total)"] for s in sorted(ref)
              if "spike/SpikeScore (total)" in ref[s]]
    assert totals and max(totals) > 0, "no spike in the run: the comparison would prove little"
    assert "train/spike_score" not in rows[5] and "train/spike_score" in rows[6]
    assert "train/spike_score_total" not in rows[3] and "train/spike_score_total" in rows[4]


def test_a_resumed_run_reports_as_the_whole_run(moecore_bin, job_data, whole, tmp_path):
    tmp, rows = whole
    cfg = config(tmp_path, job_data, "run")
    shutil.copytree(tmp / "run", tmp_path / "run")
    for step_dir in (tmp_path / "run" / "checkpoints").iterdir():
        if step_dir.name != f"step_{15:08d}":
            shutil.rmtree(step_dir)
    (tmp_path / "run" / "metrics.jsonl").unlink()
    r = train(moecore_bin, cfg, resume=True)
    assert r.returncode == 0, r.stderr
    assert "step 15" in r.stdout or "resumed from" in r.stdout, r.stdout[-1500:]
    resumed = train_rows(tmp_path / "run")
    assert sorted(resumed) == list(range(16, STEPS + 1))
    for step in resumed:
        for key in ("train/spike_score", "train/spike_score_total"):
            assert resumed[step].get(key) == rows[step].get(key), (step, key)
