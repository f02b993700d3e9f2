"""train.precision = "mxfp8" against bf16 (issue 16 item 5): peak memory and step time, with the
phase profile that says where the time goes; with --curves also the loss curves of the default
model in fp32, bf16 and mxfp8 (same seed and data) and their final validation losses.

Memory and time: for each model below, bf16 and mxfp8 (OLMo-core's recipe: the routed experts'
forward and input-gradient GEMMs in MXFP8, their inputs kept as MXFP8 copies) are trained for
STEPS steps RUNS times, interleaved; the table gives the median peak RSS (out_dir/rank_stats) and
the median mean step time of steps 2..STEPS (train.profile), and the experts' share of the step,
beside `moecore plan`'s peak and step time on this machine's rates (measured first).
Curves (--curves N, default model, N steps each; about 2 hours for N = 1000 on two cores): the
training loss per 50-step window and the final validation loss of each precision.

Writes bench/results/mxfp8.md and .json (the curves section is kept from the previous file when
--curves is not given). Run: `make bench-mxfp8` (memory and time: about 12 minutes on two cores).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

from plan_validation import BIN, REPO, RESULTS, measure_profile, median, prepare_data, run

RUNS = 3
STEPS = 4
PRECISIONS = ["bf16", "mxfp8"]
VALIDATION = REPO / "bench" / "configs" / "plan_validation.toml"
MODELS = [
    ("default (8 experts top-2, 16 x 128 tokens)", REPO / "configs" / "default.toml", []),
    ("expert-activation-heavy (16 experts top-8, 16 x 128 tokens, 4 layers)", VALIDATION,
     ["model.num_experts_per_tok=8", "train.batch_size=16", "train.seq_len=128"]),
    ("expert-activation-heavy, 16 layers (as above)", VALIDATION,
     ["model.num_experts_per_tok=8", "train.batch_size=16", "train.seq_len=128",
      "model.num_hidden_layers=16"]),
    ("expert-weight-heavy (64 experts top-8, 8 x 64 tokens)", VALIDATION,
     ["model.num_experts=64", "model.num_experts_per_tok=8"]),
]
WINDOW = 50


def settings(sets: list[str], precision: str, steps: int, data: Path | None,
             out_dir: Path) -> list[str]:
    # One thread: the rates of the profile measure() takes first, which the plan's step time uses.
    sets = sets + [f"train.precision=\"{precision}\"", f"train.max_steps={steps}",
                   "train.threads=1", "train.profile=true", "train.save_every=0", "train.sample_tokens=0",
                   "train.max_seconds=0", f"train.out_dir=\"{out_dir}\""]
    sets.append("train.eval_every=0")
    if data is not None:  # the validation model's own corpus (its vocabulary is 512)
        sets += [f"data.train=[\"{data}\"]", "data.val=[]", "data.tokenizer=\"\""]
    return [a for s in sets for a in ("--set", s)]


def measure(work: Path) -> tuple[list[dict], dict]:
    """The runs, and the profile of this machine that the plan's step times use (measured here
    first: rates measured on another CPU say nothing of this one's)."""
    data = prepare_data(work)
    profile_path = work / "cpu_profile.json"
    profile = measure_profile(profile_path, "cpu (measured by bench/mxfp8.py)")
    results = []
    for model, config, sets in MODELS:
        own_data = data if config == VALIDATION else None
        per = {p: {"peak_kib": [], "step_s": [], "experts_s": [], "load": []} for p in PRECISIONS}
        predicted, predicted_step = {}, {}
        for precision in PRECISIONS:
            hardware = ["--hardware", str(profile_path)]
            plan = json.loads(run([str(BIN), "plan", str(config), "--json", "--ranks", "1"] +
                                  hardware + settings(sets, precision, STEPS, own_data,
                                                      work / "plan")))
            predicted[precision] = plan["stages"][0]["memory_bytes"]["peak"] / 2**20
            predicted_step[precision] = plan.get("step_time", {}).get("seconds", 0.0)
        for repeat in range(RUNS):
            for precision in PRECISIONS:
                out_dir = work / f"run_{precision}"
                shutil.rmtree(out_dir, ignore_errors=True)
                per[precision]["load"].append(os.getloadavg()[0])
                run([str(BIN), "train", str(config)] +
                    settings(sets, precision, STEPS, own_data, out_dir))
                prof = json.loads((out_dir / "profile.json").read_text())
                per[precision]["step_s"].append(prof["seconds"] / prof["steps"])
                per[precision]["experts_s"].append(
                    sum(s for name, s in prof["phases"].items() if name.startswith("experts"))
                    / prof["steps"])
                per[precision]["peak_kib"].append(json.loads(
                    (out_dir / "rank_stats" / "rank0.json").read_text())["peak_rss_kib"])
                print(f"{model} {precision} run {repeat}: {per[precision]['step_s'][-1]:.3f} s, "
                      f"{per[precision]['peak_kib'][-1] / 1024:.1f} MiB", flush=True)
        for precision in PRECISIONS:
            p = per[precision]
            results.append({"model": model, "precision": precision,
                            "peak_mib": median(p["peak_kib"]) / 1024,
                            "predicted_peak_mib": predicted[precision],
                            "predicted_step_s": predicted_step[precision],
                            "step_s": median(p["step_s"]), "experts_s": median(p["experts_s"]),
                            "runs_peak_mib": [k / 1024 for k in p["peak_kib"]],
                            "runs_step_s": p["step_s"], "load_average_1min": p["load"]})
    return results, profile


