"""train.max_tokens: a run's length in tokens, OLMo-core's max_duration = Duration.tokens(n), against
OLMo-core's own trainer (ai2-olmo-core 3.0.0). Its Trainer._get_max_steps and _get_max_tokens run on
a stand-in that holds the three values they read (global_step, global_train_tokens_seen,
tokens_per_batch), stepped as its _fit_epoch steps them (the step and the batch's tokens added before
the scheduler is asked), its Duration.due says when the run is over, and its scheduler classes give
each update's rate at (step, max_steps) or (tokens seen, max_tokens). Lengths of 600 and 900 tokens
that updates of 64 and 128 do not divide: the last update ends past the horizon, where WSD's linear
decay goes on below its floor (a negative rate, which moecore trains as OLMo-core does and warns of)
while the cosine holds its floor. A resume with another batch size recounts the updates from the
tokens seen, as OLMo-core's max_steps does.

Tolerance: none. The step counts are integers, and the rates are the schedule formulas of
tests/train/test_lr_schedules.py (bit for bit) at another horizon.
"""
from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import pytest

from test_training_job import assert_one_line_error, run, train, train_rows, write_config

pytest.importorskip("olmo_core.train.trainer", reason="ai2-olmo-core is not installed")
from olmo_core.optim.scheduler import WSD, CosWithWarmup  # noqa: E402
from olmo_core.train.common import Duration  # noqa: E402
from olmo_core.train.trainer import Trainer  # noqa: E402

# OLMo-core's ComposableScheduler says once that it has its own length; so does moecore's README.
pytestmark = pytest.mark.filterwarnings("ignore:'ComposableScheduler' ignores 't_max':UserWarning")

LR = 3e-3
SEQ = 32

# name -> ([optim] settings, OLMo-core scheduler, units).
CASES = {
    # decay_min_lr 0: the last update, past 600 tokens, trains at a negative rate.
    "wsd_tokens": (dict(schedule="wsd", units="tokens", warmup_steps=0, warmup_tokens=100, decay_tokens=300,
                        min_lr_ratio=0.0),
                   WSD(warmup=100, decay=300, decay_fraction=None, decay_min_lr=0.0), "tokens"),
    "cosine_tokens": (dict(schedule="cosine", units="tokens", warmup_steps=0, warmup_tokens=150, min_lr_ratio=0.1),
                      CosWithWarmup(warmup=150, alpha_f=0.1), "tokens"),
    # In updates: the horizon is OLMo-core's max_steps, the updates until the tokens are reached.
    "cosine_steps": (dict(schedule="cosine", units="steps", warmup_steps=2, min_lr_ratio=0.1),
                     CosWithWarmup(warmup=2, alpha_f=0.1), "steps"),
}


class OlmoCoreClock:
    """OLMo-core's trainer counters and its own length arithmetic (Trainer._get_max_steps and
    _get_max_tokens, called on this object) under max_duration = `duration`."""

    def __init__(self, duration: Duration, tokens_per_batch: int, step: int = 0,
                 tokens_seen: int = 0):
        self.duration = duration
        self.global_step = step
        self.global_train_tokens_seen = tokens_seen
        self.tokens_per_batch = tokens_per_batch
        self.epoch = 1

    def _get_max_steps(self, duration):
        return Trainer._get_max_steps(self, duration)

    def max_steps(self) -> int:
        return Trainer._get_max_steps(self, self.duration)

    def max_tokens(self) -> int:
        return Trainer._get_max_tokens(self, self.duration)

    def done(self) -> bool:
        return self.duration.due(step=self.global_step, tokens=self.global_train_tokens_seen,
                                 epoch=self.epoch)

    def run(self, scheduler, units: str) -> list[tuple[int, int, float]]:
        """(step, tokens seen, rate) of each update until the duration is due."""
        rows = []
        while not self.done():
            self.global_step += 1
            self.global_train_tokens_seen += self.tokens_per_batch
            if units == "steps":
                lr = scheduler.get_lr(LR, self.global_step, self.max_steps())
            else:
                lr = scheduler.get_lr(LR, self.global_train_tokens_seen, self.max_tokens())
            rows.append((self.global_step, self.global_train_tokens_seen, float(lr)))
        return rows


def logged(out_dir, steps) -> list[tuple[int, int, float]]:
    rows = train_rows(out_dir)
    assert sorted(rows) == list(steps), sorted(rows)
    return [(t, int(rows[t]["train/tokens_seen"]), rows[t]["train/lr"]) for t in steps]


