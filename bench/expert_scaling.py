#!/usr/bin/env python3
"""Expert scaling (issue 6 item 4b), OLMo-core's experiment scaled to this machine: top-4 with a
fixed expert size (bench/configs/bench.toml: d 256, 4 layers, experts of width 256, batch
8 x 256 tokens) at 8, 16, 32, 64 and 128 experts, so that the FLOPs per token stay (almost:
the router grows as 6 d E) constant while the total parameters grow ~11x. Published: 8 -> 128
experts at top-4 lost under 5% training throughput.

Layouts: one process (all threads), and expert parallelism over 2 and 4 ranks (ep = dp = 2 or 4,
the rowwise dispatch, one thread per rank, mpirun; 4 ranks oversubscribe a 2-core machine 2:1).
Routing is random (model.routing = "random"), as in bench/scaling.py: every expert and every
rank gets an even share of the routes whatever the router learns, so the experiment measures the
cost of more experts, not the router's balance. Side by side: each repeat runs every (layout,
experts) combination once, in turn; the 8 -> 128 change is taken within a repeat and its median
reported. Every run is profiled (train.profile): the phase breakdown per expert count shows where
the time goes.

Usage: bench/expert_scaling.py [--quick] [--repeats 5] [--steps 8] [--warmup 2] [--out bench/results]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import common as C

EXPERTS = (8, 16, 32, 64, 128)
# (ranks, ep, micro-batches per optimizer step). The last layout is the same single process with
# gradient accumulation over 8 micro-batches of the same 8 x 256 tokens (batch 64, 16384 tokens
# per optimizer step): the optimizer's pass over every parameter, which grows with the expert
# count, is paid once per 8 micro-batches, as it is paid once per millions of tokens in the
# published runs. It runs the first and last expert counts only (its steps are 8x longer).
LAYOUTS = ((1, 1, 1), (2, 2, 1), (4, 4, 1), (1, 1, 8))
BASE_BATCH = 8


def layout_name(ranks: int, ep: int, micro: int = 1) -> str:
    if micro > 1:
        return f"1 process, {micro} micro-batches per step ({micro * BASE_BATCH * 256} tokens)"
    return "1 process" if ranks == 1 else f"ep={ep} ({ranks} ranks, rowwise)"


def layout_experts(micro: int, experts: tuple) -> tuple:
    return experts if micro == 1 else (experts[0], experts[-1])


def layout_steps(micro: int, steps: int, warmup: int) -> int:
    return steps if micro == 1 else max(warmup + 3, steps // 2 + 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(C.REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--quick", action="store_true", help="2 repeats, 8/32/128 experts, short runs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(C.REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    experts = EXPERTS
    if args.quick:
        args.repeats, args.steps, args.warmup, experts = 2, 5, 2, (8, 32, 128)
    work = C.work_dir()
    binary = C.private_binary(args.binary, work)
    meta = C.machine_meta(args)
    started = time.monotonic()
    params = {e: C.model_flops(binary, [f"model.num_experts={e}"]) for e in experts}
    runs = {(r, ep, mb, e): [] for r, ep, mb in LAYOUTS for e in layout_experts(mb, experts)}
    try:
        for rep in range(args.repeats):
            for ranks, ep, micro in LAYOUTS:
                for e in layout_experts(micro, experts):
                    threads = max(1, args.cores // ranks)
                    sets = [f"train.max_steps={layout_steps(micro, args.steps, args.warmup)}",
                            f"train.threads={threads}", f"train.batch_size={BASE_BATCH * micro}",
                            f"train.microbatches={micro}",
                            f"model.num_experts={e}", "model.routing=random", f"parallel.ep={ep}",
                            "parallel.dispatch=rowwise", "parallel.zero=0"]
                    res = C.run_train(binary, sets, work, f"es_{ranks}_{micro}_{e}", ranks=ranks,
                                      warmup=args.warmup, timeout=args.timeout)
                    runs[(ranks, ep, micro, e)].append(res)
                    shown = (f"{res['tokens_per_s']:.0f} tok/s" if res["status"] == "ok"
                             else f"{res['status']}: {res.get('message', '')}")
                    print(f"repeat {rep + 1}/{args.repeats} {layout_name(ranks, ep, micro)} "
                          f"{e:3d} experts: {shown} ({time.monotonic() - started:.0f}s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows, changes, model_changes = [], {}, {}
    for ranks, ep, micro in LAYOUTS:
        lexperts = layout_experts(micro, experts)
        for e in lexperts:
            rs = runs[(ranks, ep, micro, e)]
            row = {"ranks": ranks, "ep": ep, "microbatches": micro, "experts": e,
                   "threads": max(1, args.cores // ranks),
                   "parameters": params[e]["parameters"],
                   "flops_per_token": params[e]["flops_per_token"]["total"], "runs": rs}
            bad = [r for r in rs if r["status"] != "ok"]
            if bad:
                row.update(status=bad[0]["status"], message=bad[0].get("message", ""))
            else:
                row.update(status="ok", tokens_per_s=C.summarise([r["tokens_per_s"] for r in rs]),
                           drop_rate=max(r["drop_rate"] for r in rs),
                           peak_rss_mib=C.summarise([r["peak_rss_mib"] for r in rs if r["peak_rss_mib"]] or [0.0]),
                           phases_ms=phase_medians(rs))
            rows.append(row)
        lo, hi = runs[(ranks, ep, micro, lexperts[0])], runs[(ranks, ep, micro, lexperts[-1])]
        pairs = [(a["tokens_per_s"], b["tokens_per_s"]) for a, b in zip(lo, hi)
                 if a["status"] == "ok" and b["status"] == "ok"]
        if pairs:
            changes[layout_name(ranks, ep, micro)] = C.summarise([b / a - 1.0 for a, b in pairs])
        # The same change for the forward and backward alone (profiled phases without the
        # optimizer, the gradient reduction and the rest of the step): time per step, inverted.
        pairs = [(model_ms(a), model_ms(b)) for a, b in zip(lo, hi)
                 if a["status"] == "ok" and b["status"] == "ok" and a.get("profile") and b.get("profile")]
        if pairs:
            model_changes[layout_name(ranks, ep, micro)] = C.summarise([a / b - 1.0 for a, b in pairs])
    meta.update(total_seconds=time.monotonic() - started, repeats=args.repeats, steps=args.steps,
                warmup=args.warmup, experts=list(experts), config=str(C.CONFIG.relative_to(C.REPO)))
    data = {"meta": meta, "results": rows, "throughput_change": changes,
            "forward_backward_change": model_changes}
    write_markdown(Path(args.out), data)
    plot(Path(args.out), data)
    return 0


MODEL_PHASES = ("attention", "router", "dispatch", "experts", "shared_expert", "combine", "lm_head")


def model_ms(run: dict) -> float:
    """Forward + backward ms per step of a profiled run (the model's phases only)."""
    p = run["profile"]
    return sum(1e3 * s / p["steps"] for name, s in p["phases"].items()
               if name.removesuffix("_forward").removesuffix("_backward") in MODEL_PHASES)


def phase_medians(rs: list[dict]) -> dict:
    """Median ms per step of each phase (forward and backward together) over the runs."""
    per_run = []
    for r in rs:
        p = r.get("profile")
        if not p or p["steps"] <= 0:
            continue
        merged: dict[str, float] = {}
        for name, s in p["phases"].items():
            base = name.removesuffix("_forward").removesuffix("_backward")
            merged[base] = merged.get(base, 0.0) + 1e3 * s / p["steps"]
        merged["step"] = 1e3 * p["seconds"] / p["steps"]
        per_run.append(merged)
    if not per_run:
        return {}
    import statistics
    return {k: statistics.median(run[k] for run in per_run) for k in per_run[0]}


def write_markdown(out: Path, data: dict) -> None:
    m = data["meta"]
    lines = [
        "# Expert scaling (issue 6 items 4b, 5)",
        "",
        f"Generated by `make bench` (`bench/expert_scaling.py`{' --quick' if m['quick'] else ''}) on "
        f"{m['date']} (commit {m.get('commit', '?')}): {m['cores']} CPU cores, {m['machine']}, load average "
        f"{m['load_average_at_start']:.1f} at the start. Model: `{m['config']}` with random routing, "
        f"top-4, experts of width 256, batch 8 x 256 tokens (and 64 x 256 in 8 micro-batches of 8 "
        f"for the accumulation layout); {m['steps']} steps per run "
        f"({layout_steps(8, m['steps'], m['warmup'])} with accumulation), throughput "
        f"over the steps after the first {m['warmup']}; median [min, max] of {m['repeats']} repeats, "
        "each repeat running every combination once, in turn. zero = 0.",
        "",
        "| layout | experts | total params | FLOPs/token | tokens/s | spread | peak RSS MiB/rank | max drop rate | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        name = layout_name(r["ranks"], r["ep"], r.get("microbatches", 1))
        p = r["parameters"]["total"] / 1e6
        if r["status"] == "ok":
            lines.append(f"| {name} | {r['experts']} | {p:.1f}M | {r['flops_per_token'] / 1e6:.2f}M | "
                         f"{C.fmt_range(r['tokens_per_s'])} | {100 * r['tokens_per_s']['spread']:.0f}% | "
                         f"{r['peak_rss_mib']['median']:.0f} | {r['drop_rate']:.3f} | ok |")
        else:
            lines.append(f"| {name} | {r['experts']} | {p:.1f}M | {r['flops_per_token'] / 1e6:.2f}M | - | - "
                         f"| - | - | {r['status']}: {r.get('message', '')} |")
    e0, e1 = m["experts"][0], m["experts"][-1]
    lines += ["", f"Throughput change {e0} -> {e1} experts (per repeat, side by side; published: "
              "under 5% loss; target: <= 5% loss):", "",
              "| layout | tokens/s change median [min, max] | target met | forward + backward "
              "only (profile): change median [min, max] |", "|---|---|---|---|"]
    for name, s in data["throughput_change"].items():
        fb = data["forward_backward_change"].get(name)
        lines.append(f"| {name} | {C.fmt_range(s, 1, 100)} % | "
                     f"{'yes' if s['median'] >= -0.05 else 'no'} | "
                     f"{C.fmt_range(fb, 1, 100) + ' %' if fb else '-'} |")
    # Where the time goes, one process: ms per step per phase.
    one = [r for r in data["results"] if r["ranks"] == 1 and r.get("microbatches", 1) == 1
           and r["status"] == "ok" and r.get("phases_ms")]
    if one:
        names = [k for k in one[0]["phases_ms"] if k != "step"]
        lines += ["", "Time per step by phase, one process (train.profile; ms, median over the "
                  "repeats; forward and backward together; the profile leaves out the first step):", "",
                  "| experts | step | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for r in one:
            ph = r["phases_ms"]
            lines.append(f"| {r['experts']} | {ph['step']:.0f} | " +
                         " | ".join(f"{ph[n]:.0f}" for n in names) + " |")
    lines += ["", "![tokens/s and parameters against experts](expert_scaling.png)", ""]
    C.write_results(out, "expert_scaling", data, "\n".join(lines))


def plot(out: Path, data: dict) -> None:
    plt = C.plt()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    layouts = sorted({(r["ranks"], r["ep"], r.get("microbatches", 1)) for r in data["results"]})
    for ranks, ep, micro in layouts:
        rs = [r for r in data["results"]
              if (r["ranks"], r["ep"], r.get("microbatches", 1)) == (ranks, ep, micro)
              and r["status"] == "ok"]
        if not rs:
            continue
        x = [r["experts"] for r in rs]
        med = [r["tokens_per_s"]["median"] for r in rs]
        err = [[r["tokens_per_s"]["median"] - r["tokens_per_s"]["min"] for r in rs],
               [r["tokens_per_s"]["max"] - r["tokens_per_s"]["median"] for r in rs]]
        ax1.errorbar(x, med, yerr=err, marker="o", capsize=3, label=layout_name(ranks, ep, micro))
    one = [r for r in data["results"] if r["ranks"] == 1 and r.get("microbatches", 1) == 1]
    ax2.plot([r["experts"] for r in one], [r["parameters"]["total"] / 1e6 for r in one], "o-",
             label="total")
    ax2.plot([r["experts"] for r in one], [r["parameters"]["active"] / 1e6 for r in one], "s--",
             label="active per token")
    experts = data["meta"]["experts"]
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(experts, [str(e) for e in experts])
        ax.set_xlabel("experts (top-4, width 256)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("tokens/s (median, [min, max])")
    ax1.set_ylim(bottom=0)
    ax2.set_ylabel("parameters (M)")
    fig.tight_layout()
    fig.savefig(out / "expert_scaling.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
