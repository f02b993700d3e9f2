"""data.order = "olmo-core": moecore reads exactly the batches OLMo-core's NumpyFSLDataLoader reads.

OLMo-core's loader (olmo_core/data/data_loader.py) shuffles every epoch with
np.random.Generator(PCG64(seed + epoch)) (epochs from 1), cuts the epoch to whole global batches
and gives data-parallel rank r every dp-th instance of a global batch from the r-th; its train
module cuts a rank's batch into micro-batches in order. `moecore data order` reads through the
trainer's own loader (train/training_data.h) and writes, per step and rank, the instances that rank
trains on; here OLMo-core's loader, over the same token files, is the oracle: every index equal,
across epoch boundaries, for 1, 2 and 4 ranks, with and without micro-batches, for seeds of one and
of two 32-bit words (NumPy's SeedSequence hashes those differently). A run resumed with another
batch size or seq_len (`data order --resume CHECKPOINT`, through the trainer's own resume_position)
reads what OLMo-core's loader reads after load_state_dict of the saved run's state: the saved
epoch restarted after the whole new global batches its tokens fill, mid-epoch and at an epoch's
end, batch sizes up and down, seq_len up and down, two and three resumes in a row (random chains
too; tokens that filled no whole batch stay counted in their epoch). data.max_target_seq_len
(OLMo-core's max_target_sequence_length) shuffles whole blocks as its loader's chunk_size does,
and a sequence-length warm-up resumed at a longer seq_len reads on as OLMo-core's loader does.
The trainer-level half (the ranks train as one
process, a resume across an epoch boundary replays exactly, the resumed trainer starts where
`data order --resume` says) is tests/train/test_data_order.py.

Needs ai2-olmo-core (requirements.txt pins 3.0.0); skips with that reason without it.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest

import moecore_harness as H

numpy_dataset = pytest.importorskip("olmo_core.data.numpy_dataset",
                                    reason="ai2-olmo-core is not installed (requirements.txt pins it)")
data_loader = pytest.importorskip("olmo_core.data.data_loader")
collator = pytest.importorskip("olmo_core.data.collator")

SEQ = 16
VOCAB = 300


@pytest.fixture(scope="module")
def tokens(moecore_bin, tmp_path_factory):
    """Token files of 200-odd instances of SEQ tokens: an epoch is a few global batches."""
    root = tmp_path_factory.mktemp("olmo_order")
    rng = random.Random(5)
    words = "in the beginning god created heaven and earth light darkness waters day night".split()
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 20)))
                                for _ in range(300)) + "\n")
    tok = root / "tokenizer.json"
    H.run_moecore("tokenizer", "train", "--input", corpus, "--vocab-size", VOCAB, "--out", tok)
    H.run_moecore("prepare", "--tokenizer", tok, "--input", corpus, "--out", root / "tokens",
                  "--val-fraction", "0")
    return root


def write_config(root: Path, name: str, *, batch: int, micro: int, seed: int,
                 order: str = "olmo-core") -> Path:
    cfg = root / f"{name}.toml"
    cfg.write_text(f"""[model]
