"""data.order = "olmo-core": moecore reads exactly the batches OLMo-core's NumpyFSLDataLoader reads.

OLMo-core's loader (olmo_core/data/data_loader.py) shuffles every epoch with
np.random.Generator(PCG64(seed + epoch)) (epochs from 1), cuts the epoch to whole global batches
and gives data-parallel rank r every dp-th instance of a global batch from the r-th; its train
module cuts a rank's batch into micro-batches in order. `moecore data order` reads through the
trainer's own loader (train/training_data.h) and writes, per step and rank, the instances that rank
trains on; here OLMo-core's loader, over the same token files, is the oracle: every index equal,
across epoch boundaries, for 1, 2 and 4 ranks, with and without micro-batches, for seeds of one and
of two 32-bit words (NumPy's SeedSequence hashes those differently). The trainer-level half (the
ranks train as one process, a resume across an epoch boundary replays exactly) is
tests/train/test_data_order.py.

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


def moecore_order(root: Path, cfg: Path, steps: int, dp: int, *sets: str):
    out = root / f"{cfg.stem}.dp{dp}.npy"
    args = ["data", "order", cfg, "--steps", steps, "--dp", dp, "--out", out]
    for s in sets:
        args += ["--set", s]
    summary = json.loads(H.run_moecore(*args).stdout)
    return np.load(out), summary


def olmo_core_order(root: Path, steps: int, dp: int, batch: int, seed: int) -> np.ndarray:
    """[steps, dp, batch / dp]: what OLMo-core's loader gives each rank, epoch after epoch (its
    trainer's reshuffle(epoch + 1) and reset() between epochs)."""
    paths = sorted(str(p) for p in (root / "tokens" / "train").glob("*.npy"))
    meta = json.loads((root / "tokens" / "meta.json").read_text())
    ds = numpy_dataset.NumpyFSLDataset(*paths, sequence_length=SEQ, pad_token_id=0,
                                       eos_token_id=int(meta["eos_id"]), vocab_size=VOCAB,
                                       dtype=np.dtype(meta["dtype"]).type)
    ds.prepare()
    per_rank = []
    for rank in range(dp):
        loader = data_loader.NumpyFSLDataLoader(
            ds, collator=collator.DataCollator(pad_token_id=0), global_batch_size=batch * SEQ,
            work_dir=root / "olmo_work", seed=seed, dp_world_size=dp, dp_rank=rank,
            fs_local_rank=0)
        batches, epoch = [], 1
        while len(batches) < steps:
            loader.reshuffle(epoch=epoch, in_memory=True)
            for b in loader:
                batches.append(b["index"].numpy().astype(np.int64))
                if len(batches) == steps:
                    break
            loader.reset()
            epoch += 1
        per_rank.append(np.stack(batches))
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
