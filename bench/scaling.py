#!/usr/bin/env python3
"""Scaling figures for distributed training (issue 4 item 9): tokens/s and peak memory per rank for
1, 2 and 4 ranks at ep = 1, 2, 4 (where ep divides the ranks), with dispatch "sync" and "rowwise"
and overlap_grad_reduce off and on (zero = 0, which overlap needs), medians of several runs.

Each run is `mpirun -np N moecore train bench/configs/scaling.toml --set ...` (a plain process for
one rank). Throughput is the steady state, read from the run's metrics.jsonl: train/tokens_per_s
at step s is s * tokens_per_step / elapsed(s), so the time of steps w+1..S is
elapsed(S) - elapsed(w); the first `--warmup` steps (allocation, first-touch, MPI connection set-up)
are left out. Peak memory is the trainer's own figure from its final "done:" line: /proc/self/status's
VmHWM (the resident high-water mark of the process over the whole run) of the largest rank.

Threads: ranks x threads = the cores of the machine (`--cores`, default os.cpu_count()), i.e. on a
two-core machine 2 threads at 1 rank and 1 thread per rank at 2 ranks; 4 ranks are oversubscribed
with 1 thread each.

A combination the trainer rejects with "not implemented" is recorded as skipped. Dispatch only
matters with expert parallelism (ep = 1 moves no tokens), and overlap only with more than one rank,
so those duplicates are not run.

Usage: bench/scaling.py [--repeats 3] [--steps 10] [--warmup 2] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "bench" / "configs" / "scaling.toml"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1",
           # Waiting OpenMP threads sleep instead of spinning on the cores other ranks need.
           "OMP_WAIT_POLICY": "PASSIVE"}
PEAK_RE = re.compile(r"peak RSS ([0-9.]+) MiB per rank")


def layouts():
    for ranks in (1, 2, 4):
        for ep in (1, 2, 4):
            if ranks % ep:
                continue
            for dispatch in ("sync", "rowwise"):
                if ep == 1 and dispatch == "rowwise":
                    continue
                for overlap in (False, True):
                    if ranks == 1 and overlap:
                        continue
                    yield ranks, ep, dispatch, overlap


def steady_tokens_per_s(metrics: Path, warmup: int, tokens_per_step: int) -> float:
    rows = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "train/tokens_per_s" in row:
            rows[row["step"]] = row
    last = max(rows)
    elapsed = {s: s * tokens_per_step / rows[s]["train/tokens_per_s"] for s in rows}
    return (last - warmup) * tokens_per_step / (elapsed[last] - elapsed[warmup])


def run_once(binary: Path, ranks: int, ep: int, dispatch: str, overlap: bool, threads: int,
             steps: int, warmup: int, work: Path, timeout: float) -> dict:
    out = work / f"r{ranks}_ep{ep}_{dispatch}_ov{int(overlap)}"
    shutil.rmtree(out, ignore_errors=True)
    sets = [f"train.out_dir={out}", f"train.max_steps={steps}", f"train.threads={threads}",
            f"parallel.ep={ep}", f"parallel.dispatch={dispatch}", "parallel.zero=0",
            f"parallel.overlap_grad_reduce={'true' if overlap else 'false'}"]
    cmd = [str(binary), "train", str(CONFIG)]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks)] + cmd
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, **MPI_ENV})
    wall = time.monotonic() - start
    if r.returncode != 0:
        text = (r.stderr + r.stdout).strip()
        lines = [l for l in text.splitlines() if "error" in l] or text.splitlines()[-1:]
        status = "not implemented" if "not implemented" in text else "failed"
        return {"status": status, "message": lines[0] if lines else "", "wall_s": wall}
    peak = PEAK_RE.search(r.stdout)
    cfg = CONFIG.read_text()
    batch = int(re.search(r"^batch_size = (\d+)", cfg, re.M).group(1))
    seq = int(re.search(r"^seq_len = (\d+)", cfg, re.M).group(1))
    metrics = out / "metrics.jsonl"
    drops = [json.loads(l).get("moe/drop_rate", 0.0) for l in metrics.read_text().splitlines()]
    result = {"status": "ok", "tokens_per_s": steady_tokens_per_s(metrics, warmup, batch * seq),
              "peak_rss_mib": float(peak.group(1)) if peak else None, "wall_s": wall,
              "drop_rate": max(drops) if drops else 0.0}
    shutil.rmtree(out, ignore_errors=True)  # checkpoints of a benchmark are not kept
    return result


def summarise(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_markdown(path: Path, meta: dict, rows: list[dict]) -> None:
    lines = [
        "# Scaling figures (issue 4 item 9)",
        "",
        f"Generated by `make bench-scaling` (`bench/scaling.py`) on {meta['date']}: "
        f"{meta['cores']} CPU cores, {meta['machine']}. Model and batch: "
        "`bench/configs/scaling.toml` (d 256, 4 MoE layers, 16 experts top-4 of width 256, "
        "random routing, 15.75M parameters: 3.17M dense, 12.58M in experts; global batch 16 x 128 tokens), "
        f"{meta['steps']} steps per run, throughput over steps {meta['warmup'] + 1}..{meta['steps']}, "
        f"median of {meta['repeats']} runs with [min, max]. zero = 0 throughout. Threads: ranks x "
        "threads = cores (2 threads at 1 rank, 1 per rank at 2 and 4 ranks: 4 ranks are "
        "oversubscribed 2:1). Peak memory: the trainer's `done:` line, VmHWM of the "
        "largest rank over the whole run (including the final checkpoint's whole-model gather).",
        "",
        "| ranks | ep | dp | ep_dp | dispatch | overlap | threads/rank | tokens/s median [min, max] "
        "| peak RSS MiB/rank median [min, max] | max drop rate | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] == "ok":
            t, m = r["tokens_per_s"], r["peak_rss_mib"]
            tps = f"{t['median']:.0f} [{t['min']:.0f}, {t['max']:.0f}]"
            mem = f"{m['median']:.0f} [{m['min']:.0f}, {m['max']:.0f}]"
            drop = f"{r['drop_rate']:.3f}"
        else:
            tps = mem = drop = "-"
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('message', '')}"
        lines.append(f"| {r['ranks']} | {r['ep']} | {r['ranks']} | {r['ranks'] // r['ep']} | "
                     f"{r['dispatch']} | {'on' if r['overlap'] else 'off'} | {r['threads']} | "
                     f"{tps} | {mem} | {drop} | {status} |")
    lines += ["", "DISCUSSION_PLACEHOLDER", ""]
    path.write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="moecore-bench-"))
    # A private copy: a rebuild of build/ during the benchmark cannot swap the binary mid-way.
    binary = work / "moecore"
    shutil.copy2(args.binary, binary)
    rows = []
    started = time.monotonic()
    try:
        for ranks, ep, dispatch, overlap in layouts():
            threads = max(1, args.cores // ranks)
            row = {"ranks": ranks, "ep": ep, "dispatch": dispatch, "overlap": overlap,
                   "threads": threads, "runs": []}
            for _ in range(args.repeats):
                res = run_once(binary, ranks, ep, dispatch, overlap, threads, args.steps,
                               args.warmup, work, args.timeout)
                row["runs"].append(res)
                if res["status"] != "ok":
                    break
            bad = [r for r in row["runs"] if r["status"] != "ok"]
            if bad:
                row["status"], row["message"] = bad[0]["status"], bad[0].get("message", "")
            else:
                row["status"] = "ok"
                row["tokens_per_s"] = summarise([r["tokens_per_s"] for r in row["runs"]])
                row["peak_rss_mib"] = summarise([r["peak_rss_mib"] for r in row["runs"]])
                row["drop_rate"] = max(r["drop_rate"] for r in row["runs"])
            rows.append(row)
            shown = (f"{row['tokens_per_s']['median']:.0f} tok/s, "
                     f"{row['peak_rss_mib']['median']:.0f} MiB" if row["status"] == "ok"
                     else f"{row['status']}: {row.get('message', '')}")
            print(f"ranks {ranks} ep {ep} {dispatch:7s} overlap {'on ' if overlap else 'off'}: "
                  f"{shown}  ({time.monotonic() - started:.0f}s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "cores": args.cores,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
            "config": str(CONFIG.relative_to(REPO)),
            "tokens_per_s": "steady state over steps warmup+1..steps, from metrics.jsonl",
            "peak_rss_mib": "max over ranks of /proc/self/status VmHWM, whole run",
            "total_seconds": time.monotonic() - started}
    (out / "scaling.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=1) + "\n")
    md = out / "scaling.md"
    discussion = None
    if md.exists():  # keep a hand-written discussion across re-runs
        text = md.read_text()
        marker = "\n## Discussion"
        if marker in text:
            discussion = text[text.index(marker) + 1:]
    write_markdown(md, meta, rows)
    text = md.read_text().replace(
        "DISCUSSION_PLACEHOLDER",
        discussion.rstrip() if discussion else "## Discussion\n\n(to be written)")
    md.write_text(text)
    print(f"wrote {out / 'scaling.json'} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
