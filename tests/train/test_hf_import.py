"""Starting from a published Hugging Face model (issue 12, item 7): `moecore import HF_DIR --out DIR`
and `moecore train CONFIG --init-from HF_DIR`.

For each family transformers has (OlmoeForCausalLM, Qwen3MoeForCausalLM, FlexOlmoForCausalLM), a
tiny random model is built with transformers and saved with save_pretrained in fp32 and in bf16, as
one file and sharded; moecore imports it, and its logits on a fixed batch (`moecore debug-state` on
the imported directory) must equal transformers' on the same directory within the transformers
oracle tolerance, 1e-4 of max |logit| (tests/reference/moecore_harness.py's TOL: two fp32 programs
summing in other orders; measured ~1e-6, tests/TOLERANCES.md). transformers reads the bf16 files
into fp32 as moecore does (exact widening), so bf16 directories are held to the same bound.

Bad input: every defect of a directory is one line on stderr naming the tensor, file or key, and a
non-zero exit; nothing is written to --out.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch
import transformers
from safetensors.numpy import load_file as load_np
from safetensors.torch import load_file, save_file

from test_parallel import MPI_ENV, TOL as PARALLEL_TOL, final_weights, max_rel
from test_training_job import (assert_one_line_error, checkpoints, run, train_rows,
                               write_config)

ORACLE_TOL = 1e-4  # transformers oracle: see the module docstring
SEQ = 16


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every weight random and O(1)-scaled logits, so a swapped, transposed or dropped tensor
    changes the logits far beyond the tolerance (norm weights around 1, the rest N(0, 0.2^2))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)


FAMILIES = ("olmoe", "qwen3_moe", "flex_olmo")
VARIANTS = ("fp32", "fp32-sharded", "bf16", "bf16-sharded")


def build_model(family: str, vocab: int) -> torch.nn.Module:
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, eos_token_id=0, pad_token_id=None, bos_token_id=None)
    if family == "olmoe":
        model = transformers.OlmoeForCausalLM(transformers.OlmoeConfig(intermediate_size=24, **common))
    elif family == "flex_olmo":  # head_dim != hidden / heads: FlexOlmo's attention reads it
        model = transformers.FlexOlmoForCausalLM(transformers.FlexOlmoConfig(
            intermediate_size=24, norm_topk_prob=False, head_dim=16, **common))
    else:  # Qwen3-MoE: per-head QK-norm, head_dim != hidden / heads, a dense first layer, GQA
        common.update(num_hidden_layers=3)
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            head_dim=16, moe_intermediate_size=24, intermediate_size=40, mlp_only_layers=[0],
            decoder_sparse_step=1, norm_topk_prob=True, use_sliding_window=False, **common))
    _randomise(model, seed=FAMILIES.index(family))
    return model.eval()


@pytest.fixture(scope="module")
def hf_dirs(job_data, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("hf")
    dirs = {}
    for family in FAMILIES:
        model = build_model(family, job_data.vocab_size)
        for variant in VARIANTS:
            d = root / f"{family}-{variant}"
            m = copy.deepcopy(model).to(torch.bfloat16) if variant.startswith("bf16") else model
            m.save_pretrained(d, safe_serialization=True,
                              max_shard_size="40KB" if variant.endswith("sharded") else "5GB")
            dirs[(family, variant)] = d
        sharded = dirs[(family, "fp32-sharded")]
        assert len(list(sharded.glob("model-*.safetensors"))) >= 3, "not sharded"
    return dirs


def batch(vocab: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, vocab, size=(2, SEQ), dtype=np.int64)


def moecore_logits(bin_path, model_dir: Path, tokens: np.ndarray, tmp: Path) -> np.ndarray:
    np.save(tmp / "x.npy", tokens)
    np.save(tmp / "y.npy", np.concatenate([tokens[:, 1:], np.full((tokens.shape[0], 1), -100)], 1))
    run(bin_path, "debug-state", "--config", model_dir / "config.toml", "--weights",
        model_dir / "model.safetensors", "--tokens", tmp / "x.npy", "--targets", tmp / "y.npy",
        "--out", tmp / "state.safetensors")
    return load_np(str(tmp / "state.safetensors"))["logits"].astype(np.float64)


def transformers_logits(hf_dir: Path, tokens: np.ndarray) -> np.ndarray:
    m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32,
                                                          attn_implementation="eager")
    with torch.no_grad():
        return m(torch.from_numpy(tokens)).logits.double().numpy()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_import_matches_transformers(moecore_bin, hf_dirs, job_data, tmp_path, family, variant):
    hf = hf_dirs[(family, variant)]
    out = tmp_path / "imported"
    r = run(moecore_bin, "import", hf, "--out", out)
    assert "self-check: reloaded logits equal the imported model's bit for bit" in r.stdout
    assert ("BF16 -> fp32" if variant.startswith("bf16") else "F32 -> fp32") in r.stdout, r.stdout
    # save_pretrained's generation_config.json is carried byte for byte, config.json's ids and
    # context length kept.
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "config.toml",
                                                     "generation_config.json", "model.safetensors"]
    assert (out / "generation_config.json").read_bytes() == \
        (hf / "generation_config.json").read_bytes()
    source, imported = (json.loads((d / "config.json").read_text()) for d in (hf, out))
    for key in ("eos_token_id", "bos_token_id", "pad_token_id", "max_position_embeddings"):
        assert imported[key] == source.get(key), (key, imported[key], source.get(key))
    x = batch(job_data.vocab_size)
    ours = moecore_logits(moecore_bin, out, x, tmp_path)
    ref = transformers_logits(hf, x)
    assert np.abs(ref).max() > 1.0, "logits too small to tell a wrong layout"
    assert max_rel(ours, ref) <= ORACLE_TOL, (family, variant, max_rel(ours, ref))
    # The imported directory is itself a Hugging Face directory of the same family.
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    assert max_rel(transformers_logits(out, x), ref) <= ORACLE_TOL


# ------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("family", FAMILIES)
def test_import_keeps_the_padding_row_out_of_the_gradient(moecore_bin, job_data, tmp_path, family):
    """transformers' embedding is nn.Embedding(padding_idx=config.pad_token_id): the pad token's
    row gets no gradient, so a fine-tune never moves it. The imported model keeps pad_token_id
    ([model] key) and its backward leaves that row alone too; every gradient equals transformers'
    cross-entropy backward within the oracle tolerance, with the pad token in the batch."""
    pad = 3
    model = build_model(family, job_data.vocab_size)
    model.config.pad_token_id = pad
    model.model.embed_tokens.padding_idx = pad  # as transformers builds it from the config
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    run(moecore_bin, "import", tmp_path / "hf", "--out", tmp_path / "imp")
    assert "pad_token_id = 3" in (tmp_path / "imp" / "config.toml").read_text()
    assert json.loads((tmp_path / "imp" / "config.json").read_text())["pad_token_id"] == pad
    tokens = batch(job_data.vocab_size)
    tokens[:, ::5] = pad
    targets = np.concatenate([tokens[:, 1:], np.full((tokens.shape[0], 1), -100)], 1)
    np.save(tmp_path / "x.npy", tokens)
    np.save(tmp_path / "y.npy", targets)
    # Cross-entropy alone, as transformers' loss without output_router_logits.
    config = (tmp_path / "imp" / "config.toml").read_text()
    config = re.sub(r"(?m)^(router_aux_loss_coef|router_z_loss_coef) = .*$", r"\1 = 0.0", config)
    (tmp_path / "ce.toml").write_text(config)
    run(moecore_bin, "debug-state", "--config", tmp_path / "ce.toml", "--weights", tmp_path / "imp" / "model.safetensors", "--tokens", tmp_path / "x.npy",
        "--targets", tmp_path / "y.npy", "--out", tmp_path / "state.safetensors")
    ours = load_np(str(tmp_path / "state.safetensors"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32,
                                                           attn_implementation="eager").train()
    assert hf.model.embed_tokens.padding_idx == pad
    logits = hf(torch.from_numpy(tokens)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      torch.from_numpy(targets).reshape(-1), ignore_index=-100).backward()
    grads = {n: p.grad.double().numpy() for n, p in hf.named_parameters() if p.grad is not None}
    embed = ours["grad.model.embed_tokens.weight"]
    assert np.abs(grads["model.embed_tokens.weight"][pad]).max() == 0.0
    assert np.abs(embed[pad]).max() == 0.0, "the padding row has a gradient"
    assert np.abs(embed).max() > 0.0
    for name, ref in grads.items():
        assert "grad." + name in ours, name
        err = np.abs(ours["grad." + name] - ref).max() / max(np.abs(ref).max(), 1e-30)
        assert err <= ORACLE_TOL, f"{name}: {err:.2e}"


def _copy(hf_dirs, tmp_path, family="olmoe", variant="fp32") -> Path:
    d = tmp_path / "hf"
    shutil.copytree(hf_dirs[(family, variant)], d)
    return d


def _edit_tensors(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _import_fails(bin_path, hf: Path, tmp_path: Path, *needles: str) -> str:
    out = tmp_path / "out"
    r = run(bin_path, "import", hf, "--out", out, check=False)
    err = assert_one_line_error(r, *needles)
    assert not out.exists() and not list(tmp_path.glob("out.import-*")), "wrote output on failure"
    return err


EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


def test_missing_tensor(moecore_bin, hf_dirs, tmp_path):
    hf = _copy(hf_dirs, tmp_path)
    _edit_tensors(hf / "model.safetensors", lambda t: t.pop(EXPERT))
    _import_fails(moecore_bin, hf, tmp_path, EXPERT, "missing")


def test_unused_extra_expert(moecore_bin, hf_dirs, tmp_path):
    """An expert the config does not count (num_experts too small) is an error, never dropped."""
    hf = _copy(hf_dirs, tmp_path)
    extra = "model.layers.0.mlp.experts.4.up_proj.weight"
    like = "model.layers.0.mlp.experts.3.up_proj.weight"
    _edit_tensors(hf / "model.safetensors", lambda t: t.update({extra: t[like].clone()}))
    _import_fails(moecore_bin, hf, tmp_path, extra, "unused", "model.safetensors")


def test_wrong_shape(moecore_bin, hf_dirs, tmp_path):
    hf = _copy(hf_dirs, tmp_path)
    _edit_tensors(hf / "model.safetensors", lambda t: t.update({EXPERT: t[EXPERT].t().contiguous()}))
    _import_fails(moecore_bin, hf, tmp_path, EXPERT, "shape")


@pytest.mark.parametrize("dtype,name", [(torch.float16, "F16"), (torch.int64, "I64")])
def test_unsupported_dtype(moecore_bin, hf_dirs, tmp_path, dtype, name):
    hf = _copy(hf_dirs, tmp_path)
    _edit_tensors(hf / "model.safetensors", lambda t: t.update({EXPERT: t[EXPERT].to(dtype)}))
    _import_fails(moecore_bin, hf, tmp_path, EXPERT, name)


def test_shard_index_naming_a_missing_file(moecore_bin, hf_dirs, tmp_path):
    """The error is the import's and names the index that lists the shard (what to fix, or the
    download to finish) and the missing shard."""
    hf = _copy(hf_dirs, tmp_path, variant="fp32-sharded")
    shard = sorted(hf.glob("model-*.safetensors"))[1]
    shard.unlink()
    _import_fails(moecore_bin, hf, tmp_path, f"[import] {hf}/model.safetensors.index.json: ",
                  f"in {shard}, which does not exist")


def test_shard_that_is_not_safetensors(moecore_bin, hf_dirs, tmp_path):
    hf = _copy(hf_dirs, tmp_path, variant="fp32-sharded")
    shard = sorted(hf.glob("model-*.safetensors"))[1]
    shard.write_bytes(b"abc")
    _import_fails(moecore_bin, hf, tmp_path, f"[import] {shard}: file is 3 bytes")


def test_shard_tensor_left_out_of_the_index(moecore_bin, hf_dirs, tmp_path):
    hf = _copy(hf_dirs, tmp_path, variant="fp32-sharded")
    index_path = hf / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = sorted(index["weight_map"])[5]
    file = index["weight_map"].pop(name)
    index_path.write_text(json.dumps(index))
    _import_fails(moecore_bin, hf, tmp_path, "[import]", name, file, "unused")


@pytest.mark.parametrize("key,value,needle", [
    ("model_type", "mixtral", "mixtral"),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling"),
    ("clip_qkv", 8.0, "clip_qkv"),
    ("attention_dropout", 0.1, "attention_dropout"),
    ("hidden_size", "32", "hidden_size"),
])
def test_bad_config_json(moecore_bin, hf_dirs, tmp_path, key, value, needle):
    hf = _copy(hf_dirs, tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    cfg[key] = value
    (hf / "config.json").write_text(json.dumps(cfg))
    _import_fails(moecore_bin, hf, tmp_path, needle)


def test_import_refuses_a_non_empty_out(moecore_bin, hf_dirs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run(moecore_bin, "import", hf_dirs[("olmoe", "fp32")], "--out", out, check=False)
    assert_one_line_error(r, str(out))
    assert (out / "keep.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------------
# train --init-from


def init_config(tmp_path: Path, job, out_dir: Path, name="run.toml", model_lines="", **train) -> Path:
    """A run config whose [model] table sets only `model_lines`: the rest comes from config.json."""
    path = write_config(tmp_path / name, job, out_dir, train=train)
    text = path.read_text()
    path.write_text(f"[model]\n{model_lines}\n" + text[text.index("[optim]"):])
    return path


def exactly_one_batch(job, tmp_path: Path, rows: int, seq: int) -> tuple[Path, np.ndarray]:
    """A token file holding exactly one batch of instances, so step 1 sees all of them."""
    tokens = np.load(job.small_train)[: rows * seq]
    path = tmp_path / "one_batch.npy"
    np.save(path, tokens)
    return path, tokens.reshape(rows, seq).astype(np.int64)


def test_init_from_step0_loss_is_the_imported_models(moecore_bin, hf_dirs, job_data, tmp_path):
    """Step 1's logged loss is the loss of the weights before the first update: the imported
    model's loss on the same batch (debug-state on the imported directory). Same program, rows in
    another order (the loader shuffles): only the order of the loss's fp32 sums over the 128
    tokens changes, within 128 u = 7.6e-6 relative; bound 1e-5."""
    hf = hf_dirs[("qwen3_moe", "bf16-sharded")]
    imported = tmp_path / "imported"
    run(moecore_bin, "import", hf, "--out", imported)
    data, rows = exactly_one_batch(job_data, tmp_path, 4, 32)
    out = tmp_path / "run"
    cfg = init_config(tmp_path, job_data, out, max_steps=1, batch_size=4, seq_len=32, log_every=1,
                      eval_every=0)
    r = run(moecore_bin, "train", cfg, "--set", f'data.train=["{data}"]', "--init-from", hf)
    assert f"initialised from {hf}" in r.stdout
    logged = train_rows(out)[1]["train/loss"]
    np.save(tmp_path / "x.npy", rows)
    np.save(tmp_path / "y.npy", np.concatenate([rows[:, 1:], np.full((4, 1), -100)], 1))
    run(moecore_bin, "debug-state", "--config", out / "config.toml", "--weights",
        imported / "model.safetensors", "--tokens", tmp_path / "x.npy", "--targets",
        tmp_path / "y.npy", "--out", tmp_path / "s.safetensors")
    expected = float(load_np(str(tmp_path / "s.safetensors"))["loss.total"])
    assert abs(logged - expected) <= 1e-5 * abs(expected), (logged, expected)
    # The run's model is config.json's (the config set none of it) and resumes as usual.
    saved = (out / "config.toml").read_text()
    assert "head_dim = 16" in saved and "first_k_dense_replace = 1" in saved
    assert "qk_norm = 'per_head'" in saved


def test_import_init_from_and_generate_keep_the_models_generation_settings(
        moecore_bin, hf_dirs, job_data, tmp_path):
    """What a Hugging Face directory says beyond the weights reaches what moecore writes of it and
    how it generates: several EOS ids, BOS and PAD ids, the context length, generation_config.json,
    tokenizer_config.json and chat_template.jinja (byte for byte), through `import`, through the
    checkpoints of `train --init-from` with the model's own tokenizer, and into `generate`, which
    stops where transformers' generate stops (at any of the EOS ids). A run with another tokenizer
    leaves them behind and says so in a note."""
    hf = _copy(hf_dirs, tmp_path)
    shutil.copy(job_data.tokenizer, hf / "tokenizer.json")
    prompt = "And God said"
    tok = tokenizers.Tokenizer.from_file(str(job_data.tokenizer))
    ids = tok.encode(prompt).ids
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
    with torch.no_grad():
        greedy = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12,
                                eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    # The first token not seen before it, from the third on, is one of the two EOS ids.
    stop_at = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])
    eos = [greedy[stop_at], job_data.vocab_size - 1]
    config = json.loads((hf / "config.json").read_text())
    config.update(eos_token_id=eos, bos_token_id=1, pad_token_id=2, max_position_embeddings=4096)
    (hf / "config.json").write_text(json.dumps(config))
    generation = json.loads((hf / "generation_config.json").read_text())
    generation.update(eos_token_id=eos, bos_token_id=1, pad_token_id=2)
    (hf / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (hf / "tokenizer_config.json").write_text('{"model_max_length": 4096}')
    (hf / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    side = ["chat_template.jinja", "generation_config.json", "tokenizer_config.json"]

    def assert_carried(d: Path):
        for name in side:
            assert (d / name).read_bytes() == (hf / name).read_bytes(), (d, name)
        written = json.loads((d / "config.json").read_text())
        assert (written["eos_token_id"], written["bos_token_id"], written["pad_token_id"],
                written["max_position_embeddings"]) == (eos, 1, 2, 4096), written

    imported = tmp_path / "imported"
    run(moecore_bin, "import", hf, "--out", imported)
    assert_carried(imported)
    with torch.no_grad():
        expected = transformers.AutoModelForCausalLM.from_pretrained(
            imported, torch_dtype=torch.float32).generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=12)[0, len(ids):].tolist()
    assert expected == greedy[:stop_at + 1], (expected, greedy)  # transformers stops at the EOS
    r = run(moecore_bin, "generate", "--checkpoint", imported, "--prompt", prompt,
            "--temperature", "0", "--max-tokens", "12")
    assert r.stdout == prompt + tok.decode(greedy[:stop_at]) + "\n", (r.stdout, greedy, stop_at)

    out = tmp_path / "run"
    cfg = init_config(tmp_path, job_data, out, max_steps=1)
    r = run(moecore_bin, "train", cfg, "--init-from", hf)
    assert "are not carried" not in r.stdout, r.stdout
    (saved,) = checkpoints(out)
    assert_carried(saved)
    r = run(moecore_bin, "train", out / "config.toml", "--set", "train.max_steps=2", "--resume")
    assert_carried(checkpoints(out)[-1])  # and its resumes keep the checkpoint's

    other = tmp_path / "other_tokenizer.json"  # the same tokens, other bytes: not the model's
    other.write_bytes(job_data.tokenizer.read_bytes() + b"\n")
    out = tmp_path / "run_other"
    cfg = init_config(tmp_path, job_data, out, name="other.toml", max_steps=1)
    r = run(moecore_bin, "train", cfg, "--set", f'data.tokenizer="{other}"', "--init-from", hf)
    assert (f"note: config.json's token ids, {', '.join(side)} of {hf} are not carried into this "
            f"run's checkpoints: data.tokenizer is not {hf}/tokenizer.json") in r.stdout, r.stdout
    (saved,) = checkpoints(out)
    assert not any((saved / name).exists() for name in side)
    written = json.loads((saved / "config.json").read_text())
    assert written["eos_token_id"] == job_data.eos_id and written["bos_token_id"] is None
    assert written["max_position_embeddings"] == 4096  # the model's, whatever the tokenizer


@pytest.mark.parametrize("named", ["empty list", "generation config without eos",
                                   "generation config null", "config.json null"])
def test_generate_where_no_eos_is_named_stops_at_none_as_transformers(
        moecore_bin, hf_dirs, job_data, tmp_path, named):
    """transformers' generate reads generation_config.json alone where the directory has one (a
    config.json EOS does not count then) and config.json where it has none. A file that names no
    EOS (`"eos_token_id": []`, no key, null) stops at none: transformers (with the pad_token_id it
    then needs) produces every requested token, the tokenizer's EOS among them, and so does
    moecore's generate (it stopped at config.json's or the tokenizer's EOS)."""
    hf = _copy(hf_dirs, tmp_path)
    shutil.copy(job_data.tokenizer, hf / "tokenizer.json")
    prompt, n = "And God said", 12
    tok = tokenizers.Tokenizer.from_file(str(job_data.tokenizer))
    ids = tok.encode(prompt).ids

    def transformers_greedy(**kw) -> list[int]:
        model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, **kw)
        return out[0, len(ids):].tolist()

    # The EOS logit made twice the third greedy token's: greedy decoding draws the EOS early.
    third = transformers_greedy(eos_token_id=None, pad_token_id=0)[2]
    _edit_tensors(hf / "model.safetensors", lambda t: t["lm_head.weight"][job_data.eos_id].copy_(
        2 * t["lm_head.weight"][third]))
    config = json.loads((hf / "config.json").read_text())
    assert config["eos_token_id"] == job_data.eos_id
    generation_config = {"empty list": '{"eos_token_id": [], "pad_token_id": 0}',
                         "generation config without eos": '{"pad_token_id": 0}',
                         "generation config null": '{"eos_token_id": null, "pad_token_id": 0}'}
    if named in generation_config:
        (hf / "generation_config.json").write_text(generation_config[named])
    else:  # save_pretrained wrote a generation_config.json from the model's config
        (hf / "generation_config.json").unlink()
        (hf / "config.json").write_text(json.dumps({**config, "eos_token_id": None}))
    expected = transformers_greedy()
    assert len(expected) == n and job_data.eos_id in expected, expected
    imported = tmp_path / "imported"
    run(moecore_bin, "import", hf, "--out", imported)
    r = run(moecore_bin, "generate", "--checkpoint", imported, "--prompt", prompt,
            "--temperature", "0", "--max-tokens", n)
    assert r.stdout == prompt + tok.decode(expected, skip_special_tokens=False) + "\n", \
        (r.stdout, expected)


