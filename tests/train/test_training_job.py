"""The training job end to end (issue 3): resume exactness, SIGKILL survival, Hugging Face
compatibility, eval/generate, gradient accumulation, skipped steps, MoE diagnostics, the progress
display and bad input to `moecore train`.

Every run is a tiny OLMoE-style model (d 32, 2 MoE layers, 4 experts top-2, seq 32, batch 4,
2 threads) on the corpus that conftest.py's `job_data` prepares with the CLI (tokenizer train +
prepare). Each run takes about a second.

Run: /opt/moecore/venv/bin/python -m pytest -q tests/train
Binary: $MOECORE_BIN, default <repo>/build/bin/moecore (a missing binary is a failure).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import random
import re
import select
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

RUN_TIMEOUT_S = 60
CKPT_FILES = ("model.safetensors", "config.json", "optim.safetensors", "trainer_state.json",
              "config.toml", "tokenizer.json", "checksums.json")
# Metrics that depend on the wall clock, not on the computation.
TIMING_METRICS = {"train/tokens_per_s"}
# OpenMP threads that sleep instead of spinning while they wait: the results are the same, and a
# busy machine (parallel builds, other tests) does not slow the 2-thread runs down tenfold.
ENV = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


# ------------------------------------------------------------------------------------------------
# configs and runs


def model_table(vocab_size: int, **changes) -> dict:
    """An OLMoE-compatible tiny model: QK-norm over the full projection, softmax router, no shared
    expert, no dense layers."""
    m = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 64,
        "first_k_dense_replace": 0,
        "shared_expert_intermediate_size": 0,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.01,
        "router_z_loss_coef": 0.001,
        "qk_norm": "full",
        "router_score": "softmax",
        "lb_loss_style": "olmo-core",
    }
    m.update(changes)
    return m


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))  # a TOML basic string is a JSON string for these paths
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_config(path: Path, job, out_dir: Path, *, model=None, optim=None, train=None,
                 data=None) -> Path:
    tables = {
        "model": model_table(job.vocab_size, **(model or {})),
        "optim": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
                  "max_grad_norm": 1.0, "warmup_steps": 3, "schedule": "cosine",
                  "min_lr_ratio": 0.1, **(optim or {})},
        "train": {"seed": 0, "max_steps": 16, "batch_size": 4, "microbatches": 1, "seq_len": 32,
                  "threads": 2, "log_every": 4, "eval_every": 4, "eval_batches": 2,
                  "save_every": 0, "keep_last": 3, "max_seconds": 0.0,
                  "sample_prompt": "The lord", "sample_tokens": 0, "out_dir": str(out_dir),
                  **(train or {})},
        "data": {"train": [str(job.train)], "val": [str(job.val)],
                 "tokenizer": str(job.tokenizer), **(data or {})},
    }
    lines = []
    for name, kv in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in kv.items() if v is not None]  # None: unset
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def run(bin_path: Path, *args, env_extra: dict | None = None, timeout: float = RUN_TIMEOUT_S,
        check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(bin_path), *map(str, args)]
    env = {**ENV, **(env_extra or {})}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                           env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung (> {timeout} s): {' '.join(cmd)}\nstdout: {e.stdout!r}")
    if check:
        assert r.returncode == 0, (f"failed (exit {r.returncode}): {' '.join(cmd)}\n"
                                   f"stderr: {r.stderr}\nstdout tail: {r.stdout[-2000:]}")
    return r


def train(bin_path: Path, config: Path, *sets: str, resume: bool = False, **kw):
    args = ["train", config]
    for s in sets:
        args += ["--set", s]
    if resume:
        args.append("--resume")
    return run(bin_path, *args, **kw)


def metrics_rows(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def train_rows(out_dir: Path) -> dict[int, dict]:
    """{step: row} for the rows with train/loss; a step logged twice is a failure."""
    rows: dict[int, dict] = {}
    for row in metrics_rows(out_dir):
        if "train/loss" in row:
            assert row["step"] not in rows, f"step {row['step']} logged twice in {out_dir}"
            rows[row["step"]] = row
    return rows


def without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING_METRICS}


def checkpoints(out_dir: Path) -> list[Path]:
    d = out_dir / "checkpoints"
    return sorted(p for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []


def step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[1])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def temp_leftovers(out_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*")
                  if ".tmp" in p.name)


def check_complete_checkpoint(ckpt: Path) -> dict:
    """All seven files present and parse; returns the trainer state."""
    for name in CKPT_FILES:
        assert (ckpt / name).is_file(), f"{ckpt}: {name} missing ({sorted(os.listdir(ckpt))})"
    model = load_file(str(ckpt / "model.safetensors"))
    optim = load_file(str(ckpt / "optim.safetensors"))
    assert model and all(np.isfinite(v).all() for v in model.values()), ckpt
    assert set(optim) == {f"{m}.{n}" for n in model for m in ("exp_avg", "exp_avg_sq")}, ckpt
    hf = json.loads((ckpt / "config.json").read_text())
    assert hf["model_type"] == "olmoe", hf
    tomllib.loads((ckpt / "config.toml").read_text())
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE", ckpt
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == step_of(ckpt), (ckpt, state["step"])
    return state


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    diag = f"\n  exit: {r.returncode}\n  stderr: {r.stderr!r}\n  stdout tail: {r.stdout[-600:]!r}"
    assert r.returncode > 0, f"expected a non-zero exit (not a signal){diag}"
    err = r.stderr.strip()
    assert err, f"expected an error on stderr{diag}"
    assert len(err.splitlines()) == 1, f"expected one line on stderr{diag}"
    for sign in ("terminate called", "Segmentation", "what():", "AddressSanitizer", "runtime error:"):
        assert sign not in r.stderr, f"crash sign {sign!r}{diag}"
    for n in needles:
        assert n in err, f"error does not name {n!r}{diag}"
    return err


# ------------------------------------------------------------------------------------------------
# a shared trained run (80 steps at lr 1e-2: enough for greedy decoding to follow the corpus'
# word chains; checkpoints and eval every 20 steps)


TRAINED_STEPS = 80
TRAINED = {"max_steps": TRAINED_STEPS, "log_every": 10, "eval_every": 20, "eval_batches": 2,
           "save_every": 20, "keep_last": 0, "gerrymander_window": 20, "sample_tokens": 6}


@pytest.fixture(scope="module")
def trained(moecore_bin, job_data, tmp_path_factory):
    work = tmp_path_factory.mktemp("trained")
    out = work / "run"
    cfg = write_config(work / "run.toml", job_data, out, train=TRAINED, optim={"lr": 1e-2})
    r = train(moecore_bin, cfg)
    ckpt = out / "checkpoints" / f"step_{TRAINED_STEPS:08d}"
    assert ckpt.is_dir(), f"no final checkpoint: {checkpoints(out)}"
    return {"out": out, "cfg": cfg, "ckpt": ckpt, "stdout": r.stdout, "work": work}


@pytest.fixture(scope="module")
def hf_model(trained):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # a tiny model: threads only add contention
    torch.manual_seed(0)
    model, info = AutoModelForCausalLM.from_pretrained(
        str(trained["ckpt"]), torch_dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    assert type(model).__name__ == "OlmoeForCausalLM", type(model)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{key}: {info.get(key)}"
    model.eval()
    return model


@pytest.fixture(scope="module")
def hf_tokenizer(trained):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(trained["ckpt"] / "tokenizer.json"))


# ------------------------------------------------------------------------------------------------
# a. resume exactness


# In bf16 the GEMMs read bf16 copies of the weights (in mxfp8 the experts read MX caches), which
# the trainer remakes after every optimizer step and a resumed process makes at its start: a step
# that kept stale copies would part the straight run from the resumed one.
@pytest.mark.parametrize("precision", ["fp32", "bf16", "mxfp8"])
def test_resume_is_byte_exact(moecore_bin, job_data, tmp_path, precision):
    # A constant schedule after warm-up: with a cosine or linear schedule the learning rate depends
    # on train.max_steps, so a run stopped by max_steps=N is not the first half of a 2N run.
    # 40 instances (10 steps per epoch): the runs cross two epoch boundaries and the resume point
    # (step 12) lies inside an epoch, so the data cursor and the per-epoch shuffle are resumed too.
    n = 12
    settings = dict(optim={"schedule": "constant"}, data={"train": [str(job_data.small_train)]},
                    train={"max_steps": 2 * n, "log_every": 1, "eval_every": 4,
                           "precision": precision})
    straight = tmp_path / "straight"
    train(moecore_bin, write_config(tmp_path / "a.toml", job_data, straight, **settings))
    split = tmp_path / "split"
    cfg = write_config(tmp_path / "b.toml", job_data, split, **settings)
    train(moecore_bin, cfg, f"train.max_steps={n}")
    assert [step_of(c) for c in checkpoints(split)] == [n]
    r = train(moecore_bin, cfg, f"train.max_steps={2 * n}", resume=True)
    assert f"resumed from {split}/checkpoints/step_{n:08d} (step {n})" in r.stdout, r.stdout[:500]

    final = f"checkpoints/step_{2 * n:08d}"
    a, b = straight / final, split / final
    for name in ("model.safetensors", "optim.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs after resume"
    assert json.loads((a / "trainer_state.json").read_text()) == \
        json.loads((b / "trainer_state.json").read_text())
    # The run did learn something between the two halves (the comparison is not vacuous).
    assert (split / f"checkpoints/step_{n:08d}/model.safetensors").read_bytes() != \
        (b / "model.safetensors").read_bytes()

    ra, rb = train_rows(straight), train_rows(split)
    assert sorted(ra) == sorted(rb) == list(range(1, 2 * n + 1))
    for step in ra:
        assert without_timing(ra[step]) == without_timing(rb[step]), f"metrics differ at step {step}"
    val = lambda d: {r["step"]: r["val/loss"] for r in metrics_rows(d) if "val/loss" in r}
    assert val(straight) == val(split) and sorted(val(split)) == [4, 8, 12, 16, 20, 24]


# ------------------------------------------------------------------------------------------------
# b. SIGKILL at random moments, including during a save


def test_sigkill_at_random_moments_resumes_exactly(moecore_bin, job_data, tmp_path):
    steps = 40
    settings = dict(train={"max_steps": steps, "save_every": 2, "keep_last": 2, "log_every": 1,
                           "eval_every": 10})
    ref = tmp_path / "ref"
    train(moecore_bin, write_config(tmp_path / "ref.toml", job_data, ref, **settings))
    out = tmp_path / "killed"
    cfg = write_config(tmp_path / "killed.toml", job_data, out, **settings)
    ckdir = out / "checkpoints"

    rng = random.Random(20240611)
    max_attempts, max_kills = 40, 10
    kills = mid_save_kills = 0
    resumed_from_steps = []
    incomplete = []  # (attempt, checkpoint, problem) found right after a kill
    modes = []
    for attempt in range(max_attempts):
        latest = checkpoints(out)[-1] if checkpoints(out) else None
        log = open(tmp_path / f"attempt{attempt}.out", "w+")
        proc = subprocess.Popen([str(moecore_bin), "train", str(cfg), "--resume"], stdout=log,
                                stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            if kills >= max_kills:
                mode = "none"
            elif attempt < 3:
                mode = "save"  # lands for sure (a save every 2 steps): at least 3 kills
            else:
                mode = ("random", "prune", "save")[attempt % 3]
            modes.append(mode)
            killed = False
            if mode == "random":
                until = time.monotonic() + rng.uniform(0.02, 0.4)
                while proc.poll() is None and time.monotonic() < until:
                    time.sleep(0.002)
                killed = proc.poll() is None
            elif mode == "save":
                # Kill as soon as a temporary checkpoint directory appears (after a short, seeded
                # delay so that the kill lands at different points of the save).
                delay = rng.choice([0.0, 0.0, 0.0005, 0.002])
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        names = os.listdir(ckdir)
                    except FileNotFoundError:
                        names = []
                    if any(n.startswith(".tmp-") for n in names):
                        if delay:
                            time.sleep(delay)
                        killed = True
                        break
                killed = killed and proc.poll() is None
            elif mode == "prune":
                # Kill while an old checkpoint (beyond keep_last) is being removed: it is first
                # renamed to .tmp-step_pruned-*, so kill as soon as one appears (or, should pruning
                # ever delete in place again, when a step_* directory is missing files).
                while proc.poll() is None and time.monotonic() < deadline and not killed:
                    try:
                        listing = os.listdir(ckdir)
                    except FileNotFoundError:
                        listing = []
                    if any(n.startswith(".tmp-step_pruned-") for n in listing):
                        killed = True
                        break
                    names = [n for n in listing if n.startswith("step_")]
                    for n in names:
                        try:
                            if len(os.listdir(ckdir / n)) < len(CKPT_FILES):
                                killed = True
                                break
                        except FileNotFoundError:
                            pass
                killed = killed and proc.poll() is None
            if killed:
                proc.send_signal(signal.SIGKILL)
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            # The run can finish between the last poll and the signal (a fast machine ends the
            # 40 steps within the poll's microseconds): a signal to an exited, unreaped process
            # does nothing, and exit 0 then means the attempt completed, not that it was killed.
            if killed and rc == 0:
                killed = False
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        text = log.read()
        log.close()
        first_line = text.splitlines()[0] if text else ""
        if latest is not None and first_line:  # (a kill can land before the first line)
            assert f"resumed from {latest} (step {step_of(latest)})" in first_line, (
                f"attempt {attempt}: did not resume from the latest checkpoint {latest}:\n{text[:400]}")
            resumed_from_steps.append(step_of(latest))
        else:
            assert "resumed" not in first_line, text[:400]
        if not killed:
            assert rc == 0, f"attempt {attempt}: exit {rc}\n{text[-2000:]}"
            break
        assert rc == -signal.SIGKILL, (rc, text[-1000:])
        kills += 1
        if any(n.startswith(".tmp-") for n in os.listdir(ckdir)) if ckdir.is_dir() else False:
            mid_save_kills += 1
        # After every kill: every checkpoint present is complete. (Collected, so that the final
        # comparison below is still made when this fails.)
        for ckpt in checkpoints(out):
            try:
                check_complete_checkpoint(ckpt)
            except Exception as e:  # noqa: BLE001
                incomplete.append((attempt, ckpt.name, str(e).splitlines()[0]))
    else:
        pytest.fail(f"the run did not finish within {max_attempts} attempts ({kills} kills)")
    print(f"sigkill: modes {modes}, {kills} kills ({mid_save_kills} during a save), "
          f"resumed from steps {resumed_from_steps}, incomplete: {incomplete}")

    assert kills >= 3, f"only {kills} kills landed"
    assert mid_save_kills >= 1, "no kill landed while a checkpoint was being written"
    assert any(s > 0 for s in resumed_from_steps), resumed_from_steps
    assert temp_leftovers(out) == [], temp_leftovers(out)
    final = f"checkpoints/step_{steps:08d}"
    assert [c.name for c in checkpoints(out)] == [c.name for c in checkpoints(ref)]
    for name in ("model.safetensors", "optim.safetensors"):
        assert (ref / final / name).read_bytes() == (out / final / name).read_bytes(), \
            f"{name} differs from the uninterrupted run after {kills} kills"
    assert json.loads((ref / final / "trainer_state.json").read_text()) == \
        json.loads((out / final / "trainer_state.json").read_text())
    # metrics.jsonl: every step exactly once, with the uninterrupted run's values.
    ra, rb = train_rows(ref), train_rows(out)
    assert sorted(rb) == list(range(1, steps + 1)), sorted(rb)
    for step in ra:
        assert without_timing(ra[step]) == without_timing(rb[step]), f"metrics differ at step {step}"
    assert not incomplete, f"incomplete checkpoints seen after a kill: {incomplete}"


@contextlib.contextmanager
def started(cmd: list, log, env: dict):
    """The command running with its output in `log` (a file: nothing drains a pipe while the
    test waits), killed and reaped on leaving the block if it still runs."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for_logged_steps(out_dir: Path, count: int, proc: subprocess.Popen) -> None:
    """Until metrics.jsonl holds `count` training steps (or the process ends, or a timeout)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    metrics = out_dir / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count('"train/loss"') >= count:
            return
        time.sleep(0.01)


def stopped_after_five_steps(bin_path, cfg: Path, out: Path, sig, log_path: Path) -> tuple[int, str]:
    """Trains `cfg`, sends `sig` once metrics.jsonl holds 5 steps; the exit status and the output."""
    with open(log_path, "w+") as log:
        with started([bin_path, "train", cfg], log, ENV) as proc:
            wait_for_logged_steps(out, 5, proc)
            assert proc.poll() is None, "the run ended before the signal could be sent"
            proc.send_signal(sig)
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        log.seek(0)
        return rc, log.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_saves_a_checkpoint_and_resumes_exactly(moecore_bin, job_data, tmp_path, sig):
    """A preemption notice (SIGTERM) or Ctrl-C (SIGINT): the step in progress ends, a checkpoint
    is written, the process exits with 128 + signal, and --resume continues exactly as if the
    run had never stopped (final weights and optimizer state bit-identical, every step's metrics
    equal). 300 steps: the signal goes after step 5, hundreds of steps (over a second) before the
    end even at the tiny model's fastest, and the resumed and reference runs stay short."""
    steps = 300
    settings = dict(train={"max_steps": steps, "save_every": 0, "log_every": 100,
                           "eval_every": 0})
    out = tmp_path / "stopped"
    cfg = write_config(tmp_path / "stopped.toml", job_data, out, **settings)
    rc, text = stopped_after_five_steps(moecore_bin, cfg, out, sig, tmp_path / "stopped.out")
    assert rc == 128 + sig, (rc, text[-1500:])
    saved = checkpoints(out)
    assert len(saved) == 1, saved
    stopped_at = step_of(saved[0])
    assert 5 <= stopped_at < steps
    assert f"{sig.name} received: stopping at step {stopped_at} with a checkpoint" in text, text
    check_complete_checkpoint(saved[0])
    assert sorted(train_rows(out)) == list(range(1, stopped_at + 1))
    assert temp_leftovers(out) == []
    if sig != signal.SIGTERM:
        return
    resumed = train(moecore_bin, cfg, resume=True)
    assert f"resumed from {saved[0]} (step {stopped_at})" in resumed.stdout.splitlines()[0]
    ref = tmp_path / "ref"
    train(moecore_bin, write_config(tmp_path / "ref.toml", job_data, ref, **settings))
    final = f"checkpoints/step_{steps:08d}"
    for name in ("model.safetensors", "optim.safetensors"):
        assert (ref / final / name).read_bytes() == (out / final / name).read_bytes(), name
    ra, rb = train_rows(ref), train_rows(out)
    assert sorted(rb) == list(range(1, steps + 1))
    for step in ra:
        assert without_timing(ra[step]) == without_timing(rb[step]), f"metrics differ at {step}"


