"""optim.reset_optimizer_moments_on_load (OLMo-core's OLMoDDP optimizer option): the resume that
turns it on starts the Adam moments from zero and keeps the step count, as OLMo-core's
load_state_dict zeroes exp_avg / exp_avg_sq and restores "step"; later resumes of the run read
their moments as any resume does (OLMo-core would reset at every restart while the flag is set:
README). Shown on the checkpoint one update after the reset: with zero moments before it, every
element's exp_avg^2 / exp_avg_sq is (1 - beta1)^2 / (1 - beta2) whatever its gradient (a plain
resume's is not), and steps_taken counts on from the checkpoint's."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from safetensors import safe_open

from test_parallel import TOL, losses, max_rel, mpirun
from test_training_job import run, train, write_config

BETA1, BETA2 = 0.9, 0.95
RESET = "optim.reset_optimizer_moments_on_load=true"


def config(tmp_path, job, name: str):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        optim={"beta1": BETA1, "beta2": BETA2},
                        model={"num_hidden_layers": 2},
                        train={"max_steps": 6, "batch_size": 8, "threads": 1, "log_every": 1,
                               "eval_every": 0, "save_every": 1})


def resume(moecore_bin, cfg, steps: int, *sets: str, allow: bool = False):
    args = ["train", cfg, "--set", f"train.max_steps={steps}", "--resume"]
    for s in sets:
        args += ["--set", s]
    return run(moecore_bin, *args, *(["--allow-config-change"] if allow else []))


def moment_ratios(out_dir, step: int):
    """Every element's exp_avg^2 / exp_avg_sq in checkpoint `step` (where exp_avg_sq is not tiny)
    and its steps_taken."""
    path = out_dir / "checkpoints" / f"step_{step:08d}" / "optim.safetensors"
    with safe_open(str(path), "np") as f:
        ratios = []
        for key in f.keys():
            if key.startswith("exp_avg."):
                m = f.get_tensor(key).astype(np.float64).ravel()
                v = f.get_tensor("exp_avg_sq." + key[len("exp_avg."):]).astype(np.float64).ravel()
                keep = v > 1e-20
                ratios.append(m[keep] ** 2 / v[keep])
        return np.concatenate(ratios), int(f.metadata()["steps_taken"])


@pytest.fixture(scope="module")
def six_steps(moecore_bin, job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reset_moments")
    cfg = config(tmp, job_data, "run")
    r = train(moecore_bin, cfg)
    assert r.returncode == 0, r.stderr
    return tmp, cfg


def copy_run(six_steps, name: str):
    tmp, cfg = six_steps
    shutil.copytree(tmp / "run", tmp / name)
    text = cfg.read_text().replace(str(tmp / "run"), str(tmp / name))
    (tmp / f"{name}.toml").write_text(text)
    return tmp / f"{name}.toml", tmp / name


def test_the_resume_that_turns_it_on_starts_the_moments_from_zero(moecore_bin, six_steps):
    cfg, out = copy_run(six_steps, "reset")
    r = resume(moecore_bin, cfg, 7, RESET, allow=True)
    assert "optimizer: the Adam moments start from zero at this resume" in r.stdout
    ratios, steps_taken = moment_ratios(out, 7)
    assert steps_taken == 7  # the step count goes on (Adam's bias correction with it)
    expected = (1 - BETA1) ** 2 / (1 - BETA2)
    assert ratios.size > 1000 and np.max(np.abs(ratios / expected - 1)) < 1e-4, \
        (ratios.min(), ratios.max(), expected)
    # A plain resume's moments remember the steps before: the same check fails there.
    cfg, out = copy_run(six_steps, "plain")
    resume(moecore_bin, cfg, 7)
    plain, _ = moment_ratios(out, 7)
    assert np.mean(np.abs(plain / expected - 1) > 1e-2) > 0.5


def test_later_resumes_read_their_moments(moecore_bin, six_steps):
    """Reset at 6, stopped at 8 (a hard stop: the schedule's length stays 10) and resumed with the
    flag still set: the same run as reset at 6 and trained to 10 in one go (no second reset)."""
    cfg, out = copy_run(six_steps, "once")
    resume(moecore_bin, cfg, 10, RESET, allow=True)
    cfg, out_twice = copy_run(six_steps, "twice")
    resume(moecore_bin, cfg, 10, RESET, "train.hard_stop_steps=8", allow=True)
    assert len(losses(out_twice)) == 8
    r = resume(moecore_bin, cfg, 10, RESET)
    assert "Adam moments start from zero" not in r.stdout
    assert losses(out_twice) == losses(out)


def test_zero_shards_reset_as_the_single_process(moecore_bin, six_steps):
    """dp 2 with ZeRO-1: each rank zeroes its slices of the moments (the run from 6 to 9 as the
    single process's, to test_parallel's tolerance)."""
    cfg, out = copy_run(six_steps, "single")
    resume(moecore_bin, cfg, 9, RESET, allow=True)
    cfg, out_zero = copy_run(six_steps, "zero")
    r = mpirun(moecore_bin, 2, cfg, "train.max_steps=9", RESET, "parallel.zero=1", resume=True,
               allow_config_change=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Adam moments start from zero" in r.stdout
    ours, ref = losses(out_zero), losses(out)
    assert len(ours) == 9 and max_rel(ours, ref) <= TOL, (ours, ref)
