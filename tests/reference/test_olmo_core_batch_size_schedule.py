"""train.batch_sizes: OLMo-core's BatchSizeSchedulerCallback (ai2-olmo-core 3.0.0), run for real.

The oracle is OLMo-core's own code: its BatchSizeSchedulerCallback attached to a stand-in trainer
that holds what the callback, Trainer._get_max_steps / _get_max_tokens and its schedulers' set_lr
read (the step and token counters, the epoch, a TransformerTrainModule with a torch AdamW and the
scheduler), stepped as its Trainer._fit_epoch steps (pre_load_batch before each batch is loaded,
the step and the batch's tokens added before the scheduler sets the rate, reshuffle and reset
around each epoch), over its real NumpyFSLDataLoader on the same token files. The callback grows
and shrinks the loader's global batch (an increase waits until batches_processed is a multiple of
the factor; the setter moves batches_processed) and multiplies the scheduler's initial_lr by
sqrt(new / old); OLMo-core's max_steps recounts in the current batch.

Shown, bit for bit: the updates moecore lists (`lr-schedule --json`: step, tokens seen, batch
size, rate) are OLMo-core's, for a length in steps, tokens and epochs, with schedules whose floors
OLMo-core derives from initial_lr (cosine's alpha_f) and whose floors it holds as rates (WSD's
decay_min_lr), and for random schedules; the instances each rank reads (`data order`, through the
trainer's own loader and change) are OLMo-core's loader's; a trained run logs those rates, batch
sizes and tokens, and resumed in the middle (after a hard stop) it logs every row the
uninterrupted run logs, as `lr-schedule --resume` and `data order --resume` list them; bad
schedules are one-line errors.

Tolerance: none (integers, and rates computed by the same formulas in the same order).
"""

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import moecore_harness as H
from test_olmo_core_data_order import (SEQ, TINY_MODEL, olmo_core_loader,  # noqa: F401
                                       tokens)

torch = pytest.importorskip("torch")
pytest.importorskip("olmo_core.train.callbacks.batch_size_scheduler",
                    reason="ai2-olmo-core is not installed (requirements.txt pins it)")
from olmo_core.optim.scheduler import WSD, CosWithWarmup, SchedulerUnits  # noqa: E402
from olmo_core.train.callbacks.batch_size_scheduler import BatchSizeSchedulerCallback  # noqa: E402
from olmo_core.train.common import Duration  # noqa: E402
from olmo_core.train.train_module import TransformerTrainModule  # noqa: E402
from olmo_core.train.trainer import Trainer  # noqa: E402

LR = 2e-3


class StandInTrainer:
    """What OLMo-core's BatchSizeSchedulerCallback, its Trainer's length arithmetic and its
    schedulers' set_lr read of a trainer, with its own methods doing the arithmetic."""

    def __init__(self, loader, duration: Duration, scheduler):
        self.data_loader = loader
        self.max_duration = duration
        self.global_step = 0
        self.global_train_tokens_seen = 0
        self.epoch = 1
        self.callbacks = {}
        module = object.__new__(TransformerTrainModule)  # the callback's isinstance test
        module.scheduler = scheduler
        module.optim = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
        self.train_module = module

    def record_metric(self, *args):
        pass

    @property
    def tokens_per_batch(self):
        return self.data_loader.global_batch_size

    def _get_max_steps(self, duration):
        return Trainer._get_max_steps(self, duration)

    @property
    def max_steps(self):
        return Trainer._get_max_steps(self, self.max_duration)

    @property
    def max_tokens(self):
        return Trainer._get_max_tokens(self, self.max_duration)