def config(tmp_path, job_data, out, optim, max_tokens, batch_size, name="c.toml"):
    return write_config(tmp_path / name, job_data, out, optim=dict(optim, lr=LR),
                        train={"max_steps": None, "max_tokens": max_tokens, "log_every": 1,
                               "eval_every": 0, "batch_size": batch_size, "seq_len": SEQ})


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_in_tokens_stops_and_schedules_as_olmo_cores(moecore_bin, job_data, tmp_path, case):
    """600 tokens in updates of 2 x 32: OLMo-core trains 10 updates (the last ends at 640), each
    at its scheduler's rate; then the run resumed with train.max_tokens = 900 and 4 x 32 a batch
    goes on for OLMo-core's max_steps from the tokens seen (3 more updates, to 1024 tokens)."""
    optim, scheduler, units = CASES[case]
    out = tmp_path / "run"
    cfg = config(tmp_path, job_data, out, optim, 600, 2)
    r = train(moecore_bin, cfg)
    assert "length: train.max_tokens=600: 10 update(s) of 2 x 32 tokens (the last ends at 640" \
        in r.stdout, r.stdout[-2000:]
    clock = OlmoCoreClock(Duration.tokens(600), 2 * SEQ)
    ref = clock.run(scheduler, units)
    assert [row[0] for row in ref] == list(range(1, 11))  # OLMo-core's own count
    ours = logged(out, range(1, 11))
    assert ours == ref, list(zip(ours, ref))
    if case == "wsd_tokens":
        assert ours[-1][2] < 0.0  # WSD's decay line past its end at 600 tokens, as OLMo-core's
        assert "warning: the last update's learning rate is" in r.stdout
    else:
        assert "warning: the last update" not in r.stdout
    # The saved config gives the length as it was given, and reads back unchanged.
    saved = tomllib.loads((out / "config.toml").read_text())["train"]
    assert saved["max_tokens"] == 600 and "max_steps" not in saved

    resumed = config(tmp_path, job_data, out, optim, 900, 4, name="resumed.toml")
    shown = json.loads(run(moecore_bin, "lr-schedule", resumed, "--resume",
                           out / "checkpoints/step_00000010", "--json").stdout)
    r = run(moecore_bin, "train", resumed, "--resume", "--allow-config-change", "--set",
            "train.save_every=1", "--set", "train.keep_last=0")
    assert "config change on resume: train.batch_size: 2 -> 4" in r.stdout, r.stdout[-2000:]
    assert "length: train.max_tokens=900: 3 more update(s) of 4 x 32 tokens after step 10, to " \
        "step 13 (the last ends at 1024 tokens)" in r.stdout, r.stdout[-2000:]
    clock = OlmoCoreClock(Duration.tokens(900), 4 * SEQ, step=10, tokens_seen=640)
    ref = clock.run(scheduler, units)
    assert [row[:2] for row in ref] == [(11, 768), (12, 896), (13, 1024)]
    ours = logged(out, range(1, 14))[10:]
    assert ours == ref, list(zip(ours, ref))
    assert list(zip(shown["step"], shown["tokens_seen"], shown["lr"])) == ref
    # From the resumed run's own checkpoint at step 11, unchanged: the replay origin counts.
    shown = json.loads(run(moecore_bin, "lr-schedule", resumed, "--resume",
                           out / "checkpoints/step_00000011", "--json").stdout)
    assert list(zip(shown["step"], shown["tokens_seen"], shown["lr"])) == ref[1:]
    # Once more: nothing to train, in tokens.
    r = run(moecore_bin, "train", resumed, "--resume")
    assert "done: nothing to train" in r.stdout and "has seen 1024 tokens, " \
        "train.max_tokens=900" in r.stdout, r.stdout[-1500:]