def test_evaluation_a_stop_signal_cancelled_is_made_up_on_resume(moecore_bin, job_data, tmp_path):
    """A stop signal skips the evaluation due at its step (a preemption's grace period is short);
    the checkpoint records it and the resumed run evaluates that step before its first, so that
    metrics.jsonl holds every validation row of the uninterrupted run, each once, equal to it.
    400 steps: the signal, sent after step 5, lands hundreds of steps before the end."""
    steps = 400
    settings = dict(train={"max_steps": steps, "save_every": 0, "log_every": 1, "eval_every": 1,
                           "eval_batches": 1})
    out = tmp_path / "stopped"
    cfg = write_config(tmp_path / "stopped.toml", job_data, out, **settings)
    rc, text = stopped_after_five_steps(moecore_bin, cfg, out, signal.SIGUSR1,
                                        tmp_path / "stopped.out")
    assert rc == 128 + signal.SIGUSR1, (rc, text[-1500:])
    (saved,) = checkpoints(out)
    stopped_at = step_of(saved)
    assert 5 <= stopped_at < steps
    assert json.loads((saved / "trainer_state.json").read_text())["eval_pending"] is True
    val = lambda d: [(r["step"], r["val/loss"]) for r in metrics_rows(d) if "val/loss" in r]
    assert [step for step, _ in val(out)] == list(range(1, stopped_at)), "the stop evaluated"
    train(moecore_bin, cfg, resume=True)
    ref = tmp_path / "ref"
    train(moecore_bin, write_config(tmp_path / "ref.toml", job_data, ref, **settings))
    assert [step for step, _ in val(ref)] == list(range(1, steps + 1))
    assert val(out) == val(ref)


