"""scripts/compare_loss_curves.py, which decides the GPU check's training runs (issue 15 item 5):
equal curves pass, each margin (step 1, a 20-step window, a validation loss) fails alone just past
its bound, and runs that logged different steps are unreadable input (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare_loss_curves.py"


def write_run(path: Path, losses: list[float], val: dict[int, float]) -> Path:
    with path.open("w") as f:
        for step, loss in enumerate(losses, start=1):
            f.write(json.dumps({"step": step, "train/loss": loss, "train/lr": 1e-3}) + "\n")
            if step in val:
                f.write(json.dumps({"step": step, "val/loss": val[step], "val/ppl": 2.0}) + "\n")
    return path


def compare(cpu: Path, gpu: Path, precision: str = "fp32") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(cpu), str(gpu), "--precision",
                           precision], capture_output=True, text=True, timeout=60)


CPU_LOSSES = [8.0 - 0.01 * s for s in range(200)]
CPU_VAL = {50: 7.6, 100: 7.1, 150: 6.6, 200: 6.1}


def test_equal_curves_pass_with_a_row_per_window(tmp_path):
    cpu = write_run(tmp_path / "cpu.jsonl", CPU_LOSSES, CPU_VAL)
    r = compare(cpu, cpu)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("| train loss, mean of steps") == 10
    assert r.stdout.count("| val loss, step") == 4 and "BEYOND" not in r.stdout


def test_each_margin_fails_alone(tmp_path):
    cpu = write_run(tmp_path / "cpu.jsonl", CPU_LOSSES, CPU_VAL)
    # Step 1 off by 2e-5 relative: beyond fp32's 1e-5, within bf16's 1e-3.
    first = list(CPU_LOSSES)
    first[0] *= 1 + 2e-5
    gpu = write_run(tmp_path / "first.jsonl", first, CPU_VAL)
    assert compare(cpu, gpu, "fp32").returncode == 1
    assert compare(cpu, gpu, "bf16").returncode == 0
    # One window's mean off by 1.5e-2 relative (every step of steps 41-60).
    window = [x * 1.015 if 40 <= i < 60 else x for i, x in enumerate(CPU_LOSSES)]
    r = compare(cpu, write_run(tmp_path / "window.jsonl", window, CPU_VAL), "bf16")
    assert r.returncode == 1 and r.stdout.count("BEYOND") == 1, r.stdout
    assert "mean of steps 41-60" in [l for l in r.stdout.splitlines() if "BEYOND" in l][0]
    # A validation loss off by 2e-2, then within 5e-3.
    for factor, code in ((1.02, 1), (1.005, 0)):
        val = {**CPU_VAL, 150: CPU_VAL[150] * factor}
        assert compare(cpu, write_run(tmp_path / "val.jsonl", CPU_LOSSES, val)).returncode == code


def test_runs_of_other_steps_are_unreadable_input(tmp_path):
    cpu = write_run(tmp_path / "cpu.jsonl", CPU_LOSSES, CPU_VAL)
    short = write_run(tmp_path / "short.jsonl", CPU_LOSSES[:150], {50: 7.6})
    r = compare(cpu, short)
    assert r.returncode == 2 and "different steps" in r.stderr
    r = compare(cpu, tmp_path / "missing.jsonl")
    assert r.returncode == 2 and "cannot read" in r.stderr
