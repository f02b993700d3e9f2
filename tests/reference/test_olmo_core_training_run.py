"""A whole training run against OLMo-core's: `mpirun -np 2 moecore train` set up as an OLMo-core
OLMoDDP run, step by step against OLMo-core's own pieces emulating that run in one process.

The OLMo-core side (OLMo-core's code wherever it has the piece):
- data: OLMo-core's loader order (`data.order = "olmo-core"`; test_olmo_core_data_order holds
  `moecore data order` to its NumpyFSLDataLoader), each rank's batch cut into micro-batches in order;
- model: OLMo-core's OLMoDDP model (test_olmo_core_oracle's CPU stand-ins for its GPU-only
  kernels), reordered norms, a shared expert, grouped-query attention, router z-loss, its LM
  head's z-loss (z_loss_multiplier), from `moecore init`'s weights;
- loss: as its train module: every micro-batch's loss summed with loss_div_factor = the step's
  labels / dp size, its routers' losses per rank (global_load_balancing False:
  `model.lb_loss_scope = "rank"`), gradients accumulated, then DDP's mean over the ranks;
- optimizer: clip_grad_norm_ over all parameters, torch's AdamW with OLMo-core's recipes' groups
  (no weight decay on the embedding: `optim.no_decay = "embeddings"`), its CosWithWarmup at step
  s + 1 (test_adamw_steps).
- instance filter (two more runs, one melting): a corpus with repeated words, OLMo-core's
  NumpyFSLDataset with its instance_filter_config gives each instance read its instance_mask
  (which the warm-up's melt_batch repeats for every row), get_labels masks those instances'
  labels, and the loss's division counts them anyway as its OLMoDDP train module does
  (batch_num_tokens_for_loss += masked instances x (row length - 1), over dp), with the
  warm-up too (OLMo-core runs its warm-up only with TransformerTrainModule, whose count differs
  under the filter: README); train/masked_instances
  against its "train/masked instances (%)" (the ranks' mean of the masked share).
- sequence-length warm-up (three more runs): OLMo-core's SequenceLengthSchedulerCallback itself
  (on a stand-in trainer: its data loader, dataset and train module mocks of their classes)
  cuts each rank's batch in its pre_step before an update of the warm-up and sets its train
  module's rank_microbatch_size, at which the train module's split_batch makes the micro-batches
  (its post_train_batch restores the size). OLMo-core refuses the callback with its OLMoDDP and
  pipeline train modules, whose runs this emulates: the cut and split are the
  TransformerTrainModule's, applied to this run.
- optimizer groups (one more run): OLMo-core's AdamWConfig with group_overrides builds the
  optimizer's groups from its own globs (its build_groups: fnmatch over its parameter names) and
  sets each group's initial_lr; its scheduler gives each group its rate at that initial_lr.
  moecore is given the same overrides (`[[optim.group_overrides]]`), one of them by moecore's
  (Hugging Face) names, and its per-group rates (train/lr_override{k}) are compared as well.
Compared, per step: the cross-entropy, load-balancing, router z and LM-head z losses, the pre-clip
gradient norm and the learning rate; after the last step every weight of the final checkpoint.

Tolerance: max|ours - ref| / max|ref| <= moecore_harness.TOL (1e-4) per quantity; Adam's
lr * sign(g)-like first steps are why eps = 1e-5 and lr = 5e-3 (test_adamw_steps' derivation: an
element whose gradient is about eps would otherwise turn fp32 rounding into visible weight
differences). The routers' top-k margins along OLMo-core's trajectory are checked to be > 1e-5
(a near-tie would make the comparison ill-posed, not the engine wrong).
"""

import json
import subprocess
from unittest import mock

import numpy as np
from pathlib import Path

import pytest
import torch

import moecore_harness as H

pytest.importorskip("olmo_core.nn.ddp.block", reason="ai2-olmo-core is not installed (requirements.txt pins it)")

