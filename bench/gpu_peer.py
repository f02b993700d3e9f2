#!/usr/bin/env python3
"""The transformers peer on the GPU (issue 15 items 5-6): transformers' OlmoeForCausalLM +
torch.optim.AdamW (bench/peer_torch.py --device cuda: fp32 master weights, bf16 autocast) training
bench/configs/gpu.toml at 8, 32 and 128 experts with fixed active parameters (bench/
expert_scaling.py's rule: top-k and expert width stay, only model.num_experts changes), eager and
torch.compile, on one GPU, and with --modes moecore moecore's side of the comparison (>= 1.5x
transformers eager tokens/s, <= 5 % tokens/s lost from 8 to 128 experts): `moecore train --device`
on the same config (run_moecore).

Each run is one peer_torch.py process: --warmup steps (torch.compile compiles in the first), then
the timed steps; tokens/s = tokens per step / the median timed step, with the spread (max - min) /
median of the timed steps. With --repeats > 1 every repeat runs each combination once, in turn (as
bench/expert_scaling.py), and the table gives the median over repeats. Data: uniform tokens from
the config's train.seed (--synthetic-tokens): the GPU machine has no corpus, and the tokens do not
change the work of a step. MFU = tokens/s x FLOPs per token by moecore's count
(model/flop_count.cpp, reported by the peer) / a peak: --peak-tflops, or the "peak:" case of the
JSON that bench/cuda/gemm.cpp --json writes (cuBLASLt bf16 8192^3, measured in the same
scripts/gpu_check.sh run).

moecore's routed experts run as the GEMM bench found faster at each expert count
(--moecore-grouped-gemm auto, the default): its "experts, cuBLASLt per expert" and "experts, one
launch" cases at that count in --gemm-json (the same sizes and count as the model's gate/up GEMM);
one_launch passes train.cuda_grouped_gemm=one_launch (no host read of the offsets, one launch per
grouped GEMM instead of one per expert). Without both cases, or in fp32, or on the CPU: per_expert.
The choice and its reason are in each moecore run's result and in the report.

--budget-s bounds the whole script: each run's timeout is the time left, and runs that would start
with less than --min-run-s left are recorded as skipped, so a caller with a fixed time (the GPU
check) gets what fitted. Results are rewritten after every run: a run killed from outside leaves
the ones before it.

Writes <out>/gpu_peer.json and gpu_peer.md and prints where. --device cpu runs the same on the CPU
(tests, with a tiny --config).

Usage: bench/gpu_peer.py [--config bench/configs/gpu.toml] [--experts 8,32,128]
       [--modes eager,compile] [--steps 8] [--warmup 3] [--repeats 1] [--budget-s 0]
       [--peak-tflops X | --gemm-json PATH] [--experts-impl NAME] [--device cuda|cpu]
       [--moecore-grouped-gemm auto|per_expert|one_launch] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common as C

PEER = C.REPO / "bench" / "peer_torch.py"
GPU_CONFIG = C.REPO / "bench" / "configs" / "gpu.toml"


def expert_overrides(experts: int, model: dict) -> list[str]:
    """bench/expert_scaling.py's rule for the expert count at fixed active parameters: only
    model.num_experts changes; top-k and the expert width stay the config's, so the routed
    parameters a token touches (k experts per layer) are the same at every count and only the
    router (d x E per layer) grows."""
    if model["num_experts_per_tok"] > experts:
        raise SystemExit(f"gpu_peer: top-{model['num_experts_per_tok']} needs at least that many "
                         f"experts, not {experts}")
    return [f"model.num_experts={experts}"]


def read_peak(args) -> dict | None:
    """The peak FLOP/s MFU is taken against, and where it came from. A missing or unreadable
    --gemm-json only costs the MFU column: in the GPU check the peer runs whatever the GEMM
    benchmark before it gave."""
    if args.peak_tflops:
        return {"tflops": args.peak_tflops, "source": "--peak-tflops"}
    if not args.gemm_json:
        return None
    path = Path(args.gemm_json)
    if not path.is_file():
        print(f"gpu_peer: no {path}: MFU not reported", flush=True)
        return None
    try:
        doc = json.loads(path.read_text())
        peak = next((c for c in doc.get("cases", []) if c.get("name", "").startswith("peak")), None)
        if peak is None:
            print(f"gpu_peer: {path} has no \"peak\" case: MFU not reported", flush=True)
            return None
        return {"tflops": float(peak["tflops"]), "source": f"{path.name}: {peak['name']}",
                "device": doc.get("device")}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"gpu_peer: {path} is not bench/cuda/gemm.cpp's JSON ({e}): MFU not reported",
              flush=True)
        return None


GEMM_EXPERTS_CASE = re.compile(r"^experts, (cuBLASLt per expert|one launch)[^:]*: (\d+) experts,")


def grouped_gemm_choice(args, experts: int) -> tuple[str, str]:
    """moecore's train.cuda_grouped_gemm at `experts` experts, and why (module docstring)."""
    if args.moecore_grouped_gemm != "auto":
        return args.moecore_grouped_gemm, "--moecore-grouped-gemm"
    if args.device != "cuda" or args.precision != "bf16":
        return "per_expert", f"the default ({args.device}, {args.precision})"
    if not args.gemm_json:
        return "per_expert", "the default (no --gemm-json)"
    try:
        cases = json.loads(Path(args.gemm_json).read_text()).get("cases", [])
    except (OSError, ValueError) as e:
        return "per_expert", f"the default ({Path(args.gemm_json).name} unreadable: {e})"
    ms = {}
    for case in cases:
        m = GEMM_EXPERTS_CASE.match(str(case.get("name", "")))
        if m and int(m.group(2)) == experts and isinstance(case.get("ms"), (int, float)):
            ms["per_expert" if m.group(1).startswith("cuBLASLt") else "one_launch"] = case["ms"]
    if len(ms) < 2:
        return "per_expert", f"the default ({Path(args.gemm_json).name} has no pair at {experts} experts)"
    choice = min(ms, key=lambda k: (ms[k], k != "per_expert"))
    return choice, (f"{Path(args.gemm_json).name} at {experts} experts: per expert "
                    f"{ms['per_expert']:.3f} ms, one launch {ms['one_launch']:.3f} ms")


