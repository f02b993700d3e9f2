#!/usr/bin/env bash
# Packs the CUDA test and benchmark programs, built here with the `cuda` preset, into .gpu/bundle/ with every
# shared library they load except those that must match the GPU machine's driver (libcuda and
# cuBLAS/cuBLASLt, which it has) and NCCL (the toolkit's libnccl.so.2 is over 200 MiB, far more
# than the 64 MiB that travels; the GPU machine has the nvidia-nccl-cu13 wheel's, which
# gpu_check.sh finds): the C and C++ runtimes and Debian's dynamic loader included, so
# that scripts/gpu_check.sh runs them on a machine with none of moecore's Debian packages and any
# C library (the H200 machine of the device tool, which carries .gpu: `carry: [".gpu"]`).
#   scripts/gpu_bundle.sh            # then, on the GPU machine: scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset cuda > /dev/null
cmake --build --preset cuda -j "$(nproc)" --target moecore_cuda_tests moecore_bench_cuda_gemm

bundle=.gpu/bundle
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
programs=(build-cuda/bin/moecore_cuda_tests build-cuda/bin/moecore_bench_cuda_gemm)
cp "${programs[@]}" "$bundle/bin/"
for program in "${programs[@]}"; do
  ldd "$program" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/lib(cuda|cublas|cublasLt|nccl|nvidia-[a-z]+)\.so' |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$bundle/lib/"
git rev-parse HEAD > "$bundle/commit"
git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >> "$bundle/commit"
echo "gpu_bundle: $(du -sh "$bundle" | cut -f1) in $bundle ($(ls "$bundle/lib" | wc -l) libraries)"
