"""`moecore dump` and `moecore diff` (issue 16 item 4): where two precisions or two builds part.

A tiny model (layer 0 dense, layer 1 MoE, QK-norm over the full projection) on one batch:
- two fp32 dumps of the same config, in two processes, are identical tensor for tensor (exit 0);
  the dump holds what debug-state computes (logits, every parameter gradient), bit for bit;
- fp32 vs bf16 parts exactly at the first GEMM that runs in bf16: layer 0's q_proj (the embedding
  gather and the first RMSNorm run in fp32 on both sides, so every tensor before it is equal to
  the bit), with a normalised error of the order of bf16's unit roundoff u = 2^-8;
- bf16 vs mxfp8 parts exactly at the first MoE layer's experts (the first MX GEMM), or with a
  shared expert at its gate/up projection (OLMo-core's recipe runs it as an expert); two mxfp8
  variants part at the first GEMM they run differently (both sides held to bf16's threshold);
- weights of another seed part at the very first parameter-dependent tensor, the embedding;
- bad input (a missing directory, different shapes or layer counts, different batches, an
  incomplete dump, a malformed command line) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from test_training_job import ENV, assert_one_line_error, write_config

BATCH, SEQ = 2, 16
FIRST_BF16_GEMM = "model.layers.0.self_attn.q_proj"
U_BF16 = 2.0 ** -8


def run(moecore_bin, *args, expect: int = 0) -> subprocess.CompletedProcess:
    r = subprocess.run([str(moecore_bin), *map(str, args)], capture_output=True, text=True,
                       errors="replace", timeout=60, env=ENV)
    assert r.returncode == expect, (f"exit {r.returncode} (expected {expect}): {args}\n"
                                    f"stderr: {r.stderr}\nstdout tail: {r.stdout[-3000:]}")
    return r


@pytest.fixture(scope="module")
def setup(job_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diff")
    config = write_config(tmp / "c.toml", job_data, tmp / "out",
                          model={"first_k_dense_replace": 1},
                          train={"batch_size": 4, "seq_len": SEQ})
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, job_data.vocab_size, size=(BATCH, SEQ), dtype=np.int64)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -100
    np.save(tmp / "tokens.npy", tokens)
    np.save(tmp / "targets.npy", targets)
    return tmp, config, ["--tokens", tmp / "tokens.npy", "--targets", tmp / "targets.npy"]


def diff_json(moecore_bin, *args, expect: int) -> dict:
    return json.loads(run(moecore_bin, "diff", *args, "--json", expect=expect).stdout)


def test_identical_fp32_runs_are_equal_and_hold_what_debug_state_computes(moecore_bin, setup):
    tmp, config, batch = setup
    # The default batch: the first micro-batch of data.train in the trainer's order.
    for side in ("a", "b"):
        run(moecore_bin, "dump", config, "--out", tmp / f"same_{side}")
    manifest = json.loads((tmp / "same_a" / "manifest.json").read_text())
    assert manifest["format"] == "moecore-tensor-dump" and manifest["version"] == 1
    assert manifest["run"]["precision"] == "fp32" and manifest["run"]["batch_shape"] == [4, SEQ]
    names = [t["name"] for t in manifest["tensors"]]
    phases = [t["phase"] for t in manifest["tensors"]]
    # Forward, then backward, in execution order.
    assert phases == sorted(phases, key=lambda p: p != "forward")
    for earlier, later in [("model.embed_tokens", "model.layers.0.input_layernorm"),
                           ("model.layers.0.input_layernorm", FIRST_BF16_GEMM),
                           (FIRST_BF16_GEMM, "model.layers.0.self_attn.o_proj"),
                           ("model.layers.0.mlp.gate_up", "model.layers.0.mlp"),
                           ("model.layers.1.mlp.gate", "model.layers.1.mlp.topk_index"),
                           ("model.layers.1.mlp.experts", "model.layers.1"),
                           ("lm_head", "loss.total"),
                           ("grad.lm_head", "grad.model.layers.1"),
                           ("grad.model.layers.1", "grad.model.layers.1.mlp.gate.weight"),
                           ("grad.model.layers.1.mlp.gate.weight", "grad.model.layers.0"),
                           ("grad.model.layers.0", "grad.model.embed_tokens"),
                           ("grad.model.embed_tokens", "grad.model.embed_tokens.weight")]:
        assert names.index(earlier) < names.index(later), (earlier, later)

    report = diff_json(moecore_bin, tmp / "same_a", tmp / "same_b", expect=0)
    assert not report["parted"] and report["first_parted"] is None and report["same_weights"]
    assert len(report["tensors"]) == len(names)
    assert all(t["normalised_error"] == 0 and t["mismatches"] == 0 for t in report["tensors"])
    text = run(moecore_bin, "diff", tmp / "same_a", tmp / "same_b").stdout
    assert "equal within the threshold" in text

    # The same pass as debug-state (same weights: init of train.seed 0; same batch).
    from safetensors.numpy import load_file
    run(moecore_bin, "init", "--config", config, "--seed", 0, "--out", tmp / "w.safetensors")
    run(moecore_bin, "debug-state", "--config", config, "--weights", tmp / "w.safetensors",
        "--tokens", tmp / "tokens.npy", "--targets", tmp / "targets.npy",
        "--out", tmp / "state.safetensors")
    run(moecore_bin, "dump", config, *batch, "--out", tmp / "tokens_dump")
    state = load_file(tmp / "state.safetensors")
    dump = load_file(tmp / "tokens_dump" / "tensors.safetensors")
    np.testing.assert_array_equal(dump["lm_head"].reshape(state["logits"].shape), state["logits"])
    grads = [n for n in state if n.startswith("grad.")]
    assert grads and all(n in dump for n in grads)
    for n in grads:
        np.testing.assert_array_equal(dump[n], state[n], err_msg=n)
    np.testing.assert_array_equal(dump["loss.total"], state["loss.total"])


def test_fp32_vs_bf16_parts_at_the_first_bf16_gemm(moecore_bin, setup):
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch, "--a-set", "train.precision=fp32",
                       "--b-set", "train.precision=bf16", expect=1)
    assert report["a"]["run"]["precision"] == "fp32" and report["b"]["run"]["precision"] == "bf16"
    # Default threshold: 4 unit roundoffs of fp32, at least 2^-18.
    assert report["threshold"] == 2.0 ** -18
    first = report["first_parted"]
    assert first["name"] == FIRST_BF16_GEMM, first
    tensors = report["tensors"]
    assert all(t["normalised_error"] == 0 for t in tensors[:first["index"]]), tensors[:first["index"]]
    # One GEMM over bf16-rounded operands: each product errs by at most 2u relative and the errors
    # are independent, so the normalised error of the sums is of order u (bounded by 2u in RMS);
    # 2^-12 below and 4u above leave room for the statistics of 2 x 16 x 32 outputs.
    assert U_BF16 / 16 < first["normalised_error"] < 4 * U_BF16, first
    # Plausible after it, up to the first routing flip if any (a near tie of two experts' scores
    # that bf16 tips over routes a token elsewhere, and its expert output then differs by O(1)):
    # a few roundoffs per op compounding over two layers, far below an O(1) disagreement.
    # Bound 2^-5 = 8u, empirical (tests/TOLERANCES.md); measured up to 5e-3.
    flips = [t["index"] for t in tensors if t["kind"] == "index" and t["parted"]]
    before_flip = [t for t in tensors[:min(flips, default=len(tensors))] if t["kind"] == "value"]
    worst = max(before_flip, key=lambda t: t["normalised_error"])
    assert worst["normalised_error"] < 8 * U_BF16, worst
    text = run(moecore_bin, "diff", config, *batch, "--a-set", "train.precision=fp32",
               "--b-set", "train.precision=bf16", expect=1).stdout
    marked = [line for line in text.splitlines() if line.endswith("<- first parted")]
    assert len(marked) == 1 and FIRST_BF16_GEMM in marked[0]
    assert text.splitlines()[-1].startswith(f"parted at #{first['index']} (forward) "
                                            f"{FIRST_BF16_GEMM}")
    # --threshold replaces the default.
    report = diff_json(moecore_bin, config, *batch, "--b-set", "train.precision=bf16",
                       "--threshold", "0.5", expect=1 if any(
                           t["parted"] for t in tensors if t["kind"] == "index") else 0)
    assert report["threshold"] == 0.5 and report["threshold_rule"] == "--threshold 0.5"


def test_bf16_vs_mxfp8_parts_at_the_first_mx_gemm(moecore_bin, setup):
    """train.precision = "mxfp8" is the bf16 recipe with the routed experts' GEMMs in MXFP8: the
    two runs agree to the bit up to the first MoE layer's experts (attention, the dense layer and
    the fp32 router are the same on both sides), and part there by about E4M3's unit roundoff."""
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch, "--a-set", "train.precision=bf16",
                       "--b-set", "train.precision=mxfp8", expect=1)
    assert report["b"]["run"]["precision"] == "mxfp8"
    first = report["first_parted"]
    assert first["name"] == "model.layers.1.mlp.experts", first
    tensors = report["tensors"]
    assert all(t["normalised_error"] == 0 for t in tensors[:first["index"]]), tensors[:first["index"]]
    # E4M3 keeps 3 mantissa bits: each operand element is rounded with relative error up to
    # u = 2^-4 (more for elements far below their block's largest, which lose bits to the shared
    # scale), two GEMMs deep; the normalised error of the experts' outputs is of order u.
    # Bounds u/16 and 4u (measured: see the test's log line).
    u_e4m3 = 2.0 ** -4
    assert u_e4m3 / 16 < first["normalised_error"] < 4 * u_e4m3, first
    print(f"bf16 vs mxfp8: first parted {first['name']} normalised error "
          f"{first['normalised_error']:.4g}")