def run_peer(args, mode: str, experts: int, model: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(PEER), "--config", str(args.config), "--device", args.device,
           "--mode", mode, "--precision", args.precision, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--synthetic-tokens"]
    if args.device == "cpu":
        cmd += ["--threads", str(args.threads)]
    if args.experts_impl:
        cmd += ["--experts-impl", args.experts_impl]
    for s in args.overrides + expert_overrides(experts, model):
        cmd += ["--set", s]
    env = dict(os.environ)
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = str(args.threads)
    start = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=C.REPO,
                           env=env)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "message": f"timed out after {timeout:.0f}s",
                "wall_s": time.monotonic() - start}
    wall = time.monotonic() - start
    if r.returncode != 0:
        lines = (r.stderr + r.stdout).strip().splitlines()
        errors = [l for l in lines if "Error" in l or "error" in l or l.startswith("peer:")]
        return {"status": "failed", "message": (errors or lines or ["?"])[-1][:300],
                "wall_s": wall}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    timed = res["step_s"][args.warmup:]
    res.update(status="ok", wall_s=wall, step_s_timed=C.summarise(timed),
               tokens_per_s_median=res["tokens_per_step"] / statistics.median(timed))
    return res


def run_moecore(args, experts: int, model: dict, train: dict, timeout: float) -> dict:
    """moecore's side: `moecore train --device <device>` on the same config, expert count,
    precision and step count, on uniform random tokens written as a .npy (the data the peer
    draws), without checkpoints (train.checkpoint=false: a 3.4 G-parameter save would dominate).
    Per-step seconds from metrics.jsonl's cumulative tokens/s (elapsed after step s = s x tokens
    per step / tokens/s); FLOPs per token and parameters from `moecore bench flops`."""
    import numpy as np

    cmd = shlex.split(args.moecore_cmd)
    tokens_per_step = int(train["batch_size"]) * int(train["seq_len"])
    sets = [*args.overrides, *expert_overrides(experts, model),
            f"train.precision={args.precision}", f"train.max_steps={args.steps}",
            "train.checkpoint=false", "train.eval_every=0", "train.log_every=1",
            "train.sample_tokens=0", "train.profile=true", "data.val=[]", 'data.tokenizer=""']
    if args.device == "cpu":
        sets.append(f"train.threads={args.threads}")
    # The training run's only (`bench flops` validates the config without --device).
    grouped_gemm, grouped_gemm_reason = grouped_gemm_choice(args, experts)
    train_sets = (["--set", "train.cuda_grouped_gemm=one_launch"] if grouped_gemm == "one_launch"
                  else [])
    with tempfile.TemporaryDirectory(prefix="gpu_peer_moecore_") as work:
        data = Path(work) / "tokens.npy"
        rng = np.random.default_rng(int(train.get("seed", 0)))
        count = (args.steps + 2) * int(train["batch_size"]) * (int(train["seq_len"]) + 1)
        np.save(data, rng.integers(0, int(model["vocab_size"]), size=count, dtype=np.uint32))
        sets += [f"data.train=[\"{data}\"]", f"train.out_dir={Path(work) / 'run'}"]
        set_args = [a for x in sets for a in ("--set", x)]
        flops = subprocess.run(cmd + ["bench", "flops", str(args.config), *set_args],
                               capture_output=True, text=True, timeout=120, cwd=C.REPO)
        if flops.returncode != 0:
            return {"status": "failed", "message": (flops.stderr or flops.stdout).strip()[-300:]}
        counts = json.loads(flops.stdout.strip().splitlines()[-1])
        start = time.monotonic()
        try:
            r = subprocess.run(cmd + ["train", str(args.config), "--device", args.device, *set_args,
                                      *train_sets],
                               capture_output=True, text=True, timeout=timeout, cwd=C.REPO)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "message": f"timed out after {timeout:.0f}s",
                    "wall_s": time.monotonic() - start}
        wall = time.monotonic() - start
        if r.returncode != 0:
            return {"status": "failed", "message": C.first_error(r.stderr + r.stdout)[:300],
                    "wall_s": wall}
        rows = [json.loads(line) for line in
                (Path(work) / "run" / "metrics.jsonl").read_text().splitlines()]
        profile = json.loads((Path(work) / "run" / "profile.json").read_text())
    elapsed = [0.0] + [row["step"] * tokens_per_step / row["train/tokens_per_s"]
                       for row in rows if "train/tokens_per_s" in row]
    step_s = [b - a for a, b in zip(elapsed, elapsed[1:])]
    timed = step_s[args.warmup:]
    startup = re.search(r"on cuda (.+?), \S+ GEMMs", r.stdout)
    d, layers = int(model["hidden_size"]), int(model["num_hidden_layers"])
    return {"status": "ok", "wall_s": wall, "step_s": step_s, "first_step_s": step_s[0],
            "step_s_timed": C.summarise(timed), "tokens_per_step": tokens_per_step,
            "tokens_per_s_median": tokens_per_step / statistics.median(timed),
            "flops_per_token": counts["flops_per_token"]["total"],
            "parameters": counts["parameters"]["total"],
            "parameters_active": counts["parameters"]["active"],
            "parameters_router": d * experts * layers,
            "experts_implementation": f"moecore grouped GEMM, {grouped_gemm}",
            "grouped_gemm": grouped_gemm, "grouped_gemm_reason": grouped_gemm_reason,
            "gpu": startup.group(1) if startup else None, "peak_memory_allocated": None,
            "profile": step_by_phase(profile)}


