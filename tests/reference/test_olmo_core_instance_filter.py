"""OLMo-core's instance filter (`data.instance_filter`, InstanceFilterConfig) against OLMo-core's
own dataset: `moecore data instances --instance-mask-out` writes the instance_mask that
NumpyFSLDataset(instance_filter_config=...) gives each instance, for every instance and setting.

The instances are built to reach the algorithm's corners: random tokens over vocabularies of 2,
3 and 5 ids (chance repetitions, runs that touch) and of 50000, with up to two planted
repetitions each (periods 1-16, 2-39 copies, a partial last copy, placed at the start, at the end
or anywhere), at a length that periods 1, 2, 3, 4, 6, 8, 12 divide (numpy's pad then adds a
whole row) and at a prime one. Besides fixed settings, the count is swept from 1 to 34 at the
default periods (1 and 2 mask whatever OLMo-core reports: runs of three periods or more): the
masks then agree at every count only if each instance's longest repetition spans the same number
of periods in both. Mutations caught: the run's start not widened by the row before it; runs of
two periods reported.

Needs ai2-olmo-core (tests/reference/requirements.txt pins it).
"""

import json
from pathlib import Path

import numpy as np
import pytest

import moecore_harness as H

numpy_dataset = pytest.importorskip("olmo_core.data.numpy_dataset",
                                    reason="ai2-olmo-core is not installed (requirements.txt pins it)")

VOCAB = 65536
INSTANCES = 600
# (repetition_max_period, repetition_min_period, repetition_max_count)
SETTINGS = [(13, 1, 32), (4, 1, 3), (16, 2, 5), (13, 1, 4), (20, 1, 10), (13, 5, 3), (1, 1, 3),
            (40, 13, 3)] + [(13, 1, count) for count in range(1, 35)]


def planted_instances(seq: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(INSTANCES):
        row = rng.integers(0, [2, 3, 5, 50000][rng.integers(0, 4)], size=seq)
        for _ in range(rng.integers(0, 3)):
            period, copies = int(rng.integers(1, 17)), int(rng.integers(2, 40))
            run = np.tile(rng.integers(0, 60000, size=period), copies)[:seq]
            at = [0, seq - len(run), int(rng.integers(0, seq - len(run) + 1))][rng.integers(0, 3)]
            row[at:at + len(run)] = run
        rows.append(row)
    return np.stack(rows).astype(np.uint16)


def moecore_masks(tokens: Path, seq: int, tmp_path: Path, setting) -> tuple[np.ndarray, dict]:
    out = tmp_path / "mask.npy"
    max_period, min_period, count = setting
    r = H.run_moecore("data", "instances", "--data", tokens, "--seq-len", seq, "--vocab-size",
                      VOCAB, "--dtype", "uint16", "--instance-mask-out", out,
                      "--repetition-max-period", max_period, "--repetition-min-period",
                      min_period, "--repetition-max-count", count)
    mask = np.load(out)
    assert mask.dtype == np.uint8 and mask.shape == (INSTANCES,)
    return mask.astype(bool), json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seq", [96, 97])
def test_masks_are_olmo_core_datasets(moecore_bin, tmp_path, seq):
    tokens = tmp_path / "tokens.bin"
    planted_instances(seq, seed=seq).reshape(-1).tofile(tokens)
    ds = numpy_dataset.NumpyFSLDataset(str(tokens), sequence_length=seq, pad_token_id=0,
                                       eos_token_id=0, vocab_size=VOCAB, dtype=np.uint16)
    ds.prepare()
    assert len(ds) == INSTANCES
    masked_counts = {}
    for setting in SETTINGS:
        max_period, min_period, count = setting
        ds.instance_filter_config = numpy_dataset.InstanceFilterConfig(
            repetition_max_period=max_period, repetition_min_period=min_period,
            repetition_max_count=count)
        ref = np.array([bool(ds[i]["instance_mask"]) for i in range(INSTANCES)])
        ours, summary = moecore_masks(tokens, seq, tmp_path, setting)
        differ = np.nonzero(ours != ref)[0]
        assert differ.size == 0, (f"{setting}: instances {differ[:10].tolist()} differ "
                                  f"(OLMo-core keeps {ref[differ[:10]].tolist()})")
        assert summary["masked"] == int((~ref).sum())
        masked_counts[setting] = int((~ref).sum())
    # Not a vacuous comparison: each fixed setting masks some instances and keeps others, and
    # the sweep sees the count change the masks at many counts.
    for setting in SETTINGS[:8]:
        assert 0 < masked_counts[setting] < INSTANCES, (setting, masked_counts[setting])
    sweep = [masked_counts[(13, 1, c)] for c in range(1, 35)]
    assert len(set(sweep)) > 20, sweep


def test_filter_options_are_checked(moecore_bin, tmp_path):
    tokens = tmp_path / "tokens.bin"
    planted_instances(24, seed=1)[:10].reshape(-1).tofile(tokens)
    base = ["data", "instances", "--data", tokens, "--seq-len", 24, "--vocab-size", VOCAB,
            "--dtype", "uint16"]
    for extra, says in [
            (["--repetition-max-count", 3], "--instance-mask-out"),
            (["--instance-mask-out", tmp_path / "m.npy", "--repetition-max-period", 2,
              "--repetition-min-period", 3], "--repetition-max-period=2"),
            (["--instance-mask-out", tmp_path / "m.npy", "--repetition-min-period", 0],
             "--repetition-min-period")]:
        r = H.run_moecore_raw(*base, *extra)
        assert r.returncode != 0 and says in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "m.npy").exists()