def olmo_core_run(root: Path, *, sizes, starts, unit: str, duration: Duration, scheduler,
                  seed: int, dp: int = 1, rank: int = 0):
    """OLMo-core's run, as its Trainer._fit_epoch and _iter_batches step it: [(step, tokens seen,
    rate, batch size in sequences, the rank's instances)] of every update."""
    loader = olmo_core_loader(root, batch=sizes[0], seed=seed, dp=dp, rank=rank)
    trainer = StandInTrainer(loader, duration, scheduler)
    callback = BatchSizeSchedulerCallback(
        batch_sizes=[s * SEQ for s in sizes],
        schedule=[Duration(value=v, unit=unit) for v in starts])
    callback.trainer = trainer
    callback.post_attach()
    group = trainer.train_module.optim.param_groups[0]
    rows = []
    while not duration.due(step=trainer.global_step, tokens=trainer.global_train_tokens_seen,
                           epoch=trainer.epoch):
        loader.reshuffle(epoch=trainer.epoch, in_memory=True)
        batches = iter(loader)
        while True:
            callback.pre_load_batch()
            batch = next(batches, None)
            if batch is None:
                break
            trainer.global_step += 1
            trainer.global_train_tokens_seen += loader.global_batch_size
            lr = float(scheduler.set_lr(group, trainer))
            rows.append((trainer.global_step, trainer.global_train_tokens_seen, lr,
                         loader.global_batch_size // SEQ, batch["index"].numpy().astype(np.int64)))
            if duration.due(step=trainer.global_step, tokens=trainer.global_train_tokens_seen,
                            epoch=trainer.epoch):
                return rows
        trainer.epoch += 1
        loader.reset()
    return rows


def config(root: Path, name: str, *, sizes, starts, unit: str, length: dict, optim: dict,
           seed: int, micro_rows: int, train: dict | None = None) -> Path:
    """A tiny model under OLMo-core's order with the batch size schedule; its micro-batch holds
    `micro_rows` sequences."""
    cfg = root / f"{name}.toml"
    cfg.write_text(H.toml_text({
        "model": H.model_table(TINY_MODEL),
        "optim": {**H.OPTIM_DEFAULTS, "lr": LR, **optim},
        "train": {"seq_len": SEQ, "batch_size": sizes[0],
                  "microbatches": sizes[0] // micro_rows, "batch_sizes": list(sizes),
                  "batch_size_starts": list(starts), "batch_size_units": unit, "seed": seed,
                  "threads": 1, "eval_every": 0, "sample_tokens": 0, "log_every": 1,
                  "out_dir": str(root / name), **length, **(train or {})},
        "data": {"train": [str(root / "tokens" / "train")], "order": "olmo-core"},
    }))
    return cfg


def listed(cfg: Path, *args) -> list[tuple]:
    shown = json.loads(H.run_moecore("lr-schedule", cfg, "--json", *args).stdout)
    return list(zip(shown["step"], shown["tokens_seen"], shown["lr"], shown["batch_size"]))


def read_order(root: Path, cfg: Path, steps: int, dp: int, *args):
    out = root / f"{cfg.stem}.order.dp{dp}.npy"
    summary = json.loads(H.run_moecore("data", "order", cfg, "--steps", steps, "--dp", dp, "--out",
                                       out, *args).stdout)
    return np.load(out), summary


# name -> (sizes, starts, unit, moecore length, OLMo-core duration, [optim], OLMo-core scheduler,
# micro-batch rows, dp).
CASES = {
    # An increase at step 5 waits for batches_processed 6 (x2), one at 50 (x8) for a multiple of
    # 8 or the epoch's end; the decrease at 30 is made at once; past two epochs.
    "steps_cosine": ([4, 8, 2, 16], [0, 5, 30, 50], "steps", {"max_steps": 90},
                     Duration.steps(90),
                     dict(schedule="cosine", units="steps", warmup_steps=3, min_lr_ratio=0.1),
                     CosWithWarmup(warmup=3, alpha_f=0.1), 2, 2),
    # In tokens: WSD's floor decay_min_lr is a rate OLMo-core holds while initial_lr moves; the
    # run's updates are recounted in the new batch at each change.
    "tokens_wsd": ([2, 4, 8], [0, 640, 2000], "tokens", {"max_tokens": 6000, "max_steps": None},
                   Duration.tokens(6000),
                   dict(schedule="wsd", units="tokens", warmup_steps=0, warmup_tokens=300,
                        decay_tokens=1500, min_lr_ratio=0.25),
                   WSD(warmup=300, decay=1500, decay_fraction=None, decay_min_lr=LR * 0.25,
                       units=SchedulerUnits.tokens), 2, 1),
    # Two epochs, WSD in updates over OLMo-core's moving max_steps (its callback lets WSD move).
    "epochs_wsd": ([8, 4, 16], [0, 10, 20], "steps", {"max_epochs": 2, "max_steps": None},
                   Duration.epochs(2),
                   dict(schedule="wsd", units="steps", warmup_steps=2, decay_fraction=0.2,
                        min_lr_ratio=0.0),
                   WSD(warmup=2, decay_fraction=0.2, decay_min_lr=0.0), 4, 1),
    # Starts in epochs (OLMo-core's Duration.epochs: due once the trainer's epoch is past it):
    # each change starts an epoch, after its loader's reset (the epoch that ended is asked first,
    # and names the size in force).
    "epochs_units": ([4, 8, 2], [0, 1, 2], "epochs", {"max_epochs": 3, "max_steps": None},
                     Duration.epochs(3),
                     dict(schedule="wsd", units="steps", warmup_steps=2, decay_fraction=0.2,
                          min_lr_ratio=0.0),
                     WSD(warmup=2, decay_fraction=0.2, decay_min_lr=0.0), 2, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_updates_rates_and_batches_are_olmo_cores(tokens, case):
    sizes, starts, unit, length, duration, optim, scheduler, micro_rows, dp = CASES[case]
    seed = 13
    cfg = config(tokens, f"bss_{case}", sizes=sizes, starts=starts, unit=unit, length=length,
                 optim=optim, seed=seed, micro_rows=micro_rows)
    ref = [olmo_core_run(tokens, sizes=sizes, starts=starts, unit=unit, duration=duration,
                         scheduler=scheduler, seed=seed, dp=dp, rank=rank) for rank in range(dp)]
    assert len({row[3] for row in ref[0]}) == len(sizes)  # every size was in force
    ours = listed(cfg)
    theirs = [row[:4] for row in ref[0]]
    assert ours == theirs, next((a, b) for a, b in zip(ours, theirs) if a != b)
    # The instances each rank reads, update after update.
    order, summary = read_order(tokens, cfg, len(ref[0]), dp)
    assert summary["batch_sizes"] == [row[3] for row in ref[0]]
    for rank in range(dp):
        expected = np.concatenate([row[4] for row in ref[rank]])
        assert order[rank].shape == expected.shape
        differing = np.flatnonzero(order[rank] != expected)
        assert differing.size == 0, f"rank {rank} first differing row {differing[0]}"


def test_an_increase_waits_for_the_loaders_grid(tokens):
    """Not vacuous: the x2 increase due after update 5 of "steps_cosine" is made before update 7
    (OLMo-core's loader had read 5 batches, then 6), and the rates after it are initial_lr x
    sqrt(2)'s."""
    sizes, starts, unit, length, duration, optim, scheduler, micro_rows, _ = CASES["steps_cosine"]
    cfg = config(tokens, "bss_wait", sizes=sizes, starts=starts, unit=unit, length=length,
                 optim=optim, seed=13, micro_rows=micro_rows)
    rows = listed(cfg)
    assert [r[3] for r in rows[:8]] == [4, 4, 4, 4, 4, 4, 8, 8]
    flat = dict(optim, schedule="constant", warmup_steps=0)
    constant = config(tokens, "bss_wait_constant", sizes=sizes, starts=starts, unit=unit,
                      length=length, optim=flat, seed=13, micro_rows=micro_rows)
    rates = [r[2] for r in listed(constant)]
    assert rates[5] == LR and rates[6] == LR * math.sqrt(2.0)


def test_a_decrease_at_the_last_epochs_end_reads_its_tail(tokens):
    """A run of one epoch whose batch halves when the epoch's whole batches are read: OLMo-core
    asks for a batch once more at the epoch's end (its run in epochs is over only when the loader
    says so), the callback halves the batch there, and the loader, its batches_processed doubled,
    yields the epoch's tail that the larger batches left before the run ends."""
    _, summary = read_order(tokens, config(tokens, "bss_tail_probe", sizes=[2], starts=[0],
                                           unit="steps", length={"max_steps": 1}, optim={},
                                           seed=3, micro_rows=2), 1, 1)
    n = summary["instances"]
    big = next(b for b in (16, 8, 4) if n % b >= b // 2)
    sizes, starts = [big, big // 2], [0, n // big]
    optim = dict(schedule="wsd", units="steps", warmup_steps=2, decay_fraction=0.25,
                 min_lr_ratio=0.1)
    cfg = config(tokens, "bss_tail", sizes=sizes, starts=starts, unit="steps",
                 length={"max_epochs": 1, "max_steps": None}, optim=optim, seed=3, micro_rows=2,
                 train={"save_every": 1, "keep_last": 0})
    ref = olmo_core_run(tokens, sizes=sizes, starts=starts, unit="steps",
                        duration=Duration.epochs(1),
                        scheduler=WSD(warmup=2, decay_fraction=0.25, decay_min_lr=LR * 0.1),
                        seed=3)
    assert [row[3] for row in ref][-2:] == [big, big // 2] and len(ref) == n // big + 1
    assert listed(cfg) == [row[:4] for row in ref]
    order, _ = read_order(tokens, cfg, len(ref), 1)
    assert (order[0] == np.concatenate([row[4] for row in ref])).all()
    H.run_moecore("train", cfg)  # the trainer's loop asks as OLMo-core's does
    rows = metrics_rows(tokens / "bss_tail")
    assert [(s, int(rows[s]["train/tokens_seen"]), rows[s]["train/lr"],
             int(rows[s]["train/batch_size"])) for s in sorted(rows)] == [row[:4] for row in ref]
    # Stopped at the epoch's end (a hard stop there) and resumed: its checkpoint holds the halved
    # batch the tail reads, so the resumed run trains the tail as the uninterrupted run does.
    stopped = config(tokens, "bss_tail_resumed", sizes=sizes, starts=starts, unit="steps",
                     length={"max_epochs": 1, "max_steps": None}, optim=optim, seed=3,
                     micro_rows=2, train={"hard_stop_steps": n // big})
    H.run_moecore("train", stopped)
    ckpt = tokens / "bss_tail_resumed" / "checkpoints" / f"step_{n // big:08d}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["batch_size_history"] == sizes
    H.run_moecore("train", stopped, "--resume", "--set", "train.hard_stop_steps=0")
    resumed = metrics_rows(tokens / "bss_tail_resumed")
    assert sorted(resumed) == sorted(rows)
    for step in rows:
        assert without_timing(resumed[step]) == without_timing(rows[step]), step
    # A run that ended (a crash) after its checkpoint at the epoch's end, saved every update: that
    # checkpoint holds the halved batch too, and a resume from it trains the tail.
    crashed = tokens / "bss_tail_crashed"
    (crashed / "checkpoints").mkdir(parents=True)
    shutil.copytree(tokens / "bss_tail" / "checkpoints" / f"step_{n // big:08d}",
                    crashed / "checkpoints" / f"step_{n // big:08d}")
    H.run_moecore("train", cfg, "--resume", "--set", f"train.out_dir={crashed}")
    tail = metrics_rows(crashed)
    assert sorted(tail) == [n // big + 1]
    assert without_timing(tail[n // big + 1]) == without_timing(rows[n // big + 1])


def test_an_increase_due_at_an_epochs_end_of_odd_batches_starts_the_next_epoch(tokens):
    """An increase x2 due when the epoch's odd count of whole batches is read: OLMo-core's loader
    is not on the new grid there (batches_processed odd), resets for the next epoch (0) and takes
    the new size before its first batch, which moecore's change there reads too, nothing read
    again."""
    _, summary = read_order(tokens, config(tokens, "bss_odd_probe", sizes=[2], starts=[0],
                                           unit="steps", length={"max_steps": 1}, optim={},
                                           seed=4, micro_rows=2), 1, 1)
    n = summary["instances"]
    small = next(b for b in (2, 4, 8) if (n // b) % 2 == 1)
    sizes, starts = [small, 2 * small], [0, n // small]
    optim = dict(schedule="cosine", units="steps", warmup_steps=2, min_lr_ratio=0.1)
    steps = n // small + 8
    cfg = config(tokens, "bss_odd", sizes=sizes, starts=starts, unit="steps",
                 length={"max_steps": steps}, optim=optim, seed=4, micro_rows=2)
    ref = olmo_core_run(tokens, sizes=sizes, starts=starts, unit="steps",
                        duration=Duration.steps(steps),
                        scheduler=CosWithWarmup(warmup=2, alpha_f=0.1), seed=4)
    assert [row[3] for row in ref][n // small - 1:n // small + 1] == [small, 2 * small]
    assert listed(cfg) == [row[:4] for row in ref]
    order, _ = read_order(tokens, cfg, steps, 1)
    assert (order[0] == np.concatenate([row[4] for row in ref])).all()
    H.run_moecore("train", cfg)
    rows = metrics_rows(tokens / "bss_odd")
    assert [int(rows[s]["train/batch_size"]) for s in sorted(rows)] == [row[3] for row in ref]


def random_case(rng: random.Random):
    """Sizes of pairwise multiples with starts in steps or tokens, a length in steps, tokens or
    epochs, and a schedule OLMo-core's callback accepts there."""
    first = rng.choice([2, 4])
    sizes = [first]
    for _ in range(rng.randint(1, 3)):
        sizes.append(rng.choice([s for s in (2, 4, 8, 16) if s != sizes[-1]]))
    unit = rng.choice(["steps", "tokens", "epochs"])
    starts = [0]
    for _ in sizes[1:]:
        starts.append(starts[-1] + (rng.randint(1, 25) if unit == "steps"
                                    else 1 if unit == "epochs"
                                    else rng.randint(1, 25) * SEQ * 4 + rng.randint(0, 60)))
    kind = rng.choice(["steps", "tokens", "epochs"])
    if kind == "steps":
        length, duration = {"max_steps": rng.randint(20, 90)}, None
        duration = Duration.steps(length["max_steps"])
    elif kind == "tokens":
        length = {"max_tokens": rng.randint(1500, 9000), "max_steps": None}
        duration = Duration.tokens(length["max_tokens"])
    else:
        length, duration = {"max_epochs": rng.randint(1, 2), "max_steps": None}, None
        duration = Duration.epochs(length["max_epochs"])
    if kind == "steps" or rng.random() < 0.5:
        units = "tokens" if kind != "steps" else rng.choice(["steps", "tokens"])
    else:
        units = "steps"
    if units == "tokens":
        optim = dict(schedule="cosine", units="tokens", warmup_steps=0, warmup_tokens=200,
                     min_lr_ratio=0.1)
        scheduler = CosWithWarmup(warmup=200, alpha_f=0.1, units=SchedulerUnits.tokens)
    elif kind == "steps":
        optim = dict(schedule="cosine", units="steps", warmup_steps=3, min_lr_ratio=0.1)
        scheduler = CosWithWarmup(warmup=3, alpha_f=0.1)
    else:  # WSD, whose horizon OLMo-core lets move with the batch
        optim = dict(schedule="wsd", units="steps", warmup_steps=2, decay_fraction=0.25,
                     min_lr_ratio=0.1)
        scheduler = WSD(warmup=2, decay_fraction=0.25, decay_min_lr=LR * 0.1)
    return sizes, starts, unit, length, duration, optim, scheduler


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_are_olmo_cores(tokens, seed):
    rng = random.Random(seed)
    sizes, starts, unit, length, duration, optim, scheduler = random_case(rng)
    cfg = config(tokens, f"bss_random_{seed}", sizes=sizes, starts=starts, unit=unit,
                 length=length, optim=optim, seed=seed, micro_rows=2)
    ref = olmo_core_run(tokens, sizes=sizes, starts=starts, unit=unit, duration=duration,
                        scheduler=scheduler, seed=seed)
    ours = listed(cfg)
    theirs = [row[:4] for row in ref]
    assert ours == theirs, (sizes, starts, unit, length,
                            next(((a, b) for a, b in zip(ours, theirs) if a != b), None),
                            len(ours), len(theirs))
    order, summary = read_order(tokens, cfg, len(ref), 1)
    assert summary["batch_sizes"] == [row[3] for row in ref]
    assert (order[0] == np.concatenate([row[4] for row in ref])).all()


def metrics_rows(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "train/loss" in r}


def without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("time", "train/tokens_per_s")}


@pytest.mark.parametrize("stop,history", [(30, [4, 8]), (40, [4, 8, 2])])
def test_training_logs_the_schedule_and_resumes_on_it(tokens, stop, history):
    """The trained run logs OLMo-core's rates, batch sizes and tokens; stopped (a hard stop) after
    update 30, where the decrease to 2 is due before the resumed run's first update, or after 40,
    a batch of 2 in force and the x8 increase ahead, and resumed, it logs every row the
    uninterrupted run logs, which `lr-schedule --resume` and `data order --resume` list from its
    checkpoint."""
    sizes, starts, unit, _, _, optim, _, micro_rows, _ = CASES["steps_cosine"]
    length = {"max_steps": 60}
    whole = config(tokens, f"bss_train_whole_{stop}", sizes=sizes, starts=starts, unit=unit,
                   length=length, optim=optim, seed=21, micro_rows=micro_rows)
    out = H.run_moecore("train", whole).stdout
    assert "batch size: 4 -> 8 sequences (4 micro-batch(es) of 2) before update 7" in out, out[-3000:]
    ref = metrics_rows(tokens / f"bss_train_whole_{stop}")
    shown = listed(whole)
    assert [(s, int(ref[s]["train/tokens_seen"]), ref[s]["train/lr"],
             int(ref[s]["train/batch_size"])) for s in sorted(ref)] == shown

    name = f"bss_train_resumed_{stop}"
    stopped = config(tokens, name, sizes=sizes, starts=starts, unit=unit, length=length,
                     optim=optim, seed=21, micro_rows=micro_rows, train={"hard_stop_steps": stop})
    H.run_moecore("train", stopped)
    ckpt = tokens / name / "checkpoints" / f"step_{stop:08d}"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["batch_size_history"] == history
    assert listed(stopped, "--resume", ckpt) == [r for r in shown if r[0] > stop]
    order, _ = read_order(tokens, stopped, 60 - stop, 1, "--resume", ckpt)
    full, _ = read_order(tokens, whole, 60, 1)
    assert (order[0] == full[0][-len(order[0]):]).all()
    H.run_moecore("train", stopped, "--resume", "--set", "train.hard_stop_steps=0")
    rows = metrics_rows(tokens / name)
    assert sorted(rows) == sorted(ref)
    for step in ref:
        assert without_timing(rows[step]) == without_timing(ref[step]), step


@pytest.mark.parametrize("train,optim,message", [
    ({"batch_sizes": [8, 16], "batch_size_starts": [0]}, {},
     "train.batch_sizes has 2 entries and train.batch_size_starts 1"),
    ({"batch_sizes": [8, 16], "batch_size_starts": [1, 5]}, {},
     "train.batch_size_starts[0]=1: the batch size schedule starts at 0"),
    ({"batch_sizes": [16, 8], "batch_size_starts": [0, 5]}, {},
     "train.batch_sizes[0]=16 must be train.batch_size=8"),
    ({"batch_sizes": [8, 12], "batch_size_starts": [0, 5]}, {},
     "train.batch_sizes[0]=8 and [1]=12: every two batch sizes"),
    ({"batch_sizes": [8, 4, 12], "batch_size_starts": [0, 5, 9]}, {},
     "train.batch_sizes[0]=8 and [2]=12"),
    ({"batch_sizes": [8, 16], "batch_size_starts": [0, 0]}, {},
     "train.batch_size_starts[1]=0 must come after train.batch_size_starts[0]=0"),
    ({"batch_sizes": [8, 8], "batch_size_starts": [0, 3]}, {},
     "train.batch_sizes[0] and [1] are both 8"),
    ({"batch_sizes": [8, 2], "batch_size_starts": [0, 3], "microbatches": 2}, {},
     "train.batch_sizes[1]=2 is not a whole number of micro-batches of 4"),
    ({"batch_sizes": [8, 16], "batch_size_starts": [0, 3], "batch_size_units": "months"}, {},
     'train.batch_size_units="months"'),
    ({"batch_sizes": [8, 16], "batch_size_starts": [0, 3], "max_tokens": 5000,
      "max_steps": None}, {"schedule": "cosine", "units": "steps"},
     'needs optim.units = "tokens"'),
    # moecore's constant is OLMo-core's ConstantWithWarmup, which its callback refuses too.
    ({"batch_sizes": [8, 16], "batch_size_starts": [0, 3], "max_epochs": 1,
      "max_steps": None}, {"schedule": "constant", "units": "steps"},
     'needs optim.units = "tokens"'),
    ({"batch_sizes": [8, 16], "batch_size_starts": [0, 3], "cuda_graph": True}, {},
     "train.cuda_graph=true cannot replay a step whose micro-batches change"),
])
def test_bad_schedules_are_one_line_errors(tokens, train, optim, message):
    cfg = config(tokens, "bss_bad", sizes=[8], starts=[0], unit="steps", length={"max_steps": 10},
                 optim=optim, seed=0, micro_rows=1, train=train)
    for command in (["lr-schedule", cfg], ["train", cfg]):
        r = H.run_moecore_raw(*command)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and message in lines[0], (command, r.stderr)


def test_starts_in_epochs_resume_and_end_as_olmo_cores(tokens):
    """Starts in epochs: stopped (a hard stop) at the update after which the batch doubles for the
    second epoch, whose checkpoint holds the doubled batch and the loader reset into that epoch,
    the resumed run replays the uninterrupted one (it does not ask in the epoch that ended
    again); and a start at the run's last epoch (max_epochs) changes nothing, as OLMo-core's
    trainer, over once its loader says the epoch is, asks only in the ended epoch."""
    sizes, starts = [4, 8], [0, 1]
    optim = dict(schedule="wsd", units="steps", warmup_steps=2, decay_fraction=0.25,
                 min_lr_ratio=0.1)
    scheduler = WSD(warmup=2, decay_fraction=0.25, decay_min_lr=LR * 0.1)
    length = {"max_epochs": 2, "max_steps": None}
    whole = config(tokens, "bss_epochs_whole", sizes=sizes, starts=starts, unit="epochs",
                   length=length, optim=optim, seed=8, micro_rows=2,
                   train={"save_every": 1, "keep_last": 0})
    ref = olmo_core_run(tokens, sizes=sizes, starts=starts, unit="epochs",
                        duration=Duration.epochs(2), scheduler=scheduler, seed=8)
    assert listed(whole) == [row[:4] for row in ref]
    H.run_moecore("train", whole)
    rows = metrics_rows(tokens / "bss_epochs_whole")
    change = next(r[0] for r in ref if r[3] == 8) - 1  # the update after which it doubles
    name = f"step_{change:08d}"
    saved = tokens / "bss_epochs_whole" / "checkpoints" / name
    assert json.loads((saved / "trainer_state.json").read_text())["batch_size_history"] == [4, 8]
    assert listed(whole, "--resume", saved) == [r[:4] for r in ref if r[0] > change]
    resumed_dir = tokens / "bss_epochs_resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved, resumed_dir / "checkpoints" / name)
    H.run_moecore("train", whole, "--resume", "--set", f"train.out_dir={resumed_dir}")
    resumed = metrics_rows(resumed_dir)
    assert sorted(resumed) == [s for s in sorted(rows) if s > change]
    for step in resumed:
        assert without_timing(resumed[step]) == without_timing(rows[step]), step

    one = config(tokens, "bss_epochs_end", sizes=sizes, starts=starts, unit="epochs",
                 length={"max_epochs": 1, "max_steps": None}, optim=optim, seed=8, micro_rows=2)
    ref = olmo_core_run(tokens, sizes=sizes, starts=starts, unit="epochs",
                        duration=Duration.epochs(1), scheduler=scheduler, seed=8)
    assert {r[3] for r in ref} == {4} and listed(one) == [row[:4] for row in ref]
    H.run_moecore("train", one)
    last = sorted((tokens / "bss_epochs_end" / "checkpoints").iterdir())[-1]
    assert json.loads((last / "trainer_state.json").read_text())["batch_size_history"] == [4]
