"""Issue 12 through real training jobs: OLMo-2's reordered block and the router options
(auxiliary-loss-free selection bias, group-limited top-k, routed_scaling_factor, the labels
normaliser) resume byte-exactly, the selection bias is saved and moves by the sign rule, a data-parallel
run updates it like the single process, and a reordered OLMoE-shaped checkpoint loads in transformers
as FlexOlmoForCausalLM with the same logits.
"""
from __future__ import annotations

import json
import numpy as np
import pytest
from safetensors.numpy import load_file

from test_parallel import final_weights, max_rel, mpirun
from test_training_job import checkpoints, run, train, train_rows, write_config

OPTIONS = {"block_norm": "reordered", "router_score": "sigmoid", "norm_topk_prob": True,
           "num_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
           "routed_scaling_factor": 2.0, "router_bias_update_rate": 1e-3, "loss_normalizer": "labels"}
BIAS = "model.layers.{}.mlp.gate.e_score_correction_bias"


def test_reordered_router_options_resume_byte_exact(moecore_bin, job_data, tmp_path):
    n = 6
    settings = dict(model=OPTIONS, optim={"schedule": "constant"},
                    data={"train": [str(job_data.small_train)]},
                    train={"max_steps": 2 * n, "log_every": 1, "eval_every": 4})
    straight = tmp_path / "straight"
    train(moecore_bin, write_config(tmp_path / "a.toml", job_data, straight, **settings))
    split = tmp_path / "split"
    cfg = write_config(tmp_path / "b.toml", job_data, split, **settings)
    train(moecore_bin, cfg, f"train.max_steps={n}")
    train(moecore_bin, cfg, f"train.max_steps={2 * n}", resume=True)
    final = f"checkpoints/step_{2 * n:08d}"
    for name in ("model.safetensors", "optim.safetensors"):
        assert (straight / final / name).read_bytes() == (split / final / name).read_bytes(), name
    ra, rb = train_rows(straight), train_rows(split)
    assert all(ra[s]["train/loss"] == rb[s]["train/loss"] for s in ra)

    w = load_file(str(straight / final / "model.safetensors"))
    half = load_file(str(split / f"checkpoints/step_{n:08d}/model.safetensors"))
    assert "model.layers.0.post_feedforward_layernorm.weight" in w
    assert "model.layers.0.input_layernorm.weight" not in w
    rate = OPTIONS["router_bias_update_rate"]
    for layer in range(2):
        b = w[BIAS.format(layer)]
        assert b.shape == (8,) and b.dtype == np.float32
        # Every step moves each bias by -rate, 0 or +rate (float32 sums of +-fp32(rate)).
        assert np.abs(b).max() <= 2 * n * np.float32(rate) * (1 + 1e-5)
        assert np.abs(b).max() >= np.float32(rate) * 0.999, "the bias never moved"
        assert not np.array_equal(half[BIAS.format(layer)], b), "the second half did not move it"
    cfg_json = json.loads((straight / final / "config.json").read_text())
    assert cfg_json["model_type"] == "moecore"
    assert (cfg_json["block_norm"], cfg_json["n_group"], cfg_json["topk_group"]) == ("reordered", 4, 2)
    assert cfg_json["routed_scaling_factor"] == 2.0 and cfg_json["router_bias_update_rate"] == rate


