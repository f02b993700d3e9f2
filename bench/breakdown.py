#!/usr/bin/env python3
"""Time breakdown per phase and the effect of overlapping the gradient reduction (issue 6 item 4d).

Runs bench/configs/bench.toml (learned routing, the model of bench/throughput.py) with
train.profile = true in three layouts: one process with all threads; data parallel over 2 ranks
(one thread each, ep = 1, zero = 0) with parallel.overlap_grad_reduce off and on. Side by side:
each repeat runs the three once, in turn; the overlap effect (tokens/s on / off) is taken within
a repeat. Phases (core/phase_timer.h, rank 0's clock, the first step left out): attention, router,
dispatch (routes to the experts' rows: permutation, and with ep > 1 the exchange), experts (the
grouped GEMMs), combine (outputs back and the weighted sum), LM head (+ cross-entropy), optimizer
(gradient norm, clipping, AdamW), communication (gradient all-reduce: the non-blocking starts
during the backward and the final wait), other (embeddings, norms, residuals, loss bookkeeping,
zeroing gradients, metrics).

Usage: bench/breakdown.py [--quick] [--repeats 5] [--steps 12] [--out bench/results]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import common as C

# (name, ranks, overlap)
LAYOUTS = (("1 process", 1, False), ("dp=2, overlap off", 2, False), ("dp=2, overlap on", 2, True))
GROUPS = ("attention", "router", "dispatch", "experts", "shared_expert", "combine", "lm_head",
          "optimizer", "communication", "other")


def per_step_ms(profile: dict) -> dict:
    out = {g: 0.0 for g in GROUPS}
    for name, s in profile["phases"].items():
        base = name.removesuffix("_forward").removesuffix("_backward")
        out[base] += 1e3 * s / profile["steps"]
    out["step"] = 1e3 * profile["seconds"] / profile["steps"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(C.REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--quick", action="store_true", help="2 repeats of short runs (development)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(C.REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 2, 5, 2
    work = C.work_dir()
    binary = C.private_binary(args.binary, work)
    meta = C.machine_meta(args)
    started = time.monotonic()
    runs = {name: [] for name, _, _ in LAYOUTS}
    try:
        for rep in range(args.repeats):
            for name, ranks, overlap in LAYOUTS:
                sets = [f"train.max_steps={args.steps}",
                        f"train.threads={max(1, args.cores // ranks)}", "parallel.zero=0",
                        f"parallel.overlap_grad_reduce={'true' if overlap else 'false'}"]
                res = C.run_train(binary, sets, work, f"bd_{ranks}_{int(overlap)}", ranks=ranks,
                                  warmup=args.warmup, timeout=args.timeout)
                runs[name].append(res)
                shown = (f"{res['tokens_per_s']:.0f} tok/s" if res["status"] == "ok"
                         else f"{res['status']}: {res.get('message', '')}")
                print(f"repeat {rep + 1}/{args.repeats} {name}: {shown} "
                      f"({time.monotonic() - started:.0f}s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results = {}
    for name, ranks, overlap in LAYOUTS:
        rs = runs[name]
        bad = [r for r in rs if r["status"] != "ok"]
        if bad:
            results[name] = {"status": bad[0]["status"], "message": bad[0].get("message", ""), "runs": rs}
            continue
        steps = [per_step_ms(r["profile"]) for r in rs]
        results[name] = {"status": "ok", "ranks": ranks, "overlap": overlap,
                         "tokens_per_s": C.summarise([r["tokens_per_s"] for r in rs]),
                         "ms_per_step": {k: C.summarise([s[k] for s in steps]) for k in steps[0]},
                         "runs": rs}
    overlap = {}
    off, on = runs["dp=2, overlap off"], runs["dp=2, overlap on"]
    pairs = [(a, b) for a, b in zip(off, on) if a["status"] == "ok" and b["status"] == "ok"]
    if pairs:
        overlap["tokens_per_s_on_over_off"] = C.summarise([b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs])
        overlap["communication_ms_off"] = C.summarise([per_step_ms(a["profile"])["communication"] for a, _ in pairs])
        overlap["communication_ms_on"] = C.summarise([per_step_ms(b["profile"])["communication"] for _, b in pairs])
    meta.update(total_seconds=time.monotonic() - started, repeats=args.repeats, steps=args.steps,
                warmup=args.warmup, config=str(C.CONFIG.relative_to(C.REPO)))
    data = {"meta": meta, "results": results, "overlap": overlap}
    write_markdown(Path(args.out), data)
    plot(Path(args.out), data)
    return 0


def write_markdown(out: Path, data: dict) -> None:
    m = data["meta"]
    lines = [
        "# Time breakdown and gradient-reduction overlap (issue 6 item 4d)",
        "",
        f"Generated by `make bench` (`bench/breakdown.py`{' --quick' if m['quick'] else ''}) on "
        f"{m['date']} (commit {m.get('commit', '?')}): {m['cores']} CPU cores, {m['machine']}, load average "
        f"{m['load_average_at_start']:.1f} at the start. Model: `{m['config']}` (learned routing), batch "
        f"8 x 256 tokens, {m['steps']} steps per run, train.profile = true (rank 0's timers, the "
        f"first step left out); median [min, max] of {m['repeats']} repeats, each running the "
        "three layouts once, in turn. ms per step, forward and backward together.",
        "",
    ]
    ok = [(n, r) for n, r in data["results"].items() if r["status"] == "ok"]
    if ok:
        lines += ["| phase | " + " | ".join(n for n, _ in ok) + " |",
                  "|---|" + "---|" * len(ok)]
        for g in GROUPS + ("step",):
            if all(r["ms_per_step"][g]["max"] < 0.05 for _, r in ok):
                continue
            cells = []
            for _, r in ok:
                s = r["ms_per_step"][g]
                share = 100 * s["median"] / r["ms_per_step"]["step"]["median"]
                cells.append(f"{C.fmt_range(s)} ({share:.0f}%)" if g != "step" else f"**{C.fmt_range(s)}**")
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
        lines.append(f"| tokens/s (metrics.jsonl, steps {m['warmup'] + 1}..) | " +
                     " | ".join(C.fmt_range(r["tokens_per_s"]) for _, r in ok) + " |")
    for n, r in data["results"].items():
        if r["status"] != "ok":
            lines.append(f"\n{n}: {r['status']}: {r.get('message', '')}")
    o = data["overlap"]
    if o:
        lines += ["", "Overlap (dp = 2, side by side per repeat): tokens/s on / off = "
                  f"**{C.fmt_range(o['tokens_per_s_on_over_off'], 3)}**; communication per step "
                  f"{C.fmt_range(o['communication_ms_off'])} ms off -> "
                  f"{C.fmt_range(o['communication_ms_on'])} ms on."]
    lines += ["", "![time per step by phase](breakdown.png)", ""]
    C.write_results(out, "breakdown", data, "\n".join(lines))


def plot(out: Path, data: dict) -> None:
    plt = C.plt()
    if plt is None:
        return
    ok = [(n, r) for n, r in data["results"].items() if r["status"] == "ok"]
    if not ok:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = [0.0] * len(ok)
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(GROUPS):
        vals = [r["ms_per_step"][g]["median"] for _, r in ok]
        if max(vals) < 0.05:
            continue
        ax.bar(range(len(ok)), vals, bottom=bottom, label=g, color=cmap(i % 10))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(ok)), [n for n, _ in ok])
    ax.set_ylabel("ms per step (median)")
    ax.legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
