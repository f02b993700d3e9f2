"""train.precision = "bf16" (issue 6 item 1) and "mxfp8" (issue 16 item 2): a 200-step run of a tiny
model next to the same run in fp32 (and mxfp8 next to bf16), same seed and data order; bf16 GEMM
operands, fp32 accumulation, fp32 master weights; mxfp8: the routed and shared experts' GEMMs in
MXFP8 (this model has no shared expert: tests/cpp/test_mxfp8_experts.cpp and test_diff.py hold
the shared expert's MX GEMMs to the recipe).

Margins (measured on the generated test corpus: window gaps up to 2.3e-3, final val loss 2e-4):
- per 20-step window, the mean bf16 training loss is within WINDOW_MARGIN (relative to the fp32
  window mean) of the fp32 one;
- the final validation loss is within VAL_MARGIN (relative) of fp32;
- both runs learn (the last window's mean loss is well below the first's).
bf16 perturbs every step a little (a few 2^-8 relative errors in each GEMM), so the runs drift
apart as training goes on instead of matching to fp32 round-off; the margins bound that drift.
No derivation bounds a 200-step drift, so the margins are empirical, re-measured over four ISA settings
(tests/TOLERANCES.md): window gaps 1.1e-3 (native AVX512-BF16 GEMMs), 1.7e-3 (emulated bf16,
DNNL_MAX_CPU_ISA=AVX512_CORE), 1.3e-3 (emulated, AVX2); final val loss 7.8e-4 relative at most. 0.01 is
>= 4x the worst gap seen; a bf16 defect that matters (accumulating in bf16, a dropped rounding in the
backward) shows as a diverging or non-learning curve, far beyond it.
"""
from __future__ import annotations

import tomllib

import numpy as np
import pytest

from test_training_job import assert_one_line_error, metrics_rows, train, train_rows, write_config

STEPS = 200
WINDOW = 20
WINDOW_MARGIN = 0.01
VAL_MARGIN = 0.01
MODEL = {"hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2}


def run_config(tmp_path, job, name: str, precision: str, steps: int = STEPS):
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name, model=MODEL,
                        train={"max_steps": steps, "batch_size": 8, "seq_len": 32, "threads": 2,
                               "log_every": 1, "eval_every": steps, "eval_batches": 4,
                               "precision": precision})


def final_val_loss(out_dir) -> float:
    vals = [row["val/loss"] for row in metrics_rows(out_dir) if "val/loss" in row]
    assert vals, f"no val/loss in {out_dir}"
    return vals[-1]


