"""The learning-rate schedules against OLMo-core's own scheduler classes (olmo_core.optim.scheduler,
ai2-olmo-core 3.0.0): the rate each update of a training job logs (train/lr, log_every = 1) is
OLMo-core's get_lr(lr, t, max_steps) at its step number t = 1, 2, ... (its trainer counts the first
update as step 1). WSD (warm-up, stable, linear decay over decay_steps or round(max_steps x
decay_fraction) updates to decay_min_lr = lr x min_lr_ratio), and warmup_fraction (round(max_steps
x fraction), Python's round: ties to even) with every schedule, InvSqrtWithWarmup, HalfCosWithWarmup
(warm-up to the cosine's half-way rate, then its second half), CosWithWarmupAndLinearDecay (the cosine
cut short by a linear tail to decay_min_lr = lr x decay_min_lr_ratio) and PowerLR (lr (t / warm-up)^b,
then a linear tail to lr x decay_min_lr_ratio), WSDS (periods of their own lengths, each a WSD to
lr x min_lr_ratio, the floor after them), ExponentialScheduler (lr_min (lr / lr_min)^(t / max_steps)), ComposableScheduler (linear and cosine
stages, an override decay),
t_max (the schedule's own length), also in units
of tokens (SchedulerUnits.tokens: get_lr(lr, t x tokens per update, max_steps x tokens per
update)). After a resume with another batch size, a schedule in tokens is asked as OLMo-core's
trainer asks it, at the tokens seen over those and the remaining updates' tokens (logged rates and
`lr-schedule --resume`, random schedules of every family too), and its checks run over that
length at the resume. CosWithWarmup / LinearWithWarmup / ConstantWithWarmup are also checked
through tests/reference/test_adamw_steps.py's AdamW oracle.

Tolerance: none. Every formula is OLMo-core's in its order of operations (the warm-ups' (lr t) /
w, through t == w for WSD and ConstantWithWarmup, below it for the others; the cosine's pi x
current / t_max), so the rates are equal bit for bit. A rounding of the fraction the other way
moves a whole update's rate (>= 1e-2 relative here); the constant schedule's last warm-up update is
(lr w) / w, an ulp off lr for some lr and w (lr 3e-3, w 6: a case below).
"""
from __future__ import annotations

import json
import random

import pytest

from test_training_job import (assert_one_line_error, run, toml_value, train, train_rows,
                               write_config)

pytest.importorskip("olmo_core.optim.scheduler", reason="ai2-olmo-core is not installed")
from olmo_core.optim.scheduler import (  # noqa: E402
    WSD, WSDS, ComposableScheduler, ComposableSchedulerStage, ConstantWithWarmup, CosWithWarmup,
    CosWithWarmupAndLinearDecay, ExponentialScheduler, HalfCosWithWarmup, InvSqrtWithWarmup,
    LinearWithWarmup, OverrideDecay, PowerLR)

# OLMo-core's ComposableScheduler says once that it has its own length; so does moecore's README.
pytestmark = pytest.mark.filterwarnings("ignore:'ComposableScheduler' ignores 't_max':UserWarning")

LR = 3e-3
STEPS = 10

