"""`moecore devices`: one line per compute device, exit 0 whatever is found.

The cpu line names the processor as /proc/cpuinfo does, the OpenMP thread count the run would use
and the bf16 GEMM path, which must follow what the CPU and oneDNN allow (DNNL_MAX_CPU_ISA=AVX2
forbids the native path). The cuda line is one of its three forms: the device's description, why
no device is usable, or that this program was built without the backend.

Binary: $MOECORE_BIN, default <repo>/build/bin/moecore. A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MOECORE_BIN", str(REPO / "build" / "bin" / "moecore")))
CUDA_FORMS = (
    r"cuda: .+ \(sm_\d+, \d+ SMs, [\d.]+ GiB; MX GEMMs (block-scaled where cuBLASLt has a "
    r"kernel, else through bf16|through bf16: no MX tensor cores)\)",
    r"cuda: unavailable \(.+\)",
    r"cuda: not in this program \(build it with the CUDA toolkit and `cmake --preset cuda`\)",
)


def run_devices(**env: str) -> list[str]:
    result = subprocess.run([str(BIN), "devices"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout.splitlines()


def cpuinfo_field(name: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return ""


def test_one_line_per_device():
    cpu, cuda = run_devices(OMP_NUM_THREADS="3")
    model = cpuinfo_field("model name") or "unknown"
    assert cpu.startswith(f"cpu: {model}, 3 threads, bf16 GEMMs "), cpu
    assert any(re.fullmatch(form, cuda) for form in CUDA_FORMS), cuda


def test_bf16_path_follows_the_cpu_and_onednn():
    native = "avx512_bf16" in cpuinfo_field("flags").split()
    cpu, _ = run_devices()
    expected = "native (oneDNN, AVX512-BF16)" if native else "emulated (fp32 on bf16-rounded inputs)"
    assert cpu.endswith(f"bf16 GEMMs {expected}"), cpu
    # oneDNN held to AVX2 has no bf16 kernels: the path must say emulated whatever the CPU has.
    cpu, _ = run_devices(DNNL_MAX_CPU_ISA="AVX2")
    assert cpu.endswith("bf16 GEMMs emulated (fp32 on bf16-rounded inputs)"), cpu


def test_train_on_a_device_it_cannot_use_is_one_line_and_writes_nothing(tmp_path):
    """`train --device cuda` where this program has no usable GPU: the cuda line's reason, in one
    line on stderr, a non-zero exit, and no run directory. The run on a device itself is shown on
    the CPU by ctest's TrainJob/TrainOnDevice.* (the guarded device)."""
    _, cuda = run_devices()
    out = tmp_path / "run"
    result = subprocess.run(
        [str(BIN), "train", str(REPO / "configs" / "default.toml"), "--device", "cuda",
         "--set", f"train.out_dir={out}", "--set", "train.max_steps=1"],
        capture_output=True, text=True, timeout=60)
    if re.fullmatch(CUDA_FORMS[0], cuda):
        pytest.skip("a usable GPU: the run is scripts/gpu_check.sh's, not this test's")
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    if cuda.startswith("cuda: unavailable"):
        assert lines[0].startswith("moecore: error: [cuda] no usable CUDA device ("), lines[0]
    else:
        assert lines[0] == ("moecore: error: [device] train.device=cuda: this moecore program has no "
                            "CUDA backend (build it with the CUDA toolkit and `cmake --preset "
                            "cuda`)"), lines[0]
    assert not out.exists()


def test_device_names_are_checked():
    for args in (["--device", "gpu"], ["--set", "train.device=tpu"]):
        result = subprocess.run([str(BIN), "train", str(REPO / "configs" / "default.toml"), *args],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert "gpu" in result.stderr or "train.device" in result.stderr, result.stderr


def test_dump_and_diff_on_a_device_it_cannot_use_are_one_line(tmp_path):
    """`moecore dump` and `diff --b-set train.device=cuda` (the CPU against the GPU) run the pass on
    train.device; where it cannot be used: one line, exit 2 (diff's bad input) or 1, no dump."""
    _, cuda = run_devices()
    if re.fullmatch(CUDA_FORMS[0], cuda):
        pytest.skip("a usable GPU: scripts/gpu_check.sh runs the comparison")
    config = str(REPO / "configs" / "default.toml")
    for args, code in ((["dump", config, "--set", "train.device=cuda", "--out", str(tmp_path / "d")], 1),
                       (["diff", config, "--b-set", "train.device=cuda"], 2)):
        result = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == code, (args, result.returncode, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert ("[cuda] no usable CUDA device (" in lines[0] if cuda.startswith("cuda: unavailable")
                else "[device] train.device=cuda: this moecore program has no CUDA backend"
                in lines[0]), lines[0]
    assert not (tmp_path / "d").exists()
