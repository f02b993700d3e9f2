"""train.hard_stop_steps / hard_stop_tokens: OLMo-core's Trainer.hard_stop, a stop before the run's
length that leaves the learning-rate schedule as it is (an ablation trains the first part of a long
run's schedule). OLMo-core stops once Duration.due says so for its hard stop (steps >= the value, or
tokens seen >= it, checked after each update and before the first), with its schedule still over
max_duration. Shown: a run stopped at the hard stop trains exactly what the uninterrupted run trains
up to there (every logged training number, the learning rates included; logged at every update
here: at the stop a row is logged whatever log_every, as at a run's end), ends as a run does at
its length (final evaluation, checkpoint), and resumed without the hard stop continues to the
same end as the uninterrupted run, every row equal; resumed with it, or a finished run resumed
with one, trains nothing. After a resume with another batch size a hard stop in tokens counts
the tokens actually seen, as OLMo-core's does.

Tolerance: none (the same run: a resume replays exactly).
"""
from __future__ import annotations

import json

import pytest

from test_training_job import (assert_one_line_error, checkpoints, run, step_of, train,
                               train_rows, without_timing, write_config)

pytest.importorskip("olmo_core.train.common", reason="ai2-olmo-core is not installed")
from olmo_core.train.common import Duration  # noqa: E402

STEPS = 10
TOKENS_PER_STEP = 2 * 32


def olmo_core_stop(hard_stop: Duration) -> int:
    """The update after which OLMo-core's trainer, counting as its _fit_epoch does, is complete."""
    step = tokens = 0
    while not hard_stop.due(step=step, tokens=tokens, epoch=1):
        step += 1
        tokens += TOKENS_PER_STEP
    return step


@pytest.mark.parametrize("key,value,duration", [
    ("hard_stop_steps", 4, Duration.steps(4)),
    ("hard_stop_tokens", 300, Duration.tokens(300)),  # 5 updates of 64 tokens reach it
])
def test_a_hard_stop_trains_the_start_of_the_same_run(moecore_bin, job_data, tmp_path, key, value,
                                                      duration):
    stop = olmo_core_stop(duration)
    train_table = {"max_steps": STEPS, "log_every": 1, "eval_every": 2, "batch_size": 2,
                   "seq_len": 32}
    whole = write_config(tmp_path / "whole.toml", job_data, tmp_path / "whole",
                         optim=dict(schedule="cosine", warmup_steps=2), train=train_table)
    train(moecore_bin, whole)
    ref = train_rows(tmp_path / "whole")

    out = tmp_path / "stopped"
    cfg = write_config(tmp_path / "stopped.toml", job_data, out,
                       optim=dict(schedule="cosine", warmup_steps=2),
                       train=dict(train_table, **{key: value}))
    r = train(moecore_bin, cfg)
    assert f"hard stop: train.{key}={value}: the run stops at step {stop} of its {STEPS}" \
        in r.stdout, r.stdout[-1500:]
    assert f"train.{key}={value} reached at step {stop}: stopping before the run's end at step " \
        f"{STEPS}" in r.stdout, r.stdout[-1500:]
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, stop + 1))
    for step in rows:  # the schedule is the whole run's: the same rates, losses, everything
        assert without_timing(rows[step]) == without_timing(ref[step]), step
    assert [step_of(c) for c in checkpoints(out)] == [stop]
    evals = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    # The final evaluation, as at the run's end, once (a hard stop at a multiple of eval_every).
    assert evals[-1] == stop and len(evals) == len(set(evals)), evals

    # Resumed with the hard stop: nothing to train; without it: the rest of the same run.
    r = train(moecore_bin, cfg, resume=True)
    assert "done: nothing to train" in r.stdout and f"train.{key}={value}" in r.stdout, \
        r.stdout[-1500:]
    train(moecore_bin, cfg, f"train.{key}=0", resume=True)
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, STEPS + 1))
    for step in rows:
        assert without_timing(rows[step]) == without_timing(ref[step]), step
    # The finished run resumed with a hard stop before its end: nothing to train, and no hint to
    # remove the hard stop (the run is over).
    r = train(moecore_bin, cfg, f"train.{key}={value}", resume=True)
    assert f"is at train.max_steps={STEPS}" in r.stdout, r.stdout[-1500:]


