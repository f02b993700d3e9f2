"""Shared helpers of the `make bench` scripts (bench/throughput.py, bench/expert_scaling.py,
bench/breakdown.py, bench/padded_transport.py): launching training runs, the GEMM peak, FLOP counts, medians and spreads,
and the results files.

Throughput of a run is its steady state, read from metrics.jsonl as bench/scaling.py does
(steps warmup+1..S). Every run sets train.profile = true: the phase timers (core/phase_timer.h,
about 60 scoped timers per step of several hundred ms) cost nothing measurable, and the
breakdown (out_dir/profile.json) then comes from the same runs as the throughput.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from scaling import MPI_ENV, steady_tokens_per_s

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "bench" / "configs" / "bench.toml"
PEAK_RE = re.compile(r"peak RSS ([0-9.]+) MiB per rank")
STAGE_PEAK_RE = re.compile(r"per stage \[([0-9., ]+)\] MiB")
# The GEMM shapes the peak is the best of: square, and the experts' own shapes at this config
# (rows of one expert at 8 experts top-4 of a 2048-token batch, K = d, N = 2H).
PEAK_SHAPES = ((2048, 2048, 2048), (1024, 512, 256), (1024, 256, 256))


def work_dir() -> Path:
    """Run directories in memory where possible: the end-of-run checkpoint of a 100M-parameter
    model is 1.2 GB, and writing it to disk would only slow the benchmark down."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="moecore-bench-", dir=base))


def private_binary(binary: str, work: Path) -> Path:
    """A private copy: a rebuild of build/ during the benchmark cannot swap the binary mid-way."""
    copy = work / "moecore"
    shutil.copy2(binary, copy)
    return copy


def config_value(config: Path, key: str) -> int:
    return int(re.search(rf"^{key} = (\d+)", config.read_text(), re.M).group(1))


def first_error(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if "error" in l] or text.strip().splitlines()[-1:]
    return lines[0] if lines else ""


def run_train(binary: Path, sets: list[str], work: Path, name: str, *, ranks: int = 1,
              warmup: int = 2, timeout: float = 600.0, config: Path = CONFIG) -> dict:
    """One `moecore train` run (under mpirun when ranks > 1); steady tokens/s, the profile,
    peak RSS (also per pipeline stage), the rowwise drop rate and, with pipeline parallelism, the
    median measured bubble over the steps after `warmup`."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(binary), "train", str(config)]
    for s in [f"train.out_dir={out}", "train.profile=true", *sets]:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks)] + cmd
    start = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                           env={**os.environ, **MPI_ENV})
    except subprocess.TimeoutExpired:
        shutil.rmtree(out, ignore_errors=True)
        return {"status": "failed", "message": f"timed out after {timeout:.0f}s",
                "wall_s": time.monotonic() - start}
    wall = time.monotonic() - start
    if r.returncode != 0:
        text = r.stderr + r.stdout
        status = "not implemented" if "not implemented" in text else "failed"
        shutil.rmtree(out, ignore_errors=True)
        return {"status": status, "message": first_error(text), "wall_s": wall}
    given = dict(s.split("=", 1) for s in sets)
    tokens_per_step = (int(given.get("train.batch_size", config_value(config, "batch_size"))) *
                       int(given.get("train.seq_len", config_value(config, "seq_len"))))
    metrics = out / "metrics.jsonl"
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    peak = PEAK_RE.search(r.stdout)
    stage_peaks = STAGE_PEAK_RE.search(r.stdout)
    bubbles = [row["pipeline/bubble"] for row in rows
               if "pipeline/bubble" in row and row["step"] > warmup]
    profile = json.loads((out / "profile.json").read_text()) if (out / "profile.json").exists() else None
    result = {"status": "ok", "tokens_per_s": steady_tokens_per_s(metrics, warmup, tokens_per_step),
              "peak_rss_mib": float(peak.group(1)) if peak else None, "wall_s": wall,
              "drop_rate": max((row.get("moe/drop_rate", 0.0) for row in rows), default=0.0),
              "stage_peak_rss_mib": ([float(x) for x in stage_peaks.group(1).split(",")]
                                     if stage_peaks else [float(peak.group(1))] if peak else []),
              "bubble": statistics.median(bubbles) if bubbles else 0.0,
              "profile": profile}
    shutil.rmtree(out, ignore_errors=True)  # checkpoints of a benchmark are not kept
    return result


def gemm_peak(binary: Path, precision: str, threads: int, repeats: int = 5) -> dict:
    """The best median FLOP/s of `moecore bench gemm` over PEAK_SHAPES (kernels::gemm, the GEMM
    the model runs), or {"status": "not available", ...} when the build lacks the precision."""
    shapes = []
    for m, n, k in PEAK_SHAPES:
        r = subprocess.run([str(binary), "bench", "gemm", "--m", str(m), "--n", str(n), "--k",
                            str(k), "--precision", precision, "--threads", str(threads),
                            "--repeats", str(repeats)], capture_output=True, text=True, cwd=REPO)
        if r.returncode != 0:
            return {"status": "not available", "message": first_error(r.stderr + r.stdout)}
        shapes.append(json.loads(r.stdout))
    best = max(shapes, key=lambda s: s["flops_per_s_median"])
    return {"status": "ok", "flops_per_s": best["flops_per_s_median"],
            "emulated": bool(best.get("emulated", False)),
            "shape": [best["m"], best["n"], best["k"]], "shapes": shapes}


def model_flops(binary: Path, sets: list[str], config: Path = CONFIG) -> dict:
    cmd = [str(binary), "bench", "flops", str(config)]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(r.stdout)


def summarise(values: list[float]) -> dict:
    """Median, minimum, maximum and the spread (max - min) / median of repeated measurements."""
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / med if med else 0.0, "n": len(values)}


def fmt_range(s: dict, digits: int = 0, scale: float = 1.0) -> str:
    f = f"{{:.{digits}f}}"
    return (f"{f.format(s['median'] * scale)} [{f.format(s['min'] * scale)}, "
            f"{f.format(s['max'] * scale)}]")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor() or ''}".strip()


def cpu_isa() -> list[str]:
    """The CPU features the kernels choose between (oneDNN's AVX2, AVX-512, AVX512-BF16 and AMX
    paths), as /proc/cpuinfo's flags name them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                        if f in flags]
    except OSError:
        pass
    return []


def machine_meta(args) -> dict:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "commit": commit,
            "machine": cpu_model(), "isa": cpu_isa(),
            "load_average_at_start": load, "quick": bool(getattr(args, "quick", False))}


def write_results(out: Path, stem: str, data: dict, markdown: str) -> None:
    """stem.json and stem.md; a hand-written "## Discussion" section of an existing stem.md is
    kept across re-runs (as bench/scaling.py does)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    md = out / f"{stem}.md"
    discussion = "## Discussion\n\n(to be written)"
    if md.exists():
        text = md.read_text()
        marker = "\n## Discussion"
        if marker in text:
            discussion = text[text.index(marker) + 1:].rstrip()
    md.write_text(markdown.rstrip() + "\n\n" + discussion + "\n")
    print(f"wrote {out / (stem + '.json')} and {md}", flush=True)


def plt():
    """matplotlib with the file-only backend, or None when it is not installed (plots skipped)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
        return pyplot
    except ImportError:
        print("matplotlib not installed: no plots (scripts/setup.sh python installs it)")
        return None
