"""bench/gpu_peer.py (the transformers peer of issue 15 items 5-6) on the CPU with a tiny config:
the runs it makes, the JSON and markdown it writes, and the expert counts it sets keeping the active
parameters fixed (bench/expert_scaling.py's rule), checked against counts computed here from the
config alone. The GPU runs the same script with --device cuda (scripts/gpu_check.sh); this test
needs neither a GPU nor the C++ build (only the FLOP cross-check and moecore's side below use
$MOECORE_BIN, and skip without it).

Run: OMP_WAIT_POLICY=PASSIVE /opt/moecore/venv/bin/python -m pytest -q tests/cli/test_gpu_peer.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_peer.py"
BIN = Path(os.environ.get("MOECORE_BIN", str(REPO / "build" / "bin" / "moecore")))

# bench/configs/gpu.toml's model shrunk to milliseconds a step: the same keys and structure.
D, LAYERS, HEADS, K, WIDTH, VOCAB, BATCH, SEQ = 64, 2, 4, 4, 32, 512, 4, 32
TINY = f"""
[model]
vocab_size = {VOCAB}
hidden_size = {D}
num_hidden_layers = {LAYERS}
num_attention_heads = {HEADS}
num_key_value_heads = {HEADS}
rope_theta = 10000.0
rms_norm_eps = 1e-5
tie_word_embeddings = false
num_experts = 8
num_experts_per_tok = {K}
moe_intermediate_size = {WIDTH}
intermediate_size = 256
first_k_dense_replace = 0
shared_expert_intermediate_size = 0
norm_topk_prob = false
router_aux_loss_coef = 0.01
router_z_loss_coef = 0.0
qk_norm = "full"
router_score = "softmax"
lb_loss_style = "hf"
routing = "learned"

[optim]
lr = 3e-4
warmup_steps = 1

[train]
seed = 0
batch_size = {BATCH}
seq_len = {SEQ}