def test_an_eos_id_outside_the_vocabulary_is_one_error(moecore_bin, hf_dirs, job_data, tmp_path):
    """An EOS id outside the vocabulary is one error in either file: refused by import where it
    reads the file, and by generate where the file was edited after (config.json's was dropped,
    generation_config.json's refused)."""
    hf = _copy(hf_dirs, tmp_path)
    shutil.copy(job_data.tokenizer, hf / "tokenizer.json")
    imported = tmp_path / "imported"
    run(moecore_bin, "import", hf, "--out", imported)
    bad = f'{{"eos_token_id": [{job_data.vocab_size}]}}'
    (imported / "generation_config.json").write_text(bad)
    r = run(moecore_bin, "generate", "--checkpoint", imported, "--prompt", "And", check=False)
    assert_one_line_error(r, "[generate]", f"{imported}/generation_config.json: eos_token_id holds "
                          f"{job_data.vocab_size}, not a token id below vocab_size")
    (hf / "generation_config.json").write_text(bad)
    _import_fails(moecore_bin, hf, tmp_path, "[import]",
                  f"{hf}/generation_config.json: eos_token_id holds {job_data.vocab_size}")
    (hf / "generation_config.json").unlink()
    config = json.loads((hf / "config.json").read_text())
    config["eos_token_id"] = [0, job_data.vocab_size]
    (hf / "config.json").write_text(json.dumps(config))
    _import_fails(moecore_bin, hf, tmp_path, "[import]",
                  f"{hf}/config.json: eos_token_id holds {job_data.vocab_size}")


