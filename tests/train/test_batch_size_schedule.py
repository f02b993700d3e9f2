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

import json
import random

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


def test_every_schedule_family_scales_as_olmo_cores(moecore_bin, tmp_path):
    """Random schedules of all 11 families, in updates and in tokens, over a batch that goes
    2 -> 4 -> 1 -> 8 sequences: each update's rate is what OLMo-core's scheduler sets once its
    BatchSizeSchedulerCallback has multiplied initial_lr by sqrt(new / old) at each change (the
    callback on a stand-in trainer whose loader is always on the new batches' grid, as moecore's
    order is: the wait for OLMo-core's loader is the reference test's), with the run's tokens and
    its horizon in tokens as OLMo-core's trainer counts them."""
    pytest.importorskip("olmo_core.train.callbacks.batch_size_scheduler")
    import types

    import torch
    from olmo_core.train.callbacks.batch_size_scheduler import BatchSizeSchedulerCallback
    from olmo_core.train.common import Duration
    from olmo_core.train.train_module import TransformerTrainModule
    from olmo_core.train.trainer import Trainer
    from test_lr_schedules import LR, random_schedule
    from test_training_job import run, toml_value

    seq, sizes = 32, [2, 4, 1, 8]
    rng = random.Random(20261207)
    families = set()
    for i in range(90):
        in_tokens = rng.random() < 0.5
        max_steps = rng.randint(12, 40)
        starts = [0] + sorted(rng.sample(range(1, max_steps - 1), 3))
        per_step = [sizes[sum(s >= x for x in starts[1:])] * seq for s in range(max_steps)]
        horizon = sum(per_step) if in_tokens else max_steps
        optim, scheduler = random_schedule(rng, in_tokens, horizon)
        if optim.get("decay_tokens" if in_tokens else "decay_steps") == horizon:
            continue  # a tail of exactly the whole run: test_lr_schedules' (the horizon moves here)
        families.add((optim["schedule"], in_tokens))
        table = dict(optim, lr=LR, units="tokens" if in_tokens else "steps")
        cfg = tmp_path / f"c{i}.toml"
        cfg.write_text("[optim]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
                       + f"[train]\nmax_steps = {max_steps}\nbatch_size = 2\nmicrobatches = 2\n"
                       f"seq_len = {seq}\nbatch_sizes = {sizes}\nbatch_size_starts = {starts}\n")
        r = run(moecore_bin, "lr-schedule", cfg, "--json", check=False)
        assert r.returncode == 0, (table, starts, r.stderr)
        shown = json.loads(r.stdout)

        trainer = types.SimpleNamespace(
            data_loader=types.SimpleNamespace(global_batch_size=sizes[0] * seq,
                                              batches_processed=0),
            max_duration=Duration.steps(max_steps), global_step=0, global_train_tokens_seen=0,
            epoch=1, callbacks={}, record_metric=lambda *a: None)
        module = object.__new__(TransformerTrainModule)
        module.scheduler = scheduler
        module.optim = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
        trainer.train_module = module
        callback = BatchSizeSchedulerCallback(batch_sizes=[s * seq for s in sizes],
                                              schedule=[Duration.steps(s) for s in starts])
        callback.trainer = trainer
        callback.post_attach()
        group = module.optim.param_groups[0]
        ref = []
        for _ in range(max_steps):
            callback.pre_load_batch()
            trainer.global_step += 1
            trainer.global_train_tokens_seen += trainer.data_loader.global_batch_size
            group.setdefault("initial_lr", group["lr"])  # its scheduler's set_lr, first
            if in_tokens:
                t_max = trainer.global_train_tokens_seen + (
                    max_steps - trainer.global_step) * trainer.data_loader.global_batch_size
                lr = scheduler.get_lr(group["initial_lr"], trainer.global_train_tokens_seen,
                                      t_max)
            else:
                lr = scheduler.get_lr(group["initial_lr"], trainer.global_step, max_steps)
            ref.append((trainer.global_step, trainer.global_train_tokens_seen, float(lr),
                        trainer.data_loader.global_batch_size // seq))
        ours = list(zip(shown["step"], shown["tokens_seen"], shown["lr"], shown["batch_size"]))
        assert ours == ref, (table, starts, next((a, b) for a, b in zip(ours, ref) if a != b))
    # Every family in updates and in tokens.
    names = {"cosine", "linear", "constant", "wsd", "inv_sqrt", "half_cos", "cosine_linear_decay",
             "power", "wsds", "exponential", "composable"}
    missing = {(n, t) for n in names for t in (False, True)} - families
    assert not missing, missing
