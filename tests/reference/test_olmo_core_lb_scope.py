"""model.lb_loss_scope = "rank": OLMo-core's default load-balancing loss under data parallelism; and
model.lb_loss_granularity = "instance": its per-instance loss (the MoE-v2 Qwen / GPT-OSS presets).

OLMo-core's MoE-v2 router (global_load_balancing=False, lb_loss_granularity local_batch) weighs
each rank's own routes against that rank's mean scores, divided by the train module's
loss_div_factor (the step's counted labels over the dp size), and DDP averages the ranks'
gradients. Here OLMo-core's own model (test_olmo_core_oracle's CPU stand-ins for its GPU-only
kernels) runs each rank's micro-batches in one process with that divisor, its gradients
accumulated and divided by the ranks, as its train module and DDP do; `mpirun -np 2 moecore train`
runs one step of the same weights (`moecore init`) on the same instances (data.order =
"olmo-core": `moecore data order` says which rank reads which) with loss_normalizer = "labels".
Compared: the step's cross-entropy, load-balancing and router z-loss (moecore logs the global
values; OLMo-core's are the ranks' mean) and the pre-clip gradient norm, which the load-balancing
term's gradient moves (aux coefficient 1.0). Every micro-batch has the same label count (no ignored
targets but each instance's last), where moecore's per-micro-batch divisor equals OLMo-core's
per-step one (README: loss_normalizer). lb_loss_scope = "global" (OLMo-core's
global_load_balancing=True) is shown to give another loss and norm, so the comparison can fail.
Under lb_loss_granularity = "instance" each instance's routes weigh against its own mean scores
(OLMo-core: lb_loss_granularity=instance, which it allows only without global load balancing);
moecore gives the same under either lb_loss_scope (an instance's term does not depend on its rank),
and the rank-scope local_batch loss is shown to differ from it.

The routers' top-k margins are checked to be > 1e-5 (init_std 0.1 for that): no near-tie that
fp32 rounding could flip. Tolerance: rel 1e-5 on each value, the scalar form of moecore_harness.TOL (1e-4 on tensors): fp32
passes summed in other orders (two processes and MPI against one PyTorch process).
"""

import json
import subprocess
from pathlib import Path

import pytest
import torch

import moecore_harness as H

pytest.importorskip("olmo_core.nn.ddp.block", reason="ai2-olmo-core is not installed (requirements.txt pins it)")

from test_olmo_core_oracle import (cpu_kernels, hf_gradients, moecore_rank_instances,  # noqa: E402,F401
                                  olmo_core_model, olmo_core_state, olmo_core_train_passes,
                                  watch_routing_margins)

SEQ, BATCH, MICRO, RANKS = 12, 4, 2, 2
TOL = 1e-5
MODEL = dict(
    vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=24, intermediate_size=48, first_k_dense_replace=0,
    shared_expert_intermediate_size=0, norm_topk_prob=False, router_aux_loss_coef=1.0,
    router_z_loss_coef=0.02, qk_norm="full", router_score="softmax", lb_loss_style="olmo-core",
    loss_normalizer="labels",
)


@pytest.fixture(scope="module")
def run_dir(moecore_bin, tmp_path_factory):
    """Token files, the config and moecore's initial weights."""
    root = tmp_path_factory.mktemp("lb_scope")
    H.prepare_token_files(root, seed=3, documents=200)
    cfg = H.write_config(
        root / "run.toml", MODEL, optim={"lr": 1e-3, "warmup_steps": 0, "schedule": "constant",
                                         "max_grad_norm": 1.0},
        data={"train": [str(root / "tokens" / "train")], "order": "olmo-core"},
        train={"seq_len": SEQ, "batch_size": BATCH, "microbatches": MICRO, "max_steps": 1,
               "seed": 4, "init_seed": 0, "init_std": 0.1, "threads": 1, "log_every": 1, "eval_every": 0,
               "save_every": 0, "sample_tokens": 0})
    weights = root / "init.safetensors"
    H.run_moecore("init", "--config", cfg, "--seed", 0, "--out", weights)
    return root, cfg, weights


