"""The moecore program on the emulated GPU (issue 15 items 3-5 rehearsed): `moecore_cuda_sim`.

moecore_cuda_sim is the `moecore` program built against cudasim (tests/cuda_sim,
cmake/cuda_sim.cmake) instead of the CUDA toolkit, so `--device cuda` runs the CUDA backend's
kernels, its host code and NCCL's communicator on the CPU. These tests run the steps of
scripts/gpu_check.sh that need the program (not the test binaries, which ctest's CudaSim.*
entries run) on small models, against the CPU program (MOECORE_BIN):
- `devices` names the emulated sm_90 GPU and its MX GEMM path (Hopper's: through bf16), and with
  CUDASIM_ARCH=sm_100 an emulated Blackwell's (block-scaled);
- `diff --b-set train.device=cuda`: one batch's forward and backward, every activation and
  gradient, CPU against GPU, within diff's default threshold for the precision: max(4 u, 2^-18),
  u the precision's unit roundoff, and for mxfp8 bf16's (the MX GEMMs' products are exact on
  both devices; the recipe's bf16 parts set the difference). Measured with oneDNN's AVX2, AVX-512
  and AMX kernels on the CPU's side (DNNL_MAX_CPU_ISA): the small model's worst tensor at 5.7e-7
  in fp32 (threshold 3.8e-6) and 6.2e-4 in bf16 and mxfp8 (threshold 1.6e-2); the wide model
  (hidden 256, head dimension 64, 128 positions: the default run's attention shape) at 1.3e-6 in
  fp32. A
  routing flip parts two runs at a top-k choice, as it should: the small model's batch has its
  second and third router scores at least 6.2e-5 apart against CPU-GPU score differences of at
  most 6e-8, so no device flips a route there. The wide model's bf16 margin is 1.6 times its
  difference, so it runs in fp32 only (the default model does flip 3 of 512 bf16 routes at its
  third layer, which is why scripts/gpu_check.sh reports its diffs rather than failing on them).
  The mxfp8 runs carry a shared expert (32 wide), an MX module in the recipe.
  On an emulated Blackwell (CUDASIM_ARCH=sm_100) mxfp8 again, its MX GEMMs on cuBLASLt's
  block-scaled path (which must have run), and with every GEMM that can in MXFP8;
- `train --device cuda` in fp32, in bf16 with every step a CUDA graph, and in mxfp8, each loss
  curve held against the CPU's by scripts/compare_loss_curves.py, the GPU check's own gate
  (margins stated there); in fp32 every logged step too, within its step-1 bound 1e-5 (summation
  order alone: the curves measure about 1e-8 apart here);
- the job's groups on NCCL's communicator (parallel.communicator = "nccl"), named in the start-up
  line.
The emulated GPU is about a hundred times slower than the CPU on this model: the runs are short.
The program sits beside MOECORE_BIN (build/bin/moecore_cuda_sim); a missing one is a failure.
"""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_training_job import ENV, metrics_rows, run, write_config

STEPS = 4
COMPARE = Path(__file__).resolve().parents[2] / "scripts" / "compare_loss_curves.py"
FP32_STEP_BOUND = 1e-5


@pytest.fixture(scope="module")
def sim_bin(moecore_bin) -> Path:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"cudasim runs on x86-64 only (its fibers), not {platform.machine()}")
    path = moecore_bin.parent / "moecore_cuda_sim"
    assert path.is_file(), (f"{path} not found: the emulated GPU's program is built with the "
                            "tests on x86-64 (cmake/cuda_sim.cmake; make build-tests)")
    return path


