"""The benchmark scripts' command lines (bench/*.py run as programs): `--help` says how to use the
script and runs nothing, an unknown option is a one-line error with exit status 2, and neither
touches the committed results (bench/results/). A benchmark that ignored its arguments once ran for
minutes on `--help` and overwrote its results with the figures of a busy machine.

Run: /opt/moecore/venv/bin/python -m pytest -q tests/cli/test_bench_scripts.py
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"

# Every script of bench/ that runs as a program (the others are modules the programs import).
PROGRAMS = sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def results_digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(RESULTS.iterdir()) if p.is_file()}


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_the_programs_are_found():
    # The glob must see the benchmarks: an empty list would pass every case below by running none.
    assert {"throughput.py", "plan_validation.py", "recompute.py",
            "lm_head_chunks.py", "gpu_peer.py"} <= set(PROGRAMS)


@pytest.mark.parametrize("script", PROGRAMS)
def test_help_runs_nothing(script):
    before = results_digest()
    r = run(script, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: "), r.stdout[:400]
    assert results_digest() == before


@pytest.mark.parametrize("script", PROGRAMS)
def test_an_unknown_option_is_one_line(script):
    before = results_digest()
    r = run(script, "--no-such-option")
    assert r.returncode == 2, (r.returncode, r.stdout[-400:], r.stderr[-400:])
    errors = [line for line in r.stderr.splitlines() if not line.startswith("usage: ")
              and not line.startswith(" ")]
    # argparse's line names the option, or first a required one that is missing.
    assert len(errors) == 1 and errors[0].startswith(f"{script}: error: "), r.stderr
    assert results_digest() == before