def test_mxfp8_dense_parts_at_the_first_projection(moecore_bin, setup):
    """train.mxfp8_dense: attention projections and the dense layer's MLP run all their GEMMs in
    MXFP8 too, so bf16 vs mxfp8 parts at layer 0's q_proj, the first GEMM, by about
    E4M3's unit roundoff (one GEMM over two quantised operands)."""
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch, "--a-set", "train.precision=bf16",
                       "--b-set", "train.precision=mxfp8", "--b-set", "train.mxfp8_dense=true",
                       expect=1)
    first = report["first_parted"]
    assert first["name"] == FIRST_BF16_GEMM, first
    assert all(t["normalised_error"] == 0 for t in report["tensors"][:first["index"]])
    u_e4m3 = 2.0 ** -4
    assert u_e4m3 / 16 < first["normalised_error"] < 4 * u_e4m3, first
    print(f"bf16 vs mxfp8 dense: first parted {first['name']} normalised error "
          f"{first['normalised_error']:.4g}")


MX_THRESHOLD = 4 * U_BF16  # two mxfp8 sides: bf16's rule (tensor_diff.cpp derives it)


def test_mxfp8_shared_expert_parts_from_bf16_at_its_gate_up(moecore_bin, setup):
    """OLMo-core's recipe runs the shared expert as an expert (forward and input gradient in
    MXFP8): with a shared expert (32 wide: whole blocks) bf16 vs mxfp8 parts first at its gate/up
    projection, before the routed experts, by about E4M3's unit roundoff."""
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch,
                       "--set", "model.shared_expert_intermediate_size=32",
                       "--a-set", "train.precision=bf16", "--b-set", "train.precision=mxfp8",
                       expect=1)
    first = report["first_parted"]
    assert first["name"] == "model.layers.1.mlp.shared_expert.gate_up", first
    assert all(t["normalised_error"] == 0 for t in report["tensors"][:first["index"]])
    u_e4m3 = 2.0 ** -4
    assert u_e4m3 / 16 < first["normalised_error"] < 4 * u_e4m3, first
    print(f"bf16 vs mxfp8 with a shared expert: first parted {first['name']} normalised error "
          f"{first['normalised_error']:.4g}")


