"""A small, readable pure-PyTorch reference of moecore's model family and losses.

It is the oracle for every variant that no transformers class covers (shared expert, sigmoid router,
dense first layers, OLMo-core load-balancing style, router z-loss, tied embeddings, no QK-norm) and is
itself checked against transformers on the shared subset (test_ref_vs_transformers.py).

Everything is float32 and written for clarity, not speed; with precision="bf16" every matmul
except the router's rounds its operands to bf16 (forward and backward, as moecore's bf16 GEMMs do)
and multiplies them in float32, and the attention core is FlashAttention's (_Bf16FlashAttention: the
softmax's backward takes its row term from the output, as moecore's flash kernels do). `forward` takes a dict of Hugging Face named
tensors (leaves with requires_grad=True if gradients are wanted) and the [model] config dict; the
gradients come from autograd on `out.total`.

Semantics (see ../shared/DESIGN.md and issues 2 and 12):
  embedding -> L x [x += o_proj(attn(RoPE(qknorm(q, k)), v)) on RMSNorm(x); x += FFN(RMSNorm(x))]
  -> RMSNorm -> lm_head (block_norm "pre"); block_norm "reordered" (OLMo-2, HF FlexOlmo) instead
  x += RMSNorm(attn(x)); x += RMSNorm(FFN(x)).
  QK-norm before RoPE: "full" normalises the whole q [nh*hd] / k [nkv*hd] projection (OLMoE),
  "per_head" each head's hd values (Qwen3), "none" skips it.
  MoE: fp32 router logits, softmax or sigmoid (+ 1e-7, OLMo-core's sigmoid_stability_epsilon)
  scores, top-k by score (topk_softmax: by logit, as OLMo-core; + the selection bias
  e_score_correction_bias; group-limited when n_group > 1) with ties going to the LOWER expert
  index, weights = the k selected scores (renormalised if norm_topk_prob; topk_softmax: the softmax
  over the k selected logits) times routed_scaling_factor, plus an always-on, unweighted shared
  expert. The olmo-core lb of a sigmoid router renormalises each token's scores; loss_normalizer
  "labels" divides lb's f_e and the z-loss by the counted labels instead of the tokens.
  Losses: ce (mean over targets != -100, no shift), lb (olmo-core or hf style), z (router z-loss),
  total = ce + router_aux_loss_coef * lb + router_z_loss_coef * z.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class _Bf16Matmul(torch.autograd.Function):
    """a @ b with both operands rounded to bf16 (round to nearest even) and float32 products and sums,
    in the backward too: grad_a = bf16(g) @ bf16(b)^T, grad_b = bf16(a)^T @ bf16(g). These are the
    GEMMs moecore runs in train.precision = "bf16" (a product of two bf16 values is exact in fp32)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _bf16(a) @ _bf16(b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        grad_a = _bf16(g) @ _bf16(b).transpose(-1, -2)
        if b.dim() == 2 and a.dim() > 2:  # a weight shared by every row of a batch: one [K, N] GEMM
            grad_b = _bf16(a).reshape(-1, a.shape[-1]).T @ _bf16(g).reshape(-1, g.shape[-1])
        else:
            grad_b = _bf16(a).transpose(-1, -2) @ _bf16(g)
        return grad_a, grad_b


class _Bf16FlashAttention(torch.autograd.Function):
    """softmax(scale q k^T, masked) v as moecore's attention computes it in bf16 precision: the
    FlashAttention algorithm (Dao 2023), with _Bf16Matmul's operand rounding in every GEMM.
    Forward: S = scale bf16(q) bf16(k)^T, P = softmax(S) in float32, out = bf16(P) bf16(v).
    Backward: dP = bf16(dout) bf16(v)^T, dS = P (dP - D), dq = scale bf16(dS) bf16(k),
    dk = scale bf16(dS)^T bf16(q), dv = bf16(P)^T bf16(dout), where the row term is
    D = rowsum(dout * out), from the output (FlashAttention-2's; moecore sums it in double). Autograd
    through softmax would take D = rowsum(dP * P) from the float32 probabilities instead: the same
    in exact arithmetic, but out was made from the bf16-rounded P, so in bf16 the two differ by that
    rounding, and moecore's kernels (which keep no P to take it from) compute the first.
    q: [B, nh, T, hd]; k, v: [B, nh, T, hd] (kv heads repeated); allowed: broadcastable to
    [B, nh, T, T] bool."""

    @staticmethod
    def forward(ctx, q, k, v, allowed, scale):
        scores = (_bf16(q) @ _bf16(k).transpose(-1, -2)) * scale
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = _bf16(probs) @ _bf16(v)
        ctx.save_for_backward(q, k, v, probs, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, probs, out = ctx.saved_tensors
        dp = _bf16(dout) @ _bf16(v).transpose(-1, -2)
        row = (dout.double() * out.double()).sum(-1, keepdim=True).float()
        ds = probs * (dp - row)
        dq = (_bf16(ds) @ _bf16(k)) * ctx.scale
        dk = (_bf16(ds).transpose(-1, -2) @ _bf16(q)) * ctx.scale
        dv = _bf16(probs).transpose(-1, -2) @ _bf16(dout)
        return dq, dk, dv, None, None


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def matmul_for(precision: str):
    """The matmul of the model's GEMMs (not the router's, which is always float32)."""
    if precision == "fp32":
        return torch.matmul
    if precision == "bf16":
        return _Bf16Matmul.apply
    raise ValueError(f"precision {precision!r} is not fp32 or bf16")

# Defaults of the [model] table (they mirror src/model/config.h); tests write every key explicitly.
MODEL_DEFAULTS = {
    "vocab_size": 256,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 0,  # 0 or absent: hidden_size // num_attention_heads
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "intermediate_size": 512,
    "first_k_dense_replace": 0,
    "shared_expert_intermediate_size": 0,
    "norm_topk_prob": False,
    "router_aux_loss_coef": 0.01,
    "router_z_loss_coef": 0.0,
    "qk_norm": "full",
    "router_score": "softmax",
    "lb_loss_style": "olmo-core",
    # Over which ranks the load-balancing loss is (one process, this reference: the same loss).
    "lb_loss_scope": "global",
    # Which tokens each load-balancing term is over: the batch's together, or each instance's.
    "lb_loss_granularity": "local_batch",
    "block_norm": "pre",
    "loss_normalizer": "tokens",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "router_bias_update_rate": 0.0,
}


def full_config(cfg: dict) -> dict:
    """The [model] dict with defaults filled in and head_dim resolved."""
    unknown = set(cfg) - set(MODEL_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown [model] keys: {sorted(unknown)}")
    c = {**MODEL_DEFAULTS, **cfg}
    if not c.get("head_dim"):
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    assert c["qk_norm"] in ("none", "full", "per_head"), c["qk_norm"]
    assert c["router_score"] in ("softmax", "sigmoid", "topk_softmax"), c["router_score"]
    assert c["lb_loss_style"] in ("olmo-core", "hf"), c["lb_loss_style"]
    assert c["block_norm"] in ("pre", "reordered"), c["block_norm"]
    assert c["loss_normalizer"] in ("tokens", "labels"), c["loss_normalizer"]
    assert c["lb_loss_scope"] in ("global", "rank"), c["lb_loss_scope"]
    assert c["lb_loss_granularity"] in ("local_batch", "instance"), c["lb_loss_granularity"]
    assert c["num_experts"] % c["n_group"] == 0 and 1 <= c["topk_group"] <= c["n_group"]
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    assert 1 <= c["num_experts_per_tok"] <= c["num_experts"]
    return c


def is_dense_layer(cfg: dict, layer: int) -> bool:
    return layer < cfg["first_k_dense_replace"]


def param_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter name (HF naming) and its shape, in a fixed order."""
    c = full_config(cfg)
    d, hd, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    V, E, H, I, Hs = (c["vocab_size"], c["num_experts"], c["moe_intermediate_size"],
                      c["intermediate_size"], c["shared_expert_intermediate_size"])
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "self_attn.q_proj.weight"] = (nh * hd, d)
        s[p + "self_attn.k_proj.weight"] = (nkv * hd, d)
        s[p + "self_attn.v_proj.weight"] = (nkv * hd, d)
        s[p + "self_attn.o_proj.weight"] = (d, nh * hd)
        if c["qk_norm"] == "full":
            s[p + "self_attn.q_norm.weight"] = (nh * hd,)
            s[p + "self_attn.k_norm.weight"] = (nkv * hd,)
        elif c["qk_norm"] == "per_head":
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        if c["block_norm"] == "pre":
            s[p + "input_layernorm.weight"] = (d,)
            s[p + "post_attention_layernorm.weight"] = (d,)
        else:  # OLMo-2 / FlexOlmo names: the norms follow attention and the FFN
            s[p + "post_attention_layernorm.weight"] = (d,)
            s[p + "post_feedforward_layernorm.weight"] = (d,)
        if is_dense_layer(c, i):
            s[p + "mlp.gate_proj.weight"] = (I, d)
            s[p + "mlp.up_proj.weight"] = (I, d)
            s[p + "mlp.down_proj.weight"] = (d, I)
        else:
            s[p + "mlp.gate.weight"] = (E, d)
            if c["router_bias_update_rate"] > 0:  # DeepSeek-V3's name for the selection bias
                s[p + "mlp.gate.e_score_correction_bias"] = (E,)
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (H, d)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (H, d)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (d, H)
            if Hs > 0:
                s[p + "mlp.shared_expert.gate_proj.weight"] = (Hs, d)
                s[p + "mlp.shared_expert.up_proj.weight"] = (Hs, d)
                s[p + "mlp.shared_expert.down_proj.weight"] = (d, Hs)
    s["model.norm.weight"] = (d,)
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, d)
    return s


def random_params(cfg: dict, seed: int, std: float = 0.02, norm_jitter: float = 0.1) -> dict[str, torch.Tensor]:
    """Random float32 weights: matrices ~ N(0, std), norm gains ~ 1 + N(0, norm_jitter).

    Norm gains are deliberately not all ones so that their gradients and their effect are tested.
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("e_score_correction_bias"):  # a selection bias, not a gain
            out[name] = 0.05 * torch.randn(shape, generator=g, dtype=torch.float32)
        elif len(shape) == 1:
            out[name] = 1.0 + norm_jitter * torch.randn(shape, generator=g, dtype=torch.float32)
        else:
            out[name] = std * torch.randn(shape, generator=g, dtype=torch.float32)
    return out


# ----------------------------------------------------------------------------------------------
# Layers


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: x * rsqrt(mean(x^2) + eps) * w over the last dimension."""
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rope_cos_sin(T: int, hd: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF default RoPE tables [T, hd] (rotate_half layout: the two halves share frequencies)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.arange(T, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def document_mask(tokens, eos_id: int) -> torch.Tensor:
    """[B, T] tokens -> [B, T, T] bool, True where query i may attend to key j: j <= i and both in
    the same document, documents ending at (and including) each EOS, as OLMo-core's
    get_document_lengths cuts them. A block-diagonal causal mask."""
    tokens = torch.as_tensor(tokens).long()
    B, T = tokens.shape
    is_eos = (tokens == eos_id).long()
    # Document index of each token: the number of EOS strictly before it.
    doc = torch.cumsum(is_eos, dim=1) - is_eos
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return same & causal


def attention(x: torch.Tensor, P: dict, pre: str, c: dict, mm=torch.matmul,
              allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Causal GQA self-attention with optional QK-norm before RoPE. x: [B, T, d] -> [B, T, d].
    allowed: [B, T, T] bool (document_mask) instead of the plain causal mask."""
    B, T, _ = x.shape
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    q = mm(x, P[pre + "q_proj.weight"].T)  # [B, T, nh*hd]
    k = mm(x, P[pre + "k_proj.weight"].T)  # [B, T, nkv*hd]
    v = mm(x, P[pre + "v_proj.weight"].T)
    if c["qk_norm"] == "full":  # OLMoE: over the whole projection
        q = rms_norm(q, P[pre + "q_norm.weight"], eps)
        k = rms_norm(k, P[pre + "k_norm.weight"], eps)
    q = q.view(B, T, nh, hd)
    k = k.view(B, T, nkv, hd)
    v = v.view(B, T, nkv, hd)
    if c["qk_norm"] == "per_head":  # Qwen3: over each head's hd values
        q = rms_norm(q, P[pre + "q_norm.weight"], eps)
        k = rms_norm(k, P[pre + "k_norm.weight"], eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
    cos, sin = rope_cos_sin(T, hd, c["rope_theta"])
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    group = nh // nkv  # query head h uses kv head h // group
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    causal = torch.ones(T, T, dtype=torch.bool).tril() if allowed is None else allowed[:, None]
    if mm == _Bf16Matmul.apply:
        out = _Bf16FlashAttention.apply(q, k, v, causal, 1.0 / math.sqrt(hd))
    else:
        scores = mm(q, k.transpose(-1, -2)) / math.sqrt(hd)  # [B, nh, T, T]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = mm(probs, v)
    out = out.transpose(1, 2).reshape(B, T, nh * hd)
    return mm(out, P[pre + "o_proj.weight"].T)


def swiglu(x: torch.Tensor, P: dict, pre: str, mm=torch.matmul) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) with weights pre + {gate,up,down}_proj.weight."""
    act = F.silu(mm(x, P[pre + "gate_proj.weight"].T)) * mm(x, P[pre + "up_proj.weight"].T)
    return mm(act, P[pre + "down_proj.weight"].T)


def topk_lower_index_wins(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; among equal scores the lower expert index comes first.

    A stable descending sort keeps equal elements in index order, so this is the documented tie rule
    by construction (torch.topk gives no such guarantee).
    """
    order = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices
    selected = order[..., :k]
    return scores.gather(-1, selected), selected


@dataclass
class Routing:
    """What one MoE layer decided; kept for the losses and for tests that inspect routing."""

    layer: int
    inputs: torch.Tensor  # [N, d] the normalised hidden states fed to the router
    logits: torch.Tensor  # [N, E] fp32
    scores: torch.Tensor  # [N, E] softmax or sigmoid of logits
    selected: torch.Tensor  # [N, k] expert indices, best first
    weights: torch.Tensor  # [N, k] combine weights
    counts: torch.Tensor  # [E] number of (token, slot) routes per expert

    def margin(self) -> float:
        """Smallest gap between the k-th and the (k+1)-th score over tokens (inf when k == E).

        A tiny margin means a float rounding difference could flip the routing of a token.
        """
        E, k = self.scores.shape[-1], self.selected.shape[-1]
        if k == E:
            return float("inf")
        s = torch.sort(self.scores.detach(), dim=-1, descending=True).values
        return float((s[:, k - 1] - s[:, k]).min())


# OLMo-core's v2 router adds it to sigmoid scores (sigmoid_stability_epsilon): all-underflowing
# logits still give scores with a non-zero sum.
SIGMOID_SCORE_EPSILON = 1e-7


def select_experts(scores: torch.Tensor, c: dict, bias: torch.Tensor | None) -> torch.Tensor:
    """[N, k] experts chosen by the selection scores (scores, or topk_softmax's logits, + bias), best first, ties to the lower
    index; group-limited (DeepSeek-V3) when n_group > 1: a group's score is the sum of its two best
    selection scores, the topk_group best groups are kept (ties to the lower group) and the k experts
    come from them only (the others are excluded, as in DeepSeek's and Megatron's code)."""
    E, k, G = c["num_experts"], c["num_experts_per_tok"], c["n_group"]
    q = scores.detach() + (bias.detach() if bias is not None else 0.0)
    if G > 1:
        per = E // G
        grouped = q.view(-1, G, per)
        top2 = torch.sort(grouped, dim=-1, descending=True).values[..., : min(2, per)]
        group_scores = top2[..., 0] + top2[..., 1] if per > 1 else top2[..., 0]
        _, kept = topk_lower_index_wins(group_scores, c["topk_group"])
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, kept, True)
        mask = mask.unsqueeze(-1).expand(-1, G, per).reshape(-1, E)
        q = q.masked_fill(~mask, float("-inf"))
    _, selected = topk_lower_index_wins(q, k)
    return selected


def moe(x: torch.Tensor, P: dict, pre: str, c: dict, layer: int, mm=torch.matmul) -> tuple[torch.Tensor, Routing]:
    """Token-choice top-k MoE, dropless. x: [N, d] -> [N, d]."""
    E, k = c["num_experts"], c["num_experts_per_tok"]
    logits = x.float() @ P[pre + "gate.weight"].float().T  # [N, E] fp32
    scores = (torch.sigmoid(logits) + SIGMOID_SCORE_EPSILON if c["router_score"] == "sigmoid"
              else torch.softmax(logits, dim=-1))
    # topk_softmax ranks the logits (OLMo-core's selection_logits), the others the scores.
    keys = logits if c["router_score"] == "topk_softmax" else scores
    selected = select_experts(keys, c, P.get(pre + "gate.e_score_correction_bias"))
    if c["router_score"] == "topk_softmax":  # softmax over the selected logits
        weights = torch.softmax(logits.gather(-1, selected), dim=-1)
    else:
        weights = scores.gather(-1, selected)
        if c["norm_topk_prob"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * c["routed_scaling_factor"]
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.where(selected == e)
        if tok.numel() == 0:
            continue  # an expert with no tokens contributes nothing (and gets a zero gradient)
        y = swiglu(x[tok], P, pre + f"experts.{e}.", mm)
        out = out.index_add(0, tok, y * weights[tok, slot, None])
    if c["shared_expert_intermediate_size"] > 0:
        out = out + swiglu(x, P, pre + "shared_expert.", mm)
    counts = torch.bincount(selected.reshape(-1), minlength=E)
    return out, Routing(layer, x, logits, scores, selected, weights, counts)


# ----------------------------------------------------------------------------------------------
# Losses


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean CE over targets != -100 (no shift); 0 with a zero gradient when every target is ignored."""
    V = logits.shape[-1]
    t = targets.reshape(-1).long()
    n = int((t != IGNORE_INDEX).sum())
    total = F.cross_entropy(logits.reshape(-1, V).float(), t, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / max(n, 1)


def lb_loss_olmo_core(routings: list[Routing], c: dict, div: float | None = None,
                      instances: int = 1) -> torch.Tensor:
    """Sum over MoE layers of (E/k) * sum_e f_e * P_e; f_e = routes to e / div (no gradient), div =
    tokens (default) or counted labels (loss_normalizer "labels"), P_e = mean over all tokens of the
    router probability of e: the softmax probability, or each token's sigmoid scores divided by
    their sum (OLMo-core's MoERouter). lb_loss_granularity "instance": f_e and P_e per instance (the
    tokens come as `instances` equal rows), the instances' terms added."""
    E, k = c["num_experts"], c["num_experts_per_tok"]
    B = instances if c["lb_loss_granularity"] == "instance" else 1
    total = torch.zeros((), dtype=torch.float32)
    for r in routings:
        N = r.scores.shape[0]
        counts = torch.stack([torch.bincount(s.reshape(-1), minlength=E) for s in r.selected.reshape(B, -1)])
        f = counts.float() / (N if div is None else div)  # [B, E]
        probs = r.scores / r.scores.sum(dim=-1, keepdim=True) if c["router_score"] == "sigmoid" else r.scores
        P = probs.reshape(B, N // B, E).mean(dim=1)  # [B, E]
        total = total + (E / k) * (f * P).sum()
    return total


def lb_loss_hf(routings: list[Routing], c: dict) -> torch.Tensor:
    """transformers' load_balancing_loss_func (no attention mask) over all MoE layers' router logits
    concatenated: E * sum_e (routes to e / (tokens * layers)) * mean softmax prob of e."""
    if not routings:
        return torch.zeros((), dtype=torch.float32)
    E, k = c["num_experts"], c["num_experts_per_tok"]
    logits = torch.cat([r.logits for r in routings], dim=0)  # [L*N, E]
    probs = torch.softmax(logits, dim=-1)
    _, selected = topk_lower_index_wins(probs, k)
    tokens_per_expert = F.one_hot(selected, E).float().mean(dim=0)  # [k, E]
    router_prob_per_expert = probs.mean(dim=0)  # [E]
    return E * (tokens_per_expert * router_prob_per_expert[None, :]).sum()


def lm_head_z_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """OLMo-core's LM-head z-loss, unscaled: the mean over targets != -100 of logsumexp(logits)^2
    (0 when every target is ignored)."""
    V = logits.shape[-1]
    counted = (targets.reshape(-1) != IGNORE_INDEX).float()
    sq = torch.logsumexp(logits.reshape(-1, V).float(), dim=-1).pow(2)
    return (sq * counted).sum() / max(int(counted.sum()), 1)


def z_loss(routings: list[Routing], div: float | None = None) -> torch.Tensor:
    """Sum over MoE layers of sum over tokens of logsumexp(router logits)^2 / div (tokens by default)."""
    total = torch.zeros((), dtype=torch.float32)
    for r in routings:
        sq = torch.logsumexp(r.logits, dim=-1).pow(2)
        total = total + (sq.mean() if div is None else sq.sum() / div)
    return total


# ----------------------------------------------------------------------------------------------
# Model


@dataclass
class RefOutput:
    logits: torch.Tensor  # [B, T, V]
    ce: torch.Tensor  # scalars
    lb: torch.Tensor
    z: torch.Tensor
    total: torch.Tensor
    routings: list[Routing] = field(default_factory=list)
    lm_z: torch.Tensor = field(default_factory=lambda: torch.zeros(()))


def forward(params: dict[str, torch.Tensor], cfg: dict, tokens, targets=None, precision: str = "fp32",
            document_eos: int | None = None, z_loss_multiplier: float = 0.0) -> RefOutput:
    """One forward pass. tokens/targets: [B, T] integer arrays or tensors (targets: -100 = ignored).
    document_eos: intra-document attention masking with documents ending at this id.
    z_loss_multiplier: the LM-head z-loss's weight in the total (train.z_loss_multiplier)."""
    c = full_config(cfg)
    mm = matmul_for(precision)
    tokens = torch.as_tensor(tokens).long()
    B, T = tokens.shape
    eps = c["rms_norm_eps"]
    P = params
    x = P["model.embed_tokens.weight"][tokens]  # [B, T, d]
    routings: list[Routing] = []
    allowed = None if document_eos is None else document_mask(tokens, document_eos)
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        if c["block_norm"] == "pre":
            x = x + attention(rms_norm(x, P[pre + "input_layernorm.weight"], eps), P, pre + "self_attn.", c, mm,
                              allowed)
            h = rms_norm(x, P[pre + "post_attention_layernorm.weight"], eps)
        else:  # OLMo-2: h = x + norm(attn(x)); y = h + norm(ffn(h))
            x = x + rms_norm(attention(x, P, pre + "self_attn.", c, mm, allowed),
                             P[pre + "post_attention_layernorm.weight"], eps)
            h = x
        if is_dense_layer(c, i):
            y = swiglu(h, P, pre + "mlp.", mm)
        else:
            y, r = moe(h.reshape(B * T, -1), P, pre + "mlp.", c, i, mm)
            routings.append(r)
            y = y.view(B, T, -1)
        if c["block_norm"] == "reordered":
            y = rms_norm(y, P[pre + "post_feedforward_layernorm.weight"], eps)
        x = x + y
    x = rms_norm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if c["tie_word_embeddings"] else P["lm_head.weight"]
    logits = mm(x, head.T)

    if targets is None:
        ce = lm_z = torch.zeros((), dtype=torch.float32)
    else:
        ce = cross_entropy(logits, torch.as_tensor(targets))
        lm_z = lm_head_z_loss(logits, torch.as_tensor(targets))
    # Router losses over tokens, or over counted labels ("labels": OLMo-core's trainer; none without
    # a counted label).
    div = None
    if c["loss_normalizer"] == "labels":
        div = 0 if targets is None else int((torch.as_tensor(targets) != IGNORE_INDEX).sum())
    if div == 0:
        lb = torch.zeros((), dtype=torch.float32)
        z = torch.zeros((), dtype=torch.float32)
    else:
        lb = lb_loss_olmo_core(routings, c, div, B) if c["lb_loss_style"] == "olmo-core" else lb_loss_hf(routings, c)
        z = z_loss(routings, div)
    total = ce + c["router_aux_loss_coef"] * lb + c["router_z_loss_coef"] * z + z_loss_multiplier * lm_z
    return RefOutput(logits, ce, lb, z, total, routings, lm_z)


def debug_state(params: dict[str, torch.Tensor], cfg: dict, tokens, targets,
                precision: str = "fp32", document_eos: int | None = None,
                z_loss_multiplier: float = 0.0) -> tuple[dict[str, torch.Tensor], list[Routing]]:
    """What `moecore debug-state` writes, computed by the reference (logits, loss.*, grad.<name>),
    and the routing decisions of every MoE layer."""
    leaves = {n: t.detach().clone().float().requires_grad_(True) for n, t in params.items()}
    out = forward(leaves, cfg, tokens, targets, precision, document_eos, z_loss_multiplier)
    names = list(leaves)
    grads = torch.autograd.grad(out.total, [leaves[n] for n in names], allow_unused=True)
    state = {
        "logits": out.logits.detach(),
        "loss.ce": out.ce.detach(),
        "loss.lb": out.lb.detach(),
        "loss.z": out.z.detach(),
        "loss.lm_z": out.lm_z.detach(),
        "loss.total": out.total.detach(),
    }
    for n, g in zip(names, grads):
        state["grad." + n] = torch.zeros_like(leaves[n]) if g is None else g.detach()
    return state, out.routings


def update_router_bias(params: dict[str, torch.Tensor], routings: list[Routing], c: dict) -> None:
    """OLMo-core's auxiliary-loss-free update after an optimizer step, in place:
    bias += rate * sign(mean count - count), float32, no re-centring."""
    rate = c["router_bias_update_rate"]
    for r in routings:
        name = f"model.layers.{r.layer}.mlp.gate.e_score_correction_bias"
        counts = r.counts.float()
        delta = rate * torch.sign(counts.mean() - counts)
        params[name] = (params[name] + delta.float()).detach()