def test_stop_signal_after_the_final_checkpoint_ends_the_process(moecore_bin, job_data, tmp_path):
    """Past the final checkpoint a stop cannot keep anything more: a SIGTERM during the final
    evaluation or sample (here a long sample) ends the process by its default action at once, as
    outside the training loop, instead of being recorded and ignored while a preempted job
    outlives its grace period. The final checkpoint is whole. The final evaluation is made long
    (a wider model over every training instance: seconds) so that the signal lands inside it."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       model={"hidden_size": 512, "moe_intermediate_size": 512},
                       train={"max_steps": 2, "eval_every": 0, "eval_batches": 100000},
                       data={"val": [str(job_data.train)]})
    final = out / "checkpoints/step_00000002"
    with open(tmp_path / "run.out", "w+") as log:
        with started([moecore_bin, "train", cfg], log, ENV) as proc:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not final.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # into the final evaluation or the sample (seconds long)
            assert proc.poll() is None, "the run ended before the signal could be sent"
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=20)
        log.seek(0)
        text = log.read()
    assert rc == -signal.SIGTERM, (rc, text[-1500:])
    assert "done:" not in text and "sample:" not in text, text[-1500:]
    check_complete_checkpoint(final)


def test_temporaries_of_a_killed_write_are_removed_at_the_next_start(moecore_bin, existing_run):
    """A process killed while it rewrote metrics.jsonl or config.toml (a write goes to
    <name>.tmp.<pid>, then is renamed) leaves the temporary behind, a whole copy of the metrics;
    the next start removes those of moecore's files, and nothing else."""
    out, cfg = existing_run
    ours = ["metrics.jsonl.tmp.4242", "config.toml.tmp.17", "profile.json.tmp.9",
            "rank_stats/rank0.json.tmp.31"]
    theirs = ["notes.txt.tmp.5", "metrics.jsonl.tmp.draft", "metrics.jsonl.tmp."]
    for name in ours + theirs:
        (out / name).write_text("left behind\n")
    train(moecore_bin, cfg, "train.max_steps=6", resume=True)
    assert [n for n in ours if (out / n).exists()] == []
    assert [n for n in theirs if (out / n).read_text() == "left behind\n"] == theirs


