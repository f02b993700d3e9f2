"""train.skip_rule = "olmo-core": the step guard decides as OLMo-core's SkipStepOptimizer
(olmo_core.optim.skip_step_optimizer, ai2-olmo-core 3.0.0) on the same values. A training job with
a tight band (sigma 0.5, window 8: judged from step 4) skips some steps; replaying its logged
cross-entropy and gradient norm per step (train/ce, train/grad_norm; OLMo-core judges its CE batch
loss and the norm before clipping) through OLMo-core's own get_step_factor gives the same skip
decision at every step (train/skipped_steps counts them). The replay uses float64 tensors as moecore
computes in double (OLMo-core's own run would hold float32); a step whose margin to the band is
within 1e-9 relative would be ill-posed and fails the test instead of being compared.
"""
from __future__ import annotations

import pytest
import torch

from test_training_job import train, train_rows, write_config

pytest.importorskip("olmo_core.optim.skip_step_optimizer", reason="ai2-olmo-core is not installed")
from olmo_core.optim.skip_step_optimizer import SkipStepOptimizer  # noqa: E402

STEPS = 40
WINDOW = 8
SIGMA = 0.5


def test_skips_are_olmo_cores(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run",
                       train={"max_steps": STEPS, "log_every": 1, "eval_every": 0,
                              "checkpoint": False, "batch_size": 2, "skip_rule": "olmo-core",
                              "skip_window": WINDOW, "skip_sigma": SIGMA,
                              "skip_max_consecutive": 0})
    train(moecore_bin, cfg)
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == list(range(1, STEPS + 1))
    skipped = [rows[t]["train/skipped_steps"] - (rows[t - 1]["train/skipped_steps"] if t > 1 else 0)
               for t in range(1, STEPS + 1)]

    oracle = SkipStepOptimizer([torch.nn.Parameter(torch.zeros(1))], {},
                               rolling_interval_length=WINDOW, sigma_factor=SIGMA)
    theirs = []
    for t in range(1, STEPS + 1):
        loss = torch.tensor(rows[t]["train/ce"], dtype=torch.float64)
        norm = torch.tensor(rows[t]["train/grad_norm"], dtype=torch.float64)
        oracle.latest_loss, oracle.latest_grad_norm = loss, norm
        if len(oracle._losses) >= max(2, WINDOW // 2):
            for values, latest in ((oracle._losses, loss), (oracle._grad_norms, norm)):
                std, mean = torch.std_mean(torch.stack(values[:-1]))
                margin = float(latest - mean - SIGMA * std)
                assert abs(margin) > 1e-9 * float(abs(latest)), f"step {t}: on the band's edge"
        theirs.append(int(float(oracle.get_step_factor()) == 0.0))
    assert skipped == theirs, list(zip(range(1, STEPS + 1), skipped, theirs))
    # The band was tight enough to skip, and loose enough to apply, judged steps.
    judged = skipped[WINDOW // 2 - 1:]
    assert 0 < sum(judged) < len(judged), skipped


@pytest.mark.parametrize("sets,needle", [
    ({"skip_rule": "olmo-core", "skip_window": 5}, "train.skip_window=5"),
    ({"skip_rule": "olmocore"}, "skip_rule"),
])
def test_bad_skip_settings_are_one_line_errors(moecore_bin, job_data, tmp_path, sets, needle):
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "run", train={"max_steps": 3, **sets})
    r = train(moecore_bin, cfg, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "run").exists()
