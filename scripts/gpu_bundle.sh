#!/usr/bin/env bash
# Packs the CUDA test and benchmark programs, built here with the `cuda` preset, into .gpu/bundle/ with every
# shared library they load except those that must match the GPU machine's driver (libcuda and
# cuBLAS/cuBLASLt, which it has) and NCCL (the toolkit's libnccl.so.2 is over 200 MiB, far more
# than the 64 MiB that travels; the GPU machine has the nvidia-nccl-cu13 wheel's, which
# gpu_check.sh finds): the C and C++ runtimes and Debian's dynamic loader included, so
# that scripts/gpu_check.sh runs them on a machine with none of moecore's Debian packages and any
# C library (the H200 machine of the device tool, which carries .gpu: `carry: [".gpu"]`).
# With them: the `moecore` program of the cuda preset (which selects the GPU for `train --device
# cuda`), the default run's token files and tokenizer, and the CPU's loss curves of the GPU
# check's training runs (200 steps of the default run in fp32, bf16 and mxfp8, made here by the same
# program), against which gpu_check.sh holds the GPU's. Packed as .gpu/bundle.tar.xz: oneDNN's
# library alone is 38 MiB unpacked.
#   scripts/gpu_bundle.sh            # then, on the GPU machine: scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_train_args.sh

cmake --preset cuda > /dev/null
cmake --build --preset cuda -j "$(nproc)" --target moecore_cuda_tests moecore_bench_cuda_gemm moecore
# The default run's data (`make train` makes it too); made only when missing: the make target
# depends on the release build and the system set-up, which would rebuild build/ for nothing.
[[ -f data/kjv/tokens/meta.json ]] || make data/kjv/tokens/meta.json > /dev/null

bundle=.gpu/bundle
rm -rf "$bundle" .gpu/bundle.tar.xz
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/data" "$bundle/cpu_runs"
programs=(build-cuda/bin/moecore_cuda_tests build-cuda/bin/moecore_bench_cuda_gemm build-cuda/bin/moecore)
cp "${programs[@]}" "$bundle/bin/"
for program in "${programs[@]}"; do
  ldd "$program" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/lib(cuda|cublas|cublasLt|nccl|nvidia-[a-z]+)\.so' |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$bundle/lib/"
cp -r data/kjv "$bundle/data/"
# The CPU's curves, which the GPU runs of gpu_check.sh repeat.
for precision in fp32 bf16 mxfp8; do
  run_dir=$(mktemp -d)
  OMP_WAIT_POLICY=PASSIVE build-cuda/bin/moecore train configs/default.toml \
    $(gpu_train_args "$precision" "$run_dir/run") > "$run_dir/log" 2>&1 ||
    { cat "$run_dir/log" >&2; exit 1; }
  cp "$run_dir/run/metrics.jsonl" "$bundle/cpu_runs/$precision.jsonl"
  rm -rf "$run_dir"
done
git rev-parse HEAD > "$bundle/commit"
git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >> "$bundle/commit"
unpacked=$(du -sh "$bundle" | cut -f1)
tar -C .gpu -cJf .gpu/bundle.tar.xz bundle
rm -rf "$bundle"
echo "gpu_bundle: $(du -sh .gpu/bundle.tar.xz | cut -f1) in .gpu/bundle.tar.xz ($unpacked unpacked)"
