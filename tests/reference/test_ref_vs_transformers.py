"""The PyTorch reference (ref_model.py) checked against transformers on the subset both express.

OlmoeForCausalLM: full QK-norm, MHA, softmax router, HF load-balancing loss, norm_topk_prob false.
Qwen3MoeForCausalLM: per-head QK-norm, GQA (with head_dim != hidden/heads), norm_topk_prob true; and a
Qwen3-MoE variant with a dense first layer (mlp_only_layers=[0]) and tied embeddings.
The SAME weights dict goes into both (load_state_dict, eager attention, float32); we compare logits,
the aux loss (outputs.aux_loss), CE from the HF logits with our no-shift targets, and the gradient of
total = ce + router_aux_loss_coef * aux for every parameter. Needs no C++ binary.
"""

import numpy as np
import pytest
import torch

import moecore_harness as H
import ref_model

# Both implementations run the same fp32 math in PyTorch (same kernels, a few ops ordered differently),
# so they agree far below the engine tolerance: measured worst 5.9e-7 (MKL and ATen on AVX2; 3.3e-7 on
# AVX-512), 17x headroom; a formula difference between the two (a wrong lb or norm) is >= 1e-3.
REF_TOL = 1e-5

BASE = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=2, rope_theta=10000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
    intermediate_size=48, first_k_dense_replace=0, shared_expert_intermediate_size=0,
    router_aux_loss_coef=0.05, router_z_loss_coef=0.0, router_score="softmax", lb_loss_style="hf",
)

OLMOE = dict(BASE, num_attention_heads=4, num_key_value_heads=4, qk_norm="full", norm_topk_prob=False)
QWEN3 = dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=16, qk_norm="per_head",
             norm_topk_prob=True)
QWEN3_DENSE_TIED = dict(QWEN3, first_k_dense_replace=1, tie_word_embeddings=True, num_experts=6,
                        num_experts_per_tok=3)

CASES = {"olmoe": OLMOE, "qwen3_moe": QWEN3, "qwen3_moe_dense0_tied": QWEN3_DENSE_TIED}


def batch(cfg, seed, B=2, T=12, ignore_frac=0.2):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg["vocab_size"], size=(B, T))
    y = rng.integers(0, cfg["vocab_size"], size=(B, T))
    y[rng.random((B, T)) < ignore_frac] = ref_model.IGNORE_INDEX
    return x, y


@pytest.mark.parametrize("case", list(CASES))
def test_ref_matches_transformers(case):
    cfg = CASES[case]
    params = ref_model.random_params(cfg, seed=1234, std=0.08)
    x, y = batch(cfg, seed=7)

    ref, routings = ref_model.debug_state(params, cfg, x, y)
    for r in routings:
        assert r.margin() > 1e-5, f"layer {r.layer}: routing near-tie ({r.margin():.2e}); pick another seed"

    m = H.hf_model(cfg, params)
    hf = H.hf_debug_state(m, cfg, x, y)

    names = H.state_names(cfg)
    names.remove("loss.z")  # HF has no router z-loss (its coefficient is 0 here)
    assert {n for n in hf if n.startswith("grad.")} == {n for n in names if n.startswith("grad.")}
    H.assert_all_close(ref, hf, names, tol=REF_TOL, what=f"ref vs transformers [{case}]")
    # Non-degenerate: the aux loss is positive and contributes to the router gradient.
    assert float(hf["loss.lb"]) > 0
    assert float(ref["grad.model.layers.1.mlp.gate.weight"].abs().max()) > 0


def test_hf_aux_loss_matches_lb_formula():
    """lb_loss_hf equals transformers' load_balancing_loss_func on the same router logits."""
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    g = torch.Generator().manual_seed(3)
    logits = tuple(torch.randn(20, 5, generator=g) for _ in range(3))
    c = ref_model.full_config(dict(num_experts=5, num_experts_per_tok=2))
    routings = [ref_model.Routing(i, None, lg, torch.softmax(lg, -1), None, None, None) for i, lg in enumerate(logits)]
    ours = ref_model.lb_loss_hf(routings, c)
    theirs = load_balancing_loss_func(logits, 5, 2, None)
    assert abs(float(ours) - float(theirs)) <= 1e-6 * abs(float(theirs))


