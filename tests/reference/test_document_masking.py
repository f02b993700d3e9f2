"""Intra-document attention masking (`data.document_masking`, issue 12 item 6) against PyTorch.

Documents are joined by EOS and cut into instances regardless of their boundaries; with masking a
token attends only to earlier tokens of its own document (OLMo-core: NumpyFSLDataset's
generate_doc_lengths -> cu_doc_lens -> varlen attention). The oracles apply a block-diagonal causal
mask to plain PyTorch attention:
- ref_model.py (shared expert, sigmoid router, dense first layer, GQA: every engine variant),
- transformers' OlmoeForCausalLM / Qwen3MoeForCausalLM given the same mask as a 4-D additive
  attention mask (eager attention uses it as given).
Compared tensor by tensor: logits, every loss part and every parameter gradient at
max|ours - ref| / max|ref| <= 1e-4 (moecore_harness.TOL).
"""

import numpy as np
import pytest
import torch

import moecore_harness as H
import ref_model
from test_engine_parity import BASE
from test_ref_vs_transformers import OLMOE, QWEN3

B, T = 2, 24
EOS = 3

VARIANTS = {
    "olmo_core_lb": dict(BASE),
    "shared_dense_first_sigmoid_gqa": dict(BASE, num_hidden_layers=3, first_k_dense_replace=1,
                                           shared_expert_intermediate_size=16,
                                           router_score="sigmoid", norm_topk_prob=True,
                                           router_z_loss_coef=0.01, qk_norm="per_head",
                                           num_key_value_heads=2, tie_word_embeddings=True),
    "reordered": dict(BASE, block_norm="reordered"),
}


def packed_batch(cfg, seed, ignore_frac=0.1):
    """Tokens with EOS inside both rows (documents of several lengths, one of length 1, a row
    ending in EOS), targets shifted as the data loader makes them."""
    rng = np.random.default_rng(seed)
    x = rng.integers(4, cfg["vocab_size"], size=(B, T))
    x[0, [4, 5, 13]] = EOS  # documents of 5, 1, 8 and 10 tokens
    x[1, [0, 9, T - 1]] = EOS  # 1, 9, 14
    y = np.full((B, T), ref_model.IGNORE_INDEX, dtype=np.int64)
    y[:, :-1] = x[:, 1:]
    y[rng.random((B, T)) < ignore_frac] = ref_model.IGNORE_INDEX
    return x, y


def masking_data(eos=EOS):
    return {"document_masking": True, "eos_id": eos}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_engine_matches_masked_reference(moecore_bin, tmp_path, variant):
    cfg = VARIANTS[variant]
    params = ref_model.random_params(cfg, seed=4321, std=0.08)
    x, y = packed_batch(cfg, seed=11)
    ref, routings = ref_model.debug_state(params, cfg, x, y, document_eos=EOS)
    for r in routings:
        assert r.margin() > 1e-5, f"layer {r.layer}: routing near-tie ({r.margin():.2e}); pick another seed"
    ours = H.moecore_debug_state(tmp_path, cfg, params, x, y, data=masking_data())
    H.assert_all_close(ours, ref, H.state_names(cfg), what=f"engine vs masked reference [{variant}]")

    # The mask matters: the unmasked reference is far from the engine's masked logits, and the
    # engine without masking matches the unmasked reference (same weights and batch).
    plain, _ = ref_model.debug_state(params, cfg, x, y)
    assert H.rel_err(ours["logits"], plain["logits"]) > 1e-2
    unmasked = H.moecore_debug_state(tmp_path, cfg, params, x, y, name="plain")
    H.assert_all_close(unmasked, plain, H.state_names(cfg), what=f"engine without masking [{variant}]")


@pytest.mark.parametrize("case,cfg", [("olmoe", OLMOE), ("qwen3_moe", QWEN3)])
def test_engine_matches_transformers_with_block_diagonal_mask(moecore_bin, tmp_path, case, cfg):
    params = ref_model.random_params(cfg, seed=99, std=0.08)
    x, y = packed_batch(cfg, seed=5)
    allowed = ref_model.document_mask(x, EOS)  # [B, T, T]
    additive = torch.zeros(B, 1, T, T).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    m = H.hf_model(cfg, params)
    hf = H.hf_debug_state(m, cfg, x, y, attention_mask=additive)
    ours = H.moecore_debug_state(tmp_path, cfg, params, x, y, data=masking_data())
    names = H.state_names(cfg)
    names.remove("loss.z")  # HF has no router z-loss (its coefficient is 0 here)
    H.assert_all_close(ours, hf, names, what=f"engine vs transformers with document mask [{case}]")


