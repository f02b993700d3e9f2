"""Activation recompute (train.recompute, issue 17 item 7): peak memory and step time per mode next
to `moecore plan`'s prediction.

For the default model (configs/default.toml: d 256, 4 layers, 8 experts top-2, 16 x 128 tokens), an
expert-heavy one (bench/configs/plan_validation.toml with 64 experts top-8, 8 x 64 tokens: the
experts' weights and optimizer state are most of the memory) and an expert-activation-heavy one (the
same with 16 experts top-8 and 16 x 128 tokens: the experts' rows are most of the activations), one
process, one thread (the rates of bench/results/cpu_profile.json,
which bench/plan_validation.py measures), each mode "none", "attention", "moe", "full" is trained
for STEPS steps RUNS times; the table gives the median peak RSS (out_dir/rank_stats) and the median
of the mean step time of steps 2..STEPS (train.profile), next to the plan's peak memory, its
activation bytes and its step time. The modes of one repeat run in turn, so that the machine's load
(shared, recorded) falls on all of them alike. Writes bench/results/recompute.md and .json.
Run: `make bench-recompute` (about 8 minutes
on two shared cores; --rewrite: the tables again from recompute.json).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from plan_sweep import sweep
from plan_validation import REPO, RESULTS

RUNS = 3
STEPS = 4
MODES = ["none", "attention", "moe", "full"]
MODELS = [
    ("default", REPO / "configs" / "default.toml", []),
    ("expert-heavy (64 experts top-8)", REPO / "bench" / "configs" / "plan_validation.toml",
     ["model.num_experts=64", "model.num_experts_per_tok=8"]),
    ("expert-activation-heavy (16 experts top-8, 16 x 128 tokens)",
     REPO / "bench" / "configs" / "plan_validation.toml",
     ["model.num_experts_per_tok=8", "train.batch_size=16", "train.seq_len=128"]),
]


def settings(sets: list[str], mode: str, data: Path, out_dir: Path) -> list[str]:
    sets = sets + [f"train.recompute=\"{mode}\"", f"train.max_steps={STEPS}", "train.threads=1",
                   "train.profile=true", "train.eval_every=0", "train.save_every=0",
                   "train.sample_tokens=0", "train.max_seconds=0", f"data.train=[\"{data}\"]",
                   "data.val=[]", "data.tokenizer=\"\"", f"train.out_dir=\"{out_dir}\""]
    return [a for s in sets for a in ("--set", s)]


def main() -> None:
    write_results(sweep(MODELS, MODES, "mode", settings, RUNS, "moecore-recompute-"))


def write_results(results: list[dict]) -> None:
    (RESULTS / "recompute.json").write_text(json.dumps(results, indent=1))
    lines = ["# Activation recompute: measured against `moecore plan`", "",
             f"Machine: {results[0].get('cpu', '?')}, {os.cpu_count()} cores, "
             "shared with other jobs (1-minute load average at each run's start below); one "
             f"process, one thread, fp32, {STEPS} steps, median of {RUNS} runs (modes "
             "interleaved within each repeat). Plan: `moecore plan --ranks 1 --hardware "
             "bench/results/cpu_profile.json`. Produced by `make bench-recompute` (`bench/recompute.py`).", "",
             "Every mode trains bit-identically to `none` (tests/cpp/test_activation_recompute.cpp, "
             "tests/train/test_recompute.py); what changes is memory and time.", "",
             "| model | recompute | plan: activations MiB | plan: peak MiB | measured peak MiB | "
             "error | plan: step ms | measured step ms | error | vs none (measured) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        none = next(x for x in results if x["model"] == r["model"] and x["mode"] == "none")
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['predicted_activations_mib']:.1f} | "
            f"{r['predicted_peak_mib']:.1f} | {r['measured_peak_mib']:.1f} | "
            f"{r['predicted_peak_mib'] / r['measured_peak_mib'] - 1:+.1%} | "
            f"{r['predicted_step_s'] * 1e3:.0f} | {r['measured_step_s'] * 1e3:.0f} | "
            f"{r['predicted_step_s'] / r['measured_step_s'] - 1:+.1%} | "
            f"{r['measured_peak_mib'] - none['measured_peak_mib']:+.1f} MiB, "
            f"{r['measured_step_s'] / none['measured_step_s'] - 1:+.1%} time | "
            f"{', '.join(f'{x:.1f}' for x in r['load_average_1min'])} |")
    worst = max(abs(r["predicted_peak_mib"] / r["measured_peak_mib"] - 1) for r in results)
    lines += ["", f"Peak memory: worst plan error {worst:.1%} over the {len(results)} runs (the "
              "memory model counts the kept caches and the one rebuilt block from the code; RSS "
              "does not depend on the machine's load). Step time: the cost of recompute, "
              "predicted (plan, mode against none) and measured:", "",
              "| model | recompute | plan: time vs none | measured: time vs none |",
              "|---|---|---|---|"]
    for r in results:
        if r["mode"] == "none":
            continue
        none = next(x for x in results if x["model"] == r["model"] and x["mode"] == "none")
        lines.append(f"| {r['model']} | {r['mode']} | "
                     f"{r['predicted_step_s'] / none['predicted_step_s'] - 1:+.1%} | "
                     f"{r['measured_step_s'] / none['measured_step_s'] - 1:+.1%} |")
    lines += ["", "Step times on this machine move by tens of percent with the other jobs' load "
              "(an earlier session of this script measured 645 ms for the default model's `none`): "
              "read the time columns as the planner's order of magnitude, the memory columns as "
              "its accuracy. `attention` saves little here (the attention caches of d 256 and "
              "T 64-128 are small next to the experts' rows); `moe` takes most of the saving of "
              "`full` on the expert-heavy models."]
    (RESULTS / "recompute.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rewrite", action="store_true",
                    help="write the tables again from recompute.json, running nothing")
    if ap.parse_args().rewrite:
        write_results(json.loads((RESULTS / "recompute.json").read_text()))
    else:
        main()