def test_a_hard_stop_in_tokens_counts_the_tokens_seen_after_a_batch_change(moecore_bin, job_data,
                                                                            tmp_path):
    """5 updates of 64 tokens (320 seen), then updates of 128 with hard_stop_tokens = 600: as
    OLMo-core's Duration.due on the tokens actually seen, the run stops at update 8 (704 tokens),
    not at the 5th update of 128 that 600 / 128 would give from zero."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, train={
        "max_steps": 20, "hard_stop_steps": 5, "log_every": 1, "eval_every": 0, "batch_size": 2,
        "seq_len": 32})
    train(moecore_bin, cfg)
    r = run(moecore_bin, "train", cfg, "--set", "train.hard_stop_steps=0", "--set",
            "train.hard_stop_tokens=600", "--set", "train.batch_size=4", "--resume",
            "--allow-config-change")
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, 9)), r.stdout[-1500:]
    assert rows[8]["train/tokens_seen"] == 704 and rows[7]["train/tokens_seen"] < 600


def test_a_hard_stop_in_epochs_stops_where_olmo_cores_trainer_does(moecore_bin, job_data,
                                                                    tmp_path):
    """hard_stop_epochs = 1 under OLMo-core's order: 40 instances in global batches of 6 make an
    epoch of 6 updates (36 instances); OLMo-core's trainer, its epoch counted from 1, is complete
    once Duration.epochs(1).due(epoch=2), after the epoch's last batch. The rows up to there are
    the uninterrupted run's, and resumed without the hard stop the run goes on as it does."""
    settings = dict(optim={"schedule": "cosine", "warmup_steps": 2},
                    data={"train": [str(job_data.small_train)], "order": "olmo-core"},
                    train={"max_steps": 16, "batch_size": 6, "log_every": 1, "eval_every": 0})
    train(moecore_bin, write_config(tmp_path / "whole.toml", job_data, tmp_path / "whole",
                                    **settings))
    ref = train_rows(tmp_path / "whole")
    stop = 0
    while not Duration.epochs(1).due(step=stop, tokens=0, epoch=1 + stop // 6):
        stop += 1
    assert stop == 6
    out = tmp_path / "stopped"
    settings["train"]["hard_stop_epochs"] = 1
    cfg = write_config(tmp_path / "stopped.toml", job_data, out, **settings)
    r = train(moecore_bin, cfg)
    assert f"hard stop: train.hard_stop_epochs=1: the run stops at step {stop} of its 16" \
        in r.stdout, r.stdout[-1500:]
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, stop + 1))
    train(moecore_bin, cfg, "train.hard_stop_epochs=0", resume=True)
    rows = train_rows(out)
    assert sorted(rows) == sorted(ref)
    for step in rows:
        assert without_timing(rows[step]) == without_timing(ref[step]), step


def test_hard_stop_settings_are_checked(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       train={"hard_stop_steps": 3, "hard_stop_tokens": 100})
    r = run(moecore_bin, "train", cfg, check=False)
    assert_one_line_error(r, "train.hard_stop_steps=3, train.hard_stop_tokens=100 and "
                          "train.hard_stop_epochs=0: give at most one")
    r = run(moecore_bin, "train", cfg, "--set", "train.hard_stop_tokens=0", "--set",
            "train.hard_stop_epochs=1", check=False)
    assert_one_line_error(r, "train.hard_stop_steps=3, train.hard_stop_tokens=0 and "
                          "train.hard_stop_epochs=1: give at most one")
    r = run(moecore_bin, "train", cfg, "--set", "train.hard_stop_tokens=0", "--set",
            "train.hard_stop_steps=-1", check=False)
    assert_one_line_error(r, "train.hard_stop_steps=-1")
    assert not (tmp_path / "run").exists()
