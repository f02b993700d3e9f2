"""Presets in configs/presets (issue 17, item 2) and `moecore plan` on them.

* The parameter counts `moecore plan` reports are the published ones: the OLMo-core benchmark
  model 4.58B / 13.04B / 24.31B / 46.86B total with 3.17B active at 8 / 32 / 64 / 128 experts,
  OLMoE-1B-7B 6.92B total / 1.28B active (3 significant digits), and the trillion-parameter
  preset the 1.231T / 57.41B its comment states.
* Every preset trains: one step of a shrunk copy (d 32, 2 layers, the test corpus' vocabulary,
  experts and widths cut down, the preset's routing, norms and precision kept) through
  `moecore train` with nothing but --set overrides.
* An impossible layout is a one-line error naming its constraint, and plan agrees with train.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from test_training_job import assert_one_line_error, run, train

PRESETS = REPO / "configs" / "presets"

PUBLISHED = {  # preset: (total, active) parameters, as quoted
    "olmoe-1b-7b": ("6.92B", "1.28B"),
    "olmo-core-bench-e8": ("4.58B", "3.17B"),
    "olmo-core-bench-e32": ("13.04B", "3.17B"),
    "olmo-core-bench-e64": ("24.31B", "3.17B"),
    "olmo-core-bench-e128": ("46.86B", "3.17B"),
    "olmo-core3-1t": ("1.231T", "57.41B"),
}


def matches_quote(count: int, quoted: str) -> bool:
    """count rounded to the significant digits of `quoted` ("13.04B": 4) equals it."""
    mantissa, unit = quoted[:-1], {"B": 1e9, "T": 1e12}[quoted[-1]]
    digits = len(mantissa.replace(".", "").lstrip("0"))
    return float(f"{count / unit:.{digits}g}") == float(mantissa)


def plan(moecore_bin, preset: str, *args: str) -> dict:
    r = run(moecore_bin, "plan", PRESETS / f"{preset}.toml", "--json", *args)
    return json.loads(r.stdout)


def test_every_preset_is_pinned():
    assert sorted(p.stem for p in PRESETS.glob("*.toml")) == sorted(PUBLISHED)


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_counts_match_the_publication(moecore_bin, preset):
    p = plan(moecore_bin, preset)["parameters"]
    total, active = PUBLISHED[preset]
    assert matches_quote(p["total"], total), (p["total"], total)
    assert matches_quote(p["active"], active), (p["active"], active)
    assert p["embedding"] > 0 and p["lm_head"] == p["embedding"], p  # untied
    parts = ("embedding", "lm_head", "attention", "norms", "dense_mlp", "routers",
             "shared_experts", "routed_experts")
    assert sum(p[k] for k in parts) == p["total"]


def shrunk(job_data, preset: str, out_dir: Path) -> list[str]:
    """--set overrides that cut a preset down to seconds on a CPU, keeping its kind of model."""
    sets = [f"model.vocab_size={job_data.vocab_size}", "model.hidden_size=32",
            "model.num_hidden_layers=2", "model.num_attention_heads=4",
            "model.moe_intermediate_size=16",
            f"data.train=[\"{job_data.train}\"]", f"data.val=[\"{job_data.val}\"]",
            f"data.tokenizer=\"{job_data.tokenizer}\"", "train.max_steps=1", "train.batch_size=2",
            "train.microbatches=1", "train.seq_len=32", "train.eval_every=0",
            "train.eval_batches=1", "train.save_every=0", "train.sample_tokens=0",
            f"train.out_dir=\"{out_dir}\"", "optim.warmup_steps=0"]
    text = (PRESETS / f"{preset}.toml").read_text()
    top_k = int(re.search(r"^num_experts_per_tok = (\d+)", text, re.M).group(1))
    sets.append(f"model.num_experts={max(8, 2 * top_k)}")  # the preset's top-k kept
    if "head_dim" in text:
        sets.append("model.head_dim=8")
    kv_heads = 2 if "num_key_value_heads = 8" in text else 4
    sets.append(f"model.num_key_value_heads={kv_heads}")
    if "first_k_dense_replace = 1" in text:
        sets.append("model.intermediate_size=64")
    if "shared_expert_intermediate_size = 0" not in text:
        sets.append("model.shared_expert_intermediate_size=16")
    return sets


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_preset_trains_one_step_shrunk(moecore_bin, job_data, tmp_path, preset):
    r = train(moecore_bin, PRESETS / f"{preset}.toml", *shrunk(job_data, preset, tmp_path / "run"))
    assert "done: 1 steps" in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("sets, ranks, needle", [
    (["parallel.ep=3"], 3, "parallel.ep=3 does not divide num_experts=64"),
    (["parallel.pp=32"], 32, "16 layers cannot fill pp x virtual_stages = 32 model chunks"),
    (["parallel.pp=2"], 3, "parallel.pp=2 does not divide the 3 ranks"),
    (["parallel.ep=2"], 3, "parallel.ep=2 does not divide the 3 ranks of a pipeline stage"),
    ([], 3, "do not split over dp=3"),
])
def test_impossible_layouts_are_one_line_errors(moecore_bin, sets, ranks, needle):
    args = ["plan", PRESETS / "olmoe-1b-7b.toml", "--ranks", str(ranks)]
    for s in sets:
        args += ["--set", s]
    assert_one_line_error(run(moecore_bin, *args, check=False), needle)


def test_plan_and_train_refuse_the_same_layout(moecore_bin, job_data, tmp_path):
    # One process with pp = 2: plan at --ranks 1 and train (a world of one) name the same rule.
    sets = shrunk(job_data, "olmo-core-bench-e8", tmp_path / "run") + ["parallel.pp=2"]
    args = ["plan", PRESETS / "olmo-core-bench-e8.toml", "--ranks", "1"]
    for s in sets:
        args += ["--set", s]
    planned = assert_one_line_error(run(moecore_bin, *args, check=False), "parallel.pp=2")
    trained = assert_one_line_error(
        train(moecore_bin, PRESETS / "olmo-core-bench-e8.toml", *sets, check=False), "parallel.pp=2")
    assert planned.split("error: ")[-1] == trained.split("error: ")[-1]


def test_the_trillion_parameter_preset_at_512_ranks(moecore_bin):
    p = plan(moecore_bin, "olmo-core3-1t", "--ranks", "512", "--set", "parallel.ep=64",
             "--set", "parallel.pp=4", "--set", "parallel.zero=1", "--hardware", "b200")
    assert p["layout"]["dp"] == 128
    assert p["layout"]["ep_dp"] == 2 and len(p["stages"]) == 4
    stage = p["stages"][0]
    # 512 experts over ep 64: 8 per rank per MoE layer; ZeRO-1 shards their moments over ep_dp 2.
    ops = {(c["group"], c["op"]) for c in stage["collective_bytes_per_step"]}
    assert {("dp", "reduce_scatter"), ("ep_dp", "allgather"), ("ep", "put"), ("pp", "send")} <= ops
    assert p["peak_bytes_per_rank"] > 0 and isinstance(p["fits"], bool)


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_the_layout_in_the_comment_plans(moecore_bin, preset):
    """The `moecore plan ...` example in each preset's comment is a valid layout (the batch splits
    over its dp, ep divides the experts, ...)."""
    text = (PRESETS / f"{preset}.toml").read_text()
    comment = " ".join(line.lstrip("# ").rstrip("\\ ") for line in text.splitlines()
                       if line.startswith("#"))
    example = re.search(r"moecore plan (\S+)((?: --\S+ \S+)*)", comment)
    assert example, f"{preset}: no `moecore plan` example in its comment"
    args = example.group(2).split()
    r = run(moecore_bin, "plan", REPO / example.group(1), "--json", *args)
    assert json.loads(r.stdout)["layout"]["world"] > 1