def curves(work: Path, steps: int) -> dict:
    out = {}
    config = REPO / "configs" / "default.toml"
    for precision in ["fp32", "bf16", "mxfp8"]:
        out_dir = work / f"curve_{precision}"
        sets = [f"train.precision=\"{precision}\"", f"train.max_steps={steps}",
                f"train.eval_every={steps}", "train.save_every=0", "train.sample_tokens=0",
                "train.max_seconds=0", "train.log_every=1", f"train.out_dir=\"{out_dir}\""]
        run([str(BIN), "train", str(config)] + [a for s in sets for a in ("--set", s)],
            timeout=4 * 3600)
        rows = [json.loads(l) for l in (out_dir / "metrics.jsonl").read_text().splitlines()]
        train = [r["train/loss"] for r in rows if "train/loss" in r]
        val = [r["val/loss"] for r in rows if "val/loss" in r]
        out[precision] = {"train_loss": train, "val_loss": val[-1]}
        print(f"curve {precision}: final val loss {val[-1]:.4f}", flush=True)
    return out


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    name = names[0] if names else platform.processor() or platform.machine()
    return f"{name} ({', '.join(bf16)})" if bf16 else name


def window_means(losses: list[float]) -> list[float]:
    return [sum(losses[w:w + WINDOW]) / len(losses[w:w + WINDOW])
            for w in range(0, len(losses), WINDOW)]