def test_resuming_a_finished_run_trains_and_writes_nothing(moecore_bin, existing_run):
    """`make train` once more: the run is at train.max_steps, so nothing is trained, evaluated,
    logged or sampled again (the run that reached the step did all that); a train.max_steps below
    the checkpoint's step is a one-line error. The run directory stays as it was."""
    out, cfg = existing_run
    before = snapshot(out)
    step = max(step_of(c) for c in checkpoints(out))
    r = train(moecore_bin, cfg, f"train.max_steps={step}", resume=True)
    assert r.stdout.splitlines()[-1] == (f"done: nothing to train: {checkpoints(out)[-1]} is at "
                                         f"train.max_steps={step} (raise it to continue the run)")
    assert "warning" not in r.stdout + r.stderr and "eval" not in r.stdout, r.stdout
    after = snapshot(out)
    assert after == before, sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
    r = train(moecore_bin, cfg, f"train.max_steps={step - 1}", resume=True, check=False)
    assert_one_line_error(r, f"is at step {step}, past train.max_steps={step - 1}")
    assert snapshot(out) == before


# ------------------------------------------------------------------------------------------------
# c. Hugging Face: the checkpoint loads in transformers and gives moecore's logits


def test_checkpoint_logits_match_transformers(moecore_bin, trained, hf_model, job_data, tmp_path):
    import torch

    ckpt = trained["ckpt"]
    val = job_data.read_part(sorted(job_data.val.glob("*.npy"))[0]).astype(np.int64)
    seq = 32
    x = np.stack([val[i * seq: (i + 1) * seq] for i in range(3)])
    y = np.stack([val[i * seq + 1: (i + 1) * seq + 1] for i in range(3)])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    run(moecore_bin, "debug-state", "--config", ckpt / "config.toml", "--weights",
        ckpt / "model.safetensors", "--tokens", tmp_path / "x.npy", "--targets",
        tmp_path / "y.npy", "--out", tmp_path / "s.safetensors")
    ours = load_file(str(tmp_path / "s.safetensors"))["logits"].astype(np.float64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(x)).logits.double().numpy()
    assert ours.shape == ref.shape == (3, seq, job_data.vocab_size)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    # fp32 forward of a trained model in two programs (the H.TOL of tests/reference); measured 2.5e-7
    # (AVX-512 kernels) and 3.0e-7 (oneDNN, MKL and ATen on AVX2): 300x headroom.
    assert rel <= 1e-4, f"logits differ: max|a-b|/max|b| = {rel:.3g}"
    # A trained model, not an initialisation: the loss is well below ln(V).
    ce = torch.nn.functional.cross_entropy(torch.from_numpy(ref).reshape(-1, ref.shape[-1]),
                                           torch.from_numpy(y).reshape(-1))
    assert float(ce) < math.log(job_data.vocab_size) - 0.5, float(ce)


def test_checkpoint_tokenizer_matches_moecore(moecore_bin, trained, hf_tokenizer, job_data,
                                              tmp_path):
    from tokenizers import Tokenizer

    tok_path = trained["ckpt"] / "tokenizer.json"
    text = (job_data.corpus.read_text()[:6000] +
            "\nUnseen words: Zebra, café naïve 東京 🙂 1234567 it's  two  spaces\ttab\n")
    src = tmp_path / "text.txt"
    src.write_text(text)
    run(moecore_bin, "tokenizer", "encode", "--tokenizer", tok_path, "--input", src, "--out",
        tmp_path / "ids.npy")
    ours = np.load(tmp_path / "ids.npy").tolist()
    hf = hf_tokenizer.encode(text, add_special_tokens=False)
    raw = Tokenizer.from_file(str(tok_path)).encode(text, add_special_tokens=False).ids
    assert ours == hf == raw, "encodings differ"
    assert len(ours) < len(text.encode()) / 2, "the merges were not applied"
    assert hf_tokenizer.decode(hf) == text
    assert len(hf_tokenizer) == job_data.vocab_size
    # The checkpoint's tokenizer is the run's.
    assert Tokenizer.from_file(str(job_data.tokenizer)).encode(text).ids == raw


# ------------------------------------------------------------------------------------------------
# d. eval and generate


EVAL_RE = re.compile(r"eval: loss (\S+)\s+perplexity (\S+)\s+\((\d+) instances, (\d+) tokens\)")


def test_eval_matches_logged_val_loss(moecore_bin, trained, job_data):
    rows = [r for r in metrics_rows(trained["out"]) if "val/loss" in r]
    final = [r for r in rows if r["step"] == TRAINED_STEPS]
    assert len(final) == 1, rows
    logged_loss, logged_ppl = final[0]["val/loss"], final[0]["val/ppl"]
    assert logged_ppl == pytest.approx(math.exp(logged_loss), rel=1e-12)
    # The trainer evaluates eval_batches batches of batch_size / microbatches rows.
    instances = TRAINED["eval_batches"] * 4 // 1
    r = run(moecore_bin, "eval", "--checkpoint", trained["ckpt"], "--data", job_data.val,
            "--max-instances", instances)
    m = EVAL_RE.search(r.stdout)
    assert m, r.stdout
    loss, ppl, n_inst, n_tok = float(m[1]), float(m[2]), int(m[3]), int(m[4])
    assert n_inst == instances
    assert f"val_loss {logged_loss:.4f}" in trained["stdout"]
    assert re.search(rf"eval  step\s+{TRAINED_STEPS}\s.*\({n_tok} tokens\)", trained["stdout"]), \
        "eval counted a different number of tokens than the trainer"
    # Derived: the same computation, printed to 4 decimals (half a unit of the last digit, 0.5e-4).
    assert abs(loss - logged_loss) <= 0.51e-4, (loss, logged_loss)
    assert abs(ppl - math.exp(logged_loss)) <= 0.51e-3 + 1e-9 * ppl, (ppl, logged_loss)
    assert abs(math.log(ppl) - loss) <= 1e-4, (ppl, loss)
    # An earlier checkpoint gives a different (higher) loss: the comparison is not vacuous.
    r20 = run(moecore_bin, "eval", "--checkpoint", trained["out"] / "checkpoints/step_00000020",
              "--data", job_data.val, "--max-instances", instances)
    loss20 = float(EVAL_RE.search(r20.stdout)[1])
    logged20 = [r["val/loss"] for r in rows if r["step"] == 20]
    assert logged20 and abs(loss20 - logged20[0]) <= 0.51e-4 and loss20 > loss + 0.01


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_eval_scores_in_the_checkpoints_precision(moecore_bin, job_data, tmp_path, precision):
    """`moecore eval` of a bf16 or mxfp8 checkpoint is the trainer's validation of it (what a run a
    signal stopped never logged): the run's precision, not fp32. Perplexity to the printed 3
    decimals (fp32 scoring of the bf16 test run differs by about 0.2)."""
    steps = 4
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       train={"precision": precision, "max_steps": steps, "eval_every": 0,
                              "eval_batches": 2, "log_every": 1})
    run(moecore_bin, "train", cfg)
    (final,) = [r for r in metrics_rows(out) if "val/ppl" in r and r["step"] == steps]
    r = run(moecore_bin, "eval", "--checkpoint", out / f"checkpoints/step_{steps:08d}", "--data",
            job_data.val, "--max-instances", 2 * 4)
    ppl = float(EVAL_RE.search(r.stdout)[2])
    assert abs(ppl - final["val/ppl"]) <= 0.51e-3 + 1e-9 * ppl, (ppl, final["val/ppl"])


