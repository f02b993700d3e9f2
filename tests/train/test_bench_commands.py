"""Measurement support for `make bench` (issue 6 item 4): `moecore bench flops` counts FLOPs per
token as DESIGN.md says (checked against a hand count), `moecore bench gemm` reports positive
FLOP/s and refuses a precision the build lacks with one line, and train.profile = true writes
out_dir/profile.json (every phase, "other" the rest of the step) and a `profile:` line, while a
run without it writes neither.
"""
from __future__ import annotations

import json

import pytest

from test_training_job import run, train, write_config

MODEL = {"num_experts": 8, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 0}


@pytest.fixture(scope="module")
def config(job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    return write_config(tmp / "c.toml", job_data, tmp / "run", model=MODEL,
                        train={"max_steps": 4, "log_every": 1, "eval_every": 0})


def test_flops_match_a_hand_count(moecore_bin, config, job_data):
    cfg = {line.split(" = ")[0]: line.split(" = ")[1] for line in config.read_text().splitlines()
           if " = " in line}
    d, layers, e = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), 8
    heads, h, v = int(cfg["num_attention_heads"]), int(cfg["moe_intermediate_size"]), job_data.vocab_size
    kv = int(cfg["num_key_value_heads"]) * (d // heads)
    seq = 64
    r = run(moecore_bin, "bench", "flops", config, "--set", f"train.seq_len={seq}")
    f = json.loads(r.stdout)
    assert f["seq_len"] == seq
    hand = {
        "attention_projections": layers * 6 * (2 * d * d + 2 * d * kv),
        "attention_scores": layers * 12 * d * (seq + 1) / 2,  # heads x head_dim = d
        "router": layers * 6 * d * e,
        "experts": layers * 18 * d * h * 2,
        "lm_head": 6 * d * v,
    }
    for key, want in hand.items():
        assert f["flops_per_token"][key] == pytest.approx(want, rel=1e-12), key
    assert f["flops_per_token"]["total"] == pytest.approx(sum(hand.values()), rel=1e-12)
    p = f["parameters"]
    assert p["total"] == p["dense"] + p["expert"]
    assert p["active"] == pytest.approx(p["dense"] + p["expert"] * 2 / 8)


def test_gemm_reports_flops(moecore_bin):
    r = run(moecore_bin, "bench", "gemm", "--m", "64", "--n", "48", "--k", "32", "--repeats", "3",
            "--min-seconds", "0.01", "--threads", "1")
    g = json.loads(r.stdout)
    assert (g["m"], g["n"], g["k"], g["precision"], g["threads"]) == (64, 48, 32, "fp32", 1)
    assert len(g["flops_per_s"]) == 3 and g["flops_per_s_min"] > 0
    assert g["flops_per_s_min"] <= g["flops_per_s_median"] <= g["flops_per_s_max"]
    r = run(moecore_bin, "bench", "gemm", "--m", "5", "--n", "70", "--k", "64", "--repeats", "2",
            "--min-seconds", "0.01", "--precision", "mxfp8")
    g = json.loads(r.stdout)
    assert g["precision"] == "mxfp8" and g["flops_per_s_min"] > 0
    # The quantisers around the MX GEMM: activations always; the weight's two cached
    # orientations only when n is whole blocks too.
    assert g["mx_quantize_values_per_s"] > 0 and "mx_weight_refresh_values_per_s" not in g
    r = run(moecore_bin, "bench", "gemm", "--m", "5", "--n", "64", "--k", "64", "--repeats", "2",
            "--min-seconds", "0.01", "--precision", "mxfp8")
    assert json.loads(r.stdout)["mx_weight_refresh_values_per_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8"], "--precision=fp8"),
    (["--m", "0"], "sizes must be positive"),
    (["--repeats", "0"], "--repeats=0"),
    (["--precision", "mxfp8", "--k", "48"], "k=48 is not a positive multiple of the MX block size 32"),
])
def test_gemm_bad_arguments_are_one_line_errors(moecore_bin, args, message):
    r = run(moecore_bin, "bench", "gemm", *args, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moecore: error:") and message in lines[0], r.stderr


def test_profile_writes_every_phase(moecore_bin, config, tmp_path):
    out = tmp_path / "profiled"
    r = train(moecore_bin, config, f"train.out_dir={out}", "train.profile=true")
    assert r.returncode == 0, r.stderr
    p = json.loads((out / "profile.json").read_text())
    assert p["steps"] == 3  # the first step is left out
    assert p["phase_clock"] == "host wall clock"  # on a GPU: CUDA events (README, train.profile)
    phases = p["phases"]
    for name in ("attention_forward", "attention_backward", "router_forward", "router_backward",
                 "dispatch_forward", "dispatch_backward", "experts_forward", "experts_backward",
                 "combine_forward", "combine_backward", "lm_head_forward", "lm_head_backward",
                 "optimizer", "communication", "other"):
        assert name in phases, name
    assert all(v >= 0 for k, v in phases.items() if k != "other")
    assert phases["experts_backward"] > 0 and phases["attention_forward"] > 0
    assert sum(phases.values()) == pytest.approx(p["seconds"], rel=1e-9)
    # A run on host memory never waits for a device: no host reads of device memory.
    assert p["host_reads"] == []
    line = next(line for line in r.stdout.splitlines() if line.startswith("profile: 3 steps"))
    assert "host reads" not in line, line

    plain = tmp_path / "plain"
    r = train(moecore_bin, config, f"train.out_dir={plain}")
    assert r.returncode == 0, r.stderr
    assert not (plain / "profile.json").exists() and "profile:" not in r.stdout