# name -> ([optim] settings, OLMo-core scheduler).
CASES = {
    "wsd_steps": (dict(schedule="wsd", warmup_steps=3, decay_steps=5, min_lr_ratio=0.0),
                  WSD(warmup=3, decay=5, decay_fraction=None, decay_min_lr=0.0)),
    "wsd_fractions_floor": (
        dict(schedule="wsd", warmup_steps=0, warmup_fraction=0.25, decay_fraction=0.25,
             min_lr_ratio=0.1),
        # 10 x 0.25 = 2.5: 2 warm-up and 2 decay updates (ties to even, not up).
        WSD(warmup_fraction=0.25, decay_fraction=0.25, decay_min_lr=LR * 0.1)),
    "wsd_no_warmup": (dict(schedule="wsd", warmup_steps=0, decay_fraction=0.3, min_lr_ratio=0.0),
                      WSD(warmup=0, decay_fraction=0.3)),
    "cosine_warmup_fraction": (
        dict(schedule="cosine", warmup_steps=0, warmup_fraction=0.18, min_lr_ratio=0.1),
        CosWithWarmup(warmup_fraction=0.18, alpha_f=0.1)),  # 1.8 -> 2
    "linear_warmup_fraction": (
        dict(schedule="linear", warmup_steps=0, warmup_fraction=0.25, min_lr_ratio=0.2),
        LinearWithWarmup(warmup_fraction=0.25, alpha_f=0.2)),  # 2.5 -> 2
    # (3e-3 x 6) / 6 = 0.0030000000000000005: OLMo-core's last warm-up update, not lr.
    "constant_warmup_ulp": (dict(schedule="constant", warmup_steps=6),
                            ConstantWithWarmup(warmup=6)),
    "cosine_long": (dict(schedule="cosine", warmup_steps=1, min_lr_ratio=0.1),
                    CosWithWarmup(warmup=1, alpha_f=0.1)),
    "constant_warmup_fraction": (
        dict(schedule="constant", warmup_steps=0, warmup_fraction=0.35),
        ConstantWithWarmup(warmup_fraction=0.35)),  # 3.5 -> 4
    # InvSqrtWithWarmup: the floor lr x alpha_f plus the rest times sqrt(warmup / t), no end.
    "inv_sqrt": (dict(schedule="inv_sqrt", warmup_steps=3, min_lr_ratio=0.1),
                 InvSqrtWithWarmup(warmup=3, alpha_f=0.1)),
    "inv_sqrt_warmup_fraction": (
        dict(schedule="inv_sqrt", warmup_steps=0, warmup_fraction=0.15, min_lr_ratio=0.0),
        InvSqrtWithWarmup(warmup_fraction=0.15, alpha_f=0.0)),  # 1.5 -> 2
    "half_cos": (dict(schedule="half_cos", warmup_steps=2, min_lr_ratio=0.1),
                 HalfCosWithWarmup(warmup=2, alpha_f=0.1)),
    "half_cos_warmup_fraction": (
        dict(schedule="half_cos", warmup_steps=0, warmup_fraction=0.25, min_lr_ratio=0.0),
        HalfCosWithWarmup(warmup_fraction=0.25, alpha_f=0.0)),  # 2.5 -> 2
    "cosine_linear_decay": (
        dict(schedule="cosine_linear_decay", warmup_steps=2, min_lr_ratio=0.1, decay_steps=3),
        CosWithWarmupAndLinearDecay(warmup=2, alpha_f=0.1, decay=3, decay_fraction=None)),
    "cosine_linear_decay_fractions": (
        dict(schedule="cosine_linear_decay", warmup_steps=0, warmup_fraction=0.15,
             decay_fraction=0.25, min_lr_ratio=0.2, decay_min_lr_ratio=0.05),
        # 1.5 -> 2 warm-up and 2.5 -> 2 decay updates
        CosWithWarmupAndLinearDecay(warmup_fraction=0.15, alpha_f=0.2, decay_fraction=0.25,
                                    decay_min_lr=LR * 0.05)),
    "power": (dict(schedule="power", warmup_steps=2, decay_steps=3, min_lr_ratio=0.0),
              PowerLR(warmup=2, decay=3, decay_fraction=None, b=-0.51)),
    # t_max (OLMo-core's): the schedule's own length, the floor after it, or a run stopping early.
    "cosine_t_max_short": (dict(schedule="cosine", warmup_steps=2, t_max_steps=7, min_lr_ratio=0.1),
                           CosWithWarmup(warmup=2, t_max=7, alpha_f=0.1)),
    "linear_t_max_long": (
        dict(schedule="linear", warmup_steps=0, warmup_fraction=0.1, t_max_steps=25, min_lr_ratio=0.0),
        LinearWithWarmup(warmup_fraction=0.1, t_max=25, alpha_f=0.0)),  # round(2.5) = 2
    "half_cos_t_max": (dict(schedule="half_cos", warmup_steps=1, t_max_steps=16, min_lr_ratio=0.1),
                       HalfCosWithWarmup(warmup=1, t_max=16, alpha_f=0.1)),
    # The tail follows the run's end (10), the cosine its t_max (30).
    "cosine_linear_decay_t_max": (
        dict(schedule="cosine_linear_decay", warmup_steps=2, t_max_steps=30, decay_steps=3,
             min_lr_ratio=0.1),
        CosWithWarmupAndLinearDecay(warmup=2, t_max=30, decay=3, decay_fraction=None,
                                    alpha_f=0.1)),
    "power_fractions": (
        dict(schedule="power", warmup_steps=0, warmup_fraction=0.15, decay_fraction=0.25,
             decay_min_lr_ratio=0.1, power_exponent=-0.3),
        PowerLR(warmup_fraction=0.15, decay_fraction=0.25, b=-0.3, decay_min_lr=LR * 0.1)),
    # WSDS: periods of their own lengths (6 + 3 < 10 updates: the floor after them), each decaying
    # over round(its length x 0.5) updates (3, 1.5 -> 2), the warm-up in the first.
    "wsds_periods": (
        dict(schedule="wsds", warmup_steps=2, period_steps=[6, 3], decay_fraction=0.5,
             min_lr_ratio=0.1),
        WSDS(period_lengths=[6, 3], warmup=2, decay_fraction=0.5, decay_min_lr=LR * 0.1)),
    "wsds_multipliers": (  # warm-up round(6 x 0.25) = 2 (ties to even), peaks lr and lr / 2
        dict(schedule="wsds", warmup_steps=0, warmup_fraction=0.25, period_steps=[6, 4],
             period_lr_multipliers=[1.0, 0.5], decay_steps=2, min_lr_ratio=0.0),
        WSDS(period_lengths=[6, 4], period_lr_multipliers=[1.0, 0.5], warmup_fraction=0.25,
             decay=2, decay_min_lr=0.0)),
    # Peaks above lr and a floor between (min_lr_ratio 1.5); a decay of round(0.6) = 1 update in
    # the first period, none in the last (OLMo-core reaches the floor after it without dividing).
    "wsds_last_period_without_decay": (
        dict(schedule="wsds", warmup_steps=2, period_steps=[6, 3], decay_fraction=0.1,
             period_lr_multipliers=[2.0, 3.0], min_lr_ratio=1.5),
        WSDS(period_lengths=[6, 3], warmup=2, decay_fraction=0.1, period_lr_multipliers=[2.0, 3.0],
             decay_min_lr=LR * 1.5)),
    # A warm-up longer than the run (a short trial of a long run's schedule): WSD and PowerLR never
    # reach their tails, so a tail of round(10 x 0.03) = 0 updates, or longer than the run, trains.
    "wsd_warmup_covers_run": (dict(schedule="wsd", warmup_steps=12, decay_fraction=0.03),
                              WSD(warmup=12, decay_fraction=0.03, decay_min_lr=LR * 0.1)),
    "power_warmup_covers_run": (
        dict(schedule="power", warmup_steps=10, decay_steps=20, decay_min_lr_ratio=0.5),
        PowerLR(warmup=10, decay=20, decay_fraction=None, decay_min_lr=LR * 0.5)),
    # The warm-up from OLMo-core's warmup_min_lr (absolute) instead of 0.
    "cosine_warmup_min_lr": (dict(schedule="cosine", warmup_steps=4, warmup_min_lr=1e-4),
                             CosWithWarmup(warmup=4, warmup_min_lr=1e-4)),
    "exponential": (dict(schedule="exponential", warmup_steps=0, exponential_lr_min=1e-6),
                    ExponentialScheduler(lr_min=1e-6)),
    # ComposableScheduler: a linear warm-up stage from 0, a half cosine to lr / 10, a line to an
    # absolute rate, held after the stages (3 + 4 + 2 < 10 updates).
    "composable": (
        dict(schedule="composable", warmup_steps=0, stages=[
            dict(duration=3, start_lr_fraction=0.0, end_lr_fraction=1.0),
            dict(duration=4, shape="cosine", end_lr_fraction=0.1),
            dict(duration=2, end_lr=1e-4)]),
        ComposableScheduler(stages=[
            ComposableSchedulerStage(duration=3, start_lr_fraction=0.0, end_lr_fraction=1.0),
            ComposableSchedulerStage(duration=4, shape="cosine", end_lr_fraction=0.1),
            ComposableSchedulerStage(duration=2, end_lr=1e-4)])),
    # Its override decay: from update 6 a line from the cosine's rate there to 0 over 3 updates.
    "composable_override_decay": (
        dict(schedule="composable", warmup_steps=0, stages=[
            dict(duration=2, start_lr=0.0, end_lr_fraction=1.0),
            dict(duration=20, shape="cosine", end_lr_fraction=0.0)],
            override_decay=dict(start=6, duration=3, end_lr_fraction=0.0)),
        ComposableScheduler(
            stages=[ComposableSchedulerStage(duration=2, start_lr=0.0, end_lr_fraction=1.0),
                    ComposableSchedulerStage(duration=20, shape="cosine", end_lr_fraction=0.0)],
            override_decay=OverrideDecay(start=6, duration=3, end_lr_fraction=0.0))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logged_rates_are_olmo_cores(moecore_bin, job_data, tmp_path, case):
    optim, scheduler = CASES[case]
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run", optim=dict(optim, lr=LR),
                       train={"max_steps": STEPS, "log_every": 1, "eval_every": 0,
                              "checkpoint": False, "batch_size": 2})
    train(moecore_bin, cfg)
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == list(range(1, STEPS + 1))
    ours = [rows[t]["train/lr"] for t in range(1, STEPS + 1)]
    ref = [float(scheduler.get_lr(LR, t, STEPS)) for t in range(1, STEPS + 1)]
    assert ours == ref, list(zip(ours, ref))
    # Not constant: the schedule's parts are all there.
    assert len(set(ours)) > 3


# optim.units = "tokens" (OLMo-core's SchedulerUnits.tokens, as its recipes use): the scheduler
# asked at the tokens seen, t x 64 here (batch 2 x seq_len 32; OLMo-core adds the batch's tokens
# before it asks), of max_steps x 64; lengths in tokens, not whole updates.
TOKENS_PER_STEP = 2 * 32
TOKEN_CASES = {
    "cosine_tokens": (dict(schedule="cosine", warmup_tokens=150, min_lr_ratio=0.1),
                      CosWithWarmup(warmup=150, alpha_f=0.1)),
    "wsd_token_fractions": (  # round(640 x 0.15) = 96 warm-up and 192 decay tokens
        dict(schedule="wsd", warmup_fraction=0.15, decay_fraction=0.3, min_lr_ratio=0.0),
        WSD(warmup_fraction=0.15, decay_fraction=0.3, decay_min_lr=0.0)),
    "cosine_linear_decay_tokens": (
        dict(schedule="cosine_linear_decay", warmup_tokens=128, decay_tokens=200, min_lr_ratio=0.1),
        CosWithWarmupAndLinearDecay(warmup=128, decay=200, decay_fraction=None, alpha_f=0.1)),
    "power_tokens": (dict(schedule="power", warmup_tokens=100, decay_tokens=150),
                     PowerLR(warmup=100, decay=150, decay_fraction=None)),
    "inv_sqrt_tokens": (dict(schedule="inv_sqrt", warmup_tokens=100, min_lr_ratio=0.1),
                        InvSqrtWithWarmup(warmup=100, alpha_f=0.1)),
    "cosine_t_max_tokens": (dict(schedule="cosine", warmup_tokens=150, t_max_tokens=400),
                            CosWithWarmup(warmup=150, t_max=400)),
    "wsds_tokens": (  # decays of round(300 x 0.3) = 90 and round(340 x 0.3) = 102 tokens
        dict(schedule="wsds", warmup_tokens=100, period_tokens=[300, 340], decay_fraction=0.3,
             min_lr_ratio=0.1),
        WSDS(period_lengths=[300, 340], warmup=100, decay_fraction=0.3, decay_min_lr=LR * 0.1)),
    "exponential_tokens": (dict(schedule="exponential"), ExponentialScheduler()),  # lr_min 1e-9
    "composable_tokens": (  # stage and override boundaries inside updates
        dict(schedule="composable", stages=[
            dict(duration=100, start_lr_fraction=0.0, end_lr_fraction=1.0),
            dict(duration=500, shape="cosine", end_lr_fraction=0.1)],
            override_decay=dict(start=400, duration=150, shape="cosine", end_lr=0.0)),
        ComposableScheduler(
            stages=[ComposableSchedulerStage(duration=100, start_lr_fraction=0.0,
                                             end_lr_fraction=1.0),
                    ComposableSchedulerStage(duration=500, shape="cosine", end_lr_fraction=0.1)],
            override_decay=OverrideDecay(start=400, duration=150, shape="cosine", end_lr=0.0))),
}


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_rates_in_tokens_are_olmo_cores(moecore_bin, job_data, tmp_path, case):
    optim, scheduler = TOKEN_CASES[case]
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       optim=dict(optim, lr=LR, units="tokens", warmup_steps=0),
                       train={"max_steps": STEPS, "log_every": 1, "eval_every": 0,
                              "checkpoint": False, "batch_size": 2, "seq_len": 32})
    train(moecore_bin, cfg)
    rows = train_rows(tmp_path / "run")
    assert [rows[t]["train/tokens_seen"] for t in range(1, STEPS + 1)] == \
        [t * TOKENS_PER_STEP for t in range(1, STEPS + 1)]
    ours = [rows[t]["train/lr"] for t in range(1, STEPS + 1)]
    ref = [float(scheduler.get_lr(LR, t * TOKENS_PER_STEP, STEPS * TOKENS_PER_STEP))
           for t in range(1, STEPS + 1)]
    assert ours == ref, list(zip(ours, ref))
    assert len(set(ours)) > 3