[data]
train = []
"""


def expected_counts(experts: int) -> dict:
    """Parameters from the config, independently of the script and transformers: embedding and LM
    head V x d each; per layer q, k, v, o (d x d, MHA), the full QK-norm gains (2 d), two RMSNorm
    gains (2 d), the router E x d and E experts of 3 x d x H; the final norm d."""
    per_expert = 3 * D * WIDTH
    per_layer_dense = 4 * D * D + 2 * D + 2 * D
    router = LAYERS * experts * D
    total = 2 * VOCAB * D + D + LAYERS * per_layer_dense + router + LAYERS * experts * per_expert
    active = total - LAYERS * experts * per_expert + LAYERS * K * per_expert
    return {"total": total, "active": active, "router": router}


def run_script(out: Path, config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--config", str(config),
                           "--threads", "1", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=240, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_peer")
    config = tmp / "tiny.toml"
    config.write_text(TINY)
    # A results file as bench/cuda/gemm.cpp --json writes it: the MFU's peak comes from its case
    # named "peak: ...".
    gemm = tmp / "cuda_gemm.json"
    gemm.write_text(json.dumps({"device": "test device", "cases": [
        {"name": "peak: cuBLASLt bf16 8192^3 (bf16 operands)", "ms": 1.0, "tflops": 0.01},
        {"name": "matmul op bf16: 16384 x 2048 -> 2048", "ms": 1.0, "tflops": 0.005}]}))
    out = tmp / "results"
    r = run_script(out, config, "--experts", "8,32", "--modes", "eager", "--steps", "3",
                   "--warmup", "1", "--gemm-json", str(gemm))
    assert r.returncode == 0, r.stderr[-2000:]
    return {"out": out, "stdout": r.stdout, "config": config,
            "data": json.loads((out / "gpu_peer.json").read_text()),
            "md": (out / "gpu_peer.md").read_text()}


def test_runs_and_results(peer_run):
    data = peer_run["data"]
    assert f"wrote {peer_run['out'] / 'gpu_peer.json'}" in peer_run["stdout"]
    assert data["meta"]["experts"] == [8, 32] and data["meta"]["modes"] == ["eager"]
    assert data["meta"]["tokens_per_step"] == BATCH * SEQ
    assert data["peak"]["tflops"] == pytest.approx(0.01)
    assert [(r["mode"], r["experts"], r["status"]) for r in data["runs"]] == [
        ("eager", 8, "ok"), ("eager", 32, "ok")]
    for run in data["runs"]:
        assert run["device"] == "cpu" and run["data"] == "synthetic"
        assert run["precision"] == "bf16" and run["threads"] == 1
        assert len(run["step_s"]) == 3 and run["step_s_timed"]["n"] == 2
        assert run["tokens_per_s_median"] > 0 and run["tokens_per_s"] > 0
        assert all(l == l and 0 < l < 20 for l in run["losses"])  # finite, about ln(512) = 6.2
    rows = {r["experts"]: r for r in data["results"]}
    for e, row in rows.items():
        assert row["status"] == "ok"
        assert row["tokens_per_s"]["median"] > 0 and row["step_ms_median"] > 0
        # MFU against the given peak: tokens/s x FLOPs per token / 0.01 TFLOP/s.
        assert row["mfu"] == pytest.approx(row["tokens_per_s"]["median"] * row["flops_per_token"] / 1e10)
    assert "eager" in data["throughput_change"]


def test_fixed_active_parameters(peer_run):
    """Total parameters grow with the experts; the active ones stay, but for the router."""
    rows = {r["experts"]: r for r in peer_run["data"]["results"]}
    for e in (8, 32):
        want = expected_counts(e)
        assert rows[e]["parameters"] == want["total"]
        assert rows[e]["parameters_active"] == want["active"]
        assert rows[e]["parameters_router"] == want["router"]
    assert rows[32]["parameters"] > 3 * rows[8]["parameters"] // 2
    assert (rows[8]["parameters_active"] - rows[8]["parameters_router"]
            == rows[32]["parameters_active"] - rows[32]["parameters_router"])
    # FLOPs per token by model/flop_count.cpp's count: the same but for the router's 6 d E.
    assert rows[32]["flops_per_token"] - rows[8]["flops_per_token"] == pytest.approx(
        LAYERS * 6.0 * D * (32 - 8))


def test_markdown(peer_run):
    md = peer_run["md"]
    assert md.startswith("# transformers peer on the GPU")
    assert "| mode | experts | params | active | FLOPs/token | tokens/s | step ms |" in md
    table = [l for l in md.splitlines() if l.startswith("| eager |")]
    assert [l.split("|")[2].strip() for l in table] == ["8", "32"]
    assert all(l.rstrip().endswith("| ok |") for l in table)
    assert "/ 0.01 TFLOP/s (cuda_gemm.json: peak: cuBLASLt bf16 8192^3" in md
    assert "tokens/s change 8 -> 32 experts" in md
    assert "## Discussion" in md


def test_budget_skips_what_does_not_fit(tmp_path, peer_run):
    """With no time left no run starts: each is recorded as skipped and the results still written."""
    out = tmp_path / "results"
    r = run_script(out, peer_run["config"], "--experts", "8,32", "--modes", "eager,compile",
                   "--steps", "2", "--warmup", "1", "--budget-s", "1", "--min-run-s", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((out / "gpu_peer.json").read_text())
    assert [r["status"] for r in data["runs"]] == ["skipped"] * 4
    assert "skipped: time budget" in (out / "gpu_peer.md").read_text()


def test_flops_match_moecore(peer_run):
    """The peer's FLOPs per token equal `moecore bench flops` on the same config (when built)."""
    if not BIN.is_file():
        pytest.skip(f"moecore binary not found at {BIN} (make build, or set MOECORE_BIN)")
    for e, row in {r["experts"]: r for r in peer_run["data"]["results"]}.items():
        r = subprocess.run([str(BIN), "bench", "flops", str(peer_run["config"]), "--set",
                            f"model.num_experts={e}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert row["flops_per_token"] == pytest.approx(got["flops_per_token"]["total"], rel=1e-12)
        assert row["parameters"] == got["parameters"]["total"]
        assert row["parameters_active"] == pytest.approx(got["parameters"]["active"])


def gpu_config_counts() -> dict:
    """bench/configs/gpu.toml's parameters at 8, 32 and 128 experts, by tests/reference's HF shape
    table (no model built)."""
    import math
    sys.path.insert(0, str(REPO / "tests" / "reference"))
    sys.path.insert(0, str(REPO / "bench"))
    import peer_torch
    import ref_model
    model = peer_torch.load_config(str(REPO / "bench" / "configs" / "gpu.toml"), [])["model"]
    model.pop("routing")
    counts = {}
    for e in (8, 32, 128):
        shapes = ref_model.param_shapes({**model, "num_experts": e})
        total = sum(math.prod(s) for s in shapes.values())
        routed = sum(math.prod(s) for n, s in shapes.items() if ".mlp.experts." in n)
        router = sum(math.prod(s) for n, s in shapes.items() if ".mlp.gate." in n)
        counts[e] = {"total": total, "active_without_router":
                     total - routed + routed // e * model["num_experts_per_tok"] - router}
    return counts


def test_gpu_config_fits_the_gpu():
    """gpu.toml's sizing claims: the active parameters (router aside) are the same at 8, 32 and 128
    experts, and at 128 the fp32 weights, gradients and AdamW moments (16 bytes a parameter) take
    about 50 GiB of the H200's 139, leaving room for transformers' eager activations."""
    counts = gpu_config_counts()
    assert len({c["active_without_router"] for c in counts.values()}) == 1
    assert counts[128]["total"] * 16 / 2**30 == pytest.approx(50.3, abs=0.1)
    assert counts[8]["total"] < counts[32]["total"] < counts[128]["total"]


def test_gpu_config_flops_match_moecore():
    """moecore reads gpu.toml, and its FLOPs per token at 8 / 32 / 128 experts are the peer's."""
    if not BIN.is_file():
        pytest.skip(f"moecore binary not found at {BIN} (make build, or set MOECORE_BIN)")
    sys.path.insert(0, str(REPO / "tests" / "reference"))
    sys.path.insert(0, str(REPO / "bench"))
    import peer_torch
    import ref_model
    config = REPO / "bench" / "configs" / "gpu.toml"
    cfg = peer_torch.load_config(str(config), [])
    model = {k: v for k, v in cfg["model"].items() if k != "routing"}
    for e in (8, 32, 128):
        r = subprocess.run([str(BIN), "bench", "flops", str(config), "--set",
                            f"model.num_experts={e}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        want = json.loads(r.stdout)["flops_per_token"]["total"]
        got = peer_torch.moecore_flops_per_token(ref_model.full_config({**model, "num_experts": e}),
                                                 int(cfg["train"]["seq_len"]))
        assert got == pytest.approx(want, rel=1e-12)


def test_moecore_side(tmp_path, peer_run):
    """--modes moecore: `moecore train --device` on the same config and expert count without
    checkpoints, its per-step times from metrics.jsonl, FLOPs and parameters from `moecore bench
    flops`, and the moecore / eager ratio the target is stated against (on the CPU here)."""
    if not BIN.is_file():
        pytest.skip(f"moecore binary not found at {BIN} (make build, or set MOECORE_BIN)")
    out = tmp_path / "results"
    r = run_script(out, peer_run["config"], "--experts", "8", "--modes", "eager,moecore",
                   "--steps", "3", "--warmup", "1", "--moecore-cmd", str(BIN))
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((out / "gpu_peer.json").read_text())
    runs = {run["mode"]: run for run in data["runs"]}
    assert runs["moecore"]["status"] == "ok", runs["moecore"]
    run = runs["moecore"]
    assert len(run["step_s"]) == 3 and all(s > 0 for s in run["step_s"])
    assert run["step_s_timed"]["n"] == 2 and run["tokens_per_step"] == BATCH * SEQ
    want = expected_counts(8)
    assert run["parameters"] == want["total"] and run["parameters_router"] == want["router"]
    assert run["parameters_active"] == pytest.approx(want["active"])
    assert run["flops_per_token"] == pytest.approx(runs["eager"]["flops_per_token"], rel=1e-12)
    ratio = data["moecore_vs_eager"]["8"]
    assert ratio == pytest.approx(run["tokens_per_s_median"] / runs["eager"]["tokens_per_s_median"])
    md = (out / "gpu_peer.md").read_text()
    assert "| moecore | 8 |" in md and f"- 8 experts: {ratio:.2f}x" in md
    # train.profile's split of the step (the passes against the optimizer's pass over every
    # parameter), by the host's clock here, CUDA events on a GPU.
    profile = run["profile"]
    assert profile["clock"] == "host wall clock" and profile["steps"] == 2
    assert profile["passes_ms"] > 0 and profile["optimizer_ms"] > 0
    assert "timed by host wall clock" in md and "| 8 | " in md.split("step by phase")[1]


def test_moecore_side_on_the_emulated_gpu(tmp_path, peer_run):
    """--device cuda's moecore side as scripts/gpu_check.sh runs it, with the moecore program on
    the emulated GPU (moecore_cuda_sim, beside $MOECORE_BIN): the run names the GPU from the
    start-up line, its profile is timed by CUDA events, and the report names the GPU even where
    no transformers run came first."""
    sim = BIN.parent / "moecore_cuda_sim"
    if not sim.is_file():
        pytest.skip(f"{sim} not found (built with the tests on x86-64: make build-tests)")
    out = tmp_path / "results"
    # A GEMM bench whose one-launch grouped GEMM won at 8 experts: the run takes it.
    gemm = tmp_path / "cuda_gemm.json"
    gemm.write_text(json.dumps({"device": "cudasim", "cases": [
        {"name": "peak: cuBLASLt bf16 512^3 (bf16 operands)", "ms": 1.0, "tflops": 0.01},
        {"name": "experts, cuBLASLt per expert: 8 experts, top-4, gate/up 128 -> 64", "ms": 2.0},
        {"name": "experts, one launch, device offsets (WMMA): 8 experts, top-4, gate/up 128 -> 64",
         "ms": 1.0}]}))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--config",
                        str(peer_run["config"]), "--out", str(out), "--experts", "8", "--modes",
                        "moecore", "--steps", "3", "--warmup", "1", "--moecore-cmd", str(sim),
                        "--gemm-json", str(gemm)],
                       capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((out / "gpu_peer.json").read_text())
    (run,) = data["runs"]
    assert run["mode"] == "moecore" and run["status"] == "ok", run
    assert run["gpu"].startswith("cudasim "), run["gpu"]
    assert run["profile"]["clock"] == "CUDA events on the backend's stream"
    assert run["profile"]["steps"] == 2 and run["profile"]["passes_ms"] > 0
    md = (out / "gpu_peer.md").read_text()
    assert f"on {run['gpu']}: transformers ?" in md
    assert run["grouped_gemm"] == "one_launch", run["grouped_gemm_reason"]
    assert ("- 8 experts: one_launch (cuda_gemm.json at 8 experts: per expert 2.000 ms, one "
            "launch 1.000 ms)") in md


def test_moecores_grouped_gemm_follows_the_gemm_bench(tmp_path):
    """--moecore-grouped-gemm auto: per expert count, whichever grouped GEMM the bench timed
    faster at that count (per_expert on a tie), else per_expert: no pair at that count, no bench
    file, fp32, or the CPU; an explicit choice overrides."""
    import argparse
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_peer
    gemm = tmp_path / "cuda_gemm.json"
    gemm.write_text(json.dumps({"cases": [
        {"name": "peak: cuBLASLt bf16 8192^3 (bf16 operands)", "ms": 1.4, "tflops": 780.0},
        {"name": "experts, cuBLASLt per expert: 8 experts, top-4, gate/up 2048 -> 1024", "ms": 0.5},
        {"name": "experts, one launch, device offsets (WMMA): 8 experts, top-4, gate/up 2048 -> "
                 "1024", "ms": 0.9},
        {"name": "experts, cuBLASLt per expert: 128 experts, top-4, gate/up 2048 -> 1024",
         "ms": 1.5},
        {"name": "experts, one launch, device offsets (WMMA): 128 experts, top-4, gate/up 2048 -> "
                 "1024", "ms": 0.9},
        {"name": "experts, cuBLASLt per expert: 32 experts, top-4, gate/up 2048 -> 1024", "ms": 0.7},
        {"name": "experts, one launch, device offsets (WMMA): 32 experts, top-4, gate/up 2048 -> "
                 "1024", "ms": 0.7}]}))

    def choice(experts, **kw):
        args = argparse.Namespace(**{"moecore_grouped_gemm": "auto", "device": "cuda",
                                     "precision": "bf16", "gemm_json": str(gemm), **kw})
        return gpu_peer.grouped_gemm_choice(args, experts)[0]

    assert choice(8) == "per_expert" and choice(128) == "one_launch" and choice(32) == "per_expert"
    assert choice(64) == "per_expert"  # no pair at 64
    assert choice(128, precision="fp32") == "per_expert" and choice(128, device="cpu") == "per_expert"
    assert choice(128, gemm_json="") == "per_expert"
    assert choice(128, gemm_json=str(tmp_path / "missing.json")) == "per_expert"
    assert choice(8, moecore_grouped_gemm="one_launch") == "one_launch"


def test_peer_accumulates_gradients_over_microbatches(tmp_path):
    """train.microbatches: the peer's batch in passes whose gradients add up before one AdamW
    step, as moecore's accumulation. Without the load-balancing loss (a product of per-pass means,
    which differs between one pass and two) the loss is the token mean either way: one pass of 4
    rows and two passes of 2 give the same first-step loss and, after one step on the accumulated
    gradient, the same second-step loss, to fp32 rounding (seen: equal, then 8e-8 apart relative
    to the loss; 1e-5 allowed). AdamW's first step moves every weight by about lr x the sign of
    its gradient, so a step on the last pass's gradient alone moves many weights the other way:
    seen to fail the second check by 90x its tolerance."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)

    def losses(microbatches: int) -> list[float]:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        r = subprocess.run([sys.executable, str(REPO / "bench" / "peer_torch.py"), "--config",
                            str(config), "--device", "cpu", "--threads", "1", "--precision",
                            "fp32", "--steps", "2", "--warmup", "0", "--synthetic-tokens",
                            "--set", "model.router_aux_loss_coef=0.0", "--set",
                            "optim.lr=1e-2", "--set", f"train.microbatches={microbatches}"],
                           capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        result = json.loads(r.stdout.strip().splitlines()[-1])
        assert result["microbatches"] == microbatches
        return result["losses"]

    whole, halves = losses(1), losses(2)
    assert abs(whole[0] - halves[0]) < 1e-5 * whole[0], (whole, halves)
    assert abs(whole[1] - halves[1]) < 1e-5 * whole[1], (whole, halves)


def test_peer_refuses_a_batch_that_microbatches_do_not_divide(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    r = subprocess.run([sys.executable, str(REPO / "bench" / "peer_torch.py"), "--config",
                        str(config), "--device", "cpu", "--threads", "1", "--steps", "1",
                        "--synthetic-tokens", "--set", "train.microbatches=3"],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode != 0
    assert "train.batch_size=4 is not a multiple of train.microbatches=3" in r.stderr + r.stdout