@pytest.mark.parametrize("b_sets,first_name", [
    # The scale mode changes the first MX GEMM's codes: the shared expert's gate/up.
    (["train.mxfp8_scale=floor"], "model.layers.1.mlp.shared_expert.gate_up"),
    # mxfp8_dense: the first projection.
    (["train.mxfp8_dense=true"], FIRST_BF16_GEMM),
])
def test_two_mxfp8_variants_part_where_their_recipes_first_differ(moecore_bin, setup, b_sets,
                                                                   first_name):
    """Both sides mxfp8: held to bf16's threshold, 4 x 2^-8, not E4M3's 4 x 2^-4 (which let every
    MX difference through), so two variants part at the first GEMM they run differently, and the
    header names each side's variant."""
    _, config, batch = setup
    b_args = [a for s in b_sets for a in ("--b-set", s)]
    args = [config, *batch, "--set", "model.shared_expert_intermediate_size=32",
            "--a-set", "train.precision=mxfp8", "--b-set", "train.precision=mxfp8", *b_args]
    report = diff_json(moecore_bin, *args, expect=1)
    assert report["threshold"] == MX_THRESHOLD, report["threshold_rule"]
    assert "two mxfp8 variants" in report["threshold_rule"], report["threshold_rule"]
    first = report["first_parted"]
    assert first["name"] == first_name, first
    assert all(t["normalised_error"] == 0 for t in report["tensors"][:first["index"]])
    print(f"mxfp8 vs mxfp8 {' '.join(b_sets)}: first parted {first['name']} normalised error "
          f"{first['normalised_error']:.4g}")
    header = run(moecore_bin, "diff", *args, expect=1).stdout.splitlines()[:2]
    assert "precision mxfp8 (rceil scales, mxfp8_dense false, mxfp8_expert_wgrad false)" in header[0]
    want_b = ("mxfp8 (floor scales, mxfp8_dense false" if "floor" in b_sets[0]
              else "mxfp8 (rceil scales, mxfp8_dense true")
    assert want_b in header[1], header