def moecore_step(root: Path, cfg: Path, scope: str, granularity: str = "local_batch",
                 micro: int = MICRO) -> dict:
    out = root / f"out_{scope}_{granularity}_{micro}"
    cmd = ["mpirun", "-np", str(RANKS), str(H.binary_path()), "train", str(cfg), "--set",
           f"train.out_dir={out}", "--set", f"model.lb_loss_scope={scope}", "--set",
           f"model.lb_loss_granularity={granularity}", "--set", f"train.microbatches={micro}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=H.MPI_ENV,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(row for row in rows if row.get("step") == 1 and "train/loss" in row)


def olmo_core_step(root: Path, cfg: Path, weights: Path, granularity: str = "local_batch",
                   micro: int = MICRO) -> dict:
    """OLMo-core's train module and DDP over RANKS ranks, in one process."""
    # [RANKS, BATCH / RANKS, SEQ]: each rank's instances, in order
    instances = moecore_rank_instances(cfg, root / "tokens", 1, RANKS, SEQ, MODEL["vocab_size"])[0]
    model = olmo_core_model(dict(MODEL, lb_loss_granularity=granularity), "pre")
    params = H.load_tensors(weights)
    missing, unexpected = model.load_state_dict(olmo_core_state(params, MODEL), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.train()
    margins = []
    watch_routing_margins(model, MODEL, margins)
    # The train module's loss_div_factor: the step's labels over all ranks, over the dp size.
    div = torch.tensor(float(BATCH * (SEQ - 1)) / RANKS)
    routers = [b.routed_experts_router for b in model.blocks.values()]
    ce = sum(float(out.ce_loss) for out in olmo_core_train_passes(model, instances, micro, div))
    assert min(margins) > 1e-5, f"routing near-tie: {min(margins):.2e}"
    # The routers add up their losses over the passes until their metrics are read and reset.
    lb = float(sum(r.load_balancing_loss for r in routers))
    z = float(sum(r.z_loss for r in routers))
    # DDP: the ranks' gradients averaged; the logged losses the ranks' mean.
    grads = hf_gradients(model, MODEL)
    norm = float(torch.sqrt(sum((g.double() / RANKS).pow(2).sum() for g in grads.values())))
    return {"train/ce": ce / RANKS, "train/lb": lb / RANKS, "train/z": z / RANKS,
            "train/grad_norm": norm}


def test_rank_scope_is_olmo_core_default(run_dir, cpu_kernels):
    root, cfg, weights = run_dir
    ref = olmo_core_step(root, cfg, weights)
    ours = moecore_step(root, cfg, "rank")
    for key, value in ref.items():
        assert ours[key] == pytest.approx(value, rel=TOL), (key, ours[key], value)
    # The global form is another loss and another gradient: the comparison can fail.
    other = moecore_step(root, cfg, "global")
    assert other["train/ce"] == pytest.approx(ref["train/ce"], rel=TOL)
    for key in ("train/lb", "train/grad_norm"):
        assert abs(other[key] - ref[key]) > 10 * TOL * abs(ref[key]), (key, other[key], ref[key])


def test_instance_granularity_is_olmo_core(run_dir, cpu_kernels):
    root, cfg, weights = run_dir
    # One micro-batch per step: each rank's holds two instances, whose terms per instance differ
    # from the micro-batch's.
    ref = olmo_core_step(root, cfg, weights, "instance", micro=1)
    for scope in ("rank", "global"):
        ours = moecore_step(root, cfg, scope, "instance", micro=1)
        for key, value in ref.items():
            assert ours[key] == pytest.approx(value, rel=TOL), (scope, key, ours[key], value)
    batch = moecore_step(root, cfg, "rank", micro=1)
    for key in ("train/lb", "train/grad_norm"):
        assert abs(batch[key] - ref[key]) > 10 * TOL * abs(ref[key]), (key, batch[key], ref[key])


def test_rank_scope_needs_the_olmo_core_form(run_dir):
    root, cfg, _ = run_dir
    r = H.run_moecore_raw("train", cfg, "--set", "model.lb_loss_scope=rank", "--set",
                          "model.lb_loss_style=hf", "--set", "model.loss_normalizer=tokens",
                          "--set", f"train.out_dir={root / 'bad'}")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'lb_loss_scope="rank" needs model.lb_loss_style="olmo-core"' in lines[0], r.stderr
    r = H.run_moecore_raw("train", cfg, "--set", "model.lb_loss_granularity=instance", "--set",
                          "model.lb_loss_style=hf", "--set", "model.loss_normalizer=tokens",
                          "--set", f"train.out_dir={root / 'bad_instance'}")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'lb_loss_granularity="instance" needs model.lb_loss_style="olmo-core"' in lines[0], \
        r.stderr