def test_import_and_init_from_refuse_non_finite_weights(moecore_bin, hf_dirs, job_data, tmp_path):
    """A NaN where the self-check's batch does not reach it (one row of the embedding no check
    token selects) is refused by import and --init-from, naming the tensor and the element,
    before anything is written."""
    hf = _copy(hf_dirs, tmp_path)
    row = job_data.vocab_size - 1
    _edit_tensors(hf / "model.safetensors",
                  lambda t: t["model.embed_tokens.weight"][row, 3].fill_(float("nan")))
    element = row * 32 + 3
    _import_fails(moecore_bin, hf, tmp_path, "[import]", "'model.embed_tokens.weight' holds nan",
                  f"element {element}")
    out = tmp_path / "run"
    r = run(moecore_bin, "train", init_config(tmp_path, job_data, out, max_steps=1), "--init-from",
            hf, check=False)
    assert_one_line_error(r, "'model.embed_tokens.weight' holds nan", f"element {element}")
    assert not checkpoints(out)


INIT_CHECK = "init-from self-check: "
# One directory per family, both dtypes and both file layouts among them.
INIT_VARIANT = {"olmoe": "fp32", "qwen3_moe": "bf16-sharded", "flex_olmo": "bf16"}


@pytest.mark.parametrize("family", FAMILIES)
def test_init_from_self_checks_and_starts_from_transformers_logits(moecore_bin, hf_dirs, job_data,
                                                                  tmp_path, family):
    """Before its first step, `train --init-from` writes the imported weights in moecore's format,
    reads them back and finds the same logits bit for bit, and says so in one line. The model it
    starts from (a 0-step run's checkpoint: the weights before the first update) has transformers'
    logits on HF_DIR within the oracle tolerance (module docstring), and the check leaves nothing
    behind."""
    hf = hf_dirs[(family, INIT_VARIANT[family])]
    out = tmp_path / "run"
    r = run(moecore_bin, "train", init_config(tmp_path, job_data, out, max_steps=0), "--init-from",
            hf)
    lines = [l for l in r.stdout.splitlines() if l.startswith(INIT_CHECK)]
    assert len(lines) == 1, r.stdout
    assert "bit for bit (2 x 32 tokens, max |diff| 0," in lines[0], lines[0]
    assert r.stdout.index(INIT_CHECK) < r.stdout.index("checkpoint "), "check after a save"
    assert not (out / ".init-from-check").exists()
    (start,) = checkpoints(out)
    assert start.name == "step_00000000"
    x = batch(job_data.vocab_size)
    ref = transformers_logits(hf, x)
    ours = moecore_logits(moecore_bin, start, x, tmp_path)
    assert np.abs(ref).max() > 1.0, "logits too small to tell a wrong layout"
    assert max_rel(ours, ref) <= ORACLE_TOL, (family, max_rel(ours, ref))


