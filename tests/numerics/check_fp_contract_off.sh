#!/usr/bin/env bash
# Numerics.FpContractOff: every engine source is compiled with -ffp-contract=off.
#
# GCC fuses a*b+c into one FMA by default, in ISO C++ mode too, wherever the target has FMA: in
# the AVX2 and AVX-512 clones of core/simd.h's loops but not in their baseline clone. A fused
# expression rounds once where the source rounds twice, so a step's bits would depend on the
# clone a CPU picks, the tests (compiled for the baseline) would check other arithmetic than the
# engine runs, and the CUDA kernels (which round every product and sum alone, _rn) would part from
# the host. Where a fused multiply-add is wanted it is written out (std::fma: one rounding in every
# clone, the instruction or libm's exact fma), never left to the compiler. This check reads the
# build's compile_commands.json and names every C++ compile of engine code whose command lacks
# -ffp-contract=off or asks for another mode: a file under SOURCE_DIR/src, the emulated GPU's
# kernels (<build>/cuda_sim/*.cu.cpp), and the unity batches of the engine's targets (the
# sanitizers' preset compiles those instead of the files). nvcc's commands (device code: -fmad)
# are not its business.
# Usage: check_fp_contract_off.sh SOURCE_DIR COMPILE_COMMANDS_JSON
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: check_fp_contract_off.sh SOURCE_DIR COMPILE_COMMANDS_JSON" >&2
  exit 2
fi
source_dir=$1
commands=$2
if [[ ! -s $commands ]]; then
  echo "check_fp_contract_off: $commands is missing or empty (CMAKE_EXPORT_COMPILE_COMMANDS)" >&2
  exit 2
fi
# CMake writes each entry's "command" line before its "file" line.
result=$(awk -v src="$source_dir/src/" '
  /^ *"command": / { command = $0 }
  /^ *"file": / {
    file = $0
    sub(/^ *"file": "/, "", file); sub(/",?$/, "", file)
    engine = index(file, src) == 1 || file ~ /\/cuda_sim\/[^\/]*\.cu\.cpp$/ ||
             file ~ /\/CMakeFiles\/moecore(_(core|kernels|model|optim|io|data|dist|train|plan|cli|kernels_cuda|dist_nccl|cuda_sim_backend))?\.dir\/Unity\//
    if (!engine || command ~ /^ *"command": "[^ ]*nvcc /) next  # the compiler, not a path
    checked++
    if (command !~ / -ffp-contract=off( |$)/ || command ~ / -ffp-contract=(fast|on)( |$)/) {
      print "  " file; bad++
    }
  }
  END { printf "%d %d\n", checked, bad }' "$commands")
counts=$(tail -n 1 <<<"$result")
checked=${counts% *}
bad=${counts#* }
if [[ $checked -eq 0 ]]; then
  echo "check_fp_contract_off: no engine source in $commands" >&2
  exit 2
fi
if [[ $bad -ne 0 ]]; then
  echo "check_fp_contract_off: $bad of $checked engine sources compiled without -ffp-contract=off:"
  head -n -1 <<<"$result"
  exit 1
fi
echo "check_fp_contract_off: $checked engine sources, all with -ffp-contract=off"