def test_mask_follows_olmo_core_document_lengths():
    """ref_model.document_mask cuts documents where OLMo-core's get_document_lengths does (skipped
    without ai2-olmo-core in the environment: tests/reference/requirements.txt pins it)."""
    utils = pytest.importorskip("olmo_core.data.utils", reason="ai2-olmo-core is not installed")
    x, _ = packed_batch(dict(vocab_size=96), seed=3)
    for row in x:
        lengths = utils.get_document_lengths(torch.as_tensor(row), EOS).tolist()
        block = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool).tril() for n in lengths])
        assert torch.equal(ref_model.document_mask(row[None], EOS)[0], block), lengths


def test_engine_with_a_bos_id_matches_transformers_with_olmo_core_documents(moecore_bin, tmp_path):
    """data.bos_id (OLMo-core's bos_token_id): a document ends only at an EOS that a BOS follows.
    The batch has such ends, a stray EOS inside a document and an EOS ending a row; the mask comes
    from OLMo-core's get_document_lengths with the BOS, and the engine matches transformers under
    it (skipped without ai2-olmo-core)."""
    utils = pytest.importorskip("olmo_core.data.utils", reason="ai2-olmo-core is not installed")
    bos = 2
    cfg = OLMOE
    params = ref_model.random_params(cfg, seed=99, std=0.08)
    x, y = packed_batch(cfg, seed=5)
    x[0, [0, 6, 14]] = bos  # EOS at 5 and 13 followed by BOS: ends; EOS at 4 is not
    x[1, [1, 10]] = bos  # EOS at 0 and 9 end documents, the row's last EOS does not
    y[:, :-1] = x[:, 1:]
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        lengths = utils.get_document_lengths(torch.as_tensor(x[b]), EOS, bos).tolist()
        assert len(lengths) == 3, lengths
        allowed[b] = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool).tril() for n in lengths])
    additive = torch.zeros(B, 1, T, T).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    hf = H.hf_debug_state(H.hf_model(cfg, params), cfg, x, y, attention_mask=additive)
    ours = H.moecore_debug_state(tmp_path, cfg, params, x, y, data=dict(masking_data(), bos_id=bos))
    names = H.state_names(cfg)
    names.remove("loss.z")  # HF has no router z-loss (its coefficient is 0 here)
    H.assert_all_close(ours, hf, names, what="engine vs transformers with OLMo-core's BOS documents")
    every_eos = H.moecore_debug_state(tmp_path, cfg, params, x, y, data=masking_data(), name="eos")
    assert H.rel_err(every_eos["logits"], ours["logits"]) > 1e-3, "the BOS rule changed nothing"


def test_document_masking_needs_eos_in_debug_config(moecore_bin, tmp_path):
    cfg = dict(BASE)
    params = ref_model.random_params(cfg, seed=1, std=0.08)
    x, y = packed_batch(cfg, seed=1)
    with pytest.raises(AssertionError, match="data.eos_id"):
        H.moecore_debug_state(tmp_path, cfg, params, x, y, data={"document_masking": True})


@pytest.mark.parametrize("case,cfg", [("olmoe", OLMOE), ("qwen3_moe", QWEN3)])
def test_masked_reference_matches_transformers(case, cfg):
    """The oracle itself: ref_model's masked attention equals transformers' with the same mask
    (no C++ binary needed)."""
    params = ref_model.random_params(cfg, seed=99, std=0.08)
    x, y = packed_batch(cfg, seed=5)
    allowed = ref_model.document_mask(x, EOS)
    additive = torch.zeros(B, 1, T, T).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    hf = H.hf_debug_state(H.hf_model(cfg, params), cfg, x, y, attention_mask=additive)
    ref, _ = ref_model.debug_state(params, cfg, x, y, document_eos=EOS)
    names = H.state_names(cfg)
    names.remove("loss.z")
    H.assert_all_close(ref, hf, names, tol=1e-5, what=f"masked ref vs transformers [{case}]")
