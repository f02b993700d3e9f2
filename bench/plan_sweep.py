"""One setting swept over its values on one process, measured against `moecore plan`: the loop that
bench/recompute.py (train.recompute) and bench/lm_head_chunks.py (train.lm_head_chunk_tokens)
share. For each model, each value is planned (`moecore plan --json --ranks 1 --hardware
bench/results/cpu_profile.json`) and trained `runs` times; the values of one repeat run in turn,
so that the machine's load (shared, recorded) falls on all of them alike. Per value: the median
peak RSS (out_dir/rank_stats) and the median of the mean step time (train.profile), next to the
plan's peak memory, activation bytes and step time.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from plan_validation import BIN, PROFILE, median, prepare_data, run


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sweep(models: list[tuple[str, Path, list[str]]], values: list, key: str,
          settings: Callable[[list[str], object, Path, Path], list[str]], runs: int,
          prefix: str) -> list[dict]:
    """models: (name, config, --set overrides); settings(sets, value, data, out_dir) -> the
    command line's --set arguments of one run. Returns one result per model and value, the value
    under `key`."""
    if not BIN.is_file():
        raise SystemExit(f"no binary at {BIN} (build it, or set MOECORE_BIN)")
    if not PROFILE.is_file():
        raise SystemExit(f"no {PROFILE}: run bench/plan_validation.py first")
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    results = []
    try:
        data = prepare_data(work)
        for model, config, sets in models:
            measured = {v: {"peak_kib": [], "step_s": [], "load": []} for v in values}
            plans = {}
            for value in values:
                args = settings(sets, value, data, work / "plan")
                plans[value] = json.loads(run([str(BIN), "plan", str(config), "--json", "--ranks",
                                               "1", "--hardware", str(PROFILE)] + args))
            for repeat in range(runs):
                for value in values:
                    out_dir = work / f"run_{value}"
                    shutil.rmtree(out_dir, ignore_errors=True)
                    m = measured[value]
                    m["load"].append(os.getloadavg()[0])
                    run([str(BIN), "train", str(config)] + settings(sets, value, data, out_dir))
                    prof = json.loads((out_dir / "profile.json").read_text())
                    m["step_s"].append(prof["seconds"] / prof["steps"])
                    m["peak_kib"].append(json.loads(
                        (out_dir / "rank_stats" / "rank0.json").read_text())["peak_rss_kib"])
                    print(f"{model} {key} {value} run {repeat}: {m['step_s'][-1]:.3f} s, "
                          f"{m['peak_kib'][-1] / 1024:.1f} MiB", flush=True)
            for value in values:
                stage = plans[value]["stages"][0]
                m = measured[value]
                results.append({
                    "model": model, key: value, "cpu": cpu_model(),
                    "predicted_peak_mib": stage["memory_bytes"]["peak"] / 2**20,
                    "predicted_activations_mib": stage["memory_bytes"]["activations"] / 2**20,
                    "predicted_step_s": plans[value]["step_time"]["seconds"],
                    "measured_peak_mib": median(m["peak_kib"]) / 1024,
                    "measured_step_s": median(m["step_s"]),
                    "runs_step_s": m["step_s"],
                    "runs_peak_mib": [p / 1024 for p in m["peak_kib"]],
                    "load_average_1min": m["load"]})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results
