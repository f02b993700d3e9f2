# moecore's entry points. `make train` and `make test` each do their own set-up (Debian packages,
# the pinned Python oracles, the build) and are fast when everything is already in place.
ARGS ?=
JOBS ?= $(shell nproc)
export MOECORE_VENV ?= /opt/moecore/venv
PYTHON := $(MOECORE_VENV)/bin/python

.PHONY: all setup setup-system setup-python build build-tests build-sim build-asan train test test-cpp test-asan \
        test-reference test-smoke test-fresh test-two-hosts fuzz format clean bench bench-scaling bench-padded \
        bench-pipeline bench-plan bench-recompute bench-lm-head bench-compare bench-mxfp8

all: build

setup-system:
	@scripts/setup.sh system

setup-python:
	@scripts/setup.sh python

setup: setup-system setup-python

# The CLI only; the test binaries are built by test-cpp.
build: setup-system
	@cmake --preset release > /dev/null
	@cmake --build --preset release -j $(JOBS) --target moecore

build-tests: setup-system
	@cmake --preset release > /dev/null
	@cmake --build --preset release -j $(JOBS)

# The moecore program on the emulated GPU (tests/cuda_sim), which tests/train and tests/cli run
# beside the CPU's.
build-sim: setup-system
	@cmake --preset release > /dev/null
	@cmake --build --preset release -j $(JOBS) --target moecore_cuda_sim

build-asan: setup-system
	@cmake --preset asan-ubsan > /dev/null
	@cmake --build --preset asan-ubsan -j $(JOBS)

# The default corpus: KJV text -> byte-level BPE (4096 tokens) -> OLMo-core .npy token files.
KJV := data/kjv
data/kjv.txt: | setup-system
	@scripts/prepare_kjv.sh $@

$(KJV)/tokenizer.json: data/kjv.txt | build
	@mkdir -p $(KJV)
	build/bin/moecore tokenizer train --input data/kjv.txt --vocab-size 4096 --out $@

$(KJV)/tokens/meta.json: $(KJV)/tokenizer.json data/kjv.txt | build
	build/bin/moecore prepare --tokenizer $(KJV)/tokenizer.json --input data/kjv.txt \
	  --out $(KJV)/tokens --val-fraction 0.02 --overwrite

# Resumes runs/default when it holds checkpoints (delete it to start over).
train: build $(KJV)/tokens/meta.json
	build/bin/moecore train configs/default.toml --resume $(ARGS)

# Scaling figures (issue 4): tokens/s and peak memory per rank at 1/2/4 ranks, ep 1/2/4, both
# dispatch modes and overlap settings, medians of 3 runs -> bench/results/scaling.{md,json}.
bench-scaling: build $(KJV)/tokens/meta.json
	$(PYTHON) bench/scaling.py $(ARGS)

# The rowwise dispatch's transports (issue 15): MPI windows vs the padded all-to-all, interleaved
# pairs at ep 2 and 4 -> bench/results/padded_transport.{md,json}.
bench-padded: build $(KJV)/tokens/meta.json
	$(PYTHON) bench/padded_transport.py $(ARGS)

# Pipeline figures (issue 5): measured bubble vs theory, tokens/s and peak memory per stage for
# 1f1b / interleaved-1f1b / gpipe at pp 2 and 4 -> bench/results/pipeline.{md,json}.
bench-pipeline: build $(KJV)/tokens/meta.json
	$(PYTHON) bench/pipeline.py $(ARGS)

# `moecore plan` against measured memory and traffic (bench/results/plan_validation.md).
bench-plan: build setup-python
	$(PYTHON) bench/plan_validation.py

# Peak memory and step time per train.recompute mode next to the plan's
# (bench/results/recompute.md; needs bench/results/cpu_profile.json from bench-plan).
bench-recompute: build setup-python
	$(PYTHON) bench/recompute.py

# Peak memory and step time per train.lm_head_chunk_tokens next to the plan's
# (bench/results/lm_head_chunks.md; needs bench/results/cpu_profile.json from bench-plan).
bench-lm-head: build setup-python
	$(PYTHON) bench/lm_head_chunks.py

# train.precision = "mxfp8" against bf16: peak memory, step time and the experts' share
# (bench/results/mxfp8.md); ARGS="--curves 1000" adds the default model's loss curves (hours).
bench-mxfp8: build setup-python $(KJV)/tokens/meta.json
	$(PYTHON) bench/mxfp8.py $(ARGS)