vocab_size = {VOCAB}
[train]
seq_len = {SEQ}
batch_size = {batch}
microbatches = {micro}
seed = {seed}
[data]
train = ["{root / 'tokens' / 'train'}"]
order = "{order}"
""")
    return cfg


def moecore_order(root: Path, cfg: Path, steps: int, dp: int, *sets: str, resume: Path | None = None):
    out = root / f"{cfg.stem}.dp{dp}.npy"
    args = ["data", "order", cfg, "--steps", steps, "--dp", dp, "--out", out]
    if resume is not None:
        args += ["--resume", resume]
    for s in sets:
        args += ["--set", s]
    summary = json.loads(H.run_moecore(*args).stdout)
    return np.load(out), summary


def olmo_core_loader(root: Path, *, batch: int, seed: int, dp: int = 1, rank: int = 0,
                     seq: int = SEQ, max_target: int | None = None):
    """OLMo-core's loader as its NumpyDataLoaderConfig builds it (chunk_size from the dataset's
    max_target_sequence_length)."""
    paths = sorted(str(p) for p in (root / "tokens" / "train").glob("*.npy"))
    meta = json.loads((root / "tokens" / "meta.json").read_text())
    ds = numpy_dataset.NumpyFSLDataset(*paths, sequence_length=seq, pad_token_id=0,
                                       eos_token_id=int(meta["eos_id"]), vocab_size=VOCAB,
                                       dtype=np.dtype(meta["dtype"]).type,
                                       max_target_sequence_length=max_target)
    ds.prepare()
    return data_loader.NumpyDataLoaderBase.wrap_numpy_dataset(
        ds, collator=collator.DataCollator(pad_token_id=0), global_batch_size=batch * seq,
        work_dir=root / "olmo_work", seed=seed, dp_world_size=dp, dp_rank=rank, fs_local_rank=0)


def olmo_core_batches(loader, steps: int, epoch: int = 1) -> list[np.ndarray]:
    """The loader's next `steps` batches, epoch after epoch as OLMo-core's trainer takes them
    (reshuffle(epoch) before an epoch, reset() after it), from `epoch` and the loader's state."""
    batches = []
    while len(batches) < steps:
        loader.reshuffle(epoch=epoch, in_memory=True)
        for b in loader:
            batches.append(b["index"].numpy().astype(np.int64))
            if len(batches) == steps:
                return batches
        loader.reset()
        epoch += 1
    return batches


def olmo_core_order(root: Path, steps: int, dp: int, batch: int, seed: int) -> np.ndarray:
    """[steps, dp, batch / dp]: what OLMo-core's loader gives each rank, epoch after epoch."""
    per_rank = [np.stack(olmo_core_batches(
        olmo_core_loader(root, batch=batch, seed=seed, dp=dp, rank=rank), steps))
        for rank in range(dp)]
    return np.stack(per_rank, axis=1)