def test_one_mxfp8_recipe_on_both_sides_is_equal(moecore_bin, setup):
    """The same mxfp8 recipe in two processes: equal to the bit, within bf16's threshold."""
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch, "--set", "model.shared_expert_intermediate_size=32",
                       "--set", "train.precision=mxfp8", expect=0)
    assert report["threshold"] == MX_THRESHOLD
    assert "one mxfp8 recipe" in report["threshold_rule"], report["threshold_rule"]
    assert all(t["normalised_error"] == 0 for t in report["tensors"])


def test_another_seed_parts_at_the_embedding(moecore_bin, setup):
    _, config, batch = setup
    report = diff_json(moecore_bin, config, *batch, "--a-set", "train.seed=0",
                       "--b-set", "train.seed=1", expect=1)
    assert not report["same_weights"]
    assert report["first_parted"]["index"] == 0
    assert report["first_parted"]["name"] == "model.embed_tokens"


@pytest.mark.parametrize("mode", ["attention", "moe", "full"])
def test_a_recompute_dump_records_each_tensor_once_and_equal(moecore_bin, setup, tmp_path, mode):
    """dump applies train.recompute (its manifest says what ran): the rebuilt activations are not
    recorded twice, and recompute changes no value (the engine's bit-identity promise)."""
    tmp, config, batch = setup
    run(moecore_bin, "dump", config, *batch, "--out", tmp_path / "none")
    run(moecore_bin, "dump", config, *batch, "--set", f'train.recompute="{mode}"', "--out",
        tmp_path / mode)
    names = lambda d: [t["name"] for t in json.loads((d / "manifest.json").read_text())["tensors"]]
    assert names(tmp_path / mode) == names(tmp_path / "none")
    report = diff_json(moecore_bin, tmp_path / "none", tmp_path / mode, expect=0)
    assert all(t["normalised_error"] == 0.0 for t in report["tensors"]), mode