# Two binaries side by side (issue 14 item 8): tokens/s and peak RSS of OLD (a path, required)
# against this build, interleaved runs -> bench/results/binary_comparison.{md,json}.
bench-compare: build setup-python
	@test -n "$(OLD)" || { echo "bench-compare: set OLD=/path/to/baseline/moecore" >&2; exit 2; }
	$(PYTHON) bench/binary_comparison.py --old $(OLD) $(ARGS)

# Benchmarks (issue 6): throughput and MFU against a GEMM peak measured in the same run, the
# PyTorch peer (transformers' OlmoeForCausalLM + AdamW, eager and torch.compile; again at 64
# experts, where its per-expert loop runs many small GEMMs), expert scaling
# 8 -> 128 experts (1 process, ep 2, ep 4), and the time per phase with and without overlapped
# gradient reduction -> bench/results/{throughput,throughput_e64,expert_scaling,breakdown}.{md,json,png}.
# Medians of 5 side-by-side repeats, about 20 minutes on 2 cores; ARGS=--quick for a short run.
bench: build setup-python $(KJV)/tokens/meta.json
	$(PYTHON) bench/throughput.py $(ARGS)
	$(PYTHON) bench/throughput.py --experts 64 --precisions fp32 --compile-precisions= $(ARGS)
	$(PYTHON) bench/expert_scaling.py $(ARGS)
	$(PYTHON) bench/breakdown.py $(ARGS)

test-cpp: build-tests
	ctest --preset release -j $(JOBS)

test-asan: build-asan
	ctest --preset asan-ubsan -j $(JOBS)

# The tests run several multi-threaded processes (ctest -j, mpirun oversubscribed) on the same cores:
# libgomp's default spin-wait at each barrier then burns the time slices the other processes need
# (ten to fifty times slower on 2 cores). The ctest presets set the same. pytest -rs prints the
# one-line reason of every skip (the two-host tests skip where `ip netns` is not permitted).
TEST_ENV := OMP_WAIT_POLICY=PASSIVE MOECORE_BIN=$(CURDIR)/build/bin/moecore
# pytest-xdist: the Python tests in parallel processes, a test file's tests in one process (its
# module fixtures are made once, and a file's tests never race each other). One process left the
# two cores 44 % idle (it waits on one moecore run at a time): 189 -> 124 s. At most 4, each
# holding its own torch (2 where JOBS is not a count).
PYTEST_WORKERS ?= $(shell n='$(JOBS)'; case $$n in (''|*[!0-9]*|0) n=2;; esac; [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile

test-reference: build build-sim setup-python
	$(TEST_ENV) $(PYTHON) -m pytest -q -rs $(PYTEST_PARALLEL) tests/reference tests/cli tests/train

# Two "hosts" (network namespaces joined by a veth pair) running mpirun over TCP only (issue 13);
# needs root and iproute2, skipped with one line where `ip netns` is not permitted. Also part of
# test-reference (tests/train).
test-two-hosts: build setup-python
	$(TEST_ENV) $(PYTHON) -m pytest -q -rs tests/train/test_two_hosts.py

test: test-cpp test-asan test-reference

# A short test target (a few minutes): the GoogleTest suite and the PyTorch/transformers oracles,
# which together need every build and Python dependency. The fresh-machine check runs it.
test-smoke: test-cpp build setup-python
	$(TEST_ENV) $(PYTHON) -m pytest -q -rs $(PYTEST_PARALLEL) tests/reference

# The fresh-machine check (not part of `make test`: it builds a Debian root with debootstrap and
# installs everything from nothing): `make train` and `make test-smoke` on a clean clone of HEAD.
# ARGS=--full runs the whole `make test` there instead.
test-fresh:
	scripts/fresh_machine_check.sh $(ARGS)

# libFuzzer on every reader of untrusted files (tests/fuzz/README.md): clang + ASan/UBSan build in
# build-fuzz/, each target SECONDS long at nice 19; findings are copied to tests/fuzz/regressions/.
SECONDS ?= 60
fuzz:
	@scripts/setup.sh fuzz
	@cmake --preset fuzz > /dev/null
	@cmake --build --preset fuzz -j $(JOBS)
	scripts/fuzz.sh $(SECONDS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf build build-debug build-asan build-fuzz
