"""optim.schedule = "sequential" against OLMo-core's SequentialScheduler (ai2-olmo-core 3.0.0): its
schedulers one after the other, each over min(the run's remaining length, its schedulers_max)
from the rate the one before gave at its own end (get_lr(initial_lr, max, max)), the last to the
run's end; an override decay from its start on. Every rate is compared bit for bit (no tolerance:
each entry is the same formula in OLMo-core's order of operations as the schedule alone, which
tests/train/test_lr_schedules.py pins).

Where OLMo-core's run would stop (an assertion or a division by zero at some update: a warm-up
from a schedule before it that ended at 0, a decay tail that would rise, ...) moecore refuses the
config before the run with one line naming the entry (optim.sequence[i].key); where OLMo-core
computes, moecore computes the same rates. The one difference kept is moecore's own rule for
inv_sqrt (a warm-up is required: without one OLMo-core trains at its floor throughout), which
applies in a sequence as it does alone.
"""
from __future__ import annotations

import json
import random
import warnings

import pytest

from test_lr_schedules import LR, TOKENS_PER_STEP, random_schedule
from test_training_job import (assert_one_line_error, run, toml_value, train, train_rows,
                               without_timing, write_config)

pytest.importorskip("olmo_core.optim.scheduler", reason="ai2-olmo-core is not installed")
from olmo_core.optim.scheduler import (  # noqa: E402
    WSDS, ComposableScheduler, ComposableSchedulerStage, ConstantWithWarmup,
    CosWithWarmupAndLinearDecay, CosWithWarmup, LinearWithWarmup, OverrideDecay,
    SequentialScheduler)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# [optim] keys of write_config's base that belong to one schedule: unset for "sequential".
UNSET = {"warmup_steps": None, "min_lr_ratio": None}


