"""`moecore plan`'s peak memory of each pipeline stage against the trainer's, with one large
micro-batch (4096 tokens) on bench/configs/plan_validation.toml's model: pp 2, 1F1B.

The first stage (embedding, a dense and an MoE layer) used to measure 13.6 % above its plan
(530 MiB against 458): the workspace's first pass grows blocks of its requests' sizes, which
malloc kept in its heap (core/allocator_tuning.h keeps blocks up to 32 MiB for reuse) beside
the block of the high-water mark that replaces them. Mapped pages (core/host_pages.h) go back
to the system; then 455 MiB. Tolerance: 5 % of the measured peak per stage (measured here
+0.6 % and -0.2 %, the single process -0.7 %; bench/plan_validation.py holds its eleven
layouts to 10 %): the process baseline beside the plan's hardware profile's, and a few MiB of
allocator slack, are what remains.
"""
from __future__ import annotations

import json
from pathlib import Path

from test_parallel import mpirun
from test_training_job import run

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "bench" / "configs" / "plan_validation.toml"
TOLERANCE = 0.05


def test_each_stage_peaks_as_planned(moecore_bin, job_data, tmp_path):
    out = tmp_path / "run"
    sets = [f"data.train=[\"{job_data.train}\"]", "train.seq_len=256", "train.batch_size=16",
            "train.microbatches=1", "train.max_steps=3", "parallel.pp=2",
            "parallel.schedule=\"1f1b\"", f"train.out_dir=\"{out}\""]
    args = [a for s in sets for a in ("--set", s)]
    plan = json.loads(run(moecore_bin, "plan", CONFIG, *args, "--ranks", 2, "--json").stdout)
    r = mpirun(moecore_bin, 2, CONFIG, *sets)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank, stage in enumerate(plan["stages"]):
        planned = stage["memory_bytes"]["peak"]
        measured = json.loads((out / "rank_stats" / f"rank{rank}.json").read_text())[
            "peak_rss_kib"] * 1024
        error = (planned - measured) / measured
        assert abs(error) <= TOLERANCE, (
            f"stage {rank}: planned {planned / 2**20:.1f} MiB, measured "
            f"{measured / 2**20:.1f} MiB ({100 * error:+.1f} %)")
