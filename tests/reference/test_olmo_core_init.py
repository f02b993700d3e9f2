"""train.init_method: OLMo-core's initialisations, tensor by tensor against OLMo-core's own.

OLMo-core's OLMoDDP model (OLMoDDPModel.init_weights with its InitMethod: normal, llama,
llama_depth, fan_in; init_std, embedding_init_std) initialises a model of the same config as
`moecore init` with train.init_method set. The generators differ (torch's against moecore's
per-tensor streams), so the values cannot be equal; the distributions are compared, per tensor
under moecore's Hugging Face names:
- norms and the selection bias: exactly 1 and 0 on both sides;
- every other tensor's standard deviation: moecore's s_m against OLMo-core's s_o, their
  difference within 5 standard errors, se = s / sqrt(2 n) for n values each (the normal's; the
  3-sigma truncated normal's kurtosis 2.8 < 3 makes it smaller): a wrong rule (an unscaled output
  projection under llama, 0.02 for a fan-in std) is 10 to 100 standard errors off here;
- truncation: for tensors of >= 4000 values, whether any value lies beyond 3.3 s must agree: none
  where OLMo-core truncates at 3 sigma (3.04 of the truncated normal's own std; OLMo-core draws in
  bf16, half an ulp more; s within 5 % of its expectation at 5 standard errors: 3.21 s at most),
  about 0.1 % of them where it draws a plain normal (llama's and fan_in's embeddings, 20480 values:
  about 20).
The model has a dense first layer, a shared expert, grouped-query attention and two MoE layers,
so every rule of init_attention, init_moe_v2, init_embeddings and init_final_w_out is reached;
built on the meta device as OLMo-core's training scripts build it, so that a tied embedding is
initialised as the embedding (init_weights re-ties the head to it; built on the CPU, the tie
would survive and the head's rule would win).
"""

import math

import numpy as np
import pytest
import torch

import moecore_harness as H

pytest.importorskip("olmo_core.nn.ddp.block", reason="ai2-olmo-core is not installed (requirements.txt pins it)")

from olmo_core.nn.transformer.init import InitMethod  # noqa: E402

from test_olmo_core_oracle import hf_gradients, olmo_core_model  # noqa: E402

MODEL = dict(
    vocab_size=320, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=48, intermediate_size=96, first_k_dense_replace=1,
    shared_expert_intermediate_size=32, norm_topk_prob=False, router_aux_loss_coef=0.01,
    router_z_loss_coef=0.0, qk_norm="full", router_score="softmax", lb_loss_style="olmo-core",
    router_bias_update_rate=0.001,
)


def olmo_core_init(method: str, std: float, embedding_std: float | None, model_cfg=MODEL) -> dict:
    """OLMo-core's training path: the model built on the meta device, then init_weights (which
    initialises a tied embedding and head apart and re-ties the head to the embedding)."""
    model = olmo_core_model(model_cfg, "pre", init_device="meta", init_method=InitMethod(method),
                            init_std=std, embedding_init_std=embedding_std)
    model.init_weights(device=torch.device("cpu"))
    tied = model_cfg.get("tie_word_embeddings", False)
    if tied:
        assert model.lm_head.w_out.weight is model.embeddings.weight
    for p in model.parameters():  # hf_gradients maps .grad to moecore's names
        p.grad = p.detach().clone()
    # Tied, the one matrix is named once, as the embedding (as moecore holds it).
    return {n: t.double().numpy() for n, t in hf_gradients(model, model_cfg).items()}


def moecore_init(tmp_path, method: str, std: float, embedding_std: float | None,
                 model_cfg=MODEL) -> dict:
    train = {"init_method": method, "init_std": std}
    if embedding_std is not None:
        train["embedding_init_std"] = embedding_std
    cfg = H.write_config(tmp_path / f"{method}.toml", model_cfg, train=train)
    out = tmp_path / f"{method}.safetensors"
    H.run_moecore("init", "--config", cfg, "--seed", 7, "--out", out)
    return {n: t.double().numpy() for n, t in H.load_tensors(out).items()}


TIED = dict(MODEL, tie_word_embeddings=True)


@pytest.mark.parametrize("method,std,embedding_std,model_cfg", [
    ("normal", 0.02, None, MODEL),
    ("normal", 0.05, 0.3, MODEL),
    ("llama", 0.02, None, MODEL),
    ("llama_depth", 0.03, None, MODEL),
    ("fan_in", 0.02, None, MODEL),
    ("llama", 0.02, None, TIED),  # the tied matrix: the embedding's N(0, 1)
    ("normal", 0.02, 0.3, TIED),
], ids=["normal", "normal_embedding_std", "llama", "llama_depth", "fan_in", "llama_tied",
        "normal_tied_embedding_std"])
def test_each_tensor_starts_from_olmo_core_distribution(tmp_path, method, std, embedding_std,
                                                        model_cfg):
    ours = moecore_init(tmp_path, method, std, embedding_std, model_cfg)
    ref = olmo_core_init(method, std, embedding_std, model_cfg)
    assert set(ours) == set(ref)
    mismatched = []
    for name, r in ref.items():
        m = ours[name]
        assert m.shape == r.shape, name
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            assert (m == 1).all() and (r == 1).all(), name
            continue
        if name.endswith("e_score_correction_bias"):
            assert (m == 0).all(), name  # OLMo-core's score_bias buffer: zeros (no gradient here)
            continue
        n = m.size
        s_m, s_o = m.std(), r.std()
        se = math.sqrt(s_m**2 / (2 * n) + s_o**2 / (2 * n))
        z = abs(s_m - s_o) / se
        if z > 5:
            mismatched.append(f"{name}: std {s_m:.5g} vs OLMo-core {s_o:.5g} ({z:.1f} se)")
        if n >= 4000:
            tail_m = int((np.abs(m) > 3.3 * s_m).sum())
            tail_o = int((np.abs(r) > 3.3 * s_o).sum())
            if (tail_m == 0) != (tail_o == 0):
                mismatched.append(f"{name}: {tail_m} values beyond 3.3 std vs OLMo-core {tail_o}")
    assert not mismatched, "\n".join(mismatched)


def test_bad_init_settings_are_one_line_errors(tmp_path):
    for key, value, needle in [("init_method", '"xavier"', 'train.init_method="xavier" is not one of'),
                               ("init_std", "0.0", "train.init_std"),
                               ("embedding_init_std", "-0.5", "train.embedding_init_std")]:
        cfg = H.write_config(tmp_path / "bad.toml", MODEL)
        text = cfg.read_text().replace("[train]\n", f"[train]\n{key} = {value}\n")
        cfg.write_text(text)
        r = H.run_moecore_raw("init", "--config", cfg, "--seed", 1, "--out", tmp_path / "x.safetensors")
        assert r.returncode != 0, key
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], r.stderr
        assert not (tmp_path / "x.safetensors").exists()
