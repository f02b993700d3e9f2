#!/usr/bin/env python3
"""Throughput, MFU and the PyTorch peer (issue 6 items 4a, 4c and 5): moecore and transformers'
OlmoeForCausalLM + torch.optim.AdamW (eager, and torch.compile where it works; by default only in
fp32, as each run compiles anew) training the same model (bench/configs/bench.toml) on the same
batch, data, threads and precision, measured side by side: every repeat runs the GEMM peak and each variant once, in turn, so that a change in the
machine's load hits all of them alike; ratios are taken within a repeat and their median reported.

MFU = tokens/s x model FLOPs per token / peak FLOP/s. FLOPs per token: `moecore bench flops`
(model/flop_count.h, DESIGN.md's rule). The peak: `moecore bench gemm` at the same precision and
threads, the best median over bench/common.py's PEAK_SHAPES, measured in the same repeat. The
peer's MFU uses the same FLOP count and peak.

bf16 is measured when the binary has it (train.precision = "bf16" and `bench gemm --precision
bf16`); otherwise the results say it was not available.

Usage: bench/throughput.py [--quick] [--repeats 5] [--steps 12] [--warmup 2] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common as C

PEER = C.REPO / "bench" / "peer_torch.py"


def run_peer(mode: str, precision: str, threads: int, steps: int, warmup: int,
             timeout: float, sets: list[str]) -> dict:
    cmd = [sys.executable, str(PEER), "--config", str(C.CONFIG), "--mode", mode, "--precision",
           precision, "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup)]
    for s in sets:
        cmd += ["--set", s]
    start = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=C.REPO, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "message": f"timed out after {timeout:.0f}s"}
    if r.returncode != 0:
        text = (r.stderr + r.stdout).strip().splitlines()
        errors = [l for l in text if "Error" in l or "error" in l]
        return {"status": "failed", "message": (errors or text or ["?"])[-1][:300]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res.update(status="ok", wall_s=time.monotonic() - start)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(C.REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--quick", action="store_true", help="2 repeats of short runs (development)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    # PyTorch's steps vary more from one to the next than moecore's: 8 timed steps after 2 (its
    # eager steps are steady from the second on; torch.compile compiles during the first). With 2
    # timed steps (the earlier default) one slow step moved a run's rate by a third.
    ap.add_argument("--peer-steps", type=int, default=10, help="steps of each PyTorch run")
    ap.add_argument("--peer-warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--compile-precisions", default="fp32",
                    help="precisions that also run torch.compile ('' = none): each compiles anew")
    ap.add_argument("--experts", type=int, default=0,
                    help="model.num_experts for every system (0: the config's); results go to "
                         "throughput_e<N>.{md,json,png}")
    ap.add_argument("--out", default=str(C.REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup, args.peer_steps, args.peer_warmup = 2, 5, 2, 2, 1
    work = C.work_dir()
    binary = C.private_binary(args.binary, work)
    started = time.monotonic()
    meta = C.machine_meta(args)
    model_sets = [f"model.num_experts={args.experts}"] if args.experts else []
    flops = C.model_flops(binary, model_sets)
    fpt = flops["flops_per_token"]["total"]
    sets = [f"train.max_steps={args.steps}", f"train.threads={args.threads}", *model_sets]

    precisions = [p for p in args.precisions.split(",") if p]
    compiled = [p for p in args.compile_precisions.split(",") if p]

    def systems(p: str) -> list[str]:
        return ["moecore", "torch eager"] + (["torch compile"] if p in compiled else [])

    modes = ["eager", "compile"]
    variants = [(p, system) for p in precisions for system in systems(p)]
    runs = {f"{p} {system}": [] for p, system in variants}
    peaks = {p: [] for p in precisions}
    unavailable: dict[str, str] = {}
    try:
        for rep in range(args.repeats):
            for p in precisions:
                if p in unavailable:
                    continue
                peak = C.gemm_peak(binary, p, args.threads)
                if peak["status"] != "ok":
                    unavailable[p] = peak["message"]
                    print(f"{p}: not available ({peak['message']})", flush=True)
                    continue
                for system in systems(p):
                    key = f"{p} {system}"
                    if runs[key] and runs[key][-1]["status"] != "ok":
                        continue  # failed once: recorded, not retried
                    if system == "moecore":
                        extra = [] if p == "fp32" else [f"train.precision={p}"]
                        res = C.run_train(binary, sets + extra, work, f"tp_{p}", warmup=args.warmup,
                                          timeout=args.timeout)
                        if res["status"] != "ok" and "precision" in res.get("message", ""):
                            unavailable[p] = res["message"]
                    else:
                        res = run_peer(system.split()[1], p, args.threads, args.peer_steps,
                                       args.peer_warmup, args.timeout, model_sets)
                    runs[key].append(res)
                    shown = (f"{res['tokens_per_s']:.0f} tok/s" if res["status"] == "ok"
                             else f"{res['status']}: {res.get('message', '')}")
                    print(f"repeat {rep + 1}/{args.repeats} {key}: {shown} (peak "
                          f"{peak['flops_per_s'] / 1e9:.0f} GFLOP/s; "
                          f"{time.monotonic() - started:.0f}s)", flush=True)
                # The peak is measured again after the variants and the better of the two kept: a
                # load spike during one short GEMM measurement would otherwise inflate every MFU
                # of the repeat.
                after = C.gemm_peak(binary, p, args.threads)
                if after["status"] == "ok" and after["flops_per_s"] > peak["flops_per_s"]:
                    peak = after
                peaks[p].append(peak)
                for system in systems(p):
                    if runs[f"{p} {system}"] and len(runs[f"{p} {system}"]) == rep + 1:
                        runs[f"{p} {system}"][-1]["peak_flops_per_s"] = peak["flops_per_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results = {}
    for key, rs in runs.items():
        p = key.split()[0]
        ok = [r for r in rs if r["status"] == "ok"]
        if not rs:
            results[key] = {"status": "not available", "message": unavailable.get(p, "")}
            continue
        if len(ok) != len(rs):
            bad = [r for r in rs if r["status"] != "ok"][0]
            results[key] = {"status": bad["status"], "message": bad.get("message", ""),
                            "runs": rs}
            continue
        mfu = [r["tokens_per_s"] * fpt / r["peak_flops_per_s"] for r in ok]
        results[key] = {"status": "ok", "tokens_per_s": C.summarise([r["tokens_per_s"] for r in ok]),
                        "gflops_per_s": C.summarise([r["tokens_per_s"] * fpt / 1e9 for r in ok]),
                        "mfu": C.summarise(mfu), "runs": rs}
        if "compile" in key:
            results[key]["first_step_s"] = C.summarise([r["first_step_s"] for r in ok])
    # Side-by-side ratios: moecore / peer within each repeat.
    ratios = {}
    for p in precisions:
        mine = runs.get(f"{p} moecore", [])
        for m in modes:
            peer = runs.get(f"{p} torch {m}", [])
            pairs = [(a["tokens_per_s"], b["tokens_per_s"]) for a, b in zip(mine, peer)
                     if a["status"] == "ok" and b["status"] == "ok"]
            if pairs:
                ratios[f"{p} moecore / torch {m}"] = C.summarise([a / b for a, b in pairs])
    peak_summary = {p: {**C.summarise([x["flops_per_s"] for x in v]),
                        "emulated": any(x.get("emulated") for x in v)}
                    for p, v in peaks.items() if v}
    meta.update(total_seconds=time.monotonic() - started, repeats=args.repeats, steps=args.steps,
                warmup=args.warmup, peer_steps=args.peer_steps, peer_warmup=args.peer_warmup,
                threads=args.threads, config=str(C.CONFIG.relative_to(C.REPO)),
                experts=args.experts or None,
                stem=f"throughput_e{args.experts}" if args.experts else "throughput")
    # Each repeat's peak as measured: its winning shape and every shape's median, so a reader can
    # see which GEMM set the MFU's denominator.
    peak_repeats = {p: [{"flops_per_s": x["flops_per_s"], "shape": x["shape"],
                         "shape_medians": {f"{s['m']}x{s['n']}x{s['k']}": s["flops_per_s_median"]
                                           for s in x["shapes"]}} for x in v]
                    for p, v in peaks.items() if v}
    data = {"meta": meta, "flops": flops, "peaks": peak_summary, "peak_repeats": peak_repeats,
            "results": results, "ratios": ratios, "unavailable": unavailable}
    write_markdown(Path(args.out), data)
    plot(Path(args.out), data)
    return 0


def write_markdown(out: Path, data: dict) -> None:
    m, f = data["meta"], data["flops"]
    fpt = f["flops_per_token"]
    lines = [
        "# Throughput, MFU and the PyTorch peer (issue 6 items 4a, 4c, 5)",
        "",
        f"Generated by `make bench` (`bench/throughput.py`{' --quick' if m['quick'] else ''}) on "
        f"{m['date']} (commit {m.get('commit', '?')}): {m['cores']} CPU cores, {m['machine']}, load average "
        f"{m['load_average_at_start']:.1f} at the start. Model: `{m['config']}`"
        f"{' with model.num_experts = ' + str(m['experts']) if m.get('experts') else ''} "
        f"({f['parameters']['total'] / 1e6:.2f}M "
        f"parameters, {f['parameters']['active'] / 1e6:.2f}M active), batch 8 x 256 tokens, "
        f"{m['threads']} threads everywhere. {m['repeats']} repeats; in each, the GEMM peak and every "
        f"variant ran once, in turn. moecore: {m['steps']} steps per run, throughput over steps "
        f"{m['warmup'] + 1}..{m['steps']}; PyTorch: {m['peer_steps']} steps per run, over steps "
        f"{m['peer_warmup'] + 1}..{m['peer_steps']}. Figures: median [min, max] over the repeats.",
        "",
        f"Model FLOPs per token (`moecore bench flops`, DESIGN.md's count): "
        f"**{fpt['total'] / 1e6:.2f}M** = attention projections {fpt['attention_projections'] / 1e6:.2f}M "
        f"+ attention scores {fpt['attention_scores'] / 1e6:.2f}M + router {fpt['router'] / 1e6:.3f}M "
        f"+ experts {fpt['experts'] / 1e6:.2f}M + LM head {fpt['lm_head'] / 1e6:.2f}M.",
        "",
        "| precision | GEMM peak GFLOP/s (best of the shapes; per repeat the better of a "
        "measurement before and after the variants) |",
        "|---|---|",
    ]
    for p, s in data["peaks"].items():
        lines.append(f"| {p} | {C.fmt_range(s, 0, 1e-9)}"
                     f"{' (emulated bf16: no native bf16 on this CPU)' if s.get('emulated') else ''} |")
    for p, msg in data["unavailable"].items():
        lines.append(f"| {p} | not available: {msg} |")
    lines += ["", "| precision | system | tokens/s | model GFLOP/s | MFU % | spread of tokens/s | status |",
              "|---|---|---|---|---|---|---|"]
    for key, r in data["results"].items():
        p, system = key.split(" ", 1)
        if r["status"] == "ok":
            extra = ""
            if "first_step_s" in r:
                extra = f" (first step incl. compilation {r['first_step_s']['median']:.0f} s)"
            lines.append(f"| {p} | {system} | {C.fmt_range(r['tokens_per_s'])} | "
                         f"{C.fmt_range(r['gflops_per_s'])} | {C.fmt_range(r['mfu'], 1, 100)} | {100 * r['tokens_per_s']['spread']:.0f}% | ok{extra} |")
        else:
            lines.append(f"| {p} | {system} | - | - | - | - | {r['status']}: {r.get('message', '')} |")
    peer_params = sorted({r["parameters"] for key, res in data["results"].items() if "torch" in key
                          for r in res.get("runs", []) if r.get("status") == "ok"})
    if peer_params:
        same = peer_params == [int(f["parameters"]["total"])]
        lines += ["", f"Same model: moecore {int(f['parameters']['total']):,} parameters, PyTorch "
                  f"{', '.join(f'{p:,}' for p in peer_params)} ({'equal' if same else 'DIFFERENT'})."]
    lines += ["", "| side-by-side ratio (per repeat) | median [min, max] |", "|---|---|"]
    for key, s in data["ratios"].items():
        lines.append(f"| {key} | {C.fmt_range(s, 2)} |")
    lines += ["", f"![tokens/s and MFU]({m.get('stem', 'throughput')}.png)", ""]
    C.write_results(out, m.get("stem", "throughput"), data, "\n".join(lines))


def plot(out: Path, data: dict) -> None:
    plt = C.plt()
    if plt is None:
        return
    ok = [(k, r) for k, r in data["results"].items() if r["status"] == "ok"]
    if not ok:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    names = [k for k, _ in ok]
    for ax, metric, scale, label in ((ax1, "tokens_per_s", 1, "tokens/s"), (ax2, "mfu", 100, "MFU %")):
        med = [r[metric]["median"] * scale for _, r in ok]
        lo = [(r[metric]["median"] - r[metric]["min"]) * scale for _, r in ok]
        hi = [(r[metric]["max"] - r[metric]["median"]) * scale for _, r in ok]
        ax.bar(range(len(ok)), med, yerr=[lo, hi], capsize=4,
               color=["tab:blue" if "moecore" in n else "tab:orange" for n in names])
        ax.set_xticks(range(len(ok)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"bench.toml{', ' + str(data['meta']['experts']) + ' experts' if data['meta'].get('experts') else ''}, {data['meta']['threads']} threads: median and [min, max] of "
                 f"{data['meta']['repeats']} side-by-side repeats", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"{data['meta'].get('stem', 'throughput')}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