def write_results(results: list[dict], curve: dict | None, profile: dict) -> None:
    (RESULTS / "mxfp8.json").write_text(json.dumps(
        {"memory_time": results, "curves": curve, "profile": profile}, indent=1))
    shape = "x".join(str(x) for x in profile["measured"]["gemm_shape_mnk"])
    lines = ["# MXFP8 training against bf16", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, "
             "shared (1-minute load average at each run's start below); one process, one "
             f"thread, {STEPS} steps (2..{STEPS} timed), median of {RUNS} runs, precisions "
             "interleaved within each repeat. Plan: `moecore plan --hardware` with this "
             "machine's rates, measured by the same script before the runs (bench/"
             "plan_validation.py's measure_profile, one thread; at m n k = "
             f"{shape}: GEMM fp32 {profile['gemm_tflops_fp32'] * 1e3:.1f}, bf16 "
             f"{profile['gemm_tflops_bf16'] * 1e3:.1f}, MXFP8 "
             f"{profile['gemm_tflops_mxfp8'] * 1e3:.1f} GFLOP/s; memory "
             f"{profile['memory_bandwidth_gbs']:.1f} GB/s; the whole profile is in mxfp8.json). "
             "Produced by `make bench-mxfp8` (`bench/mxfp8.py`).", "",
             "| model | precision | peak RSS MiB | vs bf16 | plan: peak MiB (error) | step ms | "
             "vs bf16 | plan: step ms (error) | experts ms (share) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        base = next(x for x in results if x["model"] == r["model"] and x["precision"] == "bf16")
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['peak_mib']:.1f} | "
            f"{r['peak_mib'] - base['peak_mib']:+.1f} MiB | {r['predicted_peak_mib']:.1f} "
            f"({r['predicted_peak_mib'] / r['peak_mib'] - 1:+.1%}) | {r['step_s'] * 1e3:.0f} | "
            f"{r['step_s'] / base['step_s'] - 1:+.0%} | "
            + (f"{r['predicted_step_s'] * 1e3:.0f} ({r['predicted_step_s'] / r['step_s'] - 1:+.0%})"
               if r.get("predicted_step_s") else "-")
            + f" | {r['experts_s'] * 1e3:.0f} "
            f"({r['experts_s'] / r['step_s']:.0%}) | "
            f"{', '.join(f'{x:.1f}' for x in r['load_average_1min'])} |")
    lines += ["", "Memory: both keep each MoE layer's expert inputs (x [R, d] and the SwiGLU "
              "output [R, H], R = routed rows) as what their GEMMs read: bf16 as bf16 roundings "
              "(2 bytes per value), mxfp8 as E4M3 codes plus one E8M0 scale per 32 (1.03 bytes), "
              "so mxfp8 keeps 0.97 bytes less per value in every MoE layer. Against that it has "
              "costs that do not grow with the layers: it lends two fp32 buffers to the layer in "
              "its forward (x, and the SwiGLU output, which it quantises from fp32; bf16 lends "
              "x's alone), and its experts' backward holds the output gradients' codes, the "
              "inputs dequantised for the bf16 weight gradient and the SwiGLU's gradient in "
              "fp32 (bf16's in bf16). A shallow model's peak is therefore higher in mxfp8 and a "
              "deep one's lower (the 4- and 16-layer expert-activation-heavy rows). The experts' "
              "weights get MX caches in two orientations (2.06 bytes per weight) instead of one "
              "bf16 copy (2 bytes): models whose expert weights dominate the memory do not save "
              "(their master weights, gradients and Adam moments stay fp32, 16 bytes per weight, "
              "as in bf16).", "",
              "Time: no gain on a CPU, and none is expected. No x86 core multiplies FP8, so the "
              "exact MX GEMM (kernels/cpu/mx_gemm.cpp) decodes the E4M3 codes to fp32 and sums "
              "each output's 32-element blocks in a fixed order in its own SIMD lane, against "
              "oneDNN's bf16 GEMM on AVX512-BF16/AMX; quantising the activations and output "
              "gradients adds a pass over them. The experts' share of the step (the profile's "
              "experts_forward + experts_backward) is where mxfp8's extra time goes. On "
              "Blackwell the same GEMMs run on MX tensor cores at twice the bf16 rate."]
    if curve:
        steps = len(curve["fp32"]["train_loss"])
        lines += ["", f"## Loss curves: default model, {steps} steps, same seed and data", "",
                  "| steps | fp32 | bf16 | mxfp8 | mxfp8 vs bf16 |", "|---|---|---|---|---|"]
        for w in range(0, steps, WINDOW):
            means = {p: sum(c["train_loss"][w:w + WINDOW]) / len(c["train_loss"][w:w + WINDOW])
                     for p, c in curve.items()}
            lines.append(f"| {w + 1}-{min(w + WINDOW, steps)} | {means['fp32']:.4f} | "
                         f"{means['bf16']:.4f} | {means['mxfp8']:.4f} | "
                         f"{means['mxfp8'] / means['bf16'] - 1:+.2%} |")
        v = {p: c["val_loss"] for p, c in curve.items()}
        gaps = {p: max(abs(a / b - 1) for a, b in zip(window_means(curve[p]["train_loss"]),
                                                       window_means(curve[base]["train_loss"])))
                for p, base in (("mxfp8", "bf16"), ("bf16", "fp32"))}
        lines += ["", f"Final validation loss: fp32 {v['fp32']:.4f}, bf16 {v['bf16']:.4f}, mxfp8 "
                  f"{v['mxfp8']:.4f} (mxfp8 vs bf16 {v['mxfp8'] / v['bf16'] - 1:+.2%}, bf16 vs "
                  f"fp32 {v['bf16'] / v['fp32'] - 1:+.2%}).", "",
                  f"Margin: every {WINDOW}-step window of mxfp8 within {gaps['mxfp8']:.2%} of "
                  f"bf16's (bf16 within {gaps['bf16']:.2%} of fp32's), the final validation loss "
                  f"within {abs(v['mxfp8'] / v['bf16'] - 1):.2%}. One run per precision, one seed: "
                  "no seed-to-seed spread was measured to set the gaps against; "
                  "tests/train/test_precision.py holds a 200-step run of a tiny model to 1% of "
                  "bf16 in `make test`."]
    else:
        lines += ["", "## Loss curves", "", "Not measured yet: `python3 bench/mxfp8.py --curves "
                  "1000` (about 2 hours on two cores)."]
    (RESULTS / "mxfp8.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curves", type=int, default=0,
                        help="also train the default model this many steps in each precision")
    parser.add_argument("--rewrite", action="store_true",
                        help="only write mxfp8.md again from mxfp8.json")
    args = parser.parse_args()
    if args.rewrite:
        saved = json.loads((RESULTS / "mxfp8.json").read_text())
        write_results(saved["memory_time"], saved["curves"], saved["profile"])
        return
    if not BIN.is_file():
        raise SystemExit(f"no binary at {BIN} (build it, or set MOECORE_BIN)")
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="moecore-mxfp8-", dir=base))
    previous = RESULTS / "mxfp8.json"
    try:
        results, profile = measure(work)
        curve = curves(work, args.curves) if args.curves else (
            json.loads(previous.read_text()).get("curves") if previous.is_file() else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results(results, curve, profile)


if __name__ == "__main__":
    main()