def step_by_phase(profile: dict) -> dict:
    """train.profile's phases (out_dir/profile.json, every step but the first) per step: the
    passes (every forward and backward phase), the optimizer (clipping and AdamW) and the rest
    (communication, and "other": embeddings, norms, losses' bookkeeping), in ms, with the clock
    that timed them (CUDA events on a GPU). What separates the MoE layers' scaling with the expert
    count from the optimizer's pass over every parameter (bench/results/expert_scaling.md on the
    CPU)."""
    per_step = 1e3 / max(int(profile["steps"]), 1)
    phases = profile["phases"]
    step_ms = float(profile["seconds"]) * per_step  # the phases add up to it ("other": the rest)
    passes_ms = per_step * sum(s for name, s in phases.items()
                               if name.endswith(("_forward", "_backward")))
    optimizer_ms = per_step * phases.get("optimizer", 0.0)
    return {"clock": profile.get("phase_clock", "?"), "steps": profile["steps"],
            "step_ms": step_ms, "passes_ms": passes_ms, "optimizer_ms": optimizer_ms,
            "rest_ms": step_ms - passes_ms - optimizer_ms}


def machine(args) -> dict:
    """Where and when; the commit from git where the tree has one, else from the GPU bundle's
    commit file (the device machine gets the tree without .git)."""
    commit = "?"
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                text=True, cwd=C.REPO).stdout.strip() or "?"
    except OSError:
        pass
    bundle = C.REPO / ".gpu" / "bundle" / "commit"
    if commit == "?" and bundle.is_file():
        commit = bundle.read_text().split()[0]
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "device": args.device,
            "cores": os.cpu_count()}