def _non_finite_copy(hf_dirs, tmp_path) -> Path:
    """A real broken checkpoint: every header, dtype and shape as expected, every value finite
    (a NaN or Inf weight is refused before the check: below), but the final norm's weight near
    fp32's largest, so the logits overflow to Inf or NaN."""
    hf = _copy(hf_dirs, tmp_path)
    _edit_tensors(hf / "model.safetensors", lambda t: t["model.norm.weight"].fill_(3e38))
    return hf


def test_init_from_non_finite_logits_fail_before_anything_is_written(moecore_bin, hf_dirs,
                                                                    job_data, tmp_path):
    """The self-check fails on weights whose logits are not finite: one line, a non-zero exit, no
    step, no checkpoint, no metrics, no config.toml, no scratch directory; import refuses the same
    directory. (The round trip itself cannot be made to fail from outside without a mock: fp32
    written and read back is the same bits. Non-finite logits are the failure a user can meet.)"""
    hf = _non_finite_copy(hf_dirs, tmp_path)
    out = tmp_path / "run"
    r = run(moecore_bin, "train", init_config(tmp_path, job_data, out, max_steps=1), "--init-from",
            hf, check=False)
    assert_one_line_error(r, "[init-from] self-check", "not finite")
    assert INIT_CHECK not in r.stdout and "moecore train:" not in r.stdout, r.stdout
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert "checkpoints" not in left and "metrics.jsonl" not in left, left
    assert "config.toml" not in left and ".init-from-check" not in left, left
    _import_fails(moecore_bin, hf, tmp_path, "[import] self-check", "not finite")


