"""`moecore plan`'s step time at cluster scale, --max-memory search and --html report (issue 17,
items 4-6), through the CLI.

* The report page is opened in headless Chromium (Debian's `chromium`) and the numbers its script
  rendered are read back from the DOM and compared with `moecore plan --json` for the same layout;
  the page must not reference anything over the network. Skipped, with one line, where chromium is
  not installed.
* --max-memory: only layouts that fit, fastest first, each a factorisation of the world the
  trainer accepts and each equal to `moecore plan` of that layout; on the trillion-parameter
  preset at 512 H200s (141 GB) only layouts with activation recompute fit; below the least
  layout's peak none does, and the search names that layout.
* Every preset at 64-1024 GPUs gets a step time: tokens/s per GPU, an MFU in (0, 1) and a
  breakdown that adds up to the step.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO
from test_training_job import assert_one_line_error, run

PRESETS = REPO / "configs" / "presets"
MiB = 1 << 20


class KeyedValues(HTMLParser):
    """Text of every element with a data-key attribute (spans and SVG text alike)."""

    def __init__(self):
        super().__init__()
        self.values: dict[str, str] = {}
        self.rendered = False
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-rendered") == "yes":
            self.rendered = True
        self._open.append(a.get("data-key"))

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        if self._open and self._open[-1]:
            self.values[self._open[-1]] = self.values.get(self._open[-1], "") + data


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return name
    pytest.skip("chromium not installed (apt-get install --no-install-recommends chromium)")


def test_html_report_renders_the_plan(moecore_bin, tmp_path):
    page = tmp_path / "report.html"
    args = [PRESETS / "olmo-core-bench-e64.toml", "--ranks", "64", "--set", "parallel.ep=8",
            "--set", "parallel.pp=2", "--set", "train.microbatches=4", "--hardware", "h200"]
    plan = json.loads(run(moecore_bin, "plan", *args, "--json", "--html", page).stdout)
    text = page.read_text()
    # Self-contained: nothing fetched (the SVG namespace URI is a name, not a request).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(""", text), \
        "the page references something outside itself"
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                        "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = KeyedValues()
    dom.feed(r.stdout)
    assert dom.rendered, "the page's script did not finish"
    v = dom.values
    assert int(v["params-total"]) == plan["parameters"]["total"]
    assert float(v["peak-mib"]) == pytest.approx(round(plan["peak_bytes_per_rank"] / MiB, 1))
    for stage in plan["stages"]:
        s, mem = stage["stage"], stage["memory_bytes"]
        assert float(v[f"peak-stage-{s}"]) == pytest.approx(round(mem["peak"] / MiB, 1))
        assert v[f"memory-stage-{s}"] == f"{mem['peak'] / MiB:.1f} MiB"
    step = plan["step_time"]
    assert float(v["step-seconds"]) == pytest.approx(step["seconds"], rel=1e-3)
    assert float(v["tokens-per-s"]) == pytest.approx(step["tokens_per_s_per_rank"], rel=1e-3)
    assert float(v["mfu"]) == pytest.approx(100 * step["mfu"], abs=0.05)
    drawn = {k[len("time-"):] for k in v if k.startswith("time-")}
    assert drawn == {k for k, sec in step["breakdown_seconds"].items() if sec > 0}
    for k in drawn:
        assert float(v[f"time-{k}"].split()[0]) == pytest.approx(
            step["breakdown_seconds"][k] * 1e3, abs=5e-4)
    # The ep sweep: every ep dividing 64 experts and the 32 ranks of a stage, the planned ep's row
    # equal to the plan itself.
    eps = sorted(int(k.rsplit("-", 1)[1]) for k in v if k.startswith("sweep-peak-"))
    assert eps == [1, 2, 4, 8, 16, 32]
    assert float(v["sweep-peak-8"]) == pytest.approx(round(plan["peak_bytes_per_rank"] / MiB, 1))
    assert float(v["sweep-tps-8"]) == pytest.approx(step["tokens_per_s_per_rank"], rel=1e-3)


def plan_layout(moecore_bin, preset: Path, ranks: int, hardware: str, layout: dict) -> dict:
    sets = [f"parallel.pp={layout['pp']}", f"parallel.ep={layout['ep']}",
            f"parallel.zero={layout['zero']}", f"train.microbatches={layout['microbatches']}",
            f"train.recompute=\"{layout['recompute']}\"",
            f"train.lm_head_chunk_tokens={layout['lm_head_chunk_tokens']}"]
    return json.loads(run(moecore_bin, "plan", preset, "--ranks", str(ranks), "--hardware",
                          hardware, "--json", *[a for s in sets for a in ("--set", s)]).stdout)


