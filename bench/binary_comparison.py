"""Two moecore binaries side by side (issue 14 item 8: a renovation must not cost speed; item 4:
the bf16 step before and after the bf16 weight copies): steady tokens/s and peak RSS of the bench
model (bench/configs/bench.toml) in each precision, runs of the two binaries interleaved (old,
new, old, new, ...) so that a change of machine load hits both alike; medians of --repeats runs
with their ranges. Results: bench/results/binary_comparison.{md,json}.

    make bench-compare OLD=/path/to/old/moecore   (NEW defaults to build/bin/moecore)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the baseline binary")
    ap.add_argument("--new", default=str(C.REPO / "build" / "bin" / "moecore"))
    ap.add_argument("--old-label", default="old")
    ap.add_argument("--new-label", default="new")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--out", default=str(C.REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    work = C.work_dir()
    (work / "old").mkdir()
    (work / "new").mkdir()
    binaries = {"old": C.private_binary(args.old, work / "old"),
                "new": C.private_binary(args.new, work / "new")}
    meta = C.machine_meta(args)
    started = time.monotonic()
    precisions = [p for p in args.precisions.split(",") if p]
    sets = [f"train.max_steps={args.steps}", f"train.threads={args.threads}"]
    runs: dict[str, dict[str, list[dict]]] = {p: {"old": [], "new": []} for p in precisions}
    for rep in range(args.repeats):
        for p in precisions:
            # Alternate which binary goes first, so neither always runs on a warmer machine.
            order = ["old", "new"] if rep % 2 == 0 else ["new", "old"]
            for which in order:
                r = C.run_train(binaries[which], sets + [f"train.precision=\"{p}\""], work,
                                f"{which}_{p}_{rep}", warmup=args.warmup, timeout=args.timeout)
                if r["status"] != "ok":
                    print(f"{which} {p}: {r['message']}", file=sys.stderr)
                    return 1
                r.pop("profile", None)
                runs[p][which].append(r)
                print(f"rep {rep} {p} {which}: {r['tokens_per_s']:.0f} tokens/s, "
                      f"peak {r['peak_rss_mib']:.0f} MiB", flush=True)
    results = {}
    for p in precisions:
        res = {w: {"tokens_per_s": C.summarise([r["tokens_per_s"] for r in runs[p][w]]),
                   "peak_rss_mib": C.summarise([r["peak_rss_mib"] for r in runs[p][w]])}
               for w in ("old", "new")}
        res["ratio_new_over_old"] = (res["new"]["tokens_per_s"]["median"]
                                     / res["old"]["tokens_per_s"]["median"])
        # Each repeat's two runs ran back to back: their ratio cancels most of the load drift.
        res["paired_ratio"] = C.summarise([n["tokens_per_s"] / o["tokens_per_s"]
                                           for o, n in zip(runs[p]["old"], runs[p]["new"])])
        results[p] = res
    meta["minutes"] = (time.monotonic() - started) / 60
    data = {"meta": meta, "old": args.old_label, "new": args.new_label, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "results": results, "runs": runs}
    lines = [
        "# Two binaries side by side",
        "",
        f"`bench/binary_comparison.py`: the bench model (bench/configs/bench.toml), "
        f"{args.steps} steps (tokens/s over steps {args.warmup + 1}..{args.steps}), "
        f"{args.threads} threads, runs of the two binaries interleaved, medians of "
        f"{args.repeats} runs [min, max]. Machine: {meta['machine']}, {meta['cores']} cores, "
        f"load average {meta['load_average_at_start']:.1f} at the start; {meta['date']}; "
        f"{meta['minutes']:.0f} minutes.",
        "",
        f"- old: {args.old_label}",
        f"- new: {args.new_label}",
        "",
        "| precision | old tokens/s | new tokens/s | new / old (medians) | new / old per repeat "
        "| old peak RSS MiB | new peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for p, res in results.items():
        lines.append(f"| {p} | {C.fmt_range(res['old']['tokens_per_s'])} | "
                     f"{C.fmt_range(res['new']['tokens_per_s'])} | "
                     f"{res['ratio_new_over_old']:.3f} | {C.fmt_range(res['paired_ratio'], 3)} | "
                     f"{C.fmt_range(res['old']['peak_rss_mib'])} | "
                     f"{C.fmt_range(res['new']['peak_rss_mib'])} |")
    C.write_results(Path(args.out), "binary_comparison", data, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