def test_router_bias_data_parallel_matches_single_process(moecore_bin, job_data, tmp_path):
    """The counts behind the update are the global batch's: 2 ranks (dp), 2 ranks with experts
    split (ep = 2) and 2 pipeline stages (each updates its own layers' bias) end with the single
    process's bias and weights."""
    model = dict(OPTIONS, loss_normalizer="tokens")
    settings = dict(model=model, train={"max_steps": 8, "batch_size": 8, "threads": 1, "log_every": 1,
                                        "eval_every": 0})
    single = tmp_path / "single"
    train(moecore_bin, write_config(tmp_path / "s.toml", job_data, single, **settings))
    ref = final_weights(single)
    for name, sets in (("dp2", []), ("ep2", ["parallel.ep=2", "parallel.zero=1"]),
                       ("pp2", ["parallel.pp=2"])):
        out = tmp_path / name
        r = mpirun(moecore_bin, 2, write_config(tmp_path / f"{name}.toml", job_data, out, **settings), *sets)
        assert r.returncode == 0, r.stderr[-2000:]
        got = final_weights(out)
        for layer in range(2):
            assert np.array_equal(got[BIAS.format(layer)], ref[BIAS.format(layer)]), (name, layer)
        worst = max(max_rel(got[k], ref[k]) for k in ref)
        assert worst <= 1e-4, (name, worst)


def test_labels_normaliser_pipeline_matches_single_process(moecore_bin, job_data, tmp_path):
    """loss_normalizer = "labels" divides every layer's router losses by the global batch's counted
    targets: two pipeline stages end with the single process's weights and bias (the first stage,
    without the head, counts them too; it once counted none and dropped its layers' router losses
    and their gradients)."""
    settings = dict(model=dict(OPTIONS, router_z_loss_coef=0.01),
                    train={"max_steps": 8, "batch_size": 8, "threads": 1, "log_every": 1,
                           "eval_every": 0})
    single = tmp_path / "single"
    train(moecore_bin, write_config(tmp_path / "s.toml", job_data, single, **settings))
    ref = final_weights(single)
    out = tmp_path / "pp2"
    r = mpirun(moecore_bin, 2, write_config(tmp_path / "pp2.toml", job_data, out, **settings),
               "parallel.pp=2")
    assert r.returncode == 0, r.stderr[-2000:]
    got = final_weights(out)
    for layer in range(2):
        assert np.array_equal(got[BIAS.format(layer)], ref[BIAS.format(layer)]), layer
    worst = max(max_rel(got[k], ref[k]) for k in ref)
    assert worst <= 1e-4, worst


def test_reordered_checkpoint_is_flex_olmo_in_transformers(moecore_bin, job_data, tmp_path):
    import torch
    import transformers

    out = tmp_path / "run"
    cfg = write_config(tmp_path / "r.toml", job_data, out, model={"block_norm": "reordered"},
                       train={"max_steps": 6, "eval_every": 0})
    train(moecore_bin, cfg)
    ckpt = checkpoints(out)[-1]
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "flex_olmo"
    m = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager",
                                                          torch_dtype=torch.float32)
    assert type(m).__name__ == "FlexOlmoForCausalLM"
    val = job_data.read_part(sorted(job_data.val.glob("*.npy"))[0]).astype(np.int64)
    x = np.stack([val[i * 32: (i + 1) * 32] for i in range(2)])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", x)
    run(moecore_bin, "debug-state", "--config", ckpt / "config.toml", "--weights", ckpt / "model.safetensors",
        "--tokens", tmp_path / "x.npy", "--targets", tmp_path / "y.npy", "--out", tmp_path / "s.safetensors")
    ours = load_file(str(tmp_path / "s.safetensors"))["logits"].astype(np.float64)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).logits.double().numpy()
    assert max_rel(ours, ref) <= 1e-4
    # Greedy generation with moecore's KV cache produces transformers' text.
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(ckpt / "tokenizer.json"))
    prompt, n = "And he said unto", 12
    r = run(moecore_bin, "generate", "--checkpoint", ckpt, "--prompt", prompt, "--max-tokens", n,
            "--temperature", 0)
    ids = tok.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        new = m.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                         eos_token_id=job_data.eos_id, pad_token_id=job_data.eos_id)[0, len(ids):].tolist()
    if job_data.eos_id in new:
        new = new[: new.index(job_data.eos_id)]
    assert len(new) >= 4, f"transformers generated only {new}"
    assert r.stdout[:-1] == prompt + tok.decode(new)