@pytest.mark.parametrize("dp,batch,micro,seed", [
    (1, 8, 1, 0),
    (2, 8, 2, 3),
    (4, 8, 1, 17),
    (2, 12, 3, 2**40 + 7),  # a seed of two 32-bit words
    (1, 8, 2, 2**63 - 1),  # the largest TOML integer: seed + epoch passes 2^63
])
def test_moecore_reads_olmo_core_loaders_batches(tokens, dp, batch, micro, seed):
    cfg = write_config(tokens, f"c{dp}_{batch}_{micro}", batch=batch, micro=micro, seed=seed)
    probe, summary = moecore_order(tokens, cfg, 1, dp)
    per_epoch = summary["per_epoch"]
    assert per_epoch == batch * (summary["instances"] // batch)  # whole global batches only
    steps = 2 * per_epoch // batch + 3  # into the third epoch
    ours, summary = moecore_order(tokens, cfg, steps, dp)
    assert summary["read"] == steps * batch
    ref = olmo_core_order(tokens, steps, dp, batch, seed)
    assert ours.shape == ref.shape == (steps, dp, batch // dp)
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, f"first differing [step, rank, row]: {differing[0].tolist()}"
    # Not vacuous: moecore's own order reads other batches.
    mine, _ = moecore_order(tokens, cfg, steps, dp, "data.order=moecore")
    assert (mine != ref).any()


def test_one_epoch_reads_each_instance_once_and_drops_the_tail(tokens):
    cfg = write_config(tokens, "epoch", batch=8, micro=1, seed=1)
    _, summary = moecore_order(tokens, cfg, 1, 1)
    steps = summary["per_epoch"] // 8
    ours, _ = moecore_order(tokens, cfg, steps, 1)
    seen = ours.reshape(-1)
    assert len(np.unique(seen)) == len(seen) == summary["per_epoch"]
    assert summary["instances"] - summary["per_epoch"] < 8


@pytest.mark.parametrize("sets,message", [
    (["train.batch_size=100000"], "do not fill one of train.batch_size = 100000"),
    (["data.order=olmocore"], 'data.order="olmocore" is not one of "moecore", "olmo-core"'),
    (["data.max_target_seq_len=24"],
     "data.max_target_seq_len=24 must be 0 (none) or a positive multiple of train.seq_len=16"),
    (["data.max_target_seq_len=8"], "data.max_target_seq_len=8 must be 0 (none) or a positive"),
])
def test_bad_order_settings_are_one_line_errors(tokens, sets, message):
    cfg = write_config(tokens, "bad", batch=8, micro=1, seed=0)
    args = ["data", "order", cfg, "--steps", 1]
    for s in sets:
        args += ["--set", s]
    r = H.run_moecore_raw(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


# The model the trained runs here and in test_olmo_core_batch_size_schedule.py use: seconds a run.
TINY_MODEL = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "num_experts": 2,
              "num_experts_per_tok": 1, "moe_intermediate_size": 8, "intermediate_size": 16}


def train_config(root: Path, name: str, *, batch: int, seq: int, seed: int, steps: int | None,
                 max_target: int = 0, max_epochs: int | None = None,
                 order: str = "olmo-core", out: str | None = None) -> Path:
    """A tiny model trained `steps` steps (or `max_epochs` epochs) under OLMo-core's order, its
    checkpoint at the end, in root / `out` (default: root / name)."""
    cfg = root / f"{name}.toml"
    cfg.write_text(H.toml_text({
        "model": H.model_table(TINY_MODEL),
        "optim": {**H.OPTIM_DEFAULTS, "schedule": "constant"},
        "train": {"seq_len": seq, "batch_size": batch, "seed": seed, "max_steps": steps,
                  "max_epochs": max_epochs, "threads": 1, "eval_every": 0, "sample_tokens": 0,
                  "out_dir": str(root / (out or name))},
        "data": {"train": [str(root / "tokens" / "train")], "order": order,
                 "max_target_seq_len": max_target},
    }))
    return cfg


@pytest.mark.parametrize("before,after,dp,where", [
    # (batch, seq) of the saved run and of the resumed one; where the checkpoint is: "mid" inside
    # the second epoch at an instance the new batches do not divide, "end" at the first epoch's
    # end, "end2" at the second's.
    ((12, SEQ), (10, SEQ), 2, "mid"),    # smaller: some instances read again
    ((4, SEQ), (12, SEQ), 1, "mid"),     # larger
    ((6, SEQ), (4, SEQ), 2, "end"),      # the ended epoch's tail, which batches of 6 left, is read
    ((8, SEQ), (6, SEQ), 1, "end2"),     # the same at the second epoch's end
    ((8, SEQ), (8, 2 * SEQ), 2, "mid"),  # seq_len up: the instances are cut anew
    ((4, 2 * SEQ), (6, SEQ), 1, "end"),  # seq_len down
])
def test_resume_with_another_batch_size_reads_as_olmo_core(tokens, before, after, dp, where):
    (b0, s0), (b1, s1) = before, after
    seed = 11
    name = f"resume_{b0}_{s0}_{b1}_{s1}_{where}"
    per_epoch = moecore_order(tokens, train_config(tokens, f"{name}_probe", batch=b0, seq=s0,
                                                   seed=seed, steps=1), 1, 1)[1]["per_epoch"]
    steps = {"mid": per_epoch // b0 + 3, "end": per_epoch // b0, "end2": 2 * per_epoch // b0}[where]
    saved_cfg = train_config(tokens, name, batch=b0, seq=s0, seed=seed, steps=steps)
    H.run_moecore("train", saved_cfg)
    ckpt = tokens / name / "checkpoints" / f"step_{steps:08d}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["data_cursor"] == steps * b0

    # OLMo-core: the saved run's loader state after `steps` batches, loaded into loaders of the new
    # batch size and seq_len, the trainer going on in the saved epoch.
    old = olmo_core_loader(tokens, batch=b0, seed=seed, seq=s0)
    olmo_core_batches(old, steps)
    state = old.state_dict()
    after_steps = 2 * per_epoch // b1 + 3  # into the epoch after next
    ref = []
    for rank in range(dp):
        loader = olmo_core_loader(tokens, batch=b1, seed=seed, dp=dp, rank=rank, seq=s1)
        loader.load_state_dict(dict(state))
        ref.append(np.stack(olmo_core_batches(loader, after_steps, epoch=state["epoch"])))
    ref = np.stack(ref, axis=1)

    new_cfg = train_config(tokens, f"{name}_new", batch=b1, seq=s1, seed=seed, steps=1)
    ours, summary = moecore_order(tokens, new_cfg, after_steps, dp, resume=ckpt)
    assert ours.shape == ref.shape
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, f"first differing [step, rank, row]: {differing[0].tolist()}"
    moved = summary["moved"]
    assert moved["epoch"] == state["epoch"] and moved["tokens_read"] == state["tokens_processed"]
    if s0 == s1 and where == "mid":
        assert moved["read_again"] > 0 if b1 < b0 else moved["read_again"] == 0
    # Not vacuous: the saved cursor, read on under the new settings, reads other batches.
    full, _ = moecore_order(tokens, new_cfg, steps * b0 // b1 + after_steps + 1, 1)
    naive = full.reshape(-1)[steps * b0:][:after_steps * b1].reshape(after_steps, b1)
    assert (np.sort(naive, axis=1) != np.sort(ours.reshape(after_steps, b1), axis=1)).any()


@pytest.mark.parametrize("crossing", [False, True])
def test_two_resumes_with_other_batch_sizes_read_as_olmo_core(tokens, crossing):
    """Batches of 3 for 4 steps, then of 5 (their 192 tokens fill 2 batches of 80: 32 tokens fill
    none, and OLMo-core's loader keeps counting them in that epoch), then of 9: in the same epoch
    the kept tokens decide the position (27 instances' tokens fill 3 batches of 9, the 25 read
    only 2); an epoch later they are gone."""
    seed, cfg_name = 5, f"chain_{int(crossing)}"
    per_epoch_5 = moecore_order(tokens, train_config(tokens, f"{cfg_name}_probe", batch=5, seq=SEQ,
                                                     seed=seed, steps=1), 1, 1)[1]["per_epoch"]
    first, second = 4, (per_epoch_5 // 5 if crossing else 3)
    cfg = train_config(tokens, cfg_name, batch=3, seq=SEQ, seed=seed, steps=first)
    H.run_moecore("train", cfg)
    H.run_moecore("train", cfg, "--set", "train.batch_size=5", "--set",
                  f"train.max_steps={first + second}", "--resume", "--allow-config-change")
    ckpt = tokens / cfg_name / "checkpoints" / f"step_{first + second:08d}"

    state = None
    for batch, steps in [(3, first), (5, second)]:
        loader = olmo_core_loader(tokens, batch=batch, seed=seed)
        if state is not None:
            loader.load_state_dict(dict(state))
        olmo_core_batches(loader, steps, epoch=state["epoch"] if state else 1)
        state = loader.state_dict()
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    assert saved["replay_origin"]["epoch_tokens"] == 4 * 3 * SEQ  # the 32 kept tokens included
    after_steps = 5
    ref = olmo_core_loader(tokens, batch=9, seed=seed)
    ref.load_state_dict(dict(state))
    ref = np.stack(olmo_core_batches(ref, after_steps, epoch=state["epoch"]))[:, None, :]
    new_cfg = train_config(tokens, f"{cfg_name}_new", batch=9, seq=SEQ, seed=seed, steps=1)
    ours, summary = moecore_order(tokens, new_cfg, after_steps, 1, resume=ckpt)
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, f"first differing [step, rank, row]: {differing[0].tolist()}"
    assert summary["moved"]["tokens_read"] == state["tokens_processed"]
    if not crossing:
        assert summary["moved"]["offset"] == 27  # (192 + 3 x 80) // 144 = 3 batches of 9


@pytest.mark.parametrize("dp,batch,seed", [(1, 8, 0), (2, 12, 9)])
def test_max_target_sequence_length_reads_whole_chunks_as_olmo_core(tokens, dp, batch, seed):
    """data.max_target_seq_len = 4 x seq_len: the files are cut into blocks of 4 instances, and
    OLMo-core's loader (chunk_size 4) shuffles the blocks whole, across epochs."""
    cfg = train_config(tokens, f"chunks_{dp}_{batch}", batch=batch, seq=SEQ, seed=seed, steps=1,
                       max_target=4 * SEQ)
    per_epoch = moecore_order(tokens, cfg, 1, dp)[1]["per_epoch"]
    steps = 2 * per_epoch // batch + 3
    ours, summary = moecore_order(tokens, cfg, steps, dp)
    ref = np.stack([np.stack(olmo_core_batches(
        olmo_core_loader(tokens, batch=batch, seed=seed, dp=dp, rank=rank, max_target=4 * SEQ),
        steps)) for rank in range(dp)], axis=1)
    assert ours.shape == ref.shape
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, f"first differing [step, rank, row]: {differing[0].tolist()}"
    # Whole chunks: every step's instances (all ranks') are runs of 4 consecutive ones.
    for step in ours:
        ids = np.sort(step.reshape(-1))
        assert (ids.reshape(-1, 4) == ids.reshape(-1, 4)[:, :1] + np.arange(4)).all(), ids


def test_sequence_length_warmup_resumes_as_olmo_core(tokens):
    """A sequence-length warm-up: batches of 8 x 16 tokens with max_target_seq_len 64, resumed at
    8 x 32, then read as OLMo-core's loader reads after load_state_dict: the same blocks, cut in
    two instead of four, the epoch restarted after the tokens read."""
    seed, name = 4, "seq_warmup"
    cfg = train_config(tokens, name, batch=8, seq=SEQ, seed=seed, steps=5, max_target=4 * SEQ)
    H.run_moecore("train", cfg)
    ckpt = tokens / name / "checkpoints" / "step_00000005"
    old = olmo_core_loader(tokens, batch=8, seed=seed, max_target=4 * SEQ)
    olmo_core_batches(old, 5)
    state = old.state_dict()
    ref = olmo_core_loader(tokens, batch=8, seed=seed, seq=2 * SEQ, max_target=4 * SEQ)
    ref.load_state_dict(dict(state))
    per_epoch = moecore_order(tokens, train_config(tokens, f"{name}_probe", batch=8, seq=2 * SEQ,
                                                   seed=seed, steps=1, max_target=4 * SEQ),
                              1, 1)[1]["per_epoch"]
    after_steps = per_epoch // 8 + 2
    ref = np.stack(olmo_core_batches(ref, after_steps, epoch=state["epoch"]))[:, None, :]
    new_cfg = train_config(tokens, f"{name}_new", batch=8, seq=2 * SEQ, seed=seed, steps=1,
                           max_target=4 * SEQ)
    ours, summary = moecore_order(tokens, new_cfg, after_steps, 1, resume=ckpt)
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, f"first differing [step, rank, row]: {differing[0].tolist()}"
    assert summary["moved"]["tokens_read"] == 5 * 8 * SEQ
    # The trainer starts there (2 more steps of 8 instances).
    H.run_moecore("train", cfg, "--set", f"train.seq_len={2 * SEQ}", "--set", "train.max_steps=7",
                  "--resume", "--allow-config-change")
    trained = json.loads((tokens / name / "checkpoints" / "step_00000007" /
                          "trainer_state.json").read_text())
    assert trained["data_cursor"] == summary["start"] + 2 * 8, (trained, summary)
    # Another max_target_seq_len cannot be resumed (OLMo-core's loader refuses it too).
    r = H.run_moecore_raw("data", "order", new_cfg, "--set", "data.max_target_seq_len=128",
                          "--resume", ckpt)
    assert r.returncode != 0 and "data.max_target_seq_len: 64 -> 128" in r.stderr, r.stderr
    r = H.run_moecore_raw("train", new_cfg, "--set", "data.max_target_seq_len=128", "--set",
                          "train.max_steps=9", "--set", f"train.out_dir={tokens / name}",
                          "--resume", "--allow-config-change")
    assert r.returncode != 0 and "data.max_target_seq_len: 64 -> 128" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def random_chain(rng: random.Random):
    """2 or 3 segments of (batch, seq_len, steps) under one max_target_seq_len (or none)."""
    max_target = rng.choice([0, 4 * SEQ])
    segments = []
    for _ in range(rng.choice([2, 3])):
        seq = rng.choice([SEQ, 2 * SEQ]) if max_target else SEQ
        segments.append((rng.randint(2, 13), seq, rng.randint(1, 60)))
    return max_target, segments, rng.choice([(b, s) for b in range(2, 13) for s in (SEQ, 2 * SEQ)
                                             if max_target or s == SEQ])


@pytest.mark.parametrize("case", range(10))
def test_random_resume_chains_read_as_olmo_core(tokens, case):
    """Random runs resumed two or three times with other batch sizes (and, with blocks, other
    seq_lens), some across epochs, then read on with yet another: every index as OLMo-core's loader
    reads after load_state_dict of each saved state in turn."""
    rng = random.Random(1000 + case)
    max_target, segments, (last_batch, last_seq) = random_chain(rng)
    seed, name = rng.randint(0, 99), f"chain_random_{case}"
    step, cfg = 0, None
    state = None
    for i, (batch, seq, steps) in enumerate(segments):
        step += steps
        cfg = train_config(tokens, name, batch=batch, seq=seq, seed=seed, steps=step,
                           max_target=max_target)
        args = ["train", cfg] + (["--resume", "--allow-config-change"] if i else [])
        H.run_moecore(*args)
        loader = olmo_core_loader(tokens, batch=batch, seed=seed, seq=seq,
                                  max_target=max_target or None)
        if state is not None:
            loader.load_state_dict(dict(state))
        olmo_core_batches(loader, steps, epoch=state["epoch"] if state else 1)
        state = loader.state_dict()
    ckpt = tokens / name / "checkpoints" / f"step_{step:08d}"
    ref = olmo_core_loader(tokens, batch=last_batch, seed=seed, seq=last_seq,
                           max_target=max_target or None)
    ref.load_state_dict(dict(state))
    ref = np.stack(olmo_core_batches(ref, 40, epoch=state["epoch"]))[:, None, :]
    new_cfg = train_config(tokens, f"{name}_new", batch=last_batch, seq=last_seq, seed=seed,
                           steps=1, max_target=max_target)
    ours, _ = moecore_order(tokens, new_cfg, 40, 1, resume=ckpt)
    differing = np.argwhere(ours != ref)
    assert differing.size == 0, (segments, last_batch, last_seq,
                                 f"first differing [step, rank, row]: {differing[0].tolist()}")


class TrainerCounters:
    """The counters OLMo-core's Trainer._get_max_steps reads, around a real loader: its own
    arithmetic for max_duration = Duration.epochs(n) runs on this object."""

    def __init__(self, loader, step: int, epoch: int):
        self.data_loader, self.global_step, self.epoch = loader, step, epoch


def olmo_core_max_steps(loader, step: int, epoch: int, epochs: int) -> int:
    from olmo_core.train.common import Duration
    from olmo_core.train.trainer import Trainer
    return Trainer._get_max_steps(TrainerCounters(loader, step, epoch), Duration.epochs(epochs))


def trained_steps(root: Path, name: str) -> int:
    rows = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    return max(r["step"] for r in rows if "train/loss" in r)


@pytest.mark.parametrize("before,after,where", [
    (None, 8, None),  # a fresh run of 2 epochs
    ((12, SEQ), 10, "mid"),  # resumed inside epoch 2 with a smaller batch
    ((6, SEQ), 4, "end"),  # at epoch 1's end: its tail, which batches of 6 left, is read
    ((4, SEQ), 12, "mid"),
])
def test_max_epochs_trains_olmo_core_trainers_steps(tokens, before, after, where):
    """train.max_epochs = 2 (OLMo-core's max_duration = Duration.epochs(2)): the updates moecore
    trains, and `lr-schedule` lists, are OLMo-core's Trainer._get_max_steps over its own loader:
    2 x total_batches for a fresh run; after a resume with another batch size, the loader loaded
    from the saved run's state (its epoch and batches_processed) counts the rest of that epoch and
    the next one in the new batches."""
    seed = 7
    name = f"epochs_{before and before[0]}_{after}_{where}"
    new_cfg = train_config(tokens, f"{name}_epochs", batch=after, seq=SEQ, seed=seed,
                           steps=None, max_epochs=2, out=name)
    if before is None:
        loader = olmo_core_loader(tokens, batch=after, seed=seed)
        ref = olmo_core_max_steps(loader, 0, 1, 2)
        assert ref == 2 * loader.total_batches
        shown = json.loads(H.run_moecore("lr-schedule", new_cfg, "--json").stdout)
        assert shown["step"][-1] == ref
        out = H.run_moecore("train", new_cfg).stdout
        assert f"length: train.max_epochs=2 of {loader.total_batches * after} instances: {ref} " \
            f"update(s) of {after} sequences" in out, out[-1500:]
        assert trained_steps(tokens, name) == ref
        return
    b0, s0 = before
    per_epoch = moecore_order(tokens, train_config(tokens, f"{name}_probe", batch=b0, seq=s0,
                                                   seed=seed, steps=1), 1, 1)[1]["per_epoch"]
    steps = {"mid": per_epoch // b0 + 3, "end": per_epoch // b0}[where]
    saved_cfg = train_config(tokens, name, batch=b0, seq=s0, seed=seed, steps=steps)
    H.run_moecore("train", saved_cfg)
    ckpt = tokens / name / "checkpoints" / f"step_{steps:08d}"
    old = olmo_core_loader(tokens, batch=b0, seed=seed, seq=s0)
    olmo_core_batches(old, steps)
    state = old.state_dict()
    loader = olmo_core_loader(tokens, batch=after, seed=seed)
    loader.load_state_dict(dict(state))
    ref = olmo_core_max_steps(loader, steps, state["epoch"], 2)
    assert ref > steps
    shown = json.loads(H.run_moecore("lr-schedule", new_cfg, "--resume", ckpt, "--json").stdout)
    assert shown["step"] == list(range(steps + 1, ref + 1))
    H.run_moecore("train", new_cfg, "--resume", "--allow-config-change", "--set",
                  "train.save_every=1", "--set", "train.keep_last=0")
    assert trained_steps(tokens, name) == ref
    # From the resumed run's own next checkpoint, unchanged: counted from its replay origin.
    shown = json.loads(H.run_moecore("lr-schedule", new_cfg, "--resume",
                                     tokens / name / "checkpoints" / f"step_{steps + 1:08d}",
                                     "--json").stdout)
    assert shown["step"] == list(range(steps + 2, ref + 1))
    # Once more: finished, in epochs; one epoch is past the checkpoint, refused in one line.
    out = H.run_moecore("train", new_cfg, "--resume").stdout
    assert "done: nothing to train" in out and "train.max_epochs=2 epoch(s)" in out, out[-800:]
    r = H.run_moecore_raw("train", new_cfg, "--resume", "--set", "train.max_epochs=1")
    assert r.returncode == 1 and "past train.max_epochs=1" in r.stderr \
        and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_max_epochs_under_moecores_order_reads_every_instance(tokens):
    """Under moecore's order an epoch is every instance and batches run across epochs: 2 epochs
    are the updates until 2 x the instances are read, ceil(2 n / batch). The length is one of
    max_steps, max_tokens and max_epochs."""
    cfg = train_config(tokens, "epochs_moecore", batch=12, seq=SEQ, seed=3, steps=None,
                       max_epochs=2, order="moecore")
    n = moecore_order(tokens, cfg, 1, 1)[1]["per_epoch"]
    shown = json.loads(H.run_moecore("lr-schedule", cfg, "--json").stdout)
    assert shown["step"][-1] == -(-2 * n // 12) and (2 * n) % 12 != 0  # the last runs over
    both = tokens / "epochs_both.toml"
    both.write_text(cfg.read_text().replace("max_epochs = 2", "max_epochs = 2\nmax_steps = 5"))
    for config, sets, message in [
            (both, [], "train.max_steps=5 and train.max_epochs=2 both"),
            (cfg, ["train.max_tokens=500", "train.max_epochs=3"],
             "--set train.max_tokens and --set train.max_epochs"),
            (cfg, ["train.max_epochs=-1"], "train.max_epochs=-1 must be >= 0")]:
        r = H.run_moecore_raw("lr-schedule", config, *[a for s in sets for a in ("--set", s)])
        assert r.returncode == 1 and message in r.stderr \
            and len(r.stderr.strip().splitlines()) == 1, (sets, r.stderr)
    # A --set of another length replaces the file's.
    shown = json.loads(H.run_moecore("lr-schedule", cfg, "--set", "train.max_steps=5",
                                     "--json").stdout)
    assert shown["step"] == [1, 2, 3, 4, 5]