@pytest.mark.parametrize("case", ["cosine_tokens", "wsd_token_fractions", "power_tokens",
                                  "inv_sqrt_tokens"])
def test_rates_in_tokens_follow_the_tokens_seen_across_a_batch_size_change(
        moecore_bin, job_data, tmp_path, case):
    """A resume with another batch size (--allow-config-change) goes on at the tokens seen: OLMo-core
    asks its scheduler at global_train_tokens_seen (the old batches' tokens, then the new ones')
    over max_tokens = the tokens seen + the remaining updates x the new batch's tokens."""
    optim, scheduler = TOKEN_CASES[case]
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=dict(optim, lr=LR, units="tokens", warmup_steps=0),
                       train={"max_steps": 5, "log_every": 1, "eval_every": 0, "batch_size": 2,
                              "seq_len": 32})
    train(moecore_bin, cfg)
    run(moecore_bin, "train", cfg, "--set", f"train.max_steps={STEPS}", "--set",
        "train.batch_size=4", "--resume", "--allow-config-change")
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, STEPS + 1))
    before, after = 5 * TOKENS_PER_STEP, (STEPS - 5) * 2 * TOKENS_PER_STEP
    seen = [t * TOKENS_PER_STEP for t in range(1, 6)] + \
        [before + (t - 5) * 2 * TOKENS_PER_STEP for t in range(6, STEPS + 1)]
    assert [rows[t]["train/tokens_seen"] for t in range(1, STEPS + 1)] == seen
    ours = [rows[t]["train/lr"] for t in range(1, STEPS + 1)]
    ref = [float(scheduler.get_lr(LR, tokens, before if t <= 5 else before + after))
           for t, tokens in enumerate(seen, start=1)]
    assert ours == ref, list(zip(ours, ref))
    # `lr-schedule --resume` shows the resumed updates' rates before they run.
    shown = json.loads(run(moecore_bin, "lr-schedule", cfg, "--set", f"train.max_steps={STEPS}",
                           "--set", "train.batch_size=4", "--resume",
                           out / "checkpoints/step_00000005", "--json").stdout)
    assert shown["step"] == list(range(6, STEPS + 1)) and shown["tokens_seen"] == seen[5:]
    assert shown["lr"] == ours[5:]


