"""data.order = "olmo-core" in the trainer (the order itself against OLMo-core's loader:
tests/reference/test_olmo_core_data_order.py).

- Two data-parallel ranks, each reading its round-robin share of every global batch, train as the
  single process does (the global batch is the same set of instances; test_parallel's tolerance),
  and the order is not moecore's (the first step's loss differs).
- A run stopped inside an epoch and resumed replays the uninterrupted run bit for bit across two
  epoch boundaries, with an epoch that drops a tail (whole global batches only).
- A resume under another data.order is refused (the run would read other instances). Under
  OLMo-core's order, another batch size (with --allow-config-change) moves the saved position as
  OLMo-core's loader does: the trainer starts where `data order --resume` says, and resumes of
  the run it writes are exact again.
"""
from __future__ import annotations

import json

import pytest

from test_parallel import STEPS, dp_config, mpirun
from test_training_job import (assert_one_line_error, run, train, train_rows, without_timing,
                               write_config)

OLMO = "data.order=olmo-core"


def losses(out) -> list[float]:
    rows = train_rows(out)
    return [rows[s]["train/loss"] for s in sorted(rows)]


def test_ranks_train_as_the_single_process(moecore_bin, job_data, tmp_path):
    single = dp_config(tmp_path, job_data, "single", microbatches=2)
    train(moecore_bin, single, OLMO)
    ranks = dp_config(tmp_path, job_data, "ranks", microbatches=2)
    r = mpirun(moecore_bin, 2, ranks, OLMO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "in OLMo-core's order" in r.stdout, r.stdout[:800]
    ours, ref = losses(tmp_path / "ranks"), losses(tmp_path / "single")
    assert len(ours) == len(ref) == STEPS
    assert ours[0] == pytest.approx(ref[0], rel=1e-6)
    assert ours == pytest.approx(ref, rel=1e-3)
    mine = dp_config(tmp_path, job_data, "moecore_order", microbatches=2)
    train(moecore_bin, mine)
    assert losses(tmp_path / "moecore_order")[0] != ref[0]


def test_resume_across_epochs_is_exact(moecore_bin, job_data, tmp_path):
    # 40 instances in global batches of 6: an epoch is 6 steps (36 instances, 4 dropped); the run
    # stops at step 8, inside the second epoch, and goes on into the third.
    n = 8
    settings = dict(optim={"schedule": "constant"}, data={"train": [str(job_data.small_train)],
                                                          "order": "olmo-core"},
                    train={"max_steps": 2 * n, "batch_size": 6, "log_every": 1, "eval_every": 0})
    straight = tmp_path / "straight"
    r = train(moecore_bin, write_config(tmp_path / "a.toml", job_data, straight, **settings))
    assert "40 train instances of 32 tokens in OLMo-core's order (36 per epoch)" in r.stdout, \
        r.stdout[:800]
    split = tmp_path / "split"
    cfg = write_config(tmp_path / "b.toml", job_data, split, **settings)
    train(moecore_bin, cfg, f"train.max_steps={n}")
    train(moecore_bin, cfg, f"train.max_steps={2 * n}", resume=True)
    ra, rb = train_rows(straight), train_rows(split)
    assert sorted(ra) == sorted(rb) == list(range(1, 2 * n + 1))
    for step in ra:
        assert without_timing(ra[step]) == without_timing(rb[step]), f"metrics differ at step {step}"
    final = f"checkpoints/step_{2 * n:08d}"
    assert (straight / final / "model.safetensors").read_bytes() == \
        (split / final / "model.safetensors").read_bytes()
    state = json.loads((split / final / "trainer_state.json").read_text())
    assert state["data_cursor"] == 2 * n * 6, state

    # The order is part of what a resume must keep.
    r = train(moecore_bin, cfg, f"train.max_steps={3 * n}", "data.order=moecore", resume=True,
              check=False)
    assert_one_line_error(r, "data.order")
    # Its epochs are whole global batches: another batch size moves the saved position as
    # OLMo-core's loader does (tests/reference/test_olmo_core_data_order.py), the trainer starts
    # where `data order --resume` says, and the run it writes resumes again exactly.
    r = run(moecore_bin, "train", cfg, "--set", f"train.max_steps={3 * n}", "--set",
            "train.batch_size=4", "--resume", check=False)
    assert_one_line_error(r, "train.batch_size: 6 -> 4", "--allow-config-change")
    ckpt = split / f"checkpoints/step_{2 * n:08d}"
    order = json.loads(run(moecore_bin, "data", "order", cfg, "--set", "train.batch_size=4",
                           "--resume", ckpt, "--steps", 1).stdout)
    # Cursor 96 is 24 instances into the third epoch of 36; batches of 4 (epochs of 40) restart
    # it after 6 batches: 2 x 40 + 24.
    assert order["start"] == 104 and order["moved"] == {
        "epoch": 3, "offset": 24, "tokens_read": 24 * 32, "read_again": 0}, order
    r = run(moecore_bin, "train", cfg, "--set", f"train.max_steps={2 * n + 3}", "--set",
            "train.batch_size=4", "--resume", "--allow-config-change")
    assert ('note: data.order = "olmo-core" with train.batch_size 6 -> 4: the run goes on in '
            "epoch 3 at instance 24 of its 40") in r.stdout, r.stdout[-2000:]
    state = json.loads((split / f"checkpoints/step_{2 * n + 3:08d}" /
                        "trainer_state.json").read_text())
    assert state["data_cursor"] == 104 + 3 * 4, state
    # OLMo-core's loader state there is recorded: epoch 3, 24 instances' tokens read of it.
    assert state["replay_origin"] == {"step": 2 * n, "data_cursor": 104,
                                      "tokens_seen": 2 * n * 6 * 32, "epoch": 3,
                                      "epoch_tokens": 24 * 32}, state
    # OLMo-core's loader keeps the checkpoint's data seed: another train.seed is refused.
    r = run(moecore_bin, "train", cfg, "--set", f"train.max_steps={2 * n + 5}", "--set",
            "train.batch_size=4", "--set", "train.seed=1", "--resume", "--allow-config-change",
            check=False)
    assert_one_line_error(r, "train.seed: 0 -> 1", "olmo-core")
    r = train(moecore_bin, cfg, f"train.max_steps={2 * n + 5}", "train.batch_size=4", resume=True)
    assert "config change" not in r.stdout and "note: data.order" not in r.stdout, r.stdout[-2000:]
    assert sorted(train_rows(split))[-1] == 2 * n + 5