from olmo_core.data import NumpyFSLDataLoader, NumpyFSLDataset  # noqa: E402
from olmo_core.data.numpy_dataset import InstanceFilterConfig  # noqa: E402
from olmo_core.data import utils as data_utils  # noqa: E402
from olmo_core.optim import AdamWConfig, OptimGroupOverride  # noqa: E402
from olmo_core.optim.scheduler import CosWithWarmup  # noqa: E402
from olmo_core.train.callbacks import sequence_length_scheduler as seq_len_scheduler  # noqa: E402
from olmo_core.train.train_module import TransformerTrainModule  # noqa: E402

from test_olmo_core_oracle import (cpu_kernels, hf_gradients, moecore_rank_instances,  # noqa: E402,F401
                                  olmo_core_model, olmo_core_state, olmo_core_train_passes,
                                  watch_routing_margins)

SEQ, BATCH, MICRO, RANKS, STEPS = 12, 8, 2, 2, 6
LM_Z = 1e-3
INIT_STD = 0.1  # router logits far enough apart that no top-k choice is a near-tie
MODEL = dict(
    vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=24, intermediate_size=48, first_k_dense_replace=0,
    shared_expert_intermediate_size=16, norm_topk_prob=False, router_aux_loss_coef=0.05,
    router_z_loss_coef=0.01, qk_norm="full", router_score="softmax", lb_loss_style="olmo-core",
    loss_normalizer="labels", lb_loss_scope="rank", block_norm="reordered",
)
OPTIM = dict(lr=5e-3, beta1=0.9, beta2=0.95, eps=1e-5, weight_decay=0.1, max_grad_norm=1.0,
             warmup_steps=2, schedule="cosine", min_lr_ratio=0.1, no_decay="embeddings")
# name -> [train] keys of a sequence-length warm-up over the first 4 updates: melted into 4 rows
# of 3 tokens (one micro-batch a rank: OLMo-core's callback quadruples its micro-batch tokens),
# then 2 of 6 (with 4 micro-batches of 1 instance: 2 micro-batches of 4 rows), then whole;
# truncated to 3 tokens (one micro-batch), 6, then 9 (two: 24 // 9 = 2 of a rank's 4). "data":
# [data] keys, the instance filter (a third of the corpus's lines repeat a word 3-6 times; in
# 12 tokens periods up to 4 are looked at, masked from 3 periods).
FILTER = {"instance_filter": True, "repetition_max_period": 4, "repetition_max_count": 3}
# Optimizer groups as OLMo-core's recipes and experiments make them: (moecore's patterns, OLMo-core's
# patterns, the group's values). The embedding without weight decay (its recipes' override), the
# routed experts and their routers at a lower rate with other betas (an experiment of the MoE
# work), the QK norms (named by moecore's Hugging Face names on its side) with their own decay
# and eps.
GROUPS = [
    (["embeddings.weight"], ["embeddings.weight"], {"weight_decay": 0.0}),
    (["blocks.*.routed_experts.*", "blocks.*.routed_experts_router.*"],
     ["blocks.*.routed_experts.*", "blocks.*.routed_experts_router.*"],
     {"lr": 2e-3, "beta1": 0.8, "beta2": 0.99}),
    (["model.layers.*.self_attn.[qk]_norm.weight"], ["blocks.*.attention.[qk]_norm.weight"],
     {"weight_decay": 0.05, "eps": 1e-6}),
]
WARMUPS = {
    "none": {},
    "groups": {"optim": {"no_decay": "none", "group_overrides": [
        {"params": ours, **values} for ours, _, values in GROUPS]}},
    "melt": {"seq_len_warmup_steps": 4, "seq_len_warmup_min": 3},
    "melt_micro4": {"seq_len_warmup_steps": 4, "seq_len_warmup_min": 3, "microbatches": 4},
    "truncate": {"seq_len_warmup_steps": 4, "seq_len_warmup_min": 3,
                 "seq_len_warmup_truncate": True, "seq_len_warmup_multiple": 3},
    "filter": {"data": FILTER},
    "filter_melt": {"seq_len_warmup_steps": 4, "seq_len_warmup_min": 3, "data": FILTER},
    "label_mask": {"data": {"label_mask": True}},
    "label_mask_melt_filter": {"seq_len_warmup_steps": 4, "seq_len_warmup_min": 3,
                               "data": {"label_mask": True, **FILTER}},
}