def test_a_resume_is_checked_over_its_own_length_not_the_configs(moecore_bin, job_data, tmp_path):
    """10 updates of 128 tokens, then 10 of 32: the run is 1280 + 320 tokens long, and a decay tail
    of 1000 tokens starts inside it; over the config's own 20 x 32 tokens it would not (a fresh
    run of this config is refused), but the resume trains, at OLMo-core's rates."""
    scheduler = CosWithWarmupAndLinearDecay(warmup=100, decay=1000, decay_fraction=None,
                                            alpha_f=0.1)
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=dict(schedule="cosine_linear_decay", lr=LR, units="tokens",
                                  warmup_steps=0, warmup_tokens=100, decay_tokens=1000,
                                  min_lr_ratio=0.1),
                       train={"max_steps": 10, "log_every": 1, "eval_every": 0, "batch_size": 4,
                              "seq_len": 32})
    train(moecore_bin, cfg)
    sets = ["--set", "train.max_steps=20", "--set", "train.batch_size=1"]
    fresh = run(moecore_bin, "lr-schedule", cfg, *sets, check=False)
    # Its tail would start at -360 tokens, on the warm-up's line below 0: OLMo-core's decay asserts.
    assert_one_line_error(fresh, "over the run's 640 tokens", "its decay tail would go from -")
    run(moecore_bin, "train", cfg, *sets, "--resume", "--allow-config-change")
    rows = train_rows(out)
    seen = [t * 128 for t in range(1, 11)] + [1280 + (t - 10) * 32 for t in range(11, 21)]
    assert [rows[t]["train/tokens_seen"] for t in range(1, 21)] == seen
    ref = [float(scheduler.get_lr(LR, tokens, 1280 if t <= 10 else 1600))
           for t, tokens in enumerate(seen, start=1)]
    assert [rows[t]["train/lr"] for t in range(1, 21)] == ref
    # Its checkpoints are whole: a further resume goes on from step 20 (none set aside as
    # damaged), and eval reads them.
    r = run(moecore_bin, "train", cfg, "--set", "train.max_steps=22", "--set",
            "train.batch_size=1", "--resume")
    assert "damaged" not in r.stdout + r.stderr and "resumed from" in r.stdout, r.stdout[-1500:]
    assert "(step 20)" in r.stdout, r.stdout[-1500:]
    run(moecore_bin, "eval", "--checkpoint", out / "checkpoints/step_00000022", "--data",
        job_data.val)
    # lr-schedule --resume names a directory that is not a checkpoint in one line.
    r = run(moecore_bin, "lr-schedule", cfg, "--resume", out, check=False)
    assert_one_line_error(r, "is not a checkpoint directory")


def test_schedule_checks_run_over_the_tokens_seen_after_a_batch_size_change(
        moecore_bin, job_data, tmp_path):
    """PowerLR's tail must fall (OLMo-core asserts decay_min_lr below the rate it starts from). 10
    updates of 128 tokens, then 10 of 32: the run's length is 1280 + 320 tokens, where the power
    law (t / 100)^-0.5 has fallen to 0.258 lr at the tail's start, below lr x 0.27; the config
    alone (20 x 32 tokens: 0.43 lr there) would pass. Refused in one line at the resume."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=dict(schedule="power", lr=LR, units="tokens", warmup_steps=0,
                                  warmup_tokens=100, decay_tokens=100, power_exponent=-0.5,
                                  decay_min_lr_ratio=0.27),
                       train={"max_steps": 10, "log_every": 1, "eval_every": 0, "batch_size": 4,
                              "seq_len": 32})
    train(moecore_bin, cfg)  # its tail starts at 0.291 lr
    r = run(moecore_bin, "train", cfg, "--set", "train.max_steps=20", "--set",
            "train.batch_size=1", "--resume", "--allow-config-change", check=False)
    assert_one_line_error(r, "over the run's 1600 tokens (the 1280 seen by step 10", "decay tail")
    r = run(moecore_bin, "lr-schedule", cfg, "--set", "train.max_steps=20", "--set",
            "train.batch_size=1")
    assert r.returncode == 0  # the config alone passes


def test_a_first_resume_checks_the_schedule_before_it_writes(moecore_bin, job_data, tmp_path):
    """`make train` passes --resume from the first run on: with no checkpoint to resume, the
    schedule's checks of a fresh run come before anything is written (no run directory)."""
    out = tmp_path / "never"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=dict(schedule="cosine_linear_decay", decay_steps=50),
                       train={"max_steps": 10})
    r = run(moecore_bin, "train", cfg, "--resume", check=False)
    assert_one_line_error(r, "over train.max_steps=10 updates: its decay tail would go from -")
    assert not out.exists()


