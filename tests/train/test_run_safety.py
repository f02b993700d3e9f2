"""Never lose or mix a run (issue 13): the run-directory lock, the resume policy, and checkpoints
that the trainer must leave alone. Tiny model, few steps: the whole file runs in about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from test_training_job import (ENV, assert_one_line_error, check_complete_checkpoint, checkpoints,
                               snapshot, step_of, temp_leftovers, train, train_rows, wait_for_logged_steps,
                               write_config)

STEPS = 4
RACES = 20
# Constant schedule: a run stopped at step 2 and resumed to 4 is byte-identical to a straight run.
SETTINGS = dict(optim={"schedule": "constant", "warmup_steps": 0},
                train={"max_steps": STEPS, "save_every": 2, "keep_last": 0, "log_every": 1,
                       "eval_every": 0, "threads": 1})


def start_together(cmds: list[list], logs: list[Path], gate: Path) -> list[subprocess.Popen]:
    """Starts every command at the same instant: each waits in a shell, before exec, to open a
    FIFO for reading, which blocks until the parent opens it for writing; then all go at once."""
    os.mkfifo(gate)
    procs = [subprocess.Popen(["sh", "-c", 'read _ < "$0"; exec "$@"', str(gate),
                               *[str(c) for c in cmd]],
                              stdout=open(log, "w"), stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=ENV, text=True)
             for cmd, log in zip(cmds, logs)]
    time.sleep(0.2)  # both shells are blocked in open() by now (a late one only starts later)
    with open(gate, "w") as release:
        release.write("go\n" * len(cmds))
    return procs


@pytest.fixture(scope="module")
def straight(moecore_bin, job_data, tmp_path_factory) -> Path:
    """The uninterrupted run every winner must reproduce byte for byte."""
    root = tmp_path_factory.mktemp("straight")
    out = root / "run"
    train(moecore_bin, write_config(root / "c.toml", job_data, out, **SETTINGS))
    return out


@pytest.fixture(scope="module")
def half_run(moecore_bin, job_data, tmp_path_factory) -> Path:
    """A run stopped at step 2 (its checkpoint), for the --resume races."""
    root = tmp_path_factory.mktemp("half")
    out = root / "run"
    train(moecore_bin, write_config(root / "c.toml", job_data, out, **SETTINGS),
          "train.max_steps=2")
    return out


def test_two_trainers_started_at_once_one_runs_one_is_refused(moecore_bin, job_data, tmp_path,
                                                             straight, half_run):
    host = socket.gethostname()
    final = f"checkpoints/step_{STEPS:08d}"
    for i in range(RACES):
        resume = i % 2 == 1  # every other race: two --resume runs of one existing run
        out = tmp_path / f"race{i}"
        if resume:
            shutil.copytree(half_run, out)
        cfg = write_config(tmp_path / f"race{i}.toml", job_data, out, **SETTINGS)
        cmd = [moecore_bin, "train", cfg] + (["--resume"] if resume else [])
        procs = start_together([cmd, cmd], [tmp_path / f"race{i}.{k}.log" for k in (0, 1)],
                               tmp_path / f"race{i}.gate")
        results = []
        for p in procs:
            _, err = p.communicate(timeout=120)
            results.append((p.pid, p.returncode, err))
        ok = [r for r in results if r[1] == 0]
        refused = [r for r in results if r[1] != 0]
        diag = f"race {i} ({'resume' if resume else 'fresh'}): {results}"
        assert len(ok) == 1 and len(refused) == 1, diag
        winner_pid, loser = ok[0][0], refused[0]
        r = subprocess.CompletedProcess(cmd, loser[1], "", loser[2])
        assert_one_line_error(r, "is in use by another run", f"pid {winner_pid} on host {host}",
                              str(out))
        # Nothing lost, nothing mixed: the winner's run equals the uninterrupted one.
        assert [step_of(c) for c in checkpoints(out)] == [2, STEPS], diag
        check_complete_checkpoint(out / final)
        for name in ("model.safetensors", "optim.safetensors"):
            assert (out / final / name).read_bytes() == (straight / final / name).read_bytes(), \
                f"{name} differs from the uninterrupted run: {diag}"
        assert sorted(train_rows(out)) == list(range(1, STEPS + 1)), diag
        assert temp_leftovers(out) == [], diag
        assert (out / ".moecore.lock").read_text() == "", "the lock file keeps a holder"


def test_lock_names_the_holder_while_a_run_is_going(moecore_bin, job_data, tmp_path):
    out = tmp_path / "run"
    lock = out / ".moecore.lock"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=SETTINGS["optim"], train={**SETTINGS["train"], "max_steps": 100000})
    with open(tmp_path / "long.log", "w") as log:
        proc = subprocess.Popen([str(moecore_bin), "train", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
        try:
            deadline = time.monotonic() + 60
            while not (lock.is_file() and lock.read_text().strip()):
                assert proc.poll() is None and time.monotonic() < deadline, "no lock taken"
                time.sleep(0.05)
            assert lock.read_text().strip() == f"pid {proc.pid} on host {socket.gethostname()}"
            r = train(moecore_bin, cfg, resume=True, check=False)
            assert_one_line_error(r, "is in use by another run", f"pid {proc.pid}")
            assert proc.poll() is None, "the refused run stopped the running one"
        finally:
            proc.kill()
            proc.wait()
    # SIGKILLed: the kernel released the lock; a new run takes it (here it resumes or, killed
    # before its first save, finds nothing to resume and says so).
    r = train(moecore_bin, cfg, "train.max_steps=2", resume=True, check=False)
    assert "is in use" not in r.stderr, r.stderr


def test_run_directory_deleted_under_the_run_stops_it(moecore_bin, job_data, tmp_path):
    """`rm -rf out_dir` while a run goes: it stops at the next step with one line, instead of
    logging into a deleted metrics.jsonl and re-creating checkpoints/ without the run's lock, where
    a second run could start and overwrite its saves."""
    out = tmp_path / "run"
    # No periodic saves: the deletion cannot meet a checkpoint being written.
    cfg = write_config(tmp_path / "c.toml", job_data, out, optim=SETTINGS["optim"],
                       train={**SETTINGS["train"], "max_steps": 100000, "save_every": 0})
    with open(tmp_path / "long.err", "w+") as err:
        proc = subprocess.Popen([str(moecore_bin), "train", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, env=ENV)
        try:
            wait_for_logged_steps(out, 3, proc)
            assert proc.poll() is None, "the run ended before its directory was deleted"
            shutil.rmtree(out)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        r = subprocess.CompletedProcess(proc.args, proc.returncode, "", err.read())
    assert_one_line_error(r, f"train.out_dir '{out}' was deleted or replaced", "is gone")
    assert not (out / "checkpoints").exists(), "the run saved into the re-created directory"


# ------------------------------------------------------------------------------------------------
# resume policy


@pytest.fixture
def two_step_run(moecore_bin, job_data, tmp_path) -> tuple[Path, Path]:
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, **SETTINGS)
    train(moecore_bin, cfg, "train.max_steps=2")
    return out, cfg


@pytest.mark.parametrize("change,key", [
    ("optim.lr=0.01", "optim.lr: 0.003 -> 0.01"),
    ("train.seq_len=16", "train.seq_len: 32 -> 16"),
    ("train.batch_size=2", "train.batch_size: 4 -> 2"),
    ("train.microbatches=2", "train.microbatches: 1 -> 2"),
    ("train.precision=bf16", "train.precision: 'fp32' -> 'bf16'"),
    ("train.lm_head_chunk_tokens=16", "train.lm_head_chunk_tokens: 0 -> 16"),
    ("train.z_loss_multiplier=1e-05", "train.z_loss_multiplier: 0 -> 1e-05"),
    ("train.skip_rule=olmo-core", "train.skip_rule: 'moecore' -> 'olmo-core'"),
    ("train.seed=5", "train.seed: 0 -> 5"),
    ("model.router_aux_loss_coef=0.05", "model.router_aux_loss_coef: 0.01 -> 0.05"),
    ("optim.schedule=cosine", "optim.schedule: 'constant' -> 'cosine'"),
])
def test_replay_breaking_change_is_refused_unless_allowed(moecore_bin, two_step_run, change, key):
    out, cfg = two_step_run
    before = snapshot(out)
    r = train(moecore_bin, cfg, change, resume=True, check=False)
    assert_one_line_error(r, "--resume", "--allow-config-change", key)
    assert snapshot(out) == before, "a refused resume changed the run directory"
    # Allowed: each difference logged once, one line per key, and the run goes on.
    r = subprocess.run([str(moecore_bin), "train", str(cfg), "--set", change, "--resume",
                        "--allow-config-change"], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"config change on resume: {key}") == 1, r.stdout[:1500]
    assert "resumed from" in r.stdout
    final = check_complete_checkpoint(out / f"checkpoints/step_{STEPS:08d}")
    assert final["step"] == STEPS
    # A batch-size or sequence-length change moves the cursor's origin, which later resumes check.
    if change.split("=")[0] in ("train.batch_size", "train.seq_len"):
        assert final["replay_origin"]["step"] == 2, final
        r = train(moecore_bin, cfg, change, "train.max_steps=6", resume=True)
        assert "(step 4)" in r.stdout


def test_changed_training_set_under_the_same_path_is_refused_unless_allowed(moecore_bin, job_data,
                                                                            tmp_path):
    """data.train names the same directory, but its contents changed: a part added, or a part
    regenerated with other tokens of the same size. The data order is a shuffle over the instance
    count, so either would re-read some instances and skip others from the same cursor: refused
    like a replay key (the checkpoint records the training set's fingerprint), accepted with
    --allow-config-change, which logs it."""
    tokens = job_data.read_part(sorted(job_data.train.iterdir())[0])
    n = 64 * 32  # 64 instances of seq_len 32 a part
    data = tmp_path / "train"
    data.mkdir()
    (data / "part-0-00000.npy").write_bytes(np.asarray(tokens[:n]).tobytes())
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, **SETTINGS,
                       data={"train": [str(data)], "dtype": job_data.dtype})
    train(moecore_bin, cfg, "train.max_steps=2")
    # Control: the same files resume.
    assert "resumed from" in train(moecore_bin, cfg, "train.max_steps=3", resume=True).stdout
    before = snapshot(out)
    (data / "part-0-00001.npy").write_bytes(np.asarray(tokens[n:2 * n]).tobytes())
    r = train(moecore_bin, cfg, resume=True, check=False)
    assert_one_line_error(r, "--resume", "--allow-config-change",
                          "data.train's contents: 64 instances", "-> 128 instances")
    (data / "part-0-00001.npy").unlink()
    (data / "part-0-00000.npy").write_bytes(np.asarray(tokens[n:2 * n]).tobytes())  # regenerated
    r = train(moecore_bin, cfg, resume=True, check=False)
    assert_one_line_error(r, "data.train's contents: 64 instances", "-> 64 instances")
    assert snapshot(out) == before, "a refused resume changed the run directory"
    r = subprocess.run([str(moecore_bin), "train", str(cfg), "--resume", "--allow-config-change"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("config change on resume: data.train's contents") == 1, r.stdout[:1500]


def test_changed_label_mask_under_the_same_path_is_refused(moecore_bin, job_data, tmp_path):
    """data.label_mask names the same file, rewritten: other labels train from the same cursor.
    The checkpoint's fingerprint of the training set covers the sampled instances' targets when
    there are masks, so the resume is refused as a changed training set (accepted with
    --allow-config-change); the same masks resume."""
    tokens = job_data.read_part(sorted(job_data.train.iterdir())[0])
    n = 64 * 32
    data = tmp_path / "train"
    data.mkdir()
    (data / "part-0-00000.npy").write_bytes(np.asarray(tokens[:n]).tobytes())
    mask = tmp_path / "mask-0.bin"
    keep = np.arange(n) % 3 != 0
    keep.tofile(mask)
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, **SETTINGS,
                       data={"train": [str(data)], "dtype": job_data.dtype,
                             "label_mask": [str(mask)]})
    train(moecore_bin, cfg, "train.max_steps=2")
    assert "resumed from" in train(moecore_bin, cfg, "train.max_steps=3", resume=True).stdout
    before = snapshot(out)
    (~keep).tofile(mask)
    r = train(moecore_bin, cfg, resume=True, check=False)
    assert_one_line_error(r, "--resume", "--allow-config-change",
                          "data.train's contents: 64 instances", "-> 64 instances")
    assert snapshot(out) == before, "a refused resume changed the run directory"


def test_another_thread_count_resumes_with_a_note(moecore_bin, two_step_run):
    """The CPU kernels split their sums by thread: a resume on another count (train.threads, or
    the cores of another machine under threads = 0) goes on, saying that it leaves the exact
    path; the same count says nothing."""
    out, cfg = two_step_run
    note = "note: the run ran on 1 OpenMP thread(s) a rank and resumes on 2"
    assert note not in train(moecore_bin, cfg, "train.max_steps=3", resume=True).stdout
    assert note in train(moecore_bin, cfg, "train.threads=2", resume=True).stdout


def test_tampered_trainer_state_is_not_trusted(moecore_bin, two_step_run):
    out, cfg = two_step_run
    state_path = out / "checkpoints/step_00000002/trainer_state.json"
    for field, value, needle in [("step", -5, "step=-5 is out of range"),
                                 ("data_cursor", 2**63 - 1, "data_cursor=9223372036854775807"),
                                 ("data_cursor", 9, "data_cursor=9 does not match"),
                                 ("step", "2", 'step="2" must be an integer'),
                                 # control characters come back escaped, on one line
                                 ("step", "2\n\x1b[2K", "step=\"2\\n\\u001b[2K\""),
                                 ("threads", -1, "threads=-1 is out of range"),
                                 ("eval_pending", 1, "eval_pending=1 must be a boolean"),
                                 ("train_data", {"tokens": 4096, "instances": 1,
                                                 "sample_hash": "0x12"},
                                  "train_data.sample_hash=\"0x12\" must be 16 hex digits"),
                                 # more instances than the tokens fill
                                 ("train_data", {"tokens": 64, "instances": 3,
                                                 "sample_hash": "00000000000000ab"},
                                  "train_data.instances=3 of train.seq_len=32 tokens exceed")]:
        state = json.loads(state_path.read_text())
        good = state_path.read_text()
        state[field] = value
        state_path.write_text(json.dumps(state))
        r = train(moecore_bin, cfg, resume=True, check=False)
        err = assert_one_line_error(r, "trainer_state.json", needle)
        assert "json.exception" not in err, err
        state_path.write_text(good)
    assert train(moecore_bin, cfg, resume=True).returncode == 0  # control: the good state


def test_refused_or_finished_resume_prunes_nothing(moecore_bin, job_data, tmp_path):
    """keep_last prunes only once a resume has passed every start-up check: a resume refused
    (max_steps below the checkpoint) and a finished run resumed (which writes nothing) leave every
    checkpoint; a resume that trains prunes as before."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out, **SETTINGS)
    train(moecore_bin, cfg, "train.save_every=1")
    every = [step_of(c) for c in checkpoints(out)]
    assert every == list(range(1, STEPS + 1))
    before = snapshot(out)
    r = train(moecore_bin, cfg, "train.max_steps=2", "train.keep_last=1", resume=True, check=False)
    assert_one_line_error(r, f"is at step {STEPS}, past train.max_steps=2")
    assert snapshot(out) == before, "a refused resume changed the run directory"
    r = train(moecore_bin, cfg, "train.keep_last=1", resume=True)
    assert "done: nothing to train" in r.stdout
    assert [step_of(c) for c in checkpoints(out)] == every
    # Control: a resume that goes on prunes down to keep_last (the newest included).
    train(moecore_bin, cfg, f"train.max_steps={STEPS + 1}", "train.keep_last=2", resume=True)
    assert [step_of(c) for c in checkpoints(out)] == [STEPS, STEPS + 1]


def test_regular_file_named_like_a_checkpoint_is_left_alone(moecore_bin, two_step_run):
    out, cfg = two_step_run
    ckdir = out / "checkpoints"
    (ckdir / "step_00000003").write_text("my notes\n")
    (ckdir / ".tmp-step_00000007-1-staging").write_text("not moecore's\n")
    # The save of step 3 would land on the file: it refuses, naming it, and the file stays.
    r = train(moecore_bin, cfg, "train.save_every=1", resume=True, check=False)
    assert_one_line_error(r, "step_00000003 exists and is not a checkpoint directory")
    assert (ckdir / "step_00000003").read_text() == "my notes\n"
    # Saves at other steps go on around it, and start-up leaves both files alone.
    r = train(moecore_bin, cfg, resume=True)
    assert "resumed from" in r.stdout
    assert (ckdir / "step_00000003").read_text() == "my notes\n"
    assert (ckdir / ".tmp-step_00000007-1-staging").read_text() == "not moecore's\n"
    assert [step_of(c) for c in checkpoints(out)] == [2, STEPS]


def test_rank_zero_of_an_mpi_job_holds_the_lock(moecore_bin, job_data, tmp_path):
    """Under mpirun the writing rank (0) holds the lock: a second trainer on the directory is
    refused, naming rank 0, and the job goes on undisturbed and stops cleanly on SIGUSR1."""
    import signal

    from test_parallel import MPI_ENV
    out = tmp_path / "run"
    lock = out / ".moecore.lock"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       optim=SETTINGS["optim"], train={**SETTINGS["train"], "max_steps": 100000})
    with open(tmp_path / "mpi.log", "w+") as log:
        proc = subprocess.Popen(["mpirun", "-np", "2", str(moecore_bin), "train", str(cfg)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=MPI_ENV)
        try:
            deadline = time.monotonic() + 120
            while not (lock.is_file() and lock.read_text().strip()):
                assert proc.poll() is None and time.monotonic() < deadline, "no lock taken"
                time.sleep(0.05)
            holder = lock.read_text().strip()
            assert holder.startswith("pid ") and holder.endswith(f" on host {socket.gethostname()}")
            r = train(moecore_bin, cfg, resume=True, check=False)
            assert_one_line_error(r, "is in use by another run", holder)
            assert proc.poll() is None, "the refused run stopped the job"
            # A stop signal during start-up ends the process (nothing to save yet: the watcher
            # records signals only while the training loop runs); this one comes mid-training.
            wait_for_logged_steps(out, 1, proc)
            assert proc.poll() is None, "the job ended before its first step"
            os.kill(proc.pid, signal.SIGUSR1)  # mpirun forwards it to every rank
            assert proc.wait(timeout=120) == 128 + signal.SIGUSR1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert lock.read_text() == ""  # released and emptied by the holder
    # The stop saved the step it ended (besides any periodic save before it).
    saved = checkpoints(out)
    assert saved, "no checkpoint after the stop"
    state = json.loads((saved[-1] / "trainer_state.json").read_text())
    assert state["step"] == step_of(saved[-1])