def test_init_from_failed_check_ends_every_rank(moecore_bin, hf_dirs, job_data, tmp_path):
    """Under mpirun (ep 2, ZeRO-1) rank 0 checks and shares its verdict: every rank stops with the
    same error, and the job exits non-zero instead of hanging, with nothing written."""
    hf = _non_finite_copy(hf_dirs, tmp_path)
    out = tmp_path / "run"
    r = mpirun_init_from(moecore_bin, 2, init_config(tmp_path, job_data, out, max_steps=1,
                                                     threads=1), hf, "parallel.ep=2",
                         "parallel.zero=1")
    assert r.returncode != 0
    errors = [l for l in r.stderr.splitlines() if l.startswith("moecore: error")]
    assert errors and all("[init-from] self-check" in e and "not finite" in e for e in errors), \
        r.stderr
    assert not (out / "checkpoints").exists() and not (out / "config.toml").exists()


def test_init_from_takes_unset_keys_and_refuses_contradictions(moecore_bin, hf_dirs, job_data,
                                                               tmp_path):
    hf = hf_dirs[("olmoe", "fp32")]
    # Agreeing keys and a training-only change are accepted.
    ok = init_config(tmp_path, job_data, tmp_path / "ok", "ok.toml",
                     "hidden_size = 32\nqk_norm = \"full\"\nrouter_z_loss_coef = 0.01", max_steps=1)
    run(moecore_bin, "train", ok, "--init-from", hf)
    bad = init_config(tmp_path, job_data, tmp_path / "bad", "bad.toml", "hidden_size = 64",
                      max_steps=1)
    r = run(moecore_bin, "train", bad, "--init-from", hf, check=False)
    err = assert_one_line_error(r, "hidden_size = 64", "hidden_size = 32", "config.json")
    assert not (tmp_path / "bad").exists(), err
    r = run(moecore_bin, "train", ok, "--set", "model.block_norm=reordered", "--init-from", hf,
            check=False)
    assert_one_line_error(r, "block_norm")