def generate(bin_path, ckpt, prompt, *args) -> str:
    r = run(bin_path, "generate", "--checkpoint", ckpt, "--prompt", prompt, *args)
    assert r.stderr == "", r.stderr
    assert r.stdout.endswith("\n"), r.stdout
    return r.stdout[:-1]


@pytest.mark.parametrize("prompt", ["The lord", "And he said unto", "He shall", "Israel"])
def test_greedy_generate_matches_transformers(moecore_bin, trained, hf_model, hf_tokenizer,
                                              job_data, prompt):
    import torch

    n = 16
    ours = generate(moecore_bin, trained["ckpt"], prompt, "--max-tokens", n, "--temperature", 0)
    assert ours == generate(moecore_bin, trained["ckpt"], prompt, "--max-tokens", n,
                            "--temperature", 0), "greedy generation is not deterministic"
    ids = hf_tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                                eos_token_id=job_data.eos_id, pad_token_id=job_data.eos_id)
    new = out[0, len(ids):].tolist()
    if job_data.eos_id in new:
        new = new[: new.index(job_data.eos_id)]
    assert len(new) >= 8, f"transformers generated only {new}: test prompt too weak"
    theirs = prompt + hf_tokenizer.decode(new)
    assert ours == theirs, f"\n moecore:      {ours!r}\n transformers: {theirs!r}"


def test_seeded_sampling_is_reproducible(moecore_bin, trained):
    ckpt = trained["ckpt"]
    args = ("--max-tokens", 20, "--temperature", 1.0, "--top-p", 0.95)
    a = generate(moecore_bin, ckpt, "The lord", *args, "--seed", 7)
    assert a == generate(moecore_bin, ckpt, "The lord", *args, "--seed", 7)
    others = {generate(moecore_bin, ckpt, "The lord", *args, "--seed", s) for s in (1, 2, 3)}
    assert len(others | {a}) >= 2, "different seeds give the same text: sampling ignores the seed"
    # top-k 1 at any temperature is greedy.
    greedy = generate(moecore_bin, ckpt, "The lord", "--max-tokens", 12, "--temperature", 0)
    assert generate(moecore_bin, ckpt, "The lord", "--max-tokens", 12, "--temperature", 1.5,
                    "--top-k", 1, "--seed", 99) == greedy


def test_generate_beyond_the_machines_memory_is_one_line(moecore_bin, existing_run):
    # The key/value cache is sized for every position up front: 2e9 tokens is one line naming
    # the cache's size, at once, not an allocation the kernel kills the process for.
    out, _ = existing_run
    r = run(moecore_bin, "generate", "--checkpoint", out / "checkpoints/step_00000004",
            "--prompt", "Israel", "--max-tokens", "2000000000", check=False, timeout=30)
    assert_one_line_error(r, "positions (prompt and new tokens) need a", "GiB key/value cache",
                          "ask for fewer tokens")


def test_generated_text_is_valid_utf8(moecore_bin, existing_run):
    # A nearly untrained model (4 steps) samples lone byte tokens (e.g. 0xf8) whose bytes are not
    # UTF-8 on their own. Printed text must still be UTF-8, as transformers' decode makes it
    # (invalid sequences become U+FFFD) -- both from `moecore generate` and the end-of-run sample.
    out, cfg = existing_run
    ckpt = out / "checkpoints/step_00000004"
    outputs = []
    for seed in (1, 2, 3):
        r = subprocess.run([str(moecore_bin), "generate", "--checkpoint", str(ckpt), "--prompt",
                            "Israel", "--max-tokens", "24", "--temperature", "1.0", "--seed",
                            str(seed)], capture_output=True, env=ENV, timeout=RUN_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
        outputs.append(("generate", seed, r.stdout))
    r = subprocess.run([str(moecore_bin), "train", str(cfg), "--set", "train.max_steps=6",
                        "--set", "train.sample_tokens=48", "--resume"], capture_output=True,
                       env=ENV, timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    outputs.append(("train sample", None, r.stdout))
    texts = []
    for what, seed, raw in outputs:
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            pytest.fail(f"{what} (seed {seed}) printed invalid UTF-8: {e}: {raw[-200:]!r}")
    # Not vacuous: the near-uniform model did produce non-ASCII output.
    assert any(not t.isascii() for t in texts), texts


# ------------------------------------------------------------------------------------------------
# e. gradient accumulation


def _losses(bin_path, job, tmp_path, name, microbatches, model=None):
    out = tmp_path / name
    cfg = write_config(tmp_path / f"{name}.toml", job, out, model=model,
                       train={"max_steps": 6, "log_every": 1, "eval_every": 0,
                              "microbatches": microbatches})
    train(bin_path, cfg)
    return train_rows(out)


def test_gradient_accumulation_matches_full_batch(moecore_bin, job_data, tmp_path):
    # Without the load-balancing loss every term of the objective is a per-token mean, so two
    # micro-batches of 2 rows give the gradients of one batch of 4 (up to summation order: fp32
    # sums of the same terms, ~1e-7 relative per step over 6 steps; measured 2.4e-8 on every ISA
    # setting, 400x under 1e-5).
    no_lb = {"router_aux_loss_coef": 0.0}
    full = _losses(moecore_bin, job_data, tmp_path, "m1", 1, no_lb)
    for micro in (2, 4):
        acc = _losses(moecore_bin, job_data, tmp_path, f"m{micro}", micro, no_lb)
        assert sorted(acc) == sorted(full) == list(range(1, 7))
        for step in full:
            for key in ("train/loss", "train/ce", "train/z", "train/grad_norm"):
                a, b = acc[step][key], full[step][key]
                assert abs(a - b) <= 1e-5 * abs(b), f"microbatches={micro} step {step} {key}: {a} vs {b}"
    # Training moved the loss (6 identical losses would make the comparison vacuous).
    assert full[6]["train/ce"] < full[1]["train/ce"] - 0.05
    # With the load-balancing loss (computed per micro-batch, as in OLMo-core) the first step still
    # sees the same data: identical cross-entropy, total loss within 1e-5. That gap is not rounding:
    # the lb term (coefficient 0.01) of two half batches differs from the whole batch's by the data;
    # measured 3.8e-6 relative, the same on every ISA setting (2.6x headroom).
    full_lb = _losses(moecore_bin, job_data, tmp_path, "lb1", 1)
    acc_lb = _losses(moecore_bin, job_data, tmp_path, "lb2", 2)
    assert acc_lb[1]["train/ce"] == pytest.approx(full_lb[1]["train/ce"], rel=1e-12)
    assert acc_lb[1]["train/loss"] == pytest.approx(full_lb[1]["train/loss"], rel=1e-5)


# ------------------------------------------------------------------------------------------------
# f. skipped steps


def test_absurd_learning_rate_skips_steps_and_keeps_weights_finite(moecore_bin, job_data, tmp_path):
    # Non-finite by construction, not by a chaotic trajectory: Adam moves every weight by about lr
    # in its first step, so the next forward's SwiGLU multiplies two projections of ~1e20 each
    # (of normalised inputs), ~1e40, beyond fp32's 3.4e38. (lr 1e4 diverged to NaN only along one
    # trajectory, which a change of the attention's summation order took away.)
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "lr.toml", job_data, out,
                       optim={"lr": 1e20, "max_grad_norm": 0.0, "warmup_steps": 0},
                       train={"max_steps": 20, "log_every": 1, "eval_every": 0, "save_every": 1,
                              "keep_last": 0, "skip_min_window": 5, "sample_tokens": 0})
    r = train(moecore_bin, cfg)
    assert "skipped" in r.stdout
    rows = train_rows(out)
    assert sorted(rows) == list(range(1, 21))
    skipped = [rows[s]["train/skipped_steps"] for s in sorted(rows)]
    assert skipped[-1] > 0, skipped
    assert skipped == sorted(skipped), "the skip counter went down"
    bad = [s for s in rows if rows[s]["train/loss"] is None or not math.isfinite(rows[s]["train/loss"])]
    assert bad, "no non-finite loss: the learning rate was not absurd enough to test the guard"
    # Weights never take a bad update: a skipped step leaves weights and optimizer state as they
    # were (byte for byte), and every checkpoint's weights are finite.
    ckpts = {step_of(c): c for c in checkpoints(out)}
    assert sorted(ckpts) == list(range(1, 21))
    for s in range(2, 21):
        was_skipped = rows[s]["train/skipped_steps"] > rows[s - 1]["train/skipped_steps"]
        if was_skipped:
            for name in ("model.safetensors", "optim.safetensors"):
                assert (ckpts[s] / name).read_bytes() == (ckpts[s - 1] / name).read_bytes(), \
                    f"step {s} was skipped but {name} changed"
    final = load_file(str(ckpts[20] / "model.safetensors"))
    assert all(np.isfinite(v).all() for v in final.values())
    assert all(np.isfinite(v).all() for v in load_file(str(ckpts[20] / "optim.safetensors")).values())
    state = json.loads((ckpts[20] / "trainer_state.json").read_text())
    assert state["step_guard"]["skipped"] == skipped[-1]


def test_run_whose_model_went_non_finite_still_ends_cleanly(moecore_bin, job_data, tmp_path):
    # The same diverged run with the end-of-run sample on (the default config prints one): the
    # training itself succeeded (steps skipped, finite weights saved), so the run must exit 0.
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "lr.toml", job_data, out,
                       optim={"lr": 1e20, "max_grad_norm": 0.0, "warmup_steps": 0},
                       train={"max_steps": 12, "log_every": 1, "eval_every": 0,
                              "skip_min_window": 5, "sample_tokens": 4})
    r = train(moecore_bin, cfg, check=False)
    rows = train_rows(out)
    assert rows and rows[max(rows)]["train/skipped_steps"] > 0, "the run did not diverge"
    assert (out / "checkpoints/step_00000012/model.safetensors").is_file()
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr.strip()}"