def test_the_length_is_given_once_in_one_unit(moecore_bin, job_data, tmp_path):
    """Both train.max_steps and train.max_tokens in the file, or both set by --set, or a negative
    length, are one-line errors; a --set of one replaces the file's (make train's default config
    gives max_steps)."""
    out = tmp_path / "run"
    cfg = config(tmp_path, job_data, out, CASES["cosine_steps"][0], 600, 2)
    both = tmp_path / "both.toml"
    both.write_text(cfg.read_text().replace("max_tokens = 600", "max_tokens = 600\nmax_steps = 5"))
    r = run(moecore_bin, "lr-schedule", both, check=False)
    assert_one_line_error(r, "train.max_steps=5 and train.max_tokens=600 both set")
    r = run(moecore_bin, "lr-schedule", cfg, "--set", "train.max_tokens=700", "--set",
            "train.max_steps=5", check=False)
    assert_one_line_error(r, "--set train.max_tokens and --set train.max_steps")
    r = run(moecore_bin, "lr-schedule", cfg, "--set", "train.max_tokens=-64", check=False)
    assert_one_line_error(r, "train.max_tokens=-64 must be >= 0")
    r = run(moecore_bin, "lr-schedule", cfg, "--set", "train.max_steps=5", "--json")
    assert json.loads(r.stdout)["step"] == [1, 2, 3, 4, 5]
    default = Path(__file__).resolve().parents[2] / "configs" / "default.toml"
    shown = json.loads(run(moecore_bin, "lr-schedule", default, "--set", "train.max_tokens=100000",
                           "--json").stdout)
    assert shown["tokens_seen"][-1] >= 100000 > shown["tokens_seen"][-2]
    # The schedule's checks run over the length in tokens: a decay of 1000 tokens in a run of 600.
    r = run(moecore_bin, "lr-schedule", cfg, "--set", 'optim.schedule="wsd"', "--set",
            'optim.units="tokens"', "--set", "optim.warmup_steps=0", "--set",
            "optim.decay_tokens=1000", check=False)
    assert r.returncode == 0  # WSD's decay may outlast the run (OLMo-core starts it at once)
    r = run(moecore_bin, "lr-schedule", cfg, "--set", 'optim.schedule="power"', "--set",
            'optim.units="tokens"', "--set", "optim.warmup_steps=0", "--set",
            "optim.warmup_tokens=100", "--set", "optim.decay_tokens=1000", check=False)
    assert_one_line_error(r, "decays over 1000 of the run's 600 tokens (train.max_tokens)")


def test_a_checkpoint_past_max_tokens_is_refused(moecore_bin, job_data, tmp_path):
    """10 updates of 64 tokens (640 seen); train.max_tokens lowered to 500, which OLMo-core's run
    reached at update 8, is refused in one line (as a lowered train.max_steps is); lowered to 600,
    which update 10 reached, the run is finished."""
    out = tmp_path / "run"
    cfg = config(tmp_path, job_data, out, CASES["cosine_tokens"][0], 640, 2)
    train(moecore_bin, cfg)
    r = run(moecore_bin, "train", cfg, "--set", "train.max_tokens=500", "--resume", check=False)
    assert_one_line_error(r, "is at step 10 with 640 tokens seen, past train.max_tokens=500")
    r = run(moecore_bin, "lr-schedule", cfg, "--set", "train.max_tokens=500", "--resume",
            out / "checkpoints/step_00000010", check=False)
    assert_one_line_error(r, "past train.max_tokens=500")
    r = run(moecore_bin, "train", cfg, "--set", "train.max_tokens=600", "--resume")
    assert "done: nothing to train" in r.stdout, r.stdout[-1500:]


def test_random_schedules_over_max_tokens_are_olmo_cores(moecore_bin, tmp_path):
    """Random schedules of every family (tests/train/test_lr_schedules.py's generator) over a
    train.max_tokens that the updates of 64 tokens do not divide, in tokens and in updates:
    `lr-schedule` (the trainer's learning_rate and length) against OLMo-core's trainer stepping
    its scheduler, every update's rate bit for bit, the last one past max_tokens included."""
    from test_lr_schedules import random_schedule, toml_value
    rng = random.Random(20261206)
    families = set()
    for i in range(60):
        in_tokens = rng.random() < 0.6
        max_tokens = rng.randint(4, 40) * 64 + rng.randint(1, 63)
        updates = -(-max_tokens // 64)
        optim, scheduler = random_schedule(rng, in_tokens, max_tokens if in_tokens else updates)
        families.add((optim["schedule"], in_tokens))
        table = dict(optim, lr=LR, units="tokens" if in_tokens else "steps")
        cfg = tmp_path / f"c{i}.toml"
        cfg.write_text("[optim]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()) +
                       f"[train]\nmax_tokens = {max_tokens}\nbatch_size = 2\nseq_len = {SEQ}\n")
        r = run(moecore_bin, "lr-schedule", cfg, "--json", check=False)
        assert r.returncode == 0, (table, max_tokens, r.stderr)
        shown = json.loads(r.stdout)
        ref = OlmoCoreClock(Duration.tokens(max_tokens), 2 * SEQ).run(
            scheduler, "tokens" if in_tokens else "steps")
        assert list(zip(shown["step"], shown["tokens_seen"], shown["lr"])) == ref, \
            (table, max_tokens)
    assert len({f for f, tokens in families if tokens}) == 11, families