def test_wsd_without_decay_updates_is_one_line_error(moecore_bin, job_data, tmp_path):
    """round(10 x 0.03) = 0 decay updates: OLMo-core divides by zero at the last step; refused."""
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       optim={"schedule": "wsd", "decay_fraction": 0.03},
                       train={"max_steps": STEPS})
    r = train(moecore_bin, cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "optim.decay_fraction" in lines[0] and "wsd" in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_inv_sqrt_without_warmup_is_one_line_error(moecore_bin, job_data, tmp_path):
    """OLMo-core's InvSqrtWithWarmup without a warm-up is lr x alpha_f throughout (sqrt(0 / t)):
    refused here rather than trained at the floor."""
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       optim={"schedule": "inv_sqrt", "warmup_steps": 0}, train={"max_steps": 5})
    r = run(moecore_bin, "train", cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "inv_sqrt" in lines[0] and "warm-up" in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_warmup_steps_and_fraction_together_is_one_line_error(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       optim={"warmup_steps": 3, "warmup_fraction": 0.1}, train={"max_steps": 5})
    r = run(moecore_bin, "train", cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "warmup_fraction" in lines[0] and "warmup_steps" in lines[0], r.stderr


@pytest.mark.parametrize("optim, message", [
    ({"schedule": "power", "warmup_steps": 0}, 'optim.schedule = "power" needs a warm-up'),
    ({"schedule": "power", "warmup_steps": 2, "power_exponent": 0.5},
     "optim.power_exponent=0.5 must be negative"),
    ({"schedule": "cosine_linear_decay", "decay_fraction": 0.03},
     'optim.schedule = "cosine_linear_decay" decays over round(train.max_steps=5 x '
     'optim.decay_fraction=0.03) = 0 updates'),
    ({"schedule": "power", "warmup_steps": 1, "decay_steps": 0, "decay_fraction": 0.0},
     'optim.schedule = "power" decays over'),
    ({"schedule": "cosine_linear_decay", "decay_min_lr_ratio": 1.5},
     "optim.decay_min_lr_ratio=1.5 must be in [0, 1]"),
    # Lengths in the other units.
    ({"schedule": "wsd", "warmup_steps": 1, "decay_steps": 2, "min_lr_ratio": 1.0},
     'optim.schedule = "wsd" decays to lr x optim.min_lr_ratio=1, not below lr'),
    ({"schedule": "wsd", "t_max_steps": 20}, "optim.t_max_steps=20 applies to the cosine, linear, half_cos"),
    ({"t_max_tokens": 640}, 'optim.units = "steps" gives t_max in updates: set optim.t_max_steps'),
    ({"units": "tokens", "warmup_steps": 3},
     'optim.units = "tokens" counts the schedule in tokens: give optim.warmup_tokens'),
    ({"warmup_steps": 0, "warmup_tokens": 100}, "optim.warmup_tokens=100 / decay_tokens=0 count tokens"),
    ({"units": "tokens", "schedule": "wsd", "warmup_steps": 0, "decay_fraction": 0.0},
     'optim.schedule = "wsd" decays over round('),
    ({"units": "tokens", "schedule": "power", "warmup_steps": 0, "warmup_tokens": 10,
      "decay_tokens": 700},
     'optim.schedule = "power" decays over 700 of the run\'s 640 tokens'),
    # OLMo-core: negative rates (its cosine's warm-up before update 1), an infinite power law.
    ({"schedule": "cosine_linear_decay", "decay_steps": 5},
     'optim.schedule = "cosine_linear_decay" over train.max_steps=5 updates: its decay tail would '
     'go from 0 up to'),
    ({"schedule": "power", "warmup_steps": 1, "decay_steps": 7},
     'optim.schedule = "power" decays over 7 of train.max_steps=5 updates'),
    # (4 / 1)^-0.51 = 0.49 of lr at the tail's start, below its end: OLMo-core asserts.
    ({"schedule": "power", "warmup_steps": 1, "decay_steps": 1, "decay_min_lr_ratio": 0.9},
     'optim.schedule = "power" over train.max_steps=5 updates: its decay tail would go from'),
    # WSDS: what its constructor refuses, its decay of 0 updates (a division by zero at the
    # period's end) and a decay that rises (its assert).
    ({"schedule": "wsds"}, 'optim.schedule = "wsds" needs its periods: optim.period_steps'),
    ({"schedule": "wsds", "warmup_steps": 2, "period_steps": [3, 4], "decay_steps": 2},
     'optim.schedule = "wsds": optim.period_steps[0]=3 updates is shorter than its warm-up and '
     'decay (2 + 2 updates)'),
    ({"schedule": "wsds", "warmup_steps": 0, "period_steps": [10, 4, 10], "decay_fraction": 0.1},
     'optim.schedule = "wsds": optim.period_steps[1]=4 decays over round(4 x '
     'optim.decay_fraction=0.1) = 0 updates'),
    ({"schedule": "wsds", "warmup_steps": 0, "period_steps": [10], "decay_steps": 1,
      "min_lr_ratio": 1.5}, 'optim.schedule = "wsds": optim.period_steps[0] decays from lr x 1 to '
     'lr x optim.min_lr_ratio=1.5, not below it'),
    ({"schedule": "cosine", "min_lr_ratio": 1.5}, "optim.min_lr_ratio=1.5 must be in [0, 1]"),
    ({"schedule": "wsds", "warmup_steps": 0, "period_steps": [4, 0], "decay_steps": 1},
     "optim.period_steps[1]=0 must be positive"),
    ({"schedule": "wsds", "period_steps": [4], "period_lr_multipliers": [1.0, 0.5]},
     "optim.period_lr_multipliers has 2 values for 1 periods"),
    ({"schedule": "wsds", "warmup_steps": 0, "period_steps": [4, 4], "decay_steps": 1,
      "period_lr_multipliers": [1.0, 0.05], "min_lr_ratio": 0.1},
     'optim.schedule = "wsds": optim.period_steps[1] decays from lr x 0.05 to lr x '
     'optim.min_lr_ratio=0.1'),
    ({"period_steps": [4]}, 'apply to optim.schedule = "wsds", not this one'),
    ({"units": "tokens", "schedule": "wsds", "warmup_steps": 0, "period_steps": [64]},
     'optim.units = "tokens" gives the periods of "wsds" in tokens: set optim.period_tokens'),
    ({"schedule": "exponential"}, 'optim.schedule = "exponential" has no warm-up'),
    ({"schedule": "half_cos", "warmup_steps": 2, "min_lr_ratio": 0.0, "warmup_min_lr": 2e-3},
     "optim.warmup_min_lr=0.002 is not below the rate the warm-up rises to (0.0015)"),
    ({"warmup_min_lr": -1e-4}, "optim.warmup_min_lr=-0.0001 must be >= 0"),
    ({"schedule": "exponential", "warmup_steps": 0, "warmup_min_lr": 1e-5},
     "optim.warmup_min_lr=1e-05 applies to the schedules with a warm-up"),
    # ComposableScheduler: its stages' and override's checks.
    ({"schedule": "composable", "warmup_steps": 0}, 'optim.schedule = "composable" needs its stages'),
    ({"schedule": "composable"}, 'optim.schedule = "composable" has no warm-up of its own'),
    ({"schedule": "composable", "warmup_steps": 0, "stages": [{"duration": 0, "end_lr": 0.0}]},
     "optim.stages[0].duration=0 must be > 0"),
    ({"schedule": "composable", "warmup_steps": 0,
      "stages": [{"duration": 3, "end_lr": 0.0}, {"duration": 3}]},
     "optim.stages[1]: give exactly one of end_lr and end_lr_fraction"),
    ({"schedule": "composable", "warmup_steps": 0,
      "stages": [{"duration": 3, "end_lr": 0.0, "start_lr": 1e-3, "start_lr_fraction": 0.5}]},
     "optim.stages[0]: give at most one of start_lr and start_lr_fraction"),
    ({"schedule": "composable", "warmup_steps": 0, "stages": [{"duration": 3, "end_lr": -1e-3}]},
     "optim.stages[0].end_lr=-0.001 must be >= 0"),
    ({"schedule": "composable", "warmup_steps": 0,
      "stages": [{"duration": 3, "end_lr": 0.0, "shape": "step"}]},
     'optim.stages[0].shape="step" is not one of "linear", "cosine"'),
    ({"schedule": "composable", "warmup_steps": 0,
      "stages": [{"duration": 3, "end_lr": 0.0, "ramp": 1}]}, "unknown key optim.stages[0].ramp"),
    ({"schedule": "composable", "warmup_steps": 0, "stages": 3},
     "optim.stages must be an array of tables"),
    ({"schedule": "composable", "warmup_steps": 0, "stages": []},
     'optim.schedule = "composable" needs its stages'),
    ({"schedule": "composable", "warmup_steps": 0, "stages": [{"duration": 3, "end_lr": 0.0}],
      "override_decay": {"start": 2, "duration": 0, "end_lr": 0.0}},
     "optim.override_decay.duration=0 must be > 0"),
    ({"schedule": "composable", "warmup_steps": 0, "stages": [{"duration": 3, "end_lr": 0.0}],
      "override_decay": {"start": 2, "duration": 2}},
     "optim.override_decay: give exactly one of end_lr and end_lr_fraction"),
    ({"stages": [{"duration": 3, "end_lr": 0.0}]},
     'optim.stages apply to optim.schedule = "composable"'),
    ({"override_decay": {"start": 2, "duration": 2, "end_lr": 0.0}},
     'optim.override_decay applies to optim.schedule = "composable" or "sequential"'),
    ({"schedule": "exponential", "warmup_steps": 0, "exponential_lr_min": 0},
     "optim.exponential_lr_min=0 must be positive"),
])
def test_bad_schedule_settings_are_one_line_errors(moecore_bin, job_data, tmp_path, optim, message):
    """What OLMo-core refuses, divides by zero on or asserts against (PowerLR without a warm-up or
    with b >= 0, a decay tail of no updates, of the whole run, or rising) is a one-line error
    before anything is written; `moecore lr-schedule` gives the same one."""
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run", optim=optim,
                       train={"max_steps": 5})
    r = run(moecore_bin, "train", cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "run").exists()
    # `moecore lr-schedule` refuses what training refuses, in the same words.
    shown = run(moecore_bin, "lr-schedule", cfg, check=False)
    assert shown.returncode != 0 and shown.stderr == r.stderr, shown.stderr


@pytest.mark.parametrize("case", ["wsds_periods", "composable_override_decay"])
def test_own_length_schedules_resume_where_they_were(moecore_bin, job_data, tmp_path, case):
    """WSDS and ComposableScheduler run over their own lengths: a resume that lengthens the run
    (train.max_steps 5 -> 10) goes on with OLMo-core's rates and says nothing of a moved end."""
    optim, scheduler = CASES[case]
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, optim=dict(optim, lr=LR),
                       train={"max_steps": 5, "log_every": 1, "eval_every": 0, "batch_size": 2})
    train(moecore_bin, cfg)
    r = train(moecore_bin, cfg, f"train.max_steps={STEPS}", resume=True)
    assert "schedule's end" not in r.stdout + r.stderr, r.stdout + r.stderr
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, STEPS + 1))
    ours = [rows[t]["train/lr"] for t in range(1, STEPS + 1)]
    assert ours == [float(scheduler.get_lr(LR, t, STEPS)) for t in range(1, STEPS + 1)]