def test_steps_skipped_in_a_row_stop_the_run_saved_and_failed(moecore_bin, job_data, tmp_path):
    # The diverged run above: step 1 is applied, every later step's loss is non-finite. Without a
    # limit it would skip to max_steps and exit 0; train.skip_max_consecutive=3 stops it at step
    # 4, saved (the resume's position past the skipped batches), with status 1 and one line.
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "lr.toml", job_data, out,
                       optim={"lr": 1e20, "max_grad_norm": 0.0, "warmup_steps": 0},
                       train={"max_steps": 12, "log_every": 1, "eval_every": 0,
                              "skip_min_window": 5, "skip_max_consecutive": 3,
                              "sample_tokens": 0})
    r = train(moecore_bin, cfg, check=False)
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr.strip()}"
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and re.search(
        r"steps 2-4 were all skipped \(train.skip_max_consecutive=3; the last: loss is -?nan\): "
        r"the weights have not changed since step 1; saved at step 4", errors[0]), r.stderr
    assert sorted(train_rows(out)) == [1, 2, 3, 4]
    step4 = out / "checkpoints/step_00000004"
    state = json.loads((step4 / "trainer_state.json").read_text())
    assert state["step_guard"]["consecutive"] == 3 and state["step_guard"]["skipped"] == 3
    # The limit may change on a resume (it moves no weight): without one, the run goes on skipping
    # to max_steps.
    r = train(moecore_bin, cfg, "train.skip_max_consecutive=0", resume=True)
    assert "skipped" in r.stdout and sorted(train_rows(out)) == list(range(1, 13))
    assert (step4 / "model.safetensors").read_bytes() == \
        (out / "checkpoints/step_00000012/model.safetensors").read_bytes()


# ------------------------------------------------------------------------------------------------
# g. MoE diagnostics


def test_moe_diagnostics(trained):
    rows = train_rows(trained["out"])
    assert sorted(rows) == list(range(1, TRAINED_STEPS + 1))
    layers, experts, k = 2, 4, 2
    tokens = 4 * 32  # batch_size / microbatches rows of seq_len tokens (the last micro-batch)
    for step, row in rows.items():
        for key in ("moe/load_imbalance", "moe/router_entropy", "moe/selected_mass",
                    "moe/gerrymandering", "moe/max_load_imbalance"):
            assert key in row and row[key] is not None and math.isfinite(row[key]), (step, key)
        assert 0.0 < row["moe/router_entropy"] <= math.log(experts) + 1e-9
        assert 0.0 < row["moe/selected_mass"] <= 1.0 + 1e-9
        per_layer = [row[f"moe/layer{i}/load_imbalance"] for i in range(layers)]
        assert row["moe/load_imbalance"] == pytest.approx(sum(per_layer) / layers, rel=1e-12)
        assert row["moe/max_load_imbalance"] == pytest.approx(max(per_layer), rel=1e-12)
        for i in range(layers):
            for name in ("lb_loss", "z_loss", "router_entropy", "selected_mass", "drop_rate"):
                assert f"moe/layer{i}/{name}" in row, (step, i, name)
        counts_logged = f"moe/layer0/tokens_expert0" in row
        assert counts_logged == (step % TRAINED["log_every"] == 0 or step == TRAINED_STEPS), step
        if counts_logged:
            for i in range(layers):
                counts = [row[f"moe/layer{i}/tokens_expert{e}"] for e in range(experts)]
                assert sum(counts) == tokens * k, (step, i, counts)
                assert all(c == int(c) and c >= 0 for c in counts)
                imbalance = max(counts) / (tokens * k / experts)
                assert row[f"moe/layer{i}/load_imbalance"] == pytest.approx(imbalance, rel=1e-12)
    # The detector is on (window 10 < 30 steps) and computes trends, yet never flags a normal run.
    assert all(r["moe/gerrymandering"] == 0.0 for r in rows.values())
    assert any(r["moe/lb_trend"] != 0.0 for r in rows.values()), "the detector never ran"
    assert "gerrymandering" not in trained["stdout"]


