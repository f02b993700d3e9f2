"""`moecore plan` against measured runs (issue 17, item 3).

For each CPU layout (1, 2 and 4 ranks under mpirun; ep, zero, pp, schedule, dispatch and
micro-batches varied) this script runs `moecore plan --json` and `moecore train` on
bench/configs/plan_validation.toml and compares, per rank:
  * predicted peak memory (the rank's pipeline stage) with the peak RSS the trainer records at the
    end of its training loop (out_dir/rank_stats/rank<r>.json; before the final checkpoint, so the
    save's serialisation buffers are not part of it): target within 10 %;
  * predicted bytes per collective with the communicator's byte counters over the run, per step
    (float payloads: gradient all-reduce, reduce-scatter, all-gather, all-to-all-v, puts/gets,
    pipeline sends): target equal.
Writes bench/results/plan_validation.md and .json. Run: `make bench-plan` (the venv's Python:
the corpus comes from tests/train/conftest.py, which imports numpy); about 5 minutes on two shared
cores. Measured RSS does not depend on machine load.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "train"))
from conftest import write_corpus  # noqa: E402  (the test suite's deterministic corpus)

BIN = Path(os.environ.get("MOECORE_BIN", REPO / "build" / "bin" / "moecore"))
CONFIG = REPO / "bench" / "configs" / "plan_validation.toml"
RESULTS = REPO / "bench" / "results"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_WAIT_POLICY": "PASSIVE"}
MEMORY_TOLERANCE = 0.10
# The communicator's float payloads (dist/traffic_counters.h); the rest are statistics.
FLOAT_OPS = {"allreduce", "reduce_scatter", "allgather", "alltoallv", "put", "get", "send"}

# (name, ranks, --set overrides)
LAYOUTS = [
    ("1 rank", 1, []),
    ("1 rank, 2 micro-batches", 1, ["train.microbatches=2"]),
    ("dp 2", 2, []),
    ("dp 2, zero", 2, ["parallel.zero=1"]),
    ("ep 2 sync", 2, ["parallel.ep=2"]),
    ("ep 2 rowwise", 2, ["parallel.ep=2", "parallel.dispatch=\"rowwise\""]),
    ("pp 2 1f1b, 4 micro-batches", 2, ["parallel.pp=2", "train.microbatches=4"]),
    ("pp 2 interleaved (2 chunks each), 4 micro-batches", 2,
     ["parallel.pp=2", "parallel.schedule=\"interleaved-1f1b\"", "train.microbatches=4"]),
    ("dp 4, ep 2, zero", 4, ["parallel.ep=2", "parallel.zero=1"]),
    ("pp 2 x dp 2 gpipe, 2 micro-batches", 4,
     ["parallel.pp=2", "parallel.schedule=\"gpipe\"", "train.microbatches=2"]),
    ("ep 4 rowwise", 4, ["parallel.ep=4", "parallel.dispatch=\"rowwise\""]),
]


def run(cmd: list[str], env: dict | None = None, timeout: float = 900.0) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def prepare_data(work: Path) -> Path:
    corpus = write_corpus(work / "corpus.txt", n_bytes=200_000)
    tokenizer = work / "tokenizer.json"
    run([str(BIN), "tokenizer", "train", "--input", str(corpus), "--vocab-size", "512",
         "--out", str(tokenizer)])
    run([str(BIN), "prepare", "--tokenizer", str(tokenizer), "--input", str(corpus), "--out",
         str(work / "tokens"), "--val-fraction", "0.05"])
    return work / "tokens" / "train"


def measure(name: str, ranks: int, sets: list[str], data: Path, work: Path) -> dict:
    out_dir = work / name.replace(" ", "_").replace(",", "")
    sets = sets + [f"data.train=[\"{data}\"]", f"train.out_dir=\"{out_dir}\""]
    set_args = [a for s in sets for a in ("--set", s)]
    plan = json.loads(run([str(BIN), "plan", str(CONFIG), "--json", "--ranks", str(ranks)]
                          + set_args))
    cmd = [str(BIN), "train", str(CONFIG)] + set_args
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks)] + cmd
    run(cmd, env=MPI_ENV)
    dp = plan["layout"]["dp"]
    rows = []
    for r in range(ranks):
        stats = json.loads((out_dir / "rank_stats" / f"rank{r}.json").read_text())
        stage = plan["stages"][r // dp]
        steps = stats["steps"]
        measured_traffic = {k: v["bytes"] / steps for k, v in stats["traffic"].items()}
        predicted_traffic = {f"{c['group']}.{c['op']}": c["bytes"]
                             for c in stage["collective_bytes_per_step"]}
        float_ops = {k: v for k, v in measured_traffic.items() if k.split(".")[-1] in FLOAT_OPS}
        rows.append({
            "rank": r, "stage": stats["stage"],
            "predicted_peak_mib": stage["memory_bytes"]["peak"] / 2**20,
            "measured_peak_mib": stats["peak_rss_kib"] / 1024,
            "predicted_traffic": predicted_traffic, "measured_traffic": float_ops,
            "memory": {k: v / 2**20 for k, v in stage["memory_bytes"].items()},
        })
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"name": name, "ranks": ranks, "sets": sets[:-2], "ranks_detail": rows}


def main() -> None:
    if not BIN.is_file():
        raise SystemExit(f"no binary at {BIN} (build it, or set MOECORE_BIN)")
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="moecore-planval-", dir=base))
    try:
        data = prepare_data(work)
        results = []
        for name, ranks, sets in LAYOUTS:
            print(f"{name} ...", flush=True)
            results.append(measure(name, ranks, sets, data, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results(results)


def write_results(results: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "plan_validation.json").write_text(json.dumps(results, indent=1))
    lines = ["# `moecore plan` against measured runs", "",
             f"Machine: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores (shared); model `bench/configs/plan_validation.toml` "
             "(d 256, 4 layers, 16 experts top-2, balanced routing, 8 x 64 tokens per step, "
             "2 steps), fp32, one thread per rank, Open MPI 4.1. Produced by `make bench-plan` "
             "(`bench/plan_validation.py`).", "",
             "Peak memory per rank: the plan's prediction for the rank's stage against the peak "
             "RSS recorded at the end of the training loop (`out_dir/rank_stats`). Target: within "
             f"{MEMORY_TOLERANCE:.0%}. The plan's process baseline (24 MiB, `--hardware cpu`) and "
             "Open MPI's reduction temporaries were measured on this machine; everything else is "
             "counted from the code.", "",
             "| layout | rank | predicted MiB | measured MiB | error |", "|---|---|---|---|---|"]
    worst, memory_ok, traffic_ok = 0.0, True, True
    traffic_lines = ["", "Bytes per step per collective (float payloads; the communicator's "
                     "counters over the run divided by its steps). Target: equal.", "",
                     "| layout | rank | collective | predicted | measured | equal |",
                     "|---|---|---|---|---|---|"]
    for res in results:
        for row in res["ranks_detail"]:
            err = row["predicted_peak_mib"] / row["measured_peak_mib"] - 1.0
            worst = max(worst, abs(err))
            memory_ok &= abs(err) <= MEMORY_TOLERANCE
            lines.append(f"| {res['name']} | {row['rank']} | {row['predicted_peak_mib']:.1f} | "
                         f"{row['measured_peak_mib']:.1f} | {err:+.1%} |")
            keys = sorted(set(row["predicted_traffic"]) | set(row["measured_traffic"]))
            for k in keys:
                p = row["predicted_traffic"].get(k, 0.0)
                m = row["measured_traffic"].get(k, 0.0)
                same = abs(p - m) <= 1e-9 * max(p, m, 1.0)
                traffic_ok &= same
                traffic_lines.append(f"| {res['name']} | {row['rank']} | {k} | {p:,.0f} | "
                                     f"{m:,.0f} | {'yes' if same else 'NO'} |")
    lines += traffic_lines
    lines += ["", f"Memory: worst error {worst:.1%} ({'met' if memory_ok else 'MISSED'}); "
              f"traffic: {'every collective equal' if traffic_ok else 'MISMATCH'}."]
    (RESULTS / "plan_validation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))


if __name__ == "__main__":
    main()
