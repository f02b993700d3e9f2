"""train.merge_steps / merge_interval / merge_last_n_steps (OLMo-core's ModelMergeCallback): the
weights averaged over the last N updates before each merge step, written as a weights-only
checkpoint under out_dir/merged. Shown: the average against the run's own checkpoints after each
update of the window, summed in fp32 and divided as OLMo-core's callback does (within an ulp: the
sum is scaled by 1 / count); the directory loads in transformers and `moecore eval`; a resume
before, at and inside a window (the first two as the uninterrupted run, bit for bit; the third
skipped with a warning, as OLMo-core skips it); pipeline and expert parallel runs as the single
process; the config's errors."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from test_parallel import WEIGHT_TOL, load_parts, max_rel, mpirun
from test_training_job import run, train, write_config


def config(tmp_path, job, name: str, **train_changes):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        model={"num_hidden_layers": 2},
                        train={"max_steps": 8, "batch_size": 8, "threads": 1, "log_every": 1,
                               "eval_every": 0, "save_every": 1, "keep_last": 0,
                               "merge_steps": [4, 8], "merge_last_n_steps": 3, **train_changes})


def merged(out_dir, step: int) -> dict:
    return load_parts(out_dir / "merged" / "checkpoints" / f"step_{step:08d}", "model")


def checkpoint(out_dir, step: int) -> dict:
    return load_parts(out_dir / "checkpoints" / f"step_{step:08d}", "model")


@pytest.fixture(scope="module")
def whole(moecore_bin, job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("merge")
    r = train(moecore_bin, config(tmp, job_data, "run"))
    assert r.returncode == 0, r.stderr
    assert "model merging: the weights averaged over the last 3 updates before step 4 " \
        "(updates 2-4), 8 (updates 6-8)" in r.stdout, r.stdout[-2000:]
    return tmp, tmp / "run"


def test_the_average_of_the_windows_weights(whole):
    _, out = whole
    for last in (4, 8):
        window = [checkpoint(out, s) for s in range(last - 2, last + 1)]
        ours = merged(out, last)
        assert set(ours) == set(window[0])
        for name, value in ours.items():
            # OLMo-core's callback: a float32 sum, the weights added in turn, divided by the count.
            acc = torch.zeros(window[0][name].shape, dtype=torch.float32)
            for w in window:
                acc.add_(torch.from_numpy(np.asarray(w[name])).float())
            ref = (acc / len(window)).numpy()
            np.testing.assert_allclose(ours[name], ref, rtol=2.0 ** -22, atol=1e-30, err_msg=name)
        # And it is not a window's last weights: the average moved it.
        assert any(not np.array_equal(ours[n], window[-1][n]) for n in ours)


def test_the_merged_directory_loads(moecore_bin, whole, job_data):
    _, out = whole
    path = out / "merged" / "checkpoints" / f"step_{8:08d}"
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path))
    weights = merged(out, 8)
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(dict(model.named_parameters())[name].detach(), torch.from_numpy(weights[name]))
    r = run(moecore_bin, "eval", "--checkpoint", path, "--data", job_data.val, "--max-instances", 8)
    assert "eval: loss" in r.stdout


def resumed_copy(whole, name: str, stop: int):
    tmp, out = whole
    shutil.copytree(out, tmp / name, ignore=shutil.ignore_patterns("merged"))
    for step_dir in (tmp / name / "checkpoints").iterdir():  # resume from `stop`
        if int(step_dir.name.split("_")[1]) > stop:
            shutil.rmtree(step_dir)
    cfg = tmp / f"{name}.toml"
    cfg.write_text((tmp / "run.toml").read_text().replace(str(out), str(tmp / name)))
    (tmp / name / "metrics.jsonl").unlink()
    return cfg, tmp / name


@pytest.mark.parametrize("stop", [5, 6])
def test_a_resume_before_or_at_a_window_merges_as_the_whole_run(moecore_bin, whole, stop):
    """Stopped after update 5 (before the window 6-8) or 6 (its first update, whose weights the
    resumed run holds): the merge at 8 is the uninterrupted run's, bit for bit."""
    cfg, out = resumed_copy(whole, f"stop{stop}", stop)
    r = train(moecore_bin, cfg, resume=True)
    assert r.returncode == 0, r.stderr
    ours, ref = merged(out, 8), merged(whole[1], 8)
    assert all(np.array_equal(ours[n], ref[n]) for n in ref)
    assert not (out / "merged" / "checkpoints" / f"step_{4:08d}").exists()  # merged before