@pytest.mark.parametrize("family", ["olmoe", "qwen3_moe"])
def test_init_from_says_where_its_objective_is_not_transformers(moecore_bin, hf_dirs, job_data,
                                                                 tmp_path, family):
    """transformers adds its load-balancing loss (router_aux_loss_coef times its own form) only
    when config.json's output_router_logits is true: a fine-tune that trains another objective
    says so in a start-up line, and how to match transformers; one that matches it says nothing.
    Qwen3-MoE's router_aux_loss_coef is transformers' default, 0.001, where config.json has none."""
    hf = tmp_path / "hf"
    shutil.copytree(hf_dirs[(family, "fp32")], hf)
    config = json.loads((hf / "config.json").read_text())
    assert config["output_router_logits"] is False
    if family == "qwen3_moe":
        del config["router_aux_loss_coef"]
        (hf / "config.json").write_text(json.dumps(config))
    coef = 0.001 if family == "qwen3_moe" else 0.01

    def notes(name: str, *sets: str) -> list[str]:
        cfg = init_config(tmp_path, job_data, tmp_path / name, f"{name}.toml", "", max_steps=1)
        r = run(moecore_bin, "train", cfg, *[a for s in sets for a in ("--set", s)],
                "--init-from", hf)
        assert f"router_aux_loss_coef = {coef}" in (tmp_path / name / "config.toml").read_text()
        return [line for line in r.stdout.splitlines()
                if line.startswith("note: ") and "load-balancing loss" in line]

    assert notes("default") == [
        f"note: {hf}/config.json says output_router_logits = false, so transformers fine-tunes it "
        f"on cross-entropy alone; this run adds the load-balancing loss "
        f"(model.router_aux_loss_coef = {coef}; 0 trains as transformers does)"]
    config["output_router_logits"] = True
    (hf / "config.json").write_text(json.dumps(config))
    assert notes("olmo_core_form") == [
        "note: the load-balancing loss is OLMo-core's form (per layer, summed over the layers); "
        f"transformers adds its own form for {hf} (model.lb_loss_style = \"hf\" trains as it does)"]
    assert notes("hf_form", "model.lb_loss_style=hf") == []