def test_max_memory_ranks_the_layouts_that_fit(moecore_bin):
    preset = PRESETS / "olmo-core-bench-e64.toml"
    out = json.loads(run(moecore_bin, "plan", preset, "--ranks", "64", "--hardware", "h200",
                         "--max-memory", "141", "--top", "6", "--json").stdout)
    layouts = out["layouts"]
    assert out["layouts_considered"] > out["layouts_that_fit"] >= len(layouts) == 6
    speeds = [lay["tokens_per_s_per_rank"] for lay in layouts]
    assert speeds == sorted(speeds, reverse=True)
    for lay in layouts:
        assert lay["peak_bytes"] <= 141e9
        assert lay["pp"] * lay["ep"] * lay["ep_dp"] == 64
        assert 64 % lay["ep"] == 0 and 8 % lay["pp"] == 0
        assert 0 < lay["mfu"] < 1
    # Each listed layout, planned on its own, agrees with the search.
    for lay in layouts[:2]:
        again = plan_layout(moecore_bin, preset, 64, "h200", lay)
        assert again["fits"]
        assert again["peak_bytes_per_rank"] == pytest.approx(lay["peak_bytes"], rel=1e-12)
        assert again["step_time"]["tokens_per_s_per_rank"] == pytest.approx(
            lay["tokens_per_s_per_rank"], rel=1e-12)


def test_max_memory_on_a_trillion_parameters_at_512_h200(moecore_bin):
    """Issue 17's example: on 141 GB only layouts with activation recompute fit. The attention
    saves a logsumexp per query (the flash pair), so its activations grow with the tokens, not
    their square; what fills a rank besides them are the fp32 weights, gradients and Adam moments,
    the bf16 copies of its GEMM weights (~7 GB) and the backward's workspace (~45 GB with full
    recompute), kept through the gradient reduction. Below the least layout's peak nothing fits:
    the search says so and names that layout. Each layout planned on its own agrees."""
    preset = PRESETS / "olmo-core3-1t.toml"
    out = json.loads(run(moecore_bin, "plan", preset, "--ranks", "512", "--hardware", "h200",
                         "--max-memory", "141", "--json", timeout=600).stdout)
    assert out["layouts_considered"] > out["layouts_that_fit"] > 0
    assert all(lay["recompute"] != "none" and lay["peak_bytes"] <= 141e9
               for lay in out["layouts"])
    best = out["layouts"][0]
    again = plan_layout(moecore_bin, preset, 512, "h200", best)
    assert again["fits"] and again["layout"]["recompute"] == best["recompute"]
    assert again["peak_bytes_per_rank"] == pytest.approx(best["peak_bytes"], rel=1e-12)
    least = out["least_memory"]
    assert least["peak_bytes"] <= best["peak_bytes"]
    # Just below the least layout's peak: none fits, and the search names that layout.
    budget_gb = math.floor(least["peak_bytes"] / 1e9) - 1
    tight = json.loads(run(moecore_bin, "plan", preset, "--ranks", "512", "--hardware", "h200",
                           "--max-memory", str(budget_gb), "--json", timeout=600).stdout)
    assert tight["layouts_considered"] > 0 and tight["layouts_that_fit"] == 0
    assert tight["least_memory"]["peak_bytes"] == pytest.approx(least["peak_bytes"], rel=1e-12)
    assert plan_layout(moecore_bin, preset, 512, "h200", least)["peak_bytes_per_rank"] == \
        pytest.approx(least["peak_bytes"], rel=1e-12)


@pytest.mark.parametrize("preset,ranks,sets", [
    ("olmoe-1b-7b", 64, ["parallel.ep=8"]),
    ("olmo-core-bench-e128", 128, ["parallel.ep=8", "train.microbatches=2"]),
    ("olmo-core3-1t", 1024, ["parallel.ep=64", "parallel.pp=4", "train.microbatches=8"]),
])
def test_presets_at_scale_get_a_step_time(moecore_bin, preset, ranks, sets):
    set_args = [a for s in sets for a in ("--set", s)]
    p = json.loads(run(moecore_bin, "plan", PRESETS / f"{preset}.toml", "--ranks", str(ranks),
                       "--hardware", "b200", "--json", *set_args).stdout)
    t = p["step_time"]
    assert t["seconds"] > 0 and 0 < t["mfu"] < 1
    assert sum(t["breakdown_seconds"].values()) == pytest.approx(t["seconds"], rel=1e-9)
    tokens = p["layout"]["tokens_per_step"]
    assert t["tokens_per_s_per_rank"] == pytest.approx(tokens / t["seconds"] / ranks, rel=1e-9)
    text = run(moecore_bin, "plan", PRESETS / f"{preset}.toml", "--ranks", str(ranks),
               "--hardware", "b200", *set_args).stdout
    assert "tokens/s per rank, MFU" in text and "where the time goes:" in text


def test_plan_bad_input_is_one_line(moecore_bin, tmp_path):
    preset = PRESETS / "olmo-core-bench-e8.toml"
    r = run(moecore_bin, "plan", preset, "--max-memory", "80", check=False)
    assert_one_line_error(r, "--max-memory", "no rates")
    r = run(moecore_bin, "plan", preset, "--hardware", "h100", "--html",
            tmp_path / "missing" / "r.html", check=False)
    assert_one_line_error(r, "--html", "cannot write")
    profile = tmp_path / "half.json"
    profile.write_text(json.dumps({"memory_gib": 16, "gemm_tflops_fp32": 1.0}))
    r = run(moecore_bin, "plan", preset, "--hardware", profile, check=False)
    assert_one_line_error(r, "memory_bandwidth_gbs")