def random_sequence(rng: random.Random, in_tokens: bool, horizon: int):
    """1-3 random schedules of every family (test_lr_schedules.random_schedule, each drawn for its
    part of the run), a max for each but the last (at times past the run's end), at times an
    override decay: ([optim] keys, OLMo-core's SequentialScheduler)."""
    entries, schedulers, maxes = [], [], []
    left = horizon
    count = rng.randint(1, 3)
    for i in range(count):
        last = i == count - 1
        length = rng.randint(max(1, horizon // 10), max(1, horizon // 2))
        if not last and rng.random() < 0.15:
            length = horizon + rng.randint(1, 5)  # the run ends inside this schedule
        optim, scheduler = random_schedule(rng, in_tokens, left if last else min(left, length))
        if not last:
            optim = dict(optim, max=length)
            maxes.append(length)
            left -= length
        entries.append(optim)
        schedulers.append(scheduler)
        if left <= 0:
            break
    if len(maxes) == len(entries):  # ended early: the last runs to the end, without its max
        entries[-1] = {k: v for k, v in entries[-1].items() if k != "max"}
        maxes.pop()
    table, override = {"sequence": entries}, None
    if rng.random() < 0.3:
        decay = {"start": rng.randint(0, horizon), "duration": rng.randint(1, max(1, horizon // 3)),
                 "shape": rng.choice(["linear", "cosine"]), "end_lr_fraction": 0.0}
        table["override_decay"] = decay
        override = OverrideDecay(**decay)
    return table, SequentialScheduler(schedulers=schedulers, schedulers_max=maxes,
                                      override_decay=override)


def test_lr_schedule_command_is_olmo_cores_for_random_sequences(moecore_bin, tmp_path):
    """150 random sequences in updates and in tokens through `moecore lr-schedule --json`: every
    rate equal to OLMo-core's, or, where OLMo-core's get_lr raises at some update of the run, a
    one-line refusal naming an entry. (The same generator with other seeds, 2100 sequences, was
    the wider check when this was written: no other outcome.)"""
    rng = random.Random(20261206)
    outcomes = {"equal": 0, "both refuse": 0, "inv_sqrt rule": 0}
    for i in range(150):
        in_tokens = rng.random() < 0.4
        max_steps = rng.randint(4, 40)
        unit = TOKENS_PER_STEP if in_tokens else 1
        table, scheduler = random_sequence(rng, in_tokens, max_steps * unit)
        body = dict(table, lr=LR, units="tokens" if in_tokens else "steps",
                    schedule="sequential")
        cfg = tmp_path / f"c{i}.toml"
        cfg.write_text("[optim]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                       + f"[train]\nmax_steps = {max_steps}\nbatch_size = 2\nseq_len = 32\n")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = [float(scheduler.get_lr(LR, t * unit, max_steps * unit))
                       for t in range(1, max_steps + 1)]
        except (AssertionError, ZeroDivisionError):
            ref = None
        r = run(moecore_bin, "lr-schedule", cfg, "--json", check=False)
        if ref is None:
            assert_one_line_error(r, "optim.sequence[")
            outcomes["both refuse"] += 1
        elif r.returncode != 0:
            assert_one_line_error(r, "schedule = \"inv_sqrt\" needs a warm-up")
            outcomes["inv_sqrt rule"] += 1
        else:
            assert json.loads(r.stdout)["lr"] == ref, (body, r.stdout)
            outcomes["equal"] += 1
    assert outcomes["equal"] >= 100 and outcomes["both refuse"] >= 10, outcomes


def test_a_sequence_trains_and_resumes_at_olmo_cores_rates(moecore_bin, job_data, tmp_path):
    """A linear warm-up and decay for 4 updates, then a cosine over the rest from where it ended,
    an override decay from update 8: the logged rates are OLMo-core's, and a run stopped at update
    5 and resumed from its checkpoint (the sequence read back from the checkpoint's config) logs
    the same rows as the run without a stop."""
    optim = dict(UNSET, lr=LR, schedule="sequential",
                 sequence=[{"schedule": "linear", "max": 4, "warmup_steps": 2,
                            "min_lr_ratio": 0.5},
                           {"schedule": "cosine", "warmup_steps": 0, "min_lr_ratio": 0.1}],
                 override_decay={"start": 8, "duration": 2, "end_lr_fraction": 0.0})
    scheduler = SequentialScheduler(
        schedulers=[LinearWithWarmup(warmup=2, alpha_f=0.5), CosWithWarmup(warmup=0, alpha_f=0.1)],
        schedulers_max=[4], override_decay=OverrideDecay(start=8, duration=2, end_lr_fraction=0.0))
    steps = 10
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    for out in (whole, stopped):
        cfg = write_config(tmp_path / f"{out.name}.toml", job_data, out, optim=optim,
                           train={"max_steps": steps, "log_every": 1, "eval_every": 0,
                                  "batch_size": 2, "save_every": 5})
        if out == stopped:
            train(moecore_bin, cfg, "train.hard_stop_steps=5")
            train(moecore_bin, cfg, resume=True)
        else:
            train(moecore_bin, cfg)
    rows = train_rows(whole)
    ours = [rows[t]["train/lr"] for t in range(1, steps + 1)]
    ref = [float(scheduler.get_lr(LR, t, steps)) for t in range(1, steps + 1)]
    assert ours == ref, list(zip(ours, ref))
    assert len(set(ours)) >= 8
    resumed = train_rows(stopped)
    assert sorted(resumed) == sorted(rows)
    for step in rows:
        assert without_timing(resumed[step]) == without_timing(rows[step]), step


LINEAR = {"schedule": "linear", "warmup_steps": 0}
BAD = [
    ({"sequence": []}, "needs its schedules"),
    ({"sequence": [{"max": 3, "warmup_steps": 0}, LINEAR]}, "optim.sequence[0] names no schedule"),
    ({"sequence": [dict(LINEAR), dict(LINEAR)]}, "optim.sequence[0].max=0 must be >= 1"),
    ({"sequence": [dict(LINEAR, max=3), dict(LINEAR, max=4)]},
     "optim.sequence[1].max=4: the last schedule runs to the run's end"),
    ({"sequence": [dict(LINEAR, max=3), dict(LINEAR, schedule="sequential")]},
     "optim.sequence[1].schedule=\"sequential\" is not one of"),
    ({"warmup_steps": 2, "sequence": [LINEAR]},
     "optim.warmup_steps belongs to one schedule of optim.schedule = \"sequential\""),
    ({"sequence": [dict(LINEAR, max=3), dict(LINEAR, warmup_fraction=2.0)]},
     "optim.sequence[1].warmup_fraction=2 must be in [0, 1]"),
    ({"sequence": [dict(LINEAR, max=3), dict(LINEAR, bogus=1)]},
     "unknown key optim.sequence[1].bogus"),
    # OLMo-core's WSD asserts its decay falls: from the linear's end at 0 it cannot.
    ({"sequence": [dict(LINEAR, max=3, min_lr_ratio=0.0),
                   {"schedule": "wsd", "warmup_steps": 0, "decay_steps": 2,
                    "min_lr_ratio": 0.0}]},
     "optim.sequence[1].schedule = \"wsd\" decays to lr x optim.sequence[1].min_lr_ratio=0"),
]


@pytest.mark.parametrize("table,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_sequences_are_one_line_errors(moecore_bin, job_data, tmp_path, table, message):
    optim = dict(UNSET, lr=LR, schedule="sequential", **table)
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run", optim=optim,
                       train={"max_steps": 8})
    assert_one_line_error(run(moecore_bin, "train", cfg, check=False), message)
    assert not (tmp_path / "run").exists()


def test_a_sequence_under_another_schedule_is_a_one_line_error(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       optim={"sequence": [LINEAR]}, train={"max_steps": 8})
    assert_one_line_error(run(moecore_bin, "train", cfg, check=False),
                          "optim.sequence applies to optim.schedule = \"sequential\"")


# Edge cases a review found (each against OLMo-core's own class): (optim table, train table,
# OLMo-core's scheduler or the refusal's words where OLMo-core stops at some update).
EDGES = {
    # A chained initial_lr above lr: WSDS's floor lr x 1.5 lies below its peak 2 x lr.
    "wsds above lr after a rise": (
        {"sequence": [{"schedule": "composable", "max": 4,
                       "stages": [{"duration": 4, "end_lr_fraction": 2.0}]},
                      {"schedule": "wsds", "period_steps": [6], "decay_steps": 3,
                       "min_lr_ratio": 1.5}]},
        {"max_steps": 10},
        SequentialScheduler(schedulers=[
            ComposableScheduler(stages=[ComposableSchedulerStage(duration=4,
                                                                 end_lr_fraction=2.0)]),
            WSDS(period_lengths=[6], decay=3, decay_min_lr=1.5 * LR, warmup=0)],
            schedulers_max=[4])),
    # WSDS's last period's end is its floor, no decay asked there: the chained 0.05 x lr peak
    # below the floor never asserts.
    "wsds last period's end": (
        {"units": "tokens",
         "sequence": [{"schedule": "linear", "max": 64, "min_lr_ratio": 0.05, "warmup_tokens": 0},
                      {"schedule": "wsds", "max": 100, "period_tokens": [100], "decay_tokens": 10,
                       "min_lr_ratio": 0.1, "warmup_tokens": 0},
                      {"schedule": "constant", "warmup_tokens": 0}]},
        {"max_steps": 3, "batch_size": 1, "seq_len": 64},
        SequentialScheduler(schedulers=[
            LinearWithWarmup(warmup=0, alpha_f=0.05),
            WSDS(period_lengths=[100], decay=10, decay_min_lr=0.1 * LR, warmup=0),
            ConstantWithWarmup(warmup=0)], schedulers_max=[64, 100])),
    # A tail the whole run long after a warm-up starts from warmup_min_lr.
    "cosine_linear_decay tail from its warm-up": (
        {"sequence": [{"schedule": "cosine_linear_decay", "warmup_steps": 2,
                       "warmup_min_lr": 1e-4, "decay_fraction": 1.0, "min_lr_ratio": 0.1}]},
        {"max_steps": 10},
        SequentialScheduler(schedulers=[CosWithWarmupAndLinearDecay(
            warmup=2, warmup_min_lr=1e-4, decay_fraction=1.0, alpha_f=0.1)], schedulers_max=[])),
    # OLMo-core asserts current <= t_max: the last update ends past train.max_tokens.
    "past max_tokens": (
        {"units": "tokens",
         "sequence": [{"schedule": "constant", "max": 100, "warmup_tokens": 0},
                      {"schedule": "wsd", "warmup_tokens": 10}]},
        {"max_tokens": 100, "batch_size": 1, "seq_len": 64},
        "asserts (current <= t_max)"),
    # The tail asks the cosine inside its warm-up, whose floor lies above lr.
    "tail inside a warm-up that falls": (
        {"units": "tokens",
         "sequence": [{"schedule": "cosine_linear_decay", "warmup_tokens": 60,
                       "decay_tokens": 100, "warmup_min_lr": 2 * LR, "min_lr_ratio": 0.1}]},
        {"max_steps": 2, "batch_size": 1, "seq_len": 64},
        "its tail starts inside its warm-up"),
}


@pytest.mark.parametrize("case", sorted(EDGES))
def test_edges_are_olmo_cores(moecore_bin, tmp_path, case):
    table, train_table, expected = EDGES[case]
    body = dict(table, lr=LR, schedule="sequential")
    train_table = dict({"batch_size": 1, "seq_len": 8}, **train_table)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[optim]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                   + "[train]\n" + "".join(f"{k} = {toml_value(v)}\n"
                                          for k, v in train_table.items()))
    r = run(moecore_bin, "lr-schedule", cfg, "--json", check=False)
    if isinstance(expected, str):
        assert_one_line_error(r, expected)
        return
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    unit = train_table["batch_size"] * train_table["seq_len"] if body.get("units") == "tokens" else 1
    horizon = train_table["max_steps"] * unit
    ref = [float(expected.get_lr(LR, t * unit, horizon))
           for t in range(1, train_table["max_steps"] + 1)]
    assert shown["lr"] == ref, list(zip(shown["lr"], ref))
