#!/usr/bin/env python3
"""Pipeline figures (issue 5 item 5): for each schedule (1f1b, interleaved-1f1b with two virtual
stages, gpipe) at pp = 2 and 4 and 4 or 8 micro-batches, the measured bubble against the theory,
tokens/s and the peak memory of each stage, medians of several runs.

Model: bench/configs/scaling.toml with 8 layers (so that pp = 4 with two virtual stages still has
a layer per chunk); global batch 16 x 128 tokens cut into the micro-batches.

Measured bubble: each stage times how long it waits for a neighbour (its blocking receives) in a
step; the trainer logs pipeline/bubble, the mean over the stages of wait / step time. The figure is
the median over the steps after `--warmup`, then the median over the runs. Theory: (p - 1) / (m + p
- 1) for 1F1B and GPipe, (p - 1) / (v m + p - 1) for interleaved 1F1B with v virtual stages, both
for equal stage times and free communication.

Threads: ranks x threads = the cores (`--cores`): on two cores pp = 2 runs one thread per rank and
pp = 4 is oversubscribed 2:1, so its stages also wait for a core, not only for a neighbour; read
pp = 4 as a functional figure. Peak memory: the trainer's "per stage [...] MiB" (getrusage
ru_maxrss, the largest rank of each stage, training only).

Usage: bench/pipeline.py [--repeats 3] [--steps 8] [--warmup 2] [--quick] [--out bench/results]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling import CONFIG, MPI_ENV, REPO, steady_tokens_per_s, summarise  # noqa: E402

LAYERS = 8
BATCH, SEQ = 16, 128
STAGE_RE = re.compile(r"per stage \[([0-9., ]+)\] MiB")
PEAK_RE = re.compile(r"peak RSS ([0-9.]+) MiB per rank")


def theory(schedule: str, pp: int, m: int) -> float:
    v = 2 if schedule == "interleaved-1f1b" else 1
    return (pp - 1) / (v * m + pp - 1) if pp > 1 else 0.0


def run_once(binary: Path, pp: int, schedule: str, m: int, threads: int, steps: int, warmup: int,
             work: Path, timeout: float) -> dict:
    out = work / f"pp{pp}_{schedule}_m{m}"
    shutil.rmtree(out, ignore_errors=True)
    sets = [f"train.out_dir={out}", f"train.max_steps={steps}", f"train.threads={threads}",
            f"train.microbatches={m}", f"model.num_hidden_layers={LAYERS}",
            f"parallel.pp={pp}", f"parallel.schedule={schedule}"]
    cmd = [str(binary), "train", str(CONFIG)]
    for s in sets:
        cmd += ["--set", s]
    if pp > 1:
        cmd = ["mpirun", "-np", str(pp)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, **MPI_ENV})
    if r.returncode != 0:
        lines = [l for l in (r.stderr + r.stdout).splitlines() if "error" in l]
        return {"status": "failed", "message": lines[0] if lines else r.stderr[-300:]}
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    bubbles = [row["pipeline/bubble"] for row in rows
               if "pipeline/bubble" in row and row["step"] > warmup]
    stages = STAGE_RE.search(r.stdout)
    peak = PEAK_RE.search(r.stdout)
    result = {"status": "ok",
              "tokens_per_s": steady_tokens_per_s(out / "metrics.jsonl", warmup, BATCH * SEQ),
              "bubble": statistics.median(bubbles) if bubbles else 0.0,
              "stage_peak_mib": ([float(x) for x in stages.group(1).split(",")] if stages
                                 else [float(peak.group(1))])}
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="1 run of 4 steps each (a smoke test)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 4, 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="moecore-bench-pp-"))
    binary = work / "moecore"
    shutil.copy2(args.binary, binary)
    combos = [(1, "1f1b", 4)] + [(pp, s, m) for pp in (2, 4) for m in (4, 8)
                                 for s in ("1f1b", "interleaved-1f1b", "gpipe")]
    results, started = [], time.monotonic()
    try:
        for pp, schedule, m in combos:
            threads = max(1, args.cores // pp)
            runs = []
            for _ in range(args.repeats):
                runs.append(run_once(binary, pp, schedule, m, threads, args.steps, args.warmup,
                                     work, args.timeout))
                if runs[-1]["status"] != "ok":
                    break
            row = {"pp": pp, "schedule": schedule, "microbatches": m, "threads": threads,
                   "theory_bubble": theory(schedule, pp, m), "runs": runs}
            bad = [r for r in runs if r["status"] != "ok"]
            if bad:
                row.update(status="failed", message=bad[0]["message"])
            else:
                row.update(status="ok",
                           tokens_per_s=summarise([r["tokens_per_s"] for r in runs]),
                           bubble=summarise([r["bubble"] for r in runs]),
                           stage_peak_mib=[statistics.median(v) for v in
                                           zip(*[r["stage_peak_mib"] for r in runs])])
            results.append(row)
            shown = (f"bubble {row['bubble']['median']:.3f} (theory {row['theory_bubble']:.3f}), "
                     f"{row['tokens_per_s']['median']:.0f} tok/s" if row["status"] == "ok"
                     else row["message"])
            print(f"pp {pp} {schedule:16s} m {m}: {shown}  ({time.monotonic() - started:.0f}s)",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": args.cores,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "load_average_at_end": os.getloadavg()[0], "steps": args.steps,
            "warmup": args.warmup, "repeats": args.repeats, "layers": LAYERS,
            "config": str(CONFIG.relative_to(REPO)), "total_seconds": time.monotonic() - started}
    (out / "pipeline.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1)
                                       + "\n")
    lines = [
        "# Pipeline figures (issue 5 item 5)",
        "",
        f"Generated by `make bench-pipeline` (`bench/pipeline.py`) on {meta['date']}: "
        f"{meta['cores']} cores ({meta['machine']}), load average {meta['load_average_at_end']:.1f} "
        f"at the end. Model `{meta['config']}` with {LAYERS} layers, global batch {BATCH} x {SEQ} "
        f"tokens in m micro-batches; {args.steps} steps a run, figures over steps "
        f"{args.warmup + 1}..{args.steps}, median of {args.repeats} runs [min, max]. Bubble: the "
        "mean over the stages of the time a stage waits for a neighbour / step time; theory "
        "(p-1)/(m+p-1) (1F1B, GPipe) and (p-1)/(2m+p-1) (interleaved, 2 virtual stages). "
        "pp = 4 is oversubscribed 2:1 on two cores (see the script's docstring).",
        "",
        "| pp | schedule | m | threads/rank | bubble median [min, max] | theory | tokens/s median "
        "[min, max] | peak RSS per stage (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['pp']} | {r['schedule']} | {r['microbatches']} | {r['threads']} | "
                         f"failed: {r['message']} | | | |")
            continue
        b, t = r["bubble"], r["tokens_per_s"]
        lines.append(
            f"| {r['pp']} | {r['schedule']} | {r['microbatches']} | {r['threads']} | "
            f"{b['median']:.3f} [{b['min']:.3f}, {b['max']:.3f}] | {r['theory_bubble']:.3f} | "
            f"{t['median']:.0f} [{t['min']:.0f}, {t['max']:.0f}] | "
            f"{', '.join(f'{x:.0f}' for x in r['stage_peak_mib'])} |")
    (out / "pipeline.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'pipeline.json'} and {out / 'pipeline.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