def test_each_side_of_a_config_diff_runs_on_its_own_thread_count(moecore_bin, setup, tmp_path):
    """train.threads = 0 is the process's default for both sides: A's explicit count does not carry
    into B's pass (diff runs both in one process)."""
    tmp, config, batch = setup
    run(moecore_bin, "dump", config, *batch, "--set", "train.threads=0", "--out", tmp_path / "d")
    default = json.loads((tmp_path / "d" / "manifest.json").read_text())["run"]["threads"]
    # Equal or parted by rounding (exit 0 or 1): what counts here is the header of each side.
    r = subprocess.run([str(moecore_bin), "diff", str(config), *map(str, batch), "--set",
                        "train.threads=0", "--a-set", "train.threads=1", "--json"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    assert report["a"]["run"]["threads"] == 1
    assert report["b"]["run"]["threads"] == default


def test_bad_input_is_one_line_and_exit_2(moecore_bin, setup, tmp_path):
    tmp, config, batch = setup
    run(moecore_bin, "dump", config, *batch, "--out", tmp_path / "a")
    missing = tmp_path / "no_such_dump"
    err = assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", missing, expect=2),
                                str(missing))
    assert "not a directory" in err

    run(moecore_bin, "dump", config, *batch, "--set", "model.hidden_size=64",
        "--out", tmp_path / "wide")
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", tmp_path / "wide", expect=2),
                          "model.embed_tokens", "32]", "64]")  # names the tensor and shapes

    run(moecore_bin, "dump", config, *batch, "--set", "model.num_hidden_layers=3",
        "--out", tmp_path / "deep")
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", tmp_path / "deep", expect=2),
                          "model.layers.2", "in B but not in A")

    run(moecore_bin, "dump", config, "--out", tmp_path / "data_batch")  # data.train's batch
    assert_one_line_error(
        run(moecore_bin, "diff", tmp_path / "a", tmp_path / "data_batch", expect=2),
        "different batches")

    # An incomplete dump: a tensor the manifest does not list.
    broken = tmp_path / "broken"
    run(moecore_bin, "dump", config, *batch, "--out", broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    dropped = manifest["tensors"].pop(3)["name"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", broken, expect=2), dropped)

    # The same tokens in another shape: other batches, said so (not "different models").
    np.save(tmp_path / "flat_x.npy", np.load(tmp / "tokens.npy").reshape(1, -1))
    np.save(tmp_path / "flat_y.npy", np.load(tmp / "targets.npy").reshape(1, -1))
    run(moecore_bin, "dump", config, "--tokens", tmp_path / "flat_x.npy", "--targets",
        tmp_path / "flat_y.npy", "--set", f"train.seq_len={BATCH * SEQ}", "--out", tmp_path / "flat")
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", tmp_path / "flat", expect=2),
                          "different batches", "batch_shape")

    # A manifest that does not record its batch, and one without tensors: refused, not compared.
    for name, edit in (("unsaid", lambda m: m["run"].pop("tokens_fnv1a")),
                       ("empty", lambda m: m.update(tensors=[]))):
        shutil.copytree(tmp_path / "a", tmp_path / name)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        edit(manifest)
        (tmp_path / name / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "unsaid", tmp_path / "a", expect=2),
                          "does not say its batch", "tokens_fnv1a")
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "empty", tmp_path / "a", expect=2))

    # Command line: three inputs; options of config mode with two dumps.
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", tmp_path / "a", tmp_path / "a",
                              expect=2))
    assert_one_line_error(run(moecore_bin, "diff", tmp_path / "a", tmp_path / "a", "--b-set",
                              "train.precision=bf16", expect=2), "--b-set")
    # dump refuses to write into a non-empty directory.
    assert_one_line_error(run(moecore_bin, "dump", config, *batch, "--out", tmp_path / "a",
                              expect=1), str(tmp_path / "a"))