# ------------------------------------------------------------------------------------------------
# h. the progress display


STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+)\s+loss\s+\S+\s+\S+ tok/s\s+ETA\s+\S+s")


def test_progress_plain_lines_without_a_terminal(trained):
    out = trained["stdout"]
    assert "\r" not in out and "\033[" not in out
    steps = [int(m[1]) for line in out.splitlines() if (m := STEP_LINE.match(line))]
    assert steps == list(range(10, TRAINED_STEPS + 1, 10)), steps
    assert f"done: {TRAINED_STEPS} steps" in out


def test_progress_rewrites_the_line_on_a_terminal(moecore_bin, job_data, tmp_path):
    cfg = write_config(tmp_path / "tty.toml", job_data, tmp_path / "run",
                       train={"max_steps": 12, "log_every": 6, "eval_every": 0})
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(moecore_bin), "train", str(cfg)], stdout=slave, stderr=slave,
                            stdin=subprocess.DEVNULL, close_fds=True, env=ENV)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=10)
    text = b"".join(chunks).decode(errors="replace")
    assert rc == 0, text
    rewrites = re.findall(r"\r(?:\x1b\[K)?step\s+(\d+)/12", text)
    assert [int(s) for s in rewrites] == list(range(1, 13)), repr(text[:2000])
    # Lines stay on screen at log steps: "step 6/12 ..." is followed by a newline.
    assert re.search(r"step\s+6/12[^\r\n]*\r?\n", text), repr(text)


# ------------------------------------------------------------------------------------------------
# i. bad input to the job: one-line error, non-zero exit, the previous checkpoint untouched


@pytest.fixture
def existing_run(moecore_bin, job_data, tmp_path):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "run.toml", job_data, out,
                       train={"max_steps": 4, "save_every": 2, "keep_last": 0, "eval_every": 0})
    train(moecore_bin, cfg)
    assert [step_of(c) for c in checkpoints(out)] == [2, 4]
    return out, cfg


def _bad_tokens(job, tmp_path, kind) -> Path:
    part = sorted(job.train.glob("*.npy"))[0]
    p = tmp_path / f"{kind}.npy"
    if kind == "truncated":
        b = part.read_bytes()
        p.write_bytes(b[: len(b) - 1001])
    elif kind == "float32":
        np.save(p, job.read_part(part).astype(np.float32))
    return p


@pytest.mark.parametrize("kind,needles", [("truncated", ("truncated",)),
                                          ("float32", ("<f4", "dtype"))])
def test_bad_token_file_keeps_run(moecore_bin, job_data, tmp_path, existing_run, kind, needles):
    out, cfg = existing_run
    before = snapshot(out)
    bad = _bad_tokens(job_data, tmp_path, kind)
    # The truncated copy is headerless and away from its meta.json: its type is declared, so the
    # error is the truncation (an undeclared one is refused before: tests/cli).
    r = train(moecore_bin, cfg, f'data.train=["{bad}"]', f"data.dtype={job_data.dtype}",
              "train.max_steps=8", resume=True, check=False)
    assert_one_line_error(r, str(bad), *needles)
    assert snapshot(out) == before, "a failed run modified its out_dir"
    # Positive control: the same resume with the good data works.
    r = train(moecore_bin, cfg, "train.max_steps=6", resume=True)
    assert "resumed from" in r.stdout and (out / "checkpoints/step_00000006").is_dir()


def test_corrupt_newest_checkpoint_falls_back_to_previous(moecore_bin, job_data, tmp_path,
                                                          existing_run):
    # checkpoint.h: --resume picks the newest checkpoint whose files all parse; a damaged one is
    # skipped, and set aside whole (the run saves step 4 again, which would replace it).
    # Resuming from step 2 then redoes steps 3-4 exactly.
    out, cfg = existing_run
    reference = {n: (out / "checkpoints/step_00000004" / n).read_bytes()
                 for n in ("model.safetensors", "optim.safetensors")}
    step2 = snapshot(out / "checkpoints/step_00000002")
    st = out / "checkpoints/step_00000004/model.safetensors"
    b = bytearray(st.read_bytes())
    b[8:12] = b"XXXX"  # the JSON header no longer parses
    st.write_bytes(bytes(b))
    damaged = snapshot(out / "checkpoints/step_00000004")
    # A resume refused after the choice (train.max_steps below step 2) moves nothing.
    r = train(moecore_bin, cfg, "train.max_steps=1", resume=True, check=False)
    assert_one_line_error(r, "past train.max_steps=1")
    assert snapshot(out / "checkpoints/step_00000004") == damaged
    assert not (out / "checkpoints/damaged-step_00000004").exists()
    with pytest.raises(Exception):
        with safe_open(str(st), "np"):
            pass
    r = train(moecore_bin, cfg, resume=True)
    assert f"resumed from {out}/checkpoints/step_00000002 (step 2)" in r.stdout, r.stdout[:400]
    assert (f"warning: skipped damaged checkpoint {out}/checkpoints/step_00000004: " in r.stdout
            and f"(kept as {out}/checkpoints/damaged-step_00000004)" in r.stdout), r.stdout[:800]
    assert snapshot(out / "checkpoints/step_00000002") == step2
    assert snapshot(out / "checkpoints/damaged-step_00000004") == damaged
    for n, data in reference.items():
        assert (out / "checkpoints/step_00000004" / n).read_bytes() == data, n
    check_complete_checkpoint(out / "checkpoints/step_00000004")


def test_non_finite_values_in_a_checkpoint_without_checksums_are_damage(moecore_bin,
                                                                         existing_run):
    # A checkpoint of the kind written before moecore wrote checksums (or by another program)
    # with a NaN in a weight: the resume trained on it (every step skipped, NaN checkpoints
    # saved, keep_last deleting the good ones). Now it is damage, skipped and set aside; step 2
    # resumes and redoes step 4 exactly.
    out, cfg = existing_run
    step4 = out / "checkpoints/step_00000004"
    reference = (step4 / "model.safetensors").read_bytes()
    (step4 / "checksums.json").unlink()
    state = json.loads((step4 / "trainer_state.json").read_text())
    del state["checksums"]
    (step4 / "trainer_state.json").write_text(json.dumps(state))
    tensors = load_file(str(step4 / "model.safetensors"))
    tensors["lm_head.weight"].reshape(-1)[3] = np.nan
    save_file(tensors, str(step4 / "model.safetensors"), metadata={"format": "pt"})
    r = train(moecore_bin, cfg, resume=True)
    assert f"resumed from {out}/checkpoints/step_00000002 (step 2)" in r.stdout, r.stdout[:400]
    assert (f"warning: skipped damaged checkpoint {step4}: " in r.stdout and
            "tensor 'lm_head.weight' holds nan at element 3" in r.stdout), r.stdout[:800]
    assert (step4 / "model.safetensors").read_bytes() == reference
    assert (out / "checkpoints/damaged-step_00000004/model.safetensors").exists()


def test_eval_and_generate_check_the_checkpoints_bytes(moecore_bin, job_data, existing_run):
    # As a resume does: a value changed inside a weight file (a failing disk) is an error naming
    # the file, not a loss or a text computed from it.
    out, _ = existing_run
    step4 = out / "checkpoints/step_00000004"
    data = bytearray((step4 / "model.safetensors").read_bytes())
    data[-4] ^= 0x01
    (step4 / "model.safetensors").write_bytes(bytes(data))
    for args in (["eval", "--checkpoint", step4, "--data", job_data.val],
                 ["generate", "--checkpoint", step4, "--prompt", "The lord"]):
        r = run(moecore_bin, *args, check=False)
        assert_one_line_error(r, f"{step4}/model.safetensors: its CRC-32C is")


