"""The trainer's peak memory is its own: a run started from a process that holds a lot of memory
(a Python driver with PyTorch loaded, a notebook) reports what the trainer used, not its parent's
high-water mark. Linux carries the high-water mark behind getrusage's ru_maxrss across fork and
execve, so the figure read there was at least the parent's (a pytest worker's 2.6 GiB, for a run
that used 0.4 GiB); /proc/self/status's VmHWM is the trainer's own address space's
(core/host_memory.h). Both the `done:` line and out_dir/rank_stats/rank0.json are checked.
"""
from __future__ import annotations

import json
import re

from test_training_job import run, write_config

HELD = 1 << 30  # held resident by this process while the trainer runs


def test_peak_memory_is_not_the_parents(moecore_bin, job_data, tmp_path):
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.toml", job_data, out,
                       train={"max_steps": 2, "eval_every": 0, "log_every": 1})
    held = b"\x01" * HELD  # written, so resident
    r = run(moecore_bin, "train", cfg)
    assert len(held) == HELD
    done = re.search(r"peak RSS ([0-9.]+) MiB per rank", r.stdout + r.stderr)
    assert done, (r.stdout + r.stderr)[-2000:]
    stats = json.loads((out / "rank_stats" / "rank0.json").read_text())
    # This tiny model's run needs well under 1 GiB; a figure carried over from this process
    # would be above it.
    assert 0 < float(done.group(1)) < HELD / 2**20 / 2, done.group(0)
    assert 0 < stats["peak_rss_kib"] < HELD / 1024 / 2, stats