def test_resume_with_another_override_decay_is_refused_in_one_line(moecore_bin, job_data, tmp_path):
    """An override decay added, changed or removed on a resume changes the rates from its start:
    like any [optim] change it needs --allow-config-change, and the refusal (tables inline) is one
    line naming it."""
    optim, _ = CASES["composable_override_decay"]
    out = tmp_path / "run"
    run_keys = {"log_every": 1, "eval_every": 0, "batch_size": 2}
    train(moecore_bin, write_config(tmp_path / "c.toml", job_data, out, optim=dict(optim, lr=LR),
                                    train=dict(run_keys, max_steps=5)))
    without = {k: v for k, v in optim.items() if k != "override_decay"}
    for changed in (dict(optim, override_decay=dict(start=7, duration=3, end_lr_fraction=0.0)),
                    without):
        cfg = write_config(tmp_path / "d.toml", job_data, out, optim=dict(changed, lr=LR),
                           train=dict(run_keys, max_steps=STEPS))
        r = train(moecore_bin, cfg, resume=True, check=False)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert "optim.override_decay: {" in lines[0] and "--allow-config-change" in lines[0], lines[0]


def random_schedule(rng: random.Random, in_tokens: bool, horizon: int):
    """A random schedule of every family that both sides accept: ([optim] keys, OLMo-core's
    scheduler). Lengths in the units (updates, or tokens when in_tokens); horizon: the run's."""
    key = (lambda name: name + ("_tokens" if in_tokens else "_steps"))
    family = rng.choice(["cosine", "linear", "constant", "wsd", "inv_sqrt", "half_cos",
                         "cosine_linear_decay", "power", "wsds", "exponential", "composable"])
    optim: dict = {"schedule": family, "warmup_steps": 0}
    kw: dict = {}
    if family not in ("exponential", "composable"):
        # The warm-up: a length (at least 1 where the law divides by it; for wsd and power at times
        # longer than the run, which then never reaches their tails) or a fraction (of the run;
        # wsds draws its own below).
        divides = family in ("inv_sqrt", "power")
        if family in ("wsd", "power") and rng.random() < 0.15:
            w = horizon + rng.randint(0, 3)
            optim[key("warmup")] = w
            kw["warmup"] = w
        elif rng.random() < 0.5:
            w = rng.randint(1 if divides else 0, max(1, horizon // 4))
            optim[key("warmup")] = w
            kw["warmup"] = w
        else:
            f = rng.choice([0.15, 0.25] if divides else [0.1, 0.15, 0.25])  # round(4 x 0.15) = 1
            optim["warmup_fraction"] = f
            kw["warmup_fraction"] = f
        floor = rng.choice([0.0, 0.0, 1e-5, LR * 0.05])  # below every warm-up's peak here
        optim["warmup_min_lr"] = floor
        kw["warmup_min_lr"] = floor
    if family in ("cosine", "linear", "half_cos", "cosine_linear_decay", "inv_sqrt"):
        alpha = rng.choice([0.0, 0.1, 0.25])
        optim["min_lr_ratio"] = alpha
        kw["alpha_f"] = alpha
    if family in ("cosine", "linear", "half_cos", "cosine_linear_decay") and rng.random() < 0.3:
        t_max = rng.randint(horizon // 2 + 1, 2 * horizon)
        optim[key("t_max")] = t_max
        kw["t_max"] = t_max
        if family == "cosine_linear_decay" and kw["alpha_f"] == 0.0:
            # A cosine that reaches 0 before the tail would leave it nothing to fall from.
            optim["min_lr_ratio"] = kw["alpha_f"] = 0.1
    if family in ("wsd", "cosine_linear_decay", "power"):
        if rng.random() < 0.5:
            d = rng.randint(1, max(1, horizon // 3))
            optim[key("decay")] = d
            kw.update(decay=d, decay_fraction=None)
        else:
            f = rng.choice([0.2, 0.25, 0.3])
            optim["decay_fraction"] = f
            kw["decay_fraction"] = f
    if family == "wsd":
        ratio = rng.choice([0.0, 0.1])
        optim["min_lr_ratio"] = ratio
        return optim, WSD(decay_min_lr=LR * ratio, **kw)
    if family == "cosine":
        return optim, CosWithWarmup(**kw)
    if family == "linear":
        return optim, LinearWithWarmup(**kw)
    if family == "constant":
        return optim, ConstantWithWarmup(**kw)
    if family == "inv_sqrt":
        return optim, InvSqrtWithWarmup(**kw)
    if family == "half_cos":
        return optim, HalfCosWithWarmup(**kw)
    if family == "cosine_linear_decay":
        if rng.random() < 0.15:  # no warm-up and a tail of the whole run: it starts from lr
            optim.pop("warmup_fraction", None)
            kw.pop("warmup_fraction", None)
            optim[key("warmup")] = kw["warmup"] = 0
            optim[key("decay")] = horizon
            optim.pop("decay_fraction", None)
            kw.update(decay=horizon, decay_fraction=None)
        ratio = 0.05 if kw["alpha_f"] >= 0.1 and rng.random() < 0.5 else 0.0
        optim["decay_min_lr_ratio"] = ratio
        return optim, CosWithWarmupAndLinearDecay(decay_min_lr=LR * ratio, **kw)
    if family == "power":
        b = rng.choice([-0.51, -0.3])
        optim["power_exponent"] = b
        return optim, PowerLR(b=b, **kw)
    if family == "exponential":
        lr_min = rng.choice([1e-9, 1e-6, 1e-4])
        optim["exponential_lr_min"] = lr_min
        return optim, ExponentialScheduler(lr_min=lr_min)
    if family == "wsds":
        unit = horizon // rng.randint(8, 30) or 1
        periods = [rng.randint(3, 8) * unit for _ in range(rng.randint(1, 3))]
        optim.pop(key("warmup"), None)
        optim.pop("warmup_fraction", None)
        w = rng.randint(0, periods[0] // 3)
        # Every period holds its decay, the first its warm-up too (OLMo-core refuses otherwise).
        d = rng.randint(1, max(1, min(periods) // 3)) if rng.random() < 0.5 else None
        multipliers = [rng.choice([1.0, 0.5, 2.0]) for _ in periods] if rng.random() < 0.5 else None
        optim.update({key("period"): periods, key("warmup"): w, "min_lr_ratio": 0.1})
        if d is None:
            optim["decay_fraction"] = 0.3
        else:
            optim[key("decay")] = d
        if multipliers:
            optim["period_lr_multipliers"] = multipliers
        return optim, WSDS(period_lengths=periods, warmup=w, decay=d,
                           warmup_min_lr=kw.get("warmup_min_lr", 0.0),
                           decay_fraction=0.3 if d is None else None,
                           period_lr_multipliers=multipliers, decay_min_lr=LR * 0.1)
    # composable
    stages, ours = [], []
    for _ in range(rng.randint(1, 3)):
        stage = {"duration": rng.randint(1, max(1, horizon // 2)),
                 "shape": rng.choice(["linear", "cosine"])}
        if rng.random() < 0.4:
            stage["start_lr_fraction"] = rng.choice([0.0, 0.5])
        stage["end_lr_fraction" if rng.random() < 0.6 else "end_lr"] = rng.choice([0.0, 0.1, 1.0])
        ours.append(stage)
        stages.append(ComposableSchedulerStage(**stage))
    optim["stages"] = ours
    override = None
    if rng.random() < 0.4:
        decay = {"start": rng.randint(0, horizon), "duration": rng.randint(1, max(1, horizon // 3)),
                 "shape": rng.choice(["linear", "cosine"]), "end_lr_fraction": 0.0}
        optim["override_decay"] = decay
        override = OverrideDecay(**decay)
    return optim, ComposableScheduler(stages=stages, override_decay=override)


def test_lr_schedule_command_is_olmo_cores_for_random_schedules(moecore_bin, tmp_path):
    """`moecore lr-schedule` prints what training logs (the same learning_rate), so it can stand
    in for runs: 150 random schedules of every family, in updates and in tokens, each update's
    rate equal to OLMo-core's class's bit for bit. (The same generator with other seeds, 3000
    schedules at a time, is the wider check; this is the sample the suite keeps.)"""
    rng = random.Random(20261205)
    families = set()
    for i in range(150):
        in_tokens = rng.random() < 0.4
        max_steps = rng.randint(4, 40)
        unit = TOKENS_PER_STEP if in_tokens else 1
        optim, scheduler = random_schedule(rng, in_tokens, max_steps * unit)
        families.add((optim["schedule"], in_tokens))
        cfg = tmp_path / f"c{i}.toml"
        table = dict(optim, lr=LR, units="tokens" if in_tokens else "steps")
        cfg.write_text("[optim]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()) +
                       f"[train]\nmax_steps = {max_steps}\nbatch_size = 2\nseq_len = 32\n")
        r = run(moecore_bin, "lr-schedule", cfg, "--json", check=False)
        assert r.returncode == 0, (table, r.stderr)
        out = json.loads(r.stdout)
        assert out["step"] == list(range(1, max_steps + 1))
        ref = [float(scheduler.get_lr(LR, t * unit, max_steps * unit))
               for t in range(1, max_steps + 1)]
        assert out["lr"] == ref, (table, list(zip(out["lr"], ref)))
    assert len(families) == 22, families  # every family in updates and in tokens


def test_resumed_rates_in_tokens_are_olmo_cores_for_random_schedules(moecore_bin, job_data,
                                                                      tmp_path):
    """After a resume with another batch size, random schedules in tokens of every family go on
    at OLMo-core's rates: `lr-schedule --resume` (the trainer's learning_rate and origin) against
    each class's get_lr at the tokens seen, 5 updates of 64 tokens and then 128 an update, over
    a horizon of those and the remaining updates' tokens."""
    out = tmp_path / "run"
    base = write_config(tmp_path / "base.toml", job_data, out,
                        optim=dict(schedule="constant", lr=LR, warmup_steps=0),
                        train={"max_steps": 5, "eval_every": 0, "batch_size": 2, "seq_len": 32})
    train(moecore_bin, base)
    ckpt = out / "checkpoints/step_00000005"
    rng = random.Random(20261206)
    families = set()
    for i in range(40):
        max_steps = rng.randint(6, 40)
        horizon = 5 * TOKENS_PER_STEP + (max_steps - 5) * 2 * TOKENS_PER_STEP
        optim, scheduler = random_schedule(rng, True, horizon)
        families.add(optim["schedule"])
        cfg = write_config(tmp_path / f"c{i}.toml", job_data, out,
                           optim=dict(optim, lr=LR, units="tokens", warmup_steps=0),
                           train={"max_steps": max_steps, "eval_every": 0, "batch_size": 4,
                                  "seq_len": 32})
        r = run(moecore_bin, "lr-schedule", cfg, "--resume", ckpt, "--json", check=False)
        assert r.returncode == 0, (optim, r.stderr)
        shown = json.loads(r.stdout)
        seen = [5 * TOKENS_PER_STEP + (t - 5) * 2 * TOKENS_PER_STEP
                for t in range(6, max_steps + 1)]
        assert shown["step"] == list(range(6, max_steps + 1)) and shown["tokens_seen"] == seen
        ref = [float(scheduler.get_lr(LR, tokens, horizon)) for tokens in seen]
        assert shown["lr"] == ref, (optim, list(zip(shown["lr"], ref)))
    assert len(families) == 11, families