@pytest.fixture(scope="module")
def runs(moecore_bin, job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("precision")
    out = {}
    for precision in ("fp32", "bf16", "mxfp8"):
        r = train(moecore_bin, run_config(tmp, job_data, precision, precision))
        out[precision] = (tmp / precision, r.stdout)
    return out


def window_means(out_dir) -> np.ndarray:
    rows = train_rows(out_dir)
    assert sorted(rows) == list(range(1, STEPS + 1))
    loss = np.array([rows[s]["train/loss"] for s in sorted(rows)])
    assert np.isfinite(loss).all()
    return loss.reshape(-1, WINDOW).mean(axis=1)


def test_bf16_loss_curve_tracks_fp32(runs):
    fp32, bf16 = window_means(runs["fp32"][0]), window_means(runs["bf16"][0])
    gap = np.abs(bf16 - fp32) / fp32
    print("fp32 windows", np.round(fp32, 4), "\nbf16 windows", np.round(bf16, 4),
          "\nrelative gaps", np.round(gap, 5))
    assert (gap <= WINDOW_MARGIN).all(), f"bf16 loss windows off by {gap.max():.4f} relative"
    for curve in (fp32, bf16):
        assert curve[-1] < 0.8 * curve[0], f"did not learn: {curve}"
    assert not np.array_equal(fp32, bf16), "bf16 run identical to fp32: is bf16 on at all?"
    v32, v16 = final_val_loss(runs["fp32"][0]), final_val_loss(runs["bf16"][0])
    print(f"val loss fp32 {v32:.4f} bf16 {v16:.4f}")
    assert abs(v16 - v32) <= VAL_MARGIN * v32


def test_mxfp8_loss_curve_tracks_bf16(runs):
    """mxfp8 is bf16 with the routed experts' GEMMs in MXFP8 (E4M3: 3 mantissa bits against bf16's
    7, so each expert GEMM operand errs by up to 2^-4 instead of 2^-8). Held to the margins of bf16
    vs fp32 above, against bf16, its own baseline (measured: see the printed gaps and
    tests/TOLERANCES.md)."""
    bf16, mxfp8 = window_means(runs["bf16"][0]), window_means(runs["mxfp8"][0])
    gap = np.abs(mxfp8 - bf16) / bf16
    print("bf16 windows", np.round(bf16, 4), "\nmxfp8 windows", np.round(mxfp8, 4),
          "\nrelative gaps", np.round(gap, 5))
    assert (gap <= WINDOW_MARGIN).all(), f"mxfp8 loss windows off by {gap.max():.4f} relative"
    assert mxfp8[-1] < 0.8 * mxfp8[0], f"did not learn: {mxfp8}"
    assert not np.array_equal(bf16, mxfp8), "mxfp8 run identical to bf16: is MXFP8 on at all?"
    v16, v8 = final_val_loss(runs["bf16"][0]), final_val_loss(runs["mxfp8"][0])
    print(f"val loss bf16 {v16:.4f} mxfp8 {v8:.4f}")
    assert abs(v8 - v16) <= VAL_MARGIN * v16


def test_precision_is_reported_and_saved(runs):
    for precision, (out_dir, stdout) in runs.items():
        saved = tomllib.loads((out_dir / "config.toml").read_text())
        assert saved["train"]["precision"] == precision
        if precision == "mxfp8":  # the recipe by name
            assert ("mxfp8 (routed and shared experts' forward and input-gradient GEMMs in MXFP8 "
                    "E4M3, rceil scales, weight gradient in bf16 (routed: on the saved MXFP8 "
                    "inputs; shared: on bf16 ones)") in stdout, stdout[:600]
            continue
        assert f"{precision} GEMMs" in stdout or f"{precision} (emulated) GEMMs" in stdout, stdout[:400]


@pytest.mark.parametrize("model,needles", [
    # The checkpoint's gate_proj is [H, d] (moecore fuses gate and up into [2H, d]: not that).
    ({"moe_intermediate_size": 48},
     ("model.layers.0.mlp.experts.0.gate_proj.weight is [48, 64]",
      "model.moe_intermediate_size = 48 is not a multiple of 32")),
    ({"hidden_size": 48, "num_attention_heads": 2, "num_key_value_heads": 2},
     ("model.layers.0.mlp.experts.0.gate_proj.weight is [64, 48]",
      "model.hidden_size = 48 is not a multiple of 32")),
    # OLMo-core's recipe runs the shared expert as an expert: its widths are MX blocks too.
    ({"shared_expert_intermediate_size": 24},
     ("model.layers.0.mlp.shared_expert.gate_proj.weight is [24, 64]",
      "model.shared_expert_intermediate_size = 24 is not a multiple of 32")),
])
def test_mxfp8_needs_whole_blocks(moecore_bin, job_data, tmp_path, model, needles):
    """MXFP8 quantises the experts' weights (routed and shared) along both dimensions in blocks of
    32: another width is a one-line error naming the checkpoint's tensor with its own shape and
    the config key at fault, never a silent bf16 fallback."""
    cfg = write_config(tmp_path / "c.toml", job_data, tmp_path / "out", model={**MODEL, **model},
                       train={"max_steps": 2, "precision": "mxfp8"})
    r = train(moecore_bin, cfg, check=False)
    assert_one_line_error(r, "[mxfp8]", *needles, "multiples of 32")
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_emulated_bf16_matches_native(moecore_bin, job_data, tmp_path):
    """DNNL_MAX_CPU_ISA=AVX512_CORE hides AVX512-BF16 from oneDNN, so the emulated path runs
    (operands rounded to bf16, fp32 sgemm). Same products, other summation order: over 10 steps the
    losses agree to 1e-3 relative (measured: 1.9e-5 on an AVX512-BF16 CPU; on a CPU without it both
    runs are emulated and agree exactly), far tighter than bf16 vs fp32. Both oneDNN variables are
    set: ONEDNN_MAX_CPU_ISA, if the environment has it, would override DNNL_MAX_CPU_ISA."""
    steps = 10
    native = train(moecore_bin, run_config(tmp_path, job_data, "native", "bf16", steps))
    emulated = train(moecore_bin, run_config(tmp_path, job_data, "emulated", "bf16", steps),
                     env_extra={"DNNL_MAX_CPU_ISA": "AVX512_CORE", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert "bf16 (emulated) GEMMs" in emulated.stdout, emulated.stdout[:400]
    a = np.array([r["train/loss"] for _, r in sorted(train_rows(tmp_path / "native").items())])
    b = np.array([r["train/loss"] for _, r in sorted(train_rows(tmp_path / "emulated").items())])
    gap = np.abs(a - b) / a
    print("native", a, "\nemulated", b, "\ngap", gap)
    assert gap.max() <= 1e-3