@pytest.fixture(scope="module")
def config(job_data, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cuda_sim")
    return write_config(tmp / "c.toml", job_data, tmp / "out", model={"first_k_dense_replace": 1},
                        train={"max_steps": STEPS, "batch_size": 4, "seq_len": 16,
                               "log_every": 1, "eval_every": STEPS, "eval_batches": 1,
                               "sample_tokens": 4})


def test_devices_names_the_emulated_gpu(sim_bin):
    lines = run(sim_bin, "devices").stdout.splitlines()
    assert re.fullmatch(r"cuda: cudasim .*\(sm_90, \d+ SMs, [\d.]+ GiB; MX GEMMs through bf16: no "
                        r"MX tensor cores\)", lines[1]), lines
    lines = run(sim_bin, "devices", env_extra={"CUDASIM_ARCH": "sm_100"}).stdout.splitlines()
    assert re.fullmatch(r"cuda: cudasim .*\(sm_100, \d+ SMs, [\d.]+ GiB; MX GEMMs block-scaled "
                        r"where cuBLASLt has a kernel, else through bf16\)", lines[1]), lines


@pytest.fixture(scope="module")
def wide_config(job_data, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cuda_sim_wide")
    return write_config(tmp / "c.toml", job_data, tmp / "out",
                        model={"first_k_dense_replace": 1, "hidden_size": 256,
                               "intermediate_size": 256, "moe_intermediate_size": 128},
                        train={"batch_size": 1, "seq_len": 128})


@pytest.mark.parametrize("model,precision,arch", [
    ("small", "fp32", "sm_90"), ("small", "bf16", "sm_90"), ("small", "mxfp8", "sm_90"),
    ("wide", "fp32", "sm_90"), ("small", "mxfp8", "sm_100"), ("small", "mxfp8_all", "sm_100")])
def test_one_batch_on_the_gpu_matches_the_cpu_tensor_for_tensor(sim_bin, config, wide_config,
                                                                 model, precision, arch):
    mx = precision.startswith("mxfp8")
    sets = ["--set", f"train.precision={'mxfp8' if mx else precision}"]
    if mx:  # a shared expert, which the recipe runs as an expert (MX forward and input gradient)
        sets += ["--set", "model.shared_expert_intermediate_size=32"]
    if precision == "mxfp8_all":  # every GEMM that can: dense linears and experts' wgrad too
        sets += ["--set", "train.mxfp8_dense=true", "--set", "train.mxfp8_expert_wgrad=true"]
    r = run(sim_bin, "diff", config if model == "small" else wide_config, *sets, "--b-set",
            "train.device=cuda", "--json", check=False, env_extra={"CUDASIM_ARCH": arch})
    assert r.returncode in (0, 1), r.stderr
    if arch == "sm_100":  # Blackwell: the MX GEMMs ran on cuBLASLt's block-scaled path
        ran = re.search(r"cudasim: (\d+) block-scaled GEMMs ran", r.stderr)
        assert ran and int(ran.group(1)) > 0, r.stderr
    report = json.loads(r.stdout)
    assert report["a"]["run"]["backend"] == "cpu" and report["b"]["run"]["backend"] == "cuda"
    assert report["same_weights"]
    # Every activation of both layers (one dense, one MoE) and every parameter's gradient.
    names = {t["name"] for t in report["tensors"]}
    if mx:
        assert "grad.model.layers.1.mlp.shared_expert.gate_proj.weight" in names
    assert {"model.layers.1.mlp.experts", "lm_head", "grad.model.layers.1.mlp.gate.weight",
            "grad.model.layers.1.mlp.experts.3.down_proj.weight",
            "grad.model.embed_tokens.weight"} <= names
    # JSON's null is an infinite error.
    worst = max(report["tensors"], key=lambda t: float("inf") if t["normalised_error"] is None
                else t["normalised_error"])
    if mx:
        # CPU and GPU in one MX recipe: diff's default holds them to bf16's threshold, 4 x 2^-8
        # (their MX GEMMs' products are exact on both and only the sums' order may differ, so
        # they part by what the recipe's bf16 parts part by: src/cli/tensor_diff.cpp derives it).
        assert report["threshold"] == 4 * 2.0 ** -8, report["threshold_rule"]
        assert "one mxfp8 recipe" in report["threshold_rule"], report["threshold_rule"]
    assert not report["parted"], (f"{precision}: first parted {report['first_parted']}; "
                                  f"threshold {report['threshold_rule']}")
    assert worst["normalised_error"] <= report["threshold"], worst


@pytest.mark.parametrize("run_name", ["fp32", "bf16_graph", "mxfp8", "bf16_one_launch",
                                      "mxfp8_one_launch"])
def test_training_on_the_gpu_follows_the_cpu_curve(moecore_bin, sim_bin, config, tmp_path,
                                                   run_name):
    precision = run_name.removesuffix("_graph").removesuffix("_one_launch")
    sets = ["--set", f"train.precision={precision}"]
    run(moecore_bin, "train", config, *sets, "--set", f"train.out_dir={tmp_path / 'cpu'}")
    if run_name.endswith("_graph"):
        sets += ["--set", "train.cuda_graph=true"]
    one_launch = run_name.endswith("_one_launch")
    if one_launch:
        sets += ["--set", "train.cuda_grouped_gemm=one_launch"]
    gpu = run(sim_bin, "train", config, "--device", "cuda", *sets, "--set",
              f"train.out_dir={tmp_path / 'gpu'}", "--set", "train.profile=true", timeout=120)
    assert re.search(r"^moecore train: .* on cuda cudasim ", gpu.stdout, re.M), gpu.stdout[:500]
    assert re.search(r"^sample: ", gpu.stdout, re.M), gpu.stdout[-500:]
    assert (tmp_path / "gpu" / "profile.json").is_file()
    compared = subprocess.run(
        [sys.executable, str(COMPARE), str(tmp_path / "cpu" / "metrics.jsonl"),
         str(tmp_path / "gpu" / "metrics.jsonl"), "--precision", precision],
        capture_output=True, text=True, timeout=30, env=ENV)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    # The experts' GEMMs read their offsets back to the host, but in one launch each (as in a
    # captured step, whose steps the profile does not see).
    expert_reads = [r for r in json.loads((tmp_path / "gpu" / "profile.json").read_text())
                    ["host_reads"] if r["phase"].startswith("experts_")]
    if one_launch:
        assert "(the routed experts' in one launch each, offsets on the device)" in gpu.stdout
        assert not expert_reads, expert_reads
    elif not run_name.endswith("_graph"):
        assert expert_reads, "the per-expert GEMMs' reads of the offsets are not in the profile"
    if run_name.endswith("_graph"):
        # Step 1 runs eagerly, 2 is captured, 3 and 4 replay it.
        replayed = re.search(r"^cuda_graph: (\d+) steps replayed", gpu.stdout, re.M)
        assert replayed and int(replayed.group(1)) == STEPS - 2, gpu.stdout[-800:]
    if precision == "fp32":
        cpu_losses = [row["train/loss"] for row in metrics_rows(tmp_path / "cpu")
                      if "train/loss" in row]
        gpu_losses = [row["train/loss"] for row in metrics_rows(tmp_path / "gpu")
                      if "train/loss" in row]
        assert len(cpu_losses) == len(gpu_losses) == STEPS
        for step, (c, g) in enumerate(zip(cpu_losses, gpu_losses), start=1):
            assert abs(c - g) <= FP32_STEP_BOUND * abs(c), (step, c, g)


def test_the_jobs_groups_run_on_nccls_communicator(sim_bin, config, tmp_path):
    r = run(sim_bin, "train", config, "--device", "cuda", "--set", "train.max_steps=2", "--set",
            "train.eval_every=0", "--set", "parallel.communicator=nccl", "--set",
            f"train.out_dir={tmp_path / 'out'}", timeout=120)
    assert "parallel: 1 rank; communicator nccl" in r.stdout, r.stdout[:800]
    assert re.search(r"^done: 2 steps", r.stdout, re.M), r.stdout[-500:]


def test_a_batch_size_schedule_trains_on_the_gpu_as_on_the_cpu(moecore_bin, sim_bin, config,
                                                                 tmp_path):
    """train.batch_sizes on the device: the batch grows from 4 to 8 sequences before update 2 and
    falls to 2 before update 4 (2, 4 and 1 micro-batches of 2), each update's batch, tokens and
    rate as the CPU's exactly, its loss within the fp32 step bound."""
    sets = ["--set", "train.microbatches=2", "--set", "train.batch_sizes=[4, 8, 2]", "--set",
            "train.batch_size_starts=[0, 1, 3]"]
    run(moecore_bin, "train", config, *sets, "--set", f"train.out_dir={tmp_path / 'cpu'}")
    gpu = run(sim_bin, "train", config, "--device", "cuda", *sets, "--set",
              f"train.out_dir={tmp_path / 'gpu'}", timeout=120)
    assert "batch size: 8 -> 2 sequences (1 micro-batch(es) of 2) before update 4" in gpu.stdout
    cpu_rows = [r for r in metrics_rows(tmp_path / "cpu") if "train/loss" in r]
    gpu_rows = [r for r in metrics_rows(tmp_path / "gpu") if "train/loss" in r]
    schedule = ("train/batch_size", "train/tokens_seen", "train/lr")
    assert [[r[k] for k in schedule] for r in gpu_rows] == \
        [[r[k] for k in schedule] for r in cpu_rows]
    assert [r["train/batch_size"] for r in cpu_rows] == [4, 8, 8, 2]
    for step, (c, g) in enumerate(zip(cpu_rows, gpu_rows), start=1):
        assert abs(c["train/loss"] - g["train/loss"]) <= FP32_STEP_BOUND * abs(c["train/loss"]), \
            (step, c["train/loss"], g["train/loss"])