def write_label_masks(root: Path) -> Path:
    """One label mask per token file (OLMo-core's np.bool_ files, headerless), in runs of labels
    kept and masked (as prompts and responses make them), about half of the tokens masked."""
    rng = np.random.default_rng(5)
    meta = json.loads((root / "tokens" / "meta.json").read_text())
    masks = root / "masks"
    masks.mkdir()
    for f in meta["train"]["files"]:
        n = (root / "tokens" / f).stat().st_size // np.dtype(meta["dtype"]).itemsize
        runs = rng.integers(1, 9, size=n)
        keep = np.repeat(np.arange(len(runs)) % 2 == 0, runs)[:n]
        data_utils.write_array_to_disk(keep, masks / Path(f).name)
    return masks


@pytest.fixture(scope="module", params=list(WARMUPS))
def run(request, moecore_bin, tmp_path_factory):
    """Token files, the config, moecore's initial weights and its two-rank run."""
    warmup = dict(WARMUPS[request.param])
    data = warmup.pop("data", {})
    optim = {**OPTIM, **warmup.pop("optim", {})}
    root = tmp_path_factory.mktemp(f"olmo_run_{request.param}")
    H.prepare_token_files(root, seed=11, documents=300,
                          repeated=0.3 if data.get("instance_filter") else 0.0)
    data_keys = {k: v for k, v in data.items() if k != "label_mask"}
    if data.get("label_mask"):
        data_keys["label_mask"] = [str(write_label_masks(root))]
    out = root / "out"
    cfg = H.write_config(
        root / "run.toml", MODEL, optim=optim,
        data={"train": [str(root / "tokens" / "train")], "order": "olmo-core", **data_keys},
        train={"seq_len": SEQ, "batch_size": BATCH, "microbatches": MICRO, "max_steps": STEPS,
               "seed": 5, "init_seed": 1, "init_method": "normal", "init_std": INIT_STD,
               "z_loss_multiplier": LM_Z,
               "skip_sigma": 0.0, "threads": 1, "log_every": 1, "eval_every": 0,
               "save_every": STEPS, "sample_tokens": 0, "out_dir": str(out), **warmup})
    weights = root / "init.safetensors"
    H.run_moecore("init", "--config", cfg, "--seed", 1, "--out", weights)
    r = subprocess.run(["mpirun", "-np", str(RANKS), str(H.binary_path()), "train", str(cfg)],
                       capture_output=True, text=True, timeout=600, env=H.MPI_ENV,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    if request.param == "groups":  # its start-up lines name each group's tensors
        assert "optimizer group optim.group_overrides[2]: 4 tensors" in r.stdout, r.stdout[-3000:]
    if request.param == "melt":
        assert "sequence length: 3 from update 1 (each instance melted into 4 rows; 1 " \
            "micro-batch(es) of 16 rows a rank)" in r.stdout, r.stdout[-2000:]
    return root, cfg, weights, out, warmup, data, optim


def moecore_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {row["step"]: row for row in rows if "train/loss" in row}
    assert sorted(steps) == list(range(1, STEPS + 1))
    return [steps[s] for s in range(1, STEPS + 1)]


def moecore_final_weights(out: Path) -> dict:
    ckpt = out / "checkpoints" / f"step_{STEPS:08d}"
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        weights = {}
        for part in names:
            weights.update(H.load_tensors(ckpt / part))
        return weights
    return H.load_tensors(ckpt / "model.safetensors")


def olmo_core_warmup(warmup: dict, rank_microbatch_size: int):
    """OLMo-core's SequenceLengthSchedulerCallback attached to a stand-in trainer (mocks of the
    classes it checks), after its pre_train; None without a warm-up."""
    if not warmup:
        return None
    callback = seq_len_scheduler.SequenceLengthSchedulerCallback(
        min_sequence_length=warmup["seq_len_warmup_min"],
        warmup_steps=warmup["seq_len_warmup_steps"],
        truncate=warmup.get("seq_len_warmup_truncate", False),
        keep_multiple_of=warmup.get("seq_len_warmup_multiple", 128))
    trainer = mock.MagicMock()
    trainer.data_loader = mock.MagicMock(spec=NumpyFSLDataLoader)
    trainer.data_loader.dataset = mock.MagicMock(spec=NumpyFSLDataset)
    trainer.data_loader.dataset.sequence_length = SEQ
    trainer.train_module = mock.MagicMock(spec=TransformerTrainModule)
    trainer.train_module.rank_microbatch_size = rank_microbatch_size
    callback.trainer = trainer
    callback.pre_train()
    return callback


def olmo_core_instance_fields(cfg: Path, root: Path, data: dict) -> dict:
    """What OLMo-core's NumpyFSLDataset (with the run's instance_filter_config and
    label_mask_paths) gives each instance the run reads besides its ids: "instance_mask"
    [STEPS, RANKS, BATCH / RANKS] and "label_mask" [.., SEQ], those the run has."""
    if not data:
        return {}
    order = root / "order_fields.npy"
    H.run_moecore("data", "order", cfg, "--steps", STEPS, "--dp", RANKS, "--out", order)
    tokens = root / "tokens"
    meta = json.loads((tokens / "meta.json").read_text())
    kwargs = {}
    if data.get("instance_filter"):
        kwargs["instance_filter_config"] = InstanceFilterConfig(
            repetition_max_period=data["repetition_max_period"],
            repetition_max_count=data["repetition_max_count"])
    if data.get("label_mask"):
        kwargs["label_mask_paths"] = [str(root / "masks" / Path(f).name)
                                      for f in meta["train"]["files"]]
    ds = NumpyFSLDataset(*[str(tokens / f) for f in meta["train"]["files"]], sequence_length=SEQ,
                         pad_token_id=0, eos_token_id=meta["eos_id"],
                         vocab_size=MODEL["vocab_size"], dtype=getattr(np, meta["dtype"]), **kwargs)
    ds.prepare()
    indices = np.load(order)
    items = [[[ds[int(i)] for i in rank] for rank in step] for step in indices]
    fields = {}
    for key in ("instance_mask", "label_mask"):
        if key in items[0][0][0]:
            fields[key] = np.array([[[np.asarray(item[key]) for item in rank] for rank in step]
                                    for step in items])
    return fields


def olmo_core_step_batches(callback, rank_instances: np.ndarray, fields: dict, step: int,
                           micro: int):
    """Update `step`'s batch on every rank [ranks, rows, seq], its other fields (instance_mask
    [ranks, rows], label_mask [ranks, rows, seq]) and its micro-batch count, as each rank's
    callback (pre_step at the trainer's 1-based step: melt_batch repeats an instance's mask for
    each of its rows and cuts its label mask as its ids) and train module (split_batch at its
    rank_microbatch_size // seq) make them."""
    if callback is None:
        return rank_instances, fields, micro
    callback.trainer.global_step = step
    cut, cut_fields, parts = [], {key: [] for key in fields}, []
    for rank, rows in enumerate(rank_instances):
        batch = {"input_ids": torch.as_tensor(rows)}
        for key, values in fields.items():
            batch[key] = torch.as_tensor(values[rank])
        callback.pre_step(batch)
        size = callback.trainer.train_module.rank_microbatch_size
        parts.append(data_utils.split_batch(batch, size // batch["input_ids"].shape[1]))
        cut.append(batch["input_ids"].numpy())
        for key in fields:
            cut_fields[key].append(batch[key].numpy())
        callback.post_train_batch()
    sizes = {m["input_ids"].shape[0] for rank in parts for m in rank}
    assert len(sizes) == 1, sizes  # moecore refuses uneven splits before it starts
    return np.stack(cut), {k: np.stack(v) for k, v in cut_fields.items()}, len(parts[0])


def olmo_core_optimizer(model, optim: dict):
    """torch's AdamW with the run's groups: OLMo-core's recipes' two (no decay on the embedding), or
    the groups OLMo-core's AdamWConfig builds from group_overrides (its globs, its initial_lr)."""
    params = dict(model.named_parameters())
    betas = (optim["beta1"], optim["beta2"])
    if "group_overrides" not in optim:
        decayed = [p for n, p in params.items() if n != "embeddings.weight"]
        # (initial_lr: what OLMo-core's build sets in each group for its scheduler.)
        return torch.optim.AdamW(
            [{"params": decayed, "weight_decay": optim["weight_decay"], "initial_lr": optim["lr"]},
             {"params": [params["embeddings.weight"]], "weight_decay": 0.0,
              "initial_lr": optim["lr"]}],
            lr=optim["lr"], betas=betas, eps=optim["eps"], foreach=False)
    overrides = []
    for _, theirs, values in GROUPS:
        opts = {k: v for k, v in values.items() if k in ("lr", "weight_decay", "eps")}
        if "beta1" in values or "beta2" in values:
            opts["betas"] = (values.get("beta1", optim["beta1"]), values.get("beta2", optim["beta2"]))
        overrides.append(OptimGroupOverride(params=theirs, opts=opts))
    opt = AdamWConfig(lr=optim["lr"], betas=betas, eps=optim["eps"],
                      weight_decay=optim["weight_decay"], foreach=False,
                      group_overrides=overrides).build(model)
    assert len(opt.param_groups) == 1 + len(GROUPS)
    return opt


def olmo_core_run(root: Path, cfg: Path, weights: Path, warmup: dict, data: dict, optim: dict):
    # [STEPS, RANKS, BATCH / RANKS, SEQ]: each rank's instances, step by step
    instances = moecore_rank_instances(cfg, root / "tokens", STEPS, RANKS, SEQ, MODEL["vocab_size"])
    fields = olmo_core_instance_fields(cfg, root, data)

    model = olmo_core_model(MODEL, "reordered")
    missing, unexpected = model.load_state_dict(olmo_core_state(H.load_tensors(weights), MODEL),
                                                strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.train()
    params = dict(model.named_parameters())
    opt = olmo_core_optimizer(model, optim)
    scheduler = CosWithWarmup(warmup=OPTIM["warmup_steps"], alpha_f=OPTIM["min_lr_ratio"])
    routers = [b.routed_experts_router for b in model.blocks.values()]
    margins = []
    hooks = watch_routing_margins(model, MODEL, margins)
    micro = warmup.get("microbatches", MICRO)
    callback = olmo_core_warmup(warmup, BATCH // RANKS // micro * SEQ)
    rows, uneven = [], []
    for step in range(STEPS):
        # Its scheduler's set_lr: each group at its own initial_lr.
        for group in opt.param_groups:
            group["lr"] = float(scheduler.get_lr(group["initial_lr"], step + 1, STEPS))
        # OLMo-core's AdamWConfig puts the overrides' groups first and the rest last.
        lr = opt.param_groups[-1]["lr"]
        opt.zero_grad(set_to_none=True)
        for r in routers:
            r.reset_metrics()
        step_instances, step_fields, step_micro = olmo_core_step_batches(
            callback, instances[step], {k: v[step] for k, v in fields.items()}, step + 1, micro)
        step_masks = step_fields.get("instance_mask")
        # The loss's division: every rank's counted labels (each row's last is ignored, and with
        # label masks each masked one) over dp, a masked instance's labels counted as well (its
        # train module's batch_num_tokens_for_loss), for every micro-batch of the step.
        x = torch.as_tensor(step_instances).long()
        batch = {"input_ids": x.reshape(-1, x.shape[-1])}
        if step_masks is not None:
            batch["instance_mask"] = torch.as_tensor(step_masks).reshape(-1)
        if "label_mask" in step_fields:
            batch["label_mask"] = torch.as_tensor(step_fields["label_mask"]).reshape(
                -1, x.shape[-1])
        labels = data_utils.get_labels(batch).reshape(x.shape)
        if step_micro > 1:  # whether rank 0's micro-batches hold different label counts
            per_micro = [int((m != -100).sum()) for m in labels[0].split(x.shape[1] // step_micro)]
            uneven.append(len(set(per_micro)) > 1)
        counted = int((labels != -100).sum())
        if step_masks is not None:
            counted += int((~torch.as_tensor(step_masks)).sum()) * (x.shape[-1] - 1)
        div = torch.tensor(float(counted) / RANKS)
        passes = olmo_core_train_passes(model, step_instances, step_micro, div,
                                        z_loss_multiplier=LM_Z, labels=labels.numpy())
        ce = sum(float(out.ce_loss) for out in passes)
        lm_z = sum(float(out.z_loss) for out in passes) / LM_Z
        for p in params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad /= RANKS  # DDP: the ranks' mean
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), OPTIM["max_grad_norm"],
                                              foreach=False)
        rows.append({"train/ce": ce / RANKS, "train/lm_z": lm_z / RANKS,
                     "train/lb": float(sum(r.load_balancing_loss for r in routers)) / RANKS,
                     "train/z": float(sum(r.z_loss for r in routers)) / RANKS,
                     "train/grad_norm": float(norm), "train/lr": lr})
        if "group_overrides" in optim:
            for k, group in enumerate(opt.param_groups[:-1]):
                rows[-1][f"train/lr_override{k}"] = group["lr"]
        if step_masks is not None:
            rows[-1]["train/masked_instances"] = float(
                np.mean([(~torch.as_tensor(m)).float().mean() for m in step_masks]))
        opt.step()
    for h in hooks:
        h.remove()
    assert min(margins) > 1e-5, f"routing near-tie on the trajectory: {min(margins):.2e}"
    # Label masks make micro-batches of different label counts: OLMo-core's division by the
    # batch's count differs from one by each micro-batch's own there.
    if "label_mask" in fields:
        assert any(uneven), uneven
    for p in params.values():  # hf_gradients maps .grad to moecore's names
        p.grad = p.detach().clone()
    return rows, hf_gradients(model, MODEL)


def test_two_ranks_train_as_olmo_core(run, cpu_kernels):
    root, cfg, weights, out, warmup, data, optim = run
    ref_rows, ref_weights = olmo_core_run(root, cfg, weights, warmup, data, optim)
    ours_rows = moecore_rows(out)
    norms = [row["train/grad_norm"] for row in ref_rows]
    assert max(norms) > OPTIM["max_grad_norm"], f"clipping never active: {norms}"
    # (A warm-up's first update is scored on short rows, a cross-entropy of its own.)
    learned = 0.3 if not warmup else 0.2
    assert ref_rows[-1]["train/ce"] < ref_rows[0]["train/ce"] - learned, "the run did not learn"
    if data.get("instance_filter"):  # some steps mask instances, not every instance
        shares = [row["train/masked_instances"] for row in ref_rows]
        assert max(shares) > 0.1 and min(shares) < 0.9, shares
    ours = {k: torch.tensor([row[k] for row in ours_rows]) for k in ref_rows[0]}
    ref = {k: torch.tensor([row[k] for row in ref_rows]) for k in ref_rows[0]}
    H.assert_all_close(ours, ref, sorted(ref), what="per-step values against OLMo-core's run")
    final = moecore_final_weights(out)
    assert set(final) == set(ref_weights)
    H.assert_all_close(final, {n: t.float() for n, t in ref_weights.items()}, sorted(ref_weights),
                       what=f"weights after {STEPS} steps against OLMo-core's run")