def test_generate_draws_only_the_tokenizers_ids(moecore_bin, job_data, tmp_path):
    # A vocabulary padded past the tokenizer's (as models round it up): the ids above it have no
    # text, so sampling never draws them (a hot temperature drew them and decode failed); a
    # tokenizer larger than the model's vocabulary is not its tokenizer.
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "run.toml", job_data, out,
                       train={"max_steps": 1, "eval_every": 0, "sample_tokens": 0})
    train(moecore_bin, cfg, f"model.vocab_size={job_data.vocab_size + 200}")
    ckpt = checkpoints(out)[-1]
    for seed in range(5):
        generate(moecore_bin, ckpt, "The lord", "--temperature", "5", "--seed", str(seed),
                 "--max-tokens", "64")
    # The run's tokenizer with added tokens past the model's (padded) vocabulary.
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    size = job_data.vocab_size
    tok["added_tokens"] = tok.get("added_tokens", []) + [
        {"id": size + i, "content": f"<extra_{i}>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for i in range(205)]
    bigger = tmp_path / "bigger.json"
    bigger.write_text(json.dumps(tok))
    r = run(moecore_bin, "generate", "--checkpoint", ckpt, "--prompt", "The lord", "--tokenizer",
            bigger, check=False)
    assert_one_line_error(r, f"the tokenizer has {size + 205} tokens but the model's vocab_size "
                             f"is {size + 200}")


def test_resume_with_every_checkpoint_damaged_is_an_error(moecore_bin, job_data, tmp_path,
                                                          existing_run):
    # With checkpoints present but none valid, --resume must not silently start over (and then
    # overwrite the damaged checkpoints); it must stop and name the problem.
    out, cfg = existing_run
    for c in checkpoints(out):
        (c / "optim.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    before = snapshot(out)
    r = train(moecore_bin, cfg, resume=True, check=False)
    assert_one_line_error(r, "checkpoint")
    assert snapshot(out / "checkpoints") == {k[len("checkpoints/"):]: v for k, v in before.items()
                                             if k.startswith("checkpoints/")}


def test_resume_with_another_architecture_is_an_error(moecore_bin, existing_run):
    out, cfg = existing_run
    before = snapshot(out / "checkpoints")
    r = train(moecore_bin, cfg, "model.hidden_size=64", resume=True, check=False)
    assert_one_line_error(r, "another architecture", "hidden_size")
    assert snapshot(out / "checkpoints") == before


def test_resume_with_another_seed_is_an_error(moecore_bin, existing_run):
    out, cfg = existing_run
    before = snapshot(out / "checkpoints")
    r = train(moecore_bin, cfg, "train.seed=5", resume=True, check=False)
    assert_one_line_error(r, "train.seed")
    assert snapshot(out / "checkpoints") == before


def test_failed_resume_keeps_the_run_config(moecore_bin, existing_run):
    # A resume that fails (here: another architecture) must not rewrite <out_dir>/config.toml with
    # the configuration that was just rejected.
    out, cfg = existing_run
    before = snapshot(out)
    r = train(moecore_bin, cfg, "model.hidden_size=64", resume=True, check=False)
    assert_one_line_error(r, "another architecture")
    changed = sorted(k for k in set(before) | set(snapshot(out))
                     if before.get(k) != snapshot(out).get(k))
    assert not changed, f"a failed resume modified {changed}"


def test_out_dir_under_a_regular_file_is_an_error(moecore_bin, job_data, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    out = blocker / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, train={"max_steps": 2})
    r = train(moecore_bin, cfg, check=False)
    assert_one_line_error(r, str(out))
    assert blocker.read_text() == "not a directory\n"


def test_disk_full_during_save(moecore_bin, job_data, tmp_path):
    settings = dict(train={"max_steps": 6, "save_every": 2, "keep_last": 0, "eval_every": 0})
    ref = tmp_path / "ref"
    train(moecore_bin, write_config(tmp_path / "ref.toml", job_data, ref, **settings))
    out = tmp_path / "full"
    cfg = write_config(tmp_path / "full.toml", job_data, out, **settings)
    r = train(moecore_bin, cfg, env_extra={"MOECORE_FAULT_WRITE_BYTES": "1000"}, check=False)
    err = assert_one_line_error(r, "No space left on device")
    assert re.search(r"'[^']*checkpoints/[^']+'", err), f"error names no checkpoint path: {err}"
    assert [step_of(c) for c in checkpoints(out)] == [2], checkpoints(out)
    # Byte-identical to the uninterrupted run's step 2 (config.toml names its own out_dir, and so
    # checksums.json has another CRC for it; the resume below checks them all).
    saved = snapshot(out / "checkpoints/step_00000002")
    expected = snapshot(ref / "checkpoints/step_00000002")
    expected["config.toml"] = expected["config.toml"].replace(str(ref).encode(), str(out).encode())
    assert set(saved) == set(expected)
    del saved["checksums.json"], expected["checksums.json"]
    assert saved == expected
    assert temp_leftovers(out) == [], temp_leftovers(out)
    # The run then resumes from the surviving checkpoint and ends where the uninterrupted one did.
    r = train(moecore_bin, cfg, resume=True)
    assert "(step 2)" in r.stdout.splitlines()[0]
    for n in ("model.safetensors", "optim.safetensors"):
        assert (out / "checkpoints/step_00000006" / n).read_bytes() == \
            (ref / "checkpoints/step_00000006" / n).read_bytes(), n


def test_second_run_into_a_run_with_checkpoints_needs_resume(moecore_bin, existing_run):
    out, cfg = existing_run
    before = snapshot(out)
    r = train(moecore_bin, cfg, check=False)
    assert_one_line_error(r, "--resume", str(out))
    assert snapshot(out) == before


def test_a_run_without_checkpoints_saves_nothing(moecore_bin, job_data, tmp_path):
    """train.checkpoint = false (benchmarks of models whose saves would dominate): the run trains
    and evaluates but writes no checkpoint, not even at the end, and so prints no sample; asking
    for periodic saves as well is a contradiction, refused in one line before anything is written."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "nockpt.toml", job_data, out,
                       train={"max_steps": 4, "log_every": 1, "eval_every": 2, "checkpoint": False,
                              "sample_tokens": 8})
    r = train(moecore_bin, cfg)
    assert "done: 4 steps" in r.stdout and "val loss" in r.stdout
    assert checkpoints(out) == [] and "sample:" not in r.stdout and "checkpoint " not in r.stdout
    assert sorted(train_rows(out)) == [1, 2, 3, 4]
    # A second run on the directory would replace the first's logged steps: refused without
    # --resume, and the directory stays as it was.
    before = snapshot(out)
    r = train(moecore_bin, cfg, check=False)
    assert_one_line_error(r, str(out), "already holds a run without checkpoints", "--resume")
    assert snapshot(out) == before
    bad = tmp_path / "bad"
    r = train(moecore_bin, cfg, f"train.out_dir={bad}", "train.save_every=2", check=False)
    assert_one_line_error(r, "train.save_every=2 with train.checkpoint=false")
    assert not bad.exists()