def test_a_resume_inside_a_window_skips_its_merge(moecore_bin, whole):
    cfg, out = resumed_copy(whole, "stop7", 7)
    r = train(moecore_bin, cfg, resume=True)
    assert r.returncode == 0, r.stderr
    assert "warning: the merge at step 8 is skipped: the run resumed at step 7, inside its " \
        "window of updates 6-8" in r.stdout
    assert not (out / "merged" / "checkpoints").exists() or \
        not any((out / "merged" / "checkpoints").iterdir())


@pytest.mark.parametrize("layout,sets", [("pp2", ["parallel.pp=2"]), ("ep2", ["parallel.ep=2"]),
                                         ("dp2_zero", ["parallel.zero=1"])])
def test_parallel_runs_merge_as_the_single_process(moecore_bin, job_data, tmp_path, whole, layout,
                                                   sets):
    cfg = config(tmp_path, job_data, "run", save_every=0)
    r = mpirun(moecore_bin, 2, cfg, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ours, ref = merged(tmp_path / "run", 8), merged(whole[1], 8)
    assert set(ours) == set(ref)
    for name in ref:  # the averages of weights within test_parallel's WEIGHT_TOL (derived there)
        assert max_rel(ours[name], ref[name]) <= WEIGHT_TOL, name


def test_the_selection_bias_is_the_merge_steps(moecore_bin, job_data, tmp_path):
    """The router's selection bias (a buffer) is not averaged: the merge step's, as OLMo-core saves
    its buffers; the weights beside it are."""
    cfg = write_config(tmp_path / "bias.toml", job_data, tmp_path / "bias",
                       model={"num_hidden_layers": 2, "router_bias_update_rate": 0.01},
                       train={"max_steps": 4, "batch_size": 8, "threads": 1, "eval_every": 0,
                              "save_every": 1, "keep_last": 0, "merge_steps": [4],
                              "merge_last_n_steps": 3})
    r = train(moecore_bin, cfg)
    assert r.returncode == 0, r.stderr
    ours, last = merged(tmp_path / "bias", 4), checkpoint(tmp_path / "bias", 4)
    previous = checkpoint(tmp_path / "bias", 3)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert np.array_equal(ours[bias], last[bias]) and not np.array_equal(last[bias], previous[bias])
    gate = "model.layers.1.mlp.gate.weight"
    assert not np.array_equal(ours[gate], last[gate])


def test_warnings_and_an_interval(moecore_bin, job_data, tmp_path):
    """merge_interval's multiples up to the run's length; a hard stop before a window's end makes no
    merge and says so; a checkpoint inside a window is named as a resume point that loses it."""
    cfg = config(tmp_path, job_data, "interval", merge_steps=[], merge_interval=4,
                 save_every=5, hard_stop_steps=7)
    r = train(moecore_bin, cfg)
    assert r.returncode == 0, r.stderr
    assert "before step 4 (updates 2-4)" in r.stdout
    assert "warning: the merge at step 8 is not made: the run's last update is 7" in r.stdout
    assert (tmp_path / "interval" / "merged" / "checkpoints" / f"step_{4:08d}").is_dir()
    assert not (tmp_path / "interval" / "merged" / "checkpoints" / f"step_{8:08d}").exists()
    r = train(moecore_bin, config(tmp_path, job_data, "inside", save_every=3))
    assert "warning: the checkpoint at step 3 falls inside the merge window of updates 2-4" \
        in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("changes,needle", [
    ({"merge_last_n_steps": 0}, "train.merge_last_n_steps=0 must be positive"),
    ({"merge_steps": [2]}, "train.merge_steps[0]=2 is below train.merge_last_n_steps=3"),
    ({"merge_steps": [], "merge_interval": 2}, "train.merge_interval=2 is below"),
    ({"merge_interval": 4}, "train.merge_steps and train.merge_interval=4: give one of them"),
    ({"merge_steps": [8, 4]}, "train.merge_steps must increase"),
    ({"merge_interval": -1, "merge_steps": []}, "train.merge_interval=-1 must be >= 0"),
])
def test_config_errors(moecore_bin, job_data, tmp_path, changes, needle):
    r = train(moecore_bin, config(tmp_path, job_data, "bad", **changes), check=False)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