def test_init_from_a_broken_directory_writes_nothing(moecore_bin, hf_dirs, job_data, tmp_path):
    """The weights are checked (presence, use, dtype, shape) before the run directory is made."""
    hf = _copy(hf_dirs, tmp_path, variant="bf16")
    _edit_tensors(hf / "model.safetensors", lambda t: t.pop(EXPERT))
    out = tmp_path / "run"
    r = run(moecore_bin, "train", init_config(tmp_path, job_data, out, max_steps=1), "--init-from",
            hf, check=False)
    assert_one_line_error(r, EXPERT, "missing")
    assert not out.exists()


def test_init_from_with_resume_of_an_existing_run_is_refused(moecore_bin, hf_dirs, job_data,
                                                              tmp_path):
    hf = hf_dirs[("flex_olmo", "bf16")]
    out = tmp_path / "run"
    cfg = init_config(tmp_path, job_data, out, max_steps=2, eval_every=0)
    run(moecore_bin, "train", cfg, "--init-from", hf, "--resume")  # nothing to resume: starts
    r = run(moecore_bin, "train", cfg, "--init-from", hf, "--resume", check=False)
    assert_one_line_error(r, "--init-from", "--resume", "step_00000002")
    # The run continues from its own checkpoints with its saved config.
    run(moecore_bin, "train", out / "config.toml", "--set", "train.max_steps=3", "--resume")
    assert 3 in train_rows(out)


def mpirun_init_from(bin_path, ranks: int, config: Path, hf: Path, *sets: str):
    cmd = ["mpirun", "-np", str(ranks), str(bin_path), "train", str(config), "--init-from", str(hf)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, env=MPI_ENV)


@pytest.mark.parametrize("name,sets", [("dp2", []),
                                       ("ep2-zero1", ["parallel.ep=2", "parallel.zero=1"]),
                                       ("pp2", ["parallel.pp=2"])])