def summarise_rows(data: dict) -> None:
    """Per (mode, experts): median tokens/s over the repeats, MFU, and the 8 -> max change."""
    peak = data["peak"]
    rows = []
    for mode in data["meta"]["modes"]:
        for e in data["meta"]["experts"]:
            runs = [r for r in data["runs"] if r["mode"] == mode and r["experts"] == e]
            ok = [r for r in runs if r["status"] == "ok"]
            row = {"mode": mode, "experts": e, "repeats": len(runs)}
            if ok:
                tps = [r["tokens_per_s_median"] for r in ok]
                row.update(status="ok", tokens_per_s=C.summarise(tps),
                           step_ms_median=statistics.median(
                               1e3 * r["step_s_timed"]["median"] for r in ok),
                           step_spread=max(r["step_s_timed"]["spread"] for r in ok),
                           first_step_s=statistics.median(r["first_step_s"] for r in ok),
                           parameters=ok[0]["parameters"],
                           parameters_active=ok[0]["parameters_active"],
                           parameters_router=ok[0]["parameters_router"],
                           flops_per_token=ok[0]["flops_per_token"],
                           experts_implementation=ok[0]["experts_implementation"],
                           peak_memory_gib=max((r.get("peak_memory_allocated") or 0) / 2**30
                                               for r in ok) or None)
                if peak:
                    row["mfu"] = (row["tokens_per_s"]["median"] * row["flops_per_token"]
                                  / (peak["tflops"] * 1e12))
                profiles = [r["profile"] for r in ok if r.get("profile")]
                if profiles:
                    row["profile"] = {key: statistics.median(p[key] for p in profiles)
                                      for key in ("step_ms", "passes_ms", "optimizer_ms",
                                                  "rest_ms")}
                    row["profile"]["clock"] = profiles[0]["clock"]
            elif runs:
                row.update(status=runs[-1]["status"], message=runs[-1].get("message", ""))
            else:
                row.update(status="not run")
            rows.append(row)
    data["results"] = rows
    change = {}
    lo_e, hi_e = data["meta"]["experts"][0], data["meta"]["experts"][-1]
    for mode in data["meta"]["modes"]:
        by = {r["experts"]: r for r in rows if r["mode"] == mode and r["status"] == "ok"}
        if lo_e in by and hi_e in by and lo_e != hi_e:
            change[mode] = by[hi_e]["tokens_per_s"]["median"] / by[lo_e]["tokens_per_s"]["median"] - 1
    data["throughput_change"] = change