def test_olmo_core_lb_is_one_at_perfect_balance():
    """(E/k) * sum f_e P_e == 1 when routes and probabilities are uniform (DESIGN.md)."""
    E, k, N = 4, 2, 8
    c = ref_model.full_config(dict(num_experts=E, num_experts_per_tok=k))
    scores = torch.full((N, E), 1.0 / E)
    selected = torch.tensor([[(2 * t) % E, (2 * t + 1) % E] for t in range(N)])
    counts = torch.bincount(selected.reshape(-1), minlength=E)
    r = ref_model.Routing(0, None, torch.zeros(N, E), scores, selected, None, counts)
    assert abs(float(ref_model.lb_loss_olmo_core([r], c)) - 1.0) < 1e-6


def test_topk_tie_rule_is_lower_index_first():
    s = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.5, 0.1, 0.5, 0.1]])
    _, sel = ref_model.topk_lower_index_wins(s, 2)
    assert sel.tolist() == [[0, 1], [1, 2], [0, 2]]


def test_all_ignored_targets_give_zero_ce_and_zero_grad():
    cfg = dict(OLMOE, router_aux_loss_coef=0.0)
    params = ref_model.random_params(cfg, seed=5, std=0.08)
    x, _ = batch(cfg, seed=1)
    y = np.full_like(x, ref_model.IGNORE_INDEX)
    ref, _ = ref_model.debug_state(params, cfg, x, y)
    assert float(ref["loss.ce"]) == 0.0 and torch.isfinite(ref["loss.total"])
    assert all(float(ref[n].abs().max()) == 0.0 for n in ref if n.startswith("grad."))


# ----------------------------------------------------------------------------------------------
# Issue 12: OLMo-2's reordered block (FlexOlmo) and DeepSeek-V3's router (dots.llm1)

FLEX_OLMO = dict(OLMOE, block_norm="reordered")
# dots.llm1: per-head QK-norm attention, sigmoid router with e_score_correction_bias, group-limited
# top-k (4 groups of 2, keep 2), renormalised weights times routed_scaling_factor, a shared expert of
# 2 x moe_intermediate_size and a dense first layer. transformers computes no aux loss for it.
DOTS1 = dict(BASE, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             qk_norm="per_head", router_score="sigmoid", norm_topk_prob=True, num_experts=8,
             num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
             router_bias_update_rate=1e-3, shared_expert_intermediate_size=48, first_k_dense_replace=1,
             router_aux_loss_coef=0.0, lb_loss_style="olmo-core")


def dots1_debug_state(m, tokens, targets) -> dict[str, torch.Tensor]:
    """logits, loss.ce (no shift) and grad.<name> of a Dots1ForCausalLM, under moecore's names."""
    m.zero_grad(set_to_none=True)
    out = m(input_ids=torch.as_tensor(tokens).long(), use_cache=False)
    ce = ref_model.cross_entropy(out.logits, torch.as_tensor(targets))
    ce.backward()
    state = {"logits": out.logits.detach(), "loss.ce": ce.detach()}
    for n, p in m.named_parameters():
        n = n.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
        state["grad." + n] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
    return state


def test_ref_matches_transformers_flex_olmo():
    cfg = FLEX_OLMO
    params = ref_model.random_params(cfg, seed=1234, std=0.08)
    assert "model.layers.0.post_feedforward_layernorm.weight" in params
    assert "model.layers.0.input_layernorm.weight" not in params
    x, y = batch(cfg, seed=7)
    ref, routings = ref_model.debug_state(params, cfg, x, y)
    for r in routings:
        assert r.margin() > 1e-5, f"layer {r.layer}: routing near-tie ({r.margin():.2e}); pick another seed"
    m = H.hf_model(cfg, params)
    assert type(m).__name__ == "FlexOlmoForCausalLM"
    hf = H.hf_debug_state(m, cfg, x, y)
    names = H.state_names(cfg)
    names.remove("loss.z")
    assert {n for n in hf if n.startswith("grad.")} == {n for n in names if n.startswith("grad.")}
    H.assert_all_close(ref, hf, names, tol=REF_TOL, what="ref vs transformers [flex_olmo]")
    # The layout matters: the pre-norm model on the same weights (renamed) computes other logits.
    pre = dict(OLMOE)
    renamed = {k.replace("post_attention_layernorm", "input_layernorm")
               .replace("post_feedforward_layernorm", "post_attention_layernorm"): v for k, v in params.items()}
    other, _ = ref_model.debug_state(renamed, pre, x, y)
    assert H.rel_err(other["logits"], ref["logits"]) > 1e-2


