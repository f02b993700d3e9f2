"""The chunked LM head (train.lm_head_chunk_tokens, model/chunked_lm_head.h): peak memory and step
time per chunk size next to `moecore plan`'s prediction.

For the default model (configs/default.toml: d 256, vocabulary 4096, 16 x 128 tokens) and the same
model with OLMoE's vocabulary (50304 entries: the logits of 2048 tokens are 393 MiB in fp32), one
process, one thread (the rates of bench/results/cpu_profile.json, which bench/plan_validation.py
measures), each chunk size (0 = the whole micro-batch, the default) is trained for STEPS steps RUNS
times; the table gives the median peak RSS (out_dir/rank_stats) and the median of the mean step
time of the steps (train.profile), next to the plan's peak memory and step time. The chunk sizes of
one repeat run in turn, so that the machine's load (shared, recorded) falls on all of them alike.
Writes bench/results/lm_head_chunks.md and .json. Run: `make bench-lm-head` (about 6 minutes on
two shared cores; --rewrite: the tables again from lm_head_chunks.json).
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
CHUNKS = [0, 512, 128]
MODELS = [
    ("default (vocabulary 4096)", REPO / "configs" / "default.toml", []),
    ("default with OLMoE's vocabulary (50304)", REPO / "configs" / "default.toml",
     ["model.vocab_size=50304"]),
]


def settings(sets: list[str], chunk: int, data: Path, out_dir: Path) -> list[str]:
    sets = sets + [f"train.lm_head_chunk_tokens={chunk}", f"train.max_steps={STEPS}",
                   "train.threads=1", "train.profile=true", "train.eval_every=0",
                   "train.save_every=0", "train.checkpoint=false", "train.sample_tokens=0",
                   "train.max_seconds=0", f"data.train=[\"{data}\"]", "data.val=[]",
                   "data.tokenizer=\"\"", f"train.out_dir=\"{out_dir}\""]
    return [a for s in sets for a in ("--set", s)]


def main() -> None:
    write_results(sweep(MODELS, CHUNKS, "chunk_tokens", settings, RUNS, "moecore-lm-head-"))


def write_results(results: list[dict]) -> None:
    (RESULTS / "lm_head_chunks.json").write_text(json.dumps(results, indent=1))
    lines = ["# The chunked LM head: measured against `moecore plan`", "",
             f"Machine: {results[0].get('cpu', '?')}, {os.cpu_count()} cores, "
             "shared with other jobs (1-minute load average at each run's start below); one "
             f"process, one thread, fp32, {STEPS} steps, median of {RUNS} runs (chunk sizes "
             "interleaved within each repeat). Plan: `moecore plan --ranks 1 --hardware "
             "bench/results/cpu_profile.json`. Produced by `make bench-lm-head` "
             "(`bench/lm_head_chunks.py`).", "",
             "`train.lm_head_chunk_tokens = 0` keeps the micro-batch's logits from the forward to "
             "the backward, which makes their gradient; a chunk size keeps none and computes each "
             "chunk's logits again in the backward (one more head GEMM per micro-batch). The "
             "losses and gradients are the whole head's up to fp32 rounding of the head's sums "
             "(tests/cpp/test_chunked_lm_head.cpp, TransformerGradients.ChunkedHead*).", "",
             "| model | chunk tokens | plan: activations MiB | plan: peak MiB | measured peak MiB "
             "| error | plan: step ms | measured step ms | vs whole head (measured) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        whole = next(x for x in results if x["model"] == r["model"] and x["chunk_tokens"] == 0)
        label = "0 (whole)" if r["chunk_tokens"] == 0 else str(r["chunk_tokens"])
        lines.append(
            f"| {r['model']} | {label} | {r['predicted_activations_mib']:.1f} | "
            f"{r['predicted_peak_mib']:.1f} | {r['measured_peak_mib']:.1f} | "
            f"{r['predicted_peak_mib'] / r['measured_peak_mib'] - 1:+.1%} | "
            f"{r['predicted_step_s'] * 1e3:.0f} | {r['measured_step_s'] * 1e3:.0f} | "
            f"{r['measured_peak_mib'] - whole['measured_peak_mib']:+.1f} MiB, "
            f"{r['measured_step_s'] / whole['measured_step_s'] - 1:+.1%} time | "
            f"{', '.join(f'{x:.1f}' for x in r['load_average_1min'])} |")
    lines += ["", "Per-run figures and load averages are in lm_head_chunks.json. Step times on "
              "this machine move with the other jobs' load: read the time column as the price of "
              "the second head GEMM (the plan's step time against the whole head's says what it "
              "should be), the memory columns as the saving. The price is highest where the head dominates the "
              "step (OLMoE's vocabulary on this d-256, 4-layer body: the head's GEMMs are most of "
              "the flops): the plan prices the extra GEMM only, the measured time also holds the "
              "cross-entropy's second pass and the smaller GEMMs of the chunks. The saving is the "
              "kept logits (tokens x vocabulary x 4 bytes), and in the backward their gradient, less "
              "one chunk's logits and gradient."]
    (RESULTS / "lm_head_chunks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rewrite", action="store_true",
                    help="write the tables again from lm_head_chunks.json, running nothing")
    if ap.parse_args().rewrite:
        write_results(json.loads((RESULTS / "lm_head_chunks.json").read_text()))
    else:
        main()