def write(out: Path, data: dict) -> None:
    summarise_rows(data)
    m, peak = data["meta"], data["peak"]
    # The peer's versions and experts backend come from its own runs (moecore's carry none).
    first_ok = next((r for r in data["runs"] if r["status"] == "ok" and r["mode"] != "moecore"),
                    {})
    # The GPU's name from the peer's runs, else from moecore's start-up line.
    where = first_ok.get("gpu") or next((r["gpu"] for r in data["runs"] if r.get("gpu")),
                                        m["device"])
    lines = [
        "# transformers peer on the GPU (issue 15 items 5-6)",
        "",
        f"Generated by `bench/gpu_peer.py` on {m['date']} (commit {m['commit']}) on {where}: "
        f"transformers {first_ok.get('transformers', '?')} `OlmoeForCausalLM` (experts backend "
        f"`{first_ok.get('experts_implementation', '?')}`) + `torch.optim.AdamW`, torch "
        f"{first_ok.get('torch', '?')}, {m['precision']} autocast over fp32 master weights. "
        f"Model `{m['config']}` at {' / '.join(map(str, m['experts']))} experts with fixed active "
        f"parameters (top-{m['top_k']} of experts of width {m['expert_width']} at every count); "
        f"{m['tokens_per_step']} tokens a step of uniform random tokens "
        f"(seed {m['seed']}); {m['warmup']} warm-up steps, then {m['steps'] - m['warmup']} timed; "
        f"{m['repeats']} repeat(s). tokens/s: tokens per step / median timed step (median "
        f"[min, max] over repeats); spread: (max - min) / median of the timed steps. "
        + (f"MFU: tokens/s x FLOPs per token (moecore's count, model/flop_count.cpp) / "
           f"{peak['tflops']:.4g} TFLOP/s ({peak['source']})." if peak
           else "MFU: not reported (no peak given: --peak-tflops or --gemm-json)."),
        "",
        "| mode | experts | params | active | FLOPs/token | tokens/s | step ms | spread | MFU | "
        "peak GiB | first step s | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        if r["status"] == "ok":
            mfu = f"{100 * r['mfu']:.1f} %" if "mfu" in r else "-"
            mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
            lines.append(
                f"| {r['mode']} | {r['experts']} | {r['parameters'] / 1e6:.1f}M | "
                f"{r['parameters_active'] / 1e6:.1f}M | {r['flops_per_token'] / 1e9:.3f}G | "
                f"{C.fmt_range(r['tokens_per_s'])} | {r['step_ms_median']:.1f} | "
                f"{100 * r['step_spread']:.0f}% | {mfu} | {mem} | {r['first_step_s']:.1f} | ok |")
        else:
            lines.append(f"| {r['mode']} | {r['experts']} | - | - | - | - | - | - | - | - | - | "
                         f"{r['status']}: {r.get('message', '')} |")
    if data["throughput_change"]:
        e0, e1 = m["experts"][0], m["experts"][-1]
        lines += ["", f"tokens/s change {e0} -> {e1} experts (moecore's target: >= -5 %):", ""]
        for mode, c in data["throughput_change"].items():
            lines.append(f"- {mode}: {100 * c:+.1f} %")
    by = {(r["mode"], r["experts"]): r for r in data["results"] if r["status"] == "ok"}
    profiled = [e for e in m["experts"] if "profile" in by.get(("moecore", e), {})]
    if profiled:
        clock = by[("moecore", profiled[0])]["profile"]["clock"]
        lines += ["", f"moecore's step by phase (train.profile over every step but the first, "
                  f"so the warm-up steps after it included, unlike the tokens/s above; timed by "
                  f"{clock}; ms per step, medians over repeats; the tokens/s above were measured "
                  "with the profile on, which records two events per phase): the forward and "
                  "backward passes, the optimizer (clipping and AdamW over every parameter), the "
                  "rest (communication, embeddings, losses, the step's bookkeeping):", "",
                  "| experts | step ms | passes ms | optimizer ms | rest ms |", "|---|---|---|---|---|"]
        for e in profiled:
            p = by[("moecore", e)]["profile"]
            lines.append(f"| {e} | {p['step_ms']:.2f} | {p['passes_ms']:.2f} | "
                         f"{p['optimizer_ms']:.2f} | {p['rest_ms']:.2f} |")
        lo, hi = by[("moecore", profiled[0])]["profile"], by[("moecore", profiled[-1])]["profile"]
        if len(profiled) > 1 and hi["passes_ms"] > 0:
            data["moecore_passes_change"] = lo["passes_ms"] / hi["passes_ms"] - 1
            lines += ["", f"Tokens/s of the passes alone, {profiled[0]} -> {profiled[-1]} experts: "
                      f"{100 * data['moecore_passes_change']:+.1f} % (the optimizer's share of "
                      f"the profiled step at {profiled[-1]}: "
                      f"{100 * hi['optimizer_ms'] / hi['step_ms']:.0f} %)."]
    chosen = [(r["experts"], r["grouped_gemm"], r["grouped_gemm_reason"]) for r in data["runs"]
              if r["mode"] == "moecore" and r.get("grouped_gemm") and r.get("repeat", 0) == 0]
    if chosen:
        lines += ["", "moecore's routed experts (train.cuda_grouped_gemm):", ""]
        lines += [f"- {e} experts: {g} ({why})" for e, g, why in chosen]
    ratios = [(e, by[("moecore", e)]["tokens_per_s"]["median"] / by[("eager", e)]["tokens_per_s"]["median"])
              for e in m["experts"] if ("moecore", e) in by and ("eager", e) in by]
    data["moecore_vs_eager"] = {str(e): x for e, x in ratios}
    if ratios:
        lines += ["", "moecore / transformers eager tokens/s (target >= 1.5x):", ""]
        lines += [f"- {e} experts: {x:.2f}x" for e, x in ratios]
    elif "moecore" not in m["modes"]:
        lines += ["", "moecore's side not run (--modes without moecore).", ""]
    lines.append("")
    C.write_results(out, "gpu_peer", data, "\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(GPU_CONFIG))
    ap.add_argument("--set", action="append", default=[], dest="overrides",
                    help="config override for every run (model.num_experts is the script's)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--experts", default="8,32,128",
                    help="expert counts; the first and last give the throughput change")
    ap.add_argument("--modes", default="eager,compile",
                    help="eager and compile: transformers; moecore: `moecore train --device`")
    ap.add_argument("--moecore-cmd",
                    default=os.environ.get("MOECORE_BIN", str(C.REPO / "build" / "bin" / "moecore")),
                    help="the moecore program (a command line: the GPU check runs it through "
                         "its bundle's loader)")
    ap.add_argument("--order", default="",
                    help="expert counts in the order they run (default: --experts'); e.g. "
                         "8,128,32 so that a budget cut keeps the ends of the change")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--experts-impl", default=None, help="peer_torch.py --experts-impl")
    ap.add_argument("--steps", type=int, default=8, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="--device cpu only")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run at most")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="seconds for the whole script (0: no limit)")
    ap.add_argument("--min-run-s", type=float, default=30.0,
                    help="with --budget-s: no run starts with less time left than this")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--gemm-json", default="", help="bench/cuda/gemm.cpp --json output")
    ap.add_argument("--moecore-grouped-gemm", choices=("auto", "per_expert", "one_launch"),
                    default="auto", help="moecore's train.cuda_grouped_gemm (auto: the faster in "
                                         "--gemm-json at each expert count)")
    ap.add_argument("--out", default=str(C.REPO / "bench" / "results"))
    args = ap.parse_args()
    started = time.monotonic()
    if args.steps <= args.warmup:
        raise SystemExit(f"gpu_peer: --steps {args.steps} leaves no timed step after --warmup {args.warmup}")
    experts = [int(e) for e in args.experts.split(",") if e]
    order = [int(e) for e in args.order.split(",") if e] or experts
    if sorted(order) != sorted(experts):
        raise SystemExit(f"gpu_peer: --order {args.order} is not a permutation of --experts {args.experts}")
    modes = [m for m in args.modes.split(",") if m]
    if not experts or not modes or set(modes) - {"eager", "compile", "moecore"}:
        raise SystemExit(f"gpu_peer: bad --experts {args.experts!r} or --modes {args.modes!r}")
    for s in args.overrides:
        if s.startswith("model.num_experts="):
            raise SystemExit("gpu_peer: model.num_experts is set per run (--experts)")
    import peer_torch  # its config reader: the runs and this script read the config alike
    cfg = peer_torch.load_config(args.config, args.overrides)
    model, train = cfg["model"], cfg["train"]
    for e in experts:
        expert_overrides(e, model)  # a bad count fails here, before any run
    meta = machine(args)
    config = Path(args.config).resolve()
    meta.update(config=str(config.relative_to(C.REPO) if config.is_relative_to(C.REPO) else config),
                experts=experts, modes=modes,
                steps=args.steps, warmup=args.warmup, repeats=args.repeats,
                precision=args.precision, overrides=args.overrides,
                tokens_per_step=int(train["batch_size"]) * int(train["seq_len"]),
                seed=int(train.get("seed", 0)), budget_s=args.budget_s or None,
                experts_impl_requested=args.experts_impl, top_k=model["num_experts_per_tok"],
                moecore_grouped_gemm=args.moecore_grouped_gemm,
                expert_width=model["moe_intermediate_size"])
    data = {"meta": meta, "peak": read_peak(args), "runs": []}
    out = Path(args.out)
    # Expert count by expert count, moecore and eager side by side, so that a budget cut keeps
    # whole pairs; torch.compile (a minute or more of compiling per run) after all of them.
    passes = [[m for m in modes if m != "compile"], [m for m in modes if m == "compile"]]
    for rep in range(args.repeats):
        for e, mode in ((e, mode) for group in passes for e in order for mode in group):
            left = (args.budget_s - (time.monotonic() - started)) if args.budget_s else None
            if left is not None and left < args.min_run_s:
                res = {"status": "skipped", "message": f"time budget ({args.budget_s:.0f}s) spent"}
            else:
                timeout = args.timeout if left is None else min(args.timeout, left)
                res = (run_moecore(args, e, model, train, timeout) if mode == "moecore"
                       else run_peer(args, mode, e, model, timeout))
                if (res["status"] != "ok" and timeout < args.timeout
                        and "timed out" in res.get("message", "")):
                    # Not a failure of the run: the budget left it less than its own limit.
                    res = {"status": "skipped",
                           "message": f"stopped by the time budget after {timeout:.0f}s"}
            res.update(mode=mode, experts=e, repeat=rep)
            data["runs"].append(res)
            shown = (f"{res['tokens_per_s_median']:.0f} tok/s, step "
                     f"{1e3 * res['step_s_timed']['median']:.1f} ms"
                     if res["status"] == "ok" else f"{res['status']}: {res.get('message', '')}")
            print(f"repeat {rep + 1}/{args.repeats} {mode} {e:3d} experts: {shown} "
                  f"({time.monotonic() - started:.0f}s)", flush=True)
            meta["total_seconds"] = time.monotonic() - started
            write(out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