def dots1_params(cfg, seed):
    params = ref_model.random_params(cfg, seed=seed, std=0.08)
    g = torch.Generator().manual_seed(seed + 1)
    for name in params:
        if name.endswith("e_score_correction_bias"):  # large enough to change choices
            params[name] = 0.1 * torch.randn(params[name].shape, generator=g)
    return params


def test_ref_matches_transformers_dots1_grouped_biased_scaled():
    cfg = DOTS1
    params = dots1_params(cfg, seed=31)
    x, y = batch(cfg, seed=8)
    ref, routings = ref_model.debug_state(params, cfg, x, y)
    m = H.hf_model(cfg, params, arch="dots1")
    assert type(m).__name__ == "Dots1ForCausalLM"
    for layer in range(1, cfg["num_hidden_layers"]):
        hf_bias = m.model.layers[layer].mlp.gate.e_score_correction_bias
        assert torch.equal(hf_bias, params[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"])
    hf = dots1_debug_state(m, x, y)
    names = ["logits", "loss.ce"] + sorted(n for n in hf if n.startswith("grad."))
    H.assert_all_close(ref, hf, names, tol=REF_TOL, what="ref vs transformers [dots1]")
    # Every option changes the routing on this batch: the comparison proves each of them.
    for option, value in (("n_group", 1), ("router_bias_update_rate", 0.0)):
        plain = dict(cfg, **{option: value}, **({"topk_group": 1} if option == "n_group" else {}))
        p = {k: v for k, v in params.items() if option != "router_bias_update_rate" or "e_score" not in k}
        _, other = ref_model.debug_state(p, plain, x, y)
        assert any(not torch.equal(a.selected, b.selected) for a, b in zip(routings, other)), option
    # Positive selection scores: transformers' 0.0 for excluded experts and moecore's exclusion agree.
    for r in routings:
        bias = params[f"model.layers.{r.layer}.mlp.gate.e_score_correction_bias"]
        assert float((r.scores.detach() + bias).min()) > 0


def test_ref_router_matches_deepseek_v3_topk_router():
    """ref_model's router (the one moecore is checked against) equals transformers'
    DeepseekV3TopkRouter itself: sigmoid, e_score_correction_bias, 8 groups keep 3, renormalised
    weights x routed_scaling_factor (Dots1's router, used in the model-level tests, is the same code)."""
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    E, k, d = 32, 4, 16
    config = DeepseekV3Config(hidden_size=d, n_routed_experts=E, num_experts_per_tok=k, n_group=8,
                              topk_group=3, norm_topk_prob=True, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(config)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, d, generator=g) * 0.3)
        router.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.05)
    x = torch.randn(64, d, generator=g)
    idx, weights = router(x)
    cfg = ref_model.full_config(dict(hidden_size=d, num_experts=E, num_experts_per_tok=k, n_group=8,
                                     topk_group=3, router_score="sigmoid", norm_topk_prob=True,
                                     routed_scaling_factor=2.5, router_bias_update_rate=1e-3))
    P = {"mlp.gate.weight": router.weight.detach(), "mlp.gate.e_score_correction_bias":
         router.e_score_correction_bias.detach()}
    # The expert computation is irrelevant here: zero experts, compare the routing only.
    for e in range(E):
        for p, shape in (("gate_proj", (1, d)), ("up_proj", (1, d)), ("down_proj", (d, 1))):
            P[f"mlp.experts.{e}.{p}.weight"] = torch.zeros(shape)
    _, r = ref_model.moe(x, P, "mlp.", cfg, 0)
    order = torch.argsort(idx, dim=-1)  # transformers returns the k experts unsorted
    ours = torch.argsort(r.selected, dim=-1)
    assert torch.equal(idx.gather(-1, order), r.selected.gather(-1, ours))
    assert torch.allclose(weights.gather(-1, order), r.weights.gather(-1, ours), rtol=1e-6, atol=1e-7)
    # The bias and the group limit both changed choices here (the comparison is not vacuous).
    plain = ref_model.select_experts(r.scores, dict(cfg, n_group=1, topk_group=1), None)
    assert not torch.equal(plain.sort(-1).values, r.selected.sort(-1).values)
