"""Token files shared with OLMo-core (issue 12 item 1), checked with OLMo-core's own reader.

- moecore -> OLMo-core: `moecore prepare` writes headerless little-endian token files plus
  meta.json (dtype, eos_id); OLMo-core's NumpyFSLDataset reads the parts with the dtype meta.json
  names and yields, instance by instance, what `moecore data instances` says moecore trains on, and
  the same document lengths (generate_doc_lengths vs moecore's document masking).
- OLMo-core -> moecore: files written with OLMo-core's write_array_to_disk (np.memmap) are read by
  moecore with the declared element type (--dtype, data.dtype), and yield NumpyFSLDataset's
  instances; undeclared, they are an error (no meta.json), never a guess from the vocabulary.
Both for uint16 and uint32 (uint32 also with a vocabulary that fits uint16, the case a vocabulary
size guess gets wrong). With max_target_sequence_length (data.max_target_seq_len, `data instances
--max-target-seq-len`) the files are cut into whole blocks first, as NumpyFSLDataset cuts them.

Needs ai2-olmo-core (tests/reference/requirements.txt pins 3.0.0, which needs torch >= 2.10): the
tests skip with that reason in an environment without it.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest

import moecore_harness as H

numpy_dataset = pytest.importorskip("olmo_core.data.numpy_dataset",
                                    reason="ai2-olmo-core is not installed (requirements.txt pins it)")
olmo_utils = pytest.importorskip("olmo_core.data.utils")

SEQ = 32


def write_corpus(path: Path, lines: int = 400) -> Path:
    rng = random.Random(1)
    words = "in the beginning god created heaven and earth light darkness waters day night".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
                              for _ in range(lines)) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer(moecore_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("olmo_data")
    corpus = write_corpus(root / "corpus.txt")
    tok = root / "tokenizer.json"
    H.run_moecore("tokenizer", "train", "--input", corpus, "--vocab-size", 300, "--out", tok)
    return root, corpus, tok


def moecore_instances(tmp_path: Path, paths, vocab: int, dtype: str | None = None,
                      eos: int | None = None, bos: int | None = None, max_target: int = 0):
    """`moecore data instances`: (instances [N, SEQ], doc_lens [N, SEQ] zero-padded, summary)."""
    out, lens = tmp_path / "inst.npy", tmp_path / "lens.npy"
    args = ["data", "instances", "--seq-len", SEQ, "--vocab-size", vocab, "--out", out,
            "--doc-lens-out", lens]
    for p in paths:
        args += ["--data", p]
    if dtype:
        args += ["--dtype", dtype]
    if eos is not None:
        args += ["--eos-id", eos]
    if bos is not None:
        args += ["--bos-id", bos]
    if max_target:
        args += ["--max-target-seq-len", max_target]
    r = H.run_moecore(*args)
    return np.load(out), np.load(lens), json.loads(r.stdout.strip().splitlines()[-1])


def olmo_dataset(paths, vocab: int, eos: int, dtype, bos: int | None = None,
                 max_target: int | None = None):
    ds = numpy_dataset.NumpyFSLDataset(*[str(p) for p in paths], sequence_length=SEQ,
                                       pad_token_id=0, eos_token_id=eos, vocab_size=vocab,
                                       dtype=dtype, generate_doc_lengths=True,
                                       bos_token_id=bos, max_target_sequence_length=max_target)
    ds.prepare()
    return ds


def compare(ds, ours, our_lens):
    assert len(ds) == ours.shape[0] > 10
    for i in range(len(ds)):
        item = ds[i]
        np.testing.assert_array_equal(item["input_ids"].numpy().astype(np.int64), ours[i],
                                      err_msg=f"instance {i}")
        lens = item["doc_lens"].numpy().astype(np.int64)
        np.testing.assert_array_equal(lens, our_lens[i][: len(lens)], err_msg=f"doc_lens {i}")
        assert not our_lens[i][len(lens):].any(), f"instance {i}: extra documents"


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_olmo_core_reads_moecore_prepare(tokenizer, tmp_path, dtype):
    _, corpus, tok = tokenizer
    out = tmp_path / "tokens"
    args = ["prepare", "--tokenizer", tok, "--input", corpus, "--out", out, "--val-fraction", "0.1"]
    if dtype == "uint32":
        args += ["--dtype", "uint32"]  # the vocabulary (300) would fit uint16
    H.run_moecore(*args)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == dtype and meta["header"] == "none" and meta["byte_order"] == "little"
    parts = sorted((out / "train").glob("*.npy"))
    # No NumPy header: the file is exactly the tokens.
    assert parts[0].stat().st_size == meta["train"]["tokens"] * np.dtype(dtype).itemsize
    assert not parts[0].read_bytes().startswith(b"\x93NUMPY")
    vocab, eos = int(meta["vocab_size"]), int(meta["eos_id"])
    # moecore takes the type and EOS from meta.json: no --dtype, no --eos-id.
    ours, our_lens, summary = moecore_instances(tmp_path, [out / "train"], vocab)
    assert [f["dtype"] for f in summary["files"]] == [dtype] * len(parts)
    assert summary["metadata_eos_id"] == eos
    compare(olmo_dataset(parts, vocab, eos, getattr(np, dtype)), ours, our_lens)


@pytest.mark.parametrize("dtype,vocab", [("uint16", 50280), ("uint32", 100278), ("uint32", 300)])
def test_moecore_reads_olmo_core_files(moecore_bin, tmp_path, dtype, vocab):
    rng = np.random.default_rng(7)
    eos = vocab - 1
    paths = []
    for f, n in enumerate([SEQ * 9 + 5, SEQ * 4]):  # a tail that both drop, and an exact fit
        arr = rng.integers(0, vocab, size=n).astype(dtype)
        arr[rng.random(n) < 0.08] = eos
        p = tmp_path / f"part-{f}-00000.npy"
        olmo_utils.write_array_to_disk(arr, p)  # OLMo-core's writer: np.memmap, no header
        paths.append(p)
    ds = olmo_dataset(paths, vocab, eos, getattr(np, dtype))
    ours, our_lens, summary = moecore_instances(tmp_path, paths, vocab, dtype=dtype, eos=eos)
    assert summary["total_instances"] == len(ds) == 13
    compare(ds, ours, our_lens)
    # Undeclared, a headerless file without meta.json is an error naming it, not a guess.
    r = H.run_moecore_raw("data", "instances", "--data", paths[0], "--seq-len", SEQ,
                          "--vocab-size", vocab, "--out", tmp_path / "x.npy")
    assert r.returncode != 0 and str(paths[0]) in r.stderr and "--dtype" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_max_target_sequence_length_cuts_whole_blocks(moecore_bin, tmp_path):
    """OLMo-core's max_target_sequence_length: each file is cut into whole blocks of that many
    tokens first (a block's worth of tail dropped), each block into consecutive instances, so
    runs of every seq_len up to it read the same tokens."""
    rng = np.random.default_rng(3)
    vocab, eos, paths = 300, 299, []
    for f, n in enumerate([SEQ * 3, SEQ * 9 + 5, SEQ * 4]):  # none, 2 blocks + tail, 1 block
        arr = rng.integers(0, vocab, size=n).astype(np.uint16)
        p = tmp_path / f"part-{f}-00000.npy"
        olmo_utils.write_array_to_disk(arr, p)
        paths.append(p)
    ds = olmo_dataset(paths, vocab, eos, np.uint16, max_target=4 * SEQ)
    ours, our_lens, summary = moecore_instances(tmp_path, paths, vocab, dtype="uint16", eos=eos,
                                                max_target=4 * SEQ)
    assert summary["total_instances"] == len(ds) == 12  # 16 without the blocks
    compare(ds, ours, our_lens)
    r = H.run_moecore_raw("data", "instances", "--data", paths[0], "--seq-len", SEQ,
                          "--vocab-size", vocab, "--dtype", "uint16", "--max-target-seq-len",
                          SEQ + 1)
    assert r.returncode != 0 and "--max-target-seq-len=33 must be 0 (none) or a positive " \
        "multiple of --seq-len=32" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("same_id", [True, False])
def test_document_lengths_with_a_bos_token(moecore_bin, tmp_path, same_id):
    """OLMo-core's bos_token_id: documents start with a BOS and end at an EOS that a BOS follows
    (get_document_lengths), so an EOS elsewhere, and with GPT-2's one id for both the BOS itself,
    opens no document. `moecore data instances --bos-id` (data.bos_id in a run) finds the same
    lengths; without it the same stream splits at every EOS, which OLMo-core calls otherwise."""
    rng = np.random.default_rng(3)
    vocab, eos = 500, 0
    bos = 0 if same_id else 1
    docs = []
    for _ in range(60):
        body = rng.integers(2, vocab, size=int(rng.integers(1, 20)))
        body[rng.random(body.size) < 0.05] = eos  # a stray EOS inside a document
        docs += [bos, *body.tolist(), eos]
    arr = np.asarray(docs, dtype=np.uint16)
    path = tmp_path / "part-0-00000.npy"
    olmo_utils.write_array_to_disk(arr, path)
    ds = olmo_dataset([path], vocab, eos, np.uint16, bos=bos)
    ours, our_lens, _ = moecore_instances(tmp_path, [path], vocab, dtype="uint16", eos=eos,
                                          bos=bos)
    compare(ds, ours, our_lens)
    _, without_bos, _ = moecore_instances(tmp_path, [path], vocab, dtype="uint16", eos=eos)
    assert (without_bos != our_lens).any(), "the BOS rule changed no document"


def test_a_wrong_declared_type_is_named(moecore_bin, tmp_path):
    """OLMo-core's files carry no type: a wrong data.dtype / --dtype is named as the suspect. A
    uint32 file read as uint16 (every other element 0, twice the instances, nothing out of range:
    OLMo-core reads it so without a word) is refused; a uint16 file read as uint32 fails on its
    size or its first id, and the message says the declared type may be wrong."""
    rng = np.random.default_rng(5)
    vocab = 300
    ids = rng.integers(1, vocab, size=SEQ * 40)
    wide, narrow = tmp_path / "wide.npy", tmp_path / "narrow.npy"
    olmo_utils.write_array_to_disk(ids.astype(np.uint32), wide)
    olmo_utils.write_array_to_disk(ids.astype(np.uint16), narrow)

    def refused(path, dtype, *needles):
        r = H.run_moecore_raw("data", "instances", "--data", path, "--seq-len", SEQ,
                              "--vocab-size", vocab, "--dtype", dtype, "--out", tmp_path / "x.npy")
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        for needle in needles:
            assert needle in r.stderr, r.stderr

    refused(wide, "uint16", "every other one of its first 2560 tokens is 0",
            "look like uint32", "data.dtype (--dtype)")
    refused(narrow, "uint32", "outside the vocabulary", "read as uint32", "declare it")
    odd = tmp_path / "odd.npy"
    odd.write_bytes(narrow.read_bytes()[:-2])
    refused(odd, "uint32", "truncated, or its elements are not uint32")
    # Declared right, both read as OLMo-core reads them.
    for path, dtype in ((wide, "uint32"), (narrow, "uint16")):
        ours, _, _ = moecore_instances(tmp_path, [path], vocab, dtype=dtype, eos=0)
        assert ours.shape == (40, SEQ) and (ours.reshape(-1) == ids).all()


@pytest.mark.parametrize("max_target", [0, 4 * SEQ])
def test_label_masks_make_olmo_core_labels(moecore_bin, tmp_path, max_target):
    """OLMo-core's label_mask_paths (data.label_mask, `data instances --label-mask`): one np.bool_
    file per token file, as long as it; a token whose mask is False is no label (get_labels masks
    the labels, then shifts them). `data instances --targets-out` writes the targets training
    reads, which must be get_labels' of NumpyFSLDataset's input_ids and label_mask for every
    instance (with max_target_sequence_length too). Headerless masks as OLMo-core writes them and
    a .npy of bool; mismatched files and values other than 0 / 1 are one-line errors."""
    rng = np.random.default_rng(9)
    vocab, eos, paths, headerless, masks = 300, 299, [], [], []
    for f, n in enumerate([SEQ * 9 + 5, SEQ * 4]):
        p, m = tmp_path / f"part-{f}-00000.npy", tmp_path / f"mask-{f}.bin"
        olmo_utils.write_array_to_disk(rng.integers(0, vocab, size=n).astype(np.uint16), p)
        keep = np.repeat(np.arange(n) % 2 == 0, rng.integers(1, 9, size=n))[:n]
        olmo_utils.write_array_to_disk(keep, m)  # OLMo-core's: headerless bytes
        paths.append(p)
        headerless.append(m)
        if f == 1:  # moecore also reads a .npy of |b1
            m = tmp_path / f"mask-{f}.npy"
            np.save(m, keep)
        masks.append(m)
    ds = numpy_dataset.NumpyFSLDataset(*[str(p) for p in paths], sequence_length=SEQ,
                                       pad_token_id=0, eos_token_id=eos, vocab_size=vocab,
                                       dtype=np.uint16, label_mask_paths=headerless,
                                       max_target_sequence_length=max_target or None)
    ds.prepare()
    targets = tmp_path / "targets.npy"
    base = ["data", "instances", "--seq-len", SEQ, "--vocab-size", vocab, "--dtype", "uint16",
            "--max-target-seq-len", max_target]
    for p in paths:
        base += ["--data", p]
    H.run_moecore(*base, *[a for m in masks for a in ("--label-mask", m)],
                  "--targets-out", targets)
    ours = np.load(targets)
    assert ours.shape == (len(ds), SEQ) and len(ds) > 10
    for i in range(len(ds)):
        item = ds[i]
        ref = olmo_utils.get_labels({"input_ids": item["input_ids"][None],
                                     "label_mask": item["label_mask"][None]})[0].numpy()
        np.testing.assert_array_equal(ours[i], ref, err_msg=f"instance {i}")
    assert 0.3 < (ours == -100).mean() < 0.7

    def refused(extra, *needles):
        r = H.run_moecore_raw(*base, *extra, "--targets-out", tmp_path / "x.npy")
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        for needle in needles:
            assert needle in r.stderr, (needle, r.stderr)
        assert not (tmp_path / "x.npy").exists()

    refused(["--label-mask", masks[0]], "1 label mask file(s)", "2 token file(s)")
    refused(["--label-mask", masks[1], "--label-mask", masks[0]], str(masks[1]), "elements")
    bad = tmp_path / "bad-mask.npy"
    values = np.fromfile(masks[0], dtype=np.uint8)
    values[SEQ * 9 + 2] = 2  # in the tail no instance reads: every value is checked
    values.tofile(bad)
    refused(["--label-mask", bad, "--label-mask", masks[1]], str(bad), "value 2",
            f"position {SEQ * 9 + 2}")