def test_init_from_under_mpirun_follows_the_single_process(moecore_bin, hf_dirs, job_data,
                                                           tmp_path, name, sets):
    """Each rank keeps its part of the imported weights. A 0-step run saves them as the ranks hold
    them (under ep = 2 each rank writes its own experts, under pp = 2 its own layers): bit for bit HF_DIR's weights. Four steps
    then follow the single process within the parallel suite's loss bound (1e-5 relative per
    step, test_parallel.py; measured 2.6e-8). The final weights are not compared: from these
    random O(1) weights Adam turns last-bit differences of near-zero embedding gradients into
    4e-5 of max |w| (measured), too close to the suite's 1e-4 to hold on every CPU."""
    hf = hf_dirs[("olmoe", "bf16-sharded")]
    expected = {}
    for shard in hf.glob("model-*.safetensors"):
        expected.update({k: v.float().numpy() for k, v in load_file(str(shard)).items()})
    start = tmp_path / f"{name}-start"
    r = mpirun_init_from(moecore_bin, 2, init_config(tmp_path, job_data, start, "z.toml",
                                                     max_steps=0, threads=1), hf, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count(INIT_CHECK) == 1, r.stdout  # rank 0's check, before the save
    saved = final_weights(start)
    assert saved.keys() == expected.keys()
    for k in expected:
        assert np.array_equal(saved[k], expected[k]), k

    steps = dict(max_steps=4, batch_size=4, threads=1, log_every=1, eval_every=0)
    single = tmp_path / "single"
    run(moecore_bin, "train", init_config(tmp_path, job_data, single, "s.toml", **steps),
        "--init-from", hf)
    out = tmp_path / name
    r = mpirun_init_from(moecore_bin, 2, init_config(tmp_path, job_data, out, "p.toml", **steps),
                         hf, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"initialised from {hf}" in r.stdout
    ref, got = train_rows(single), train_rows(out)
    assert sorted(ref) == sorted(got) == [1, 2, 3, 4]
    assert max_rel([got[s]["train/loss"] for s in ref],
                   [ref[s]["train/loss"] for s in ref]) <= PARALLEL_TOL


def test_moecore_checkpoint_imports_as_itself(moecore_bin, job_data, tmp_path):
    """moecore's own export (model_type "moecore": reordered norms, sigmoid router, groups, a
    weight scale, a selection bias, a shared expert) imports back to the same weights and logits
    bit for bit."""
    from test_training_job import train

    model = {"block_norm": "reordered", "router_score": "sigmoid", "norm_topk_prob": True,
             "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0,
             "router_bias_update_rate": 1e-3, "shared_expert_intermediate_size": 16}
    out = tmp_path / "run"
    train(moecore_bin, write_config(tmp_path / "m.toml", job_data, out, model=model,
                                    train={"max_steps": 2, "eval_every": 0}))
    ckpt = checkpoints(out)[-1]
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "moecore"
    imported = tmp_path / "imported"
    run(moecore_bin, "import", ckpt, "--out", imported)
    a, b = load_np(str(ckpt / "model.safetensors")), load_np(str(imported / "model.safetensors"))
    assert a.keys() == b.keys() and "model.layers.0.mlp.gate.e_score_correction_bias" in a
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert (imported / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    # Its config.toml is the same architecture: the same logits, bit for bit (same program, same
    # weights); and `eval` reads the directory as it reads a checkpoint.
    x = batch(job_data.vocab_size)
    (tmp_path / "c").mkdir()
    (tmp_path / "i").mkdir()
    ours = moecore_logits(moecore_bin, imported, x, tmp_path / "i")
    assert np.array_equal(moecore_logits(moecore_bin, ckpt, x, tmp_path / "c"), ours)
    r = run(moecore_bin, "eval", "--checkpoint", imported, "--data", job_data.val,
            "--max-instances", 4)
    assert r.stdout.startswith("eval: loss"), r.stdout


def test_init_from_ranks_other_than_0_read_only_their_share(moecore_bin, job_data, tmp_path):
    """Under ep = 2 a rank holds half of the experts: ranks other than 0 read only their share of
    HF_DIR (rank 0 reads the whole model, for the self-check). Shown by rank 1's peak RSS against
    the same layout's run from random weights: the file is mapped, and the pages of the share it
    reads count as resident while mapped, so the init-from run's peak is higher by at most the
    share's bytes (measured 0.42 of the whole model's fp32 size, AMD EPYC); reading the whole
    model (as before) added the whole fp32 copy and every page of the file, over twice its size.
    Bound: one whole model. The HF_DIR is a moecore checkpoint (config.json, model.safetensors,
    104 MB, 97 % experts), made by a 0-step run."""
    model = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 2,
             "moe_intermediate_size": 512, "intermediate_size": 512, "first_k_dense_replace": 0,
             "shared_expert_intermediate_size": 0}
    steps = dict(max_steps=1, batch_size=2, seq_len=32, threads=1, eval_every=0, log_every=1,
                 checkpoint=False)
    made = tmp_path / "made"
    run(moecore_bin, "train", write_config(tmp_path / "made.toml", job_data, made, model=model,
                                           train=dict(steps, max_steps=0, checkpoint=True)))
    hf = checkpoints(made)[-1]
    whole_bytes = (hf / "model.safetensors").stat().st_size  # fp32: the whole model's size
    assert whole_bytes > 100e6

    def rank1_peak(out: Path, config: Path, *extra: str) -> float:
        cmd = ["mpirun", "-np", "2", str(moecore_bin), "train", str(config), *extra,
               "--set", "parallel.ep=2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                           stdin=subprocess.DEVNULL, env=MPI_ENV)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return json.loads((out / "rank_stats" / "rank1.json").read_text())["peak_rss_kib"] * 1024.0

    plain = rank1_peak(tmp_path / "plain", write_config(tmp_path / "plain.toml", job_data,
                                                        tmp_path / "plain", model=model,
                                                        train=steps))
    init = rank1_peak(tmp_path / "init", init_config(tmp_path, job_data, tmp_path / "init",
                                                     "init.toml", **steps), "--init-from", str(hf))
    assert init - plain < whole_bytes, (init / 1e6, plain / 1e6, whole_bytes / 1e6)
