#!/usr/bin/env bash
# Builds benchmarks/anchors/deepselect_topk_anchor.cu (kvc's standalone harness around DeepSelect's
# fp32 top-k kernel, csrc/cuda_kernels/v3_fp32; no torch) for sm_90a, HERE or on the GPU machine: a
# machine with nvcc, no GPU needed. The DeepSelect source tree stays outside kvc's history
# (.anchors/DeepSelect, git-ignored via .git/info/exclude; its PROVENANCE.txt says where each file
# came from, and its first line is compiled into the binary's JSON as "deepselect").
#
# Usage: benchmarks/anchors/deepselect_topk_anchor.sh [SRC] [BIN]
#   SRC  DeepSelect's tree (default .anchors/DeepSelect): csrc/cuda_kernels/v3_fp32/topk_select.cuh
#        and what it includes (csrc/structs.h, csrc/cuda_kernels/{config.h,utils.cuh,bit_utils.cuh,
#        common_parts.cuh}, csrc/3rdparty/kerutils/include); where no snapshot of the repository can
#        be fetched, deepselect-provenance.txt beside this script lists where the thirty-fifth
#        session read each file from instead
#   BIN  the binary (default .anchors/p1/bin/deepselect_topk_anchor; the anchor bundle's folder, so
#        a device call that carries .anchors/p1/bin gets it: run-anchors.sh's anchor deepselect_bin)
# Needs: nvcc >= 12.8 with C++20 (default /usr/local/cuda/bin/nvcc, or $NVCC; built and checked with
#   13.0 and g++ 12), and CUTLASS headers (cutlass/, cute/): SRC/csrc/3rdparty/cutlass/include when
#   present, else $CUTLASS_INCLUDE, else the PyPI wheel in .whl/ unpacked into /tmp (here:
#   python3 -m pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0). CUB comes from the toolkit.
# Flags follow DeepSelect's setup.py (-O3 -std=c++20 --use_fast_math --ftz=false ..., ptxas -v with
#   --warn-on-spills); the log goes to /tmp/deepselect_topk_anchor_build.log and its spill lines are
#   printed. The binary needs no libcuda at link time (the TMA encoder is found through the runtime).
#   Skipped when BIN is newer than the .cu and every file under SRC/csrc (DEEPSELECT_TOPK_FORCE=1
#   rebuilds).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${1:-$repo/.anchors/DeepSelect}"
bin="${2:-$repo/.anchors/p1/bin/deepselect_topk_anchor}"
nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
log=/tmp/deepselect_topk_anchor_build.log
fail() { echo "deepselect_topk_anchor: $*" >&2; exit 1; }

[ -f "$src/csrc/cuda_kernels/v3_fp32/topk_select.cuh" ] && [ -d "$src/csrc/3rdparty/kerutils/include" ] ||
  fail "no DeepSelect fp32 tree at $src (csrc/cuda_kernels/v3_fp32/topk_select.cuh, csrc/3rdparty/kerutils/include)"
[ -x "$nvcc" ] || nvcc="$(command -v nvcc || true)"
[ -n "$nvcc" ] && [ -x "$nvcc" ] || fail "no nvcc (set NVCC)"
if [ "${DEEPSELECT_TOPK_FORCE:-0}" != 1 ] && [ -x "$bin" ] && [ "$bin" -nt "$here/deepselect_topk_anchor.cu" ] &&
   [ -z "$(find "$src/csrc" -newer "$bin" -print -quit)" ]; then
  echo "deepselect_topk_anchor: $bin is up to date"
  exit 0
fi

cutlass="$src/csrc/3rdparty/cutlass/include"
if [ ! -f "$cutlass/cutlass/cutlass.h" ]; then
  if [ -n "${CUTLASS_INCLUDE:-}" ] && [ -f "$CUTLASS_INCLUDE/cutlass/cutlass.h" ]; then
    cutlass="$CUTLASS_INCLUDE"
  else
    whl=$(ls "$repo"/.whl/nvidia_cutlass-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || fail "no CUTLASS headers: put them in $src/csrc/3rdparty/cutlass/include, set CUTLASS_INCLUDE, or put the nvidia-cutlass wheel in .whl/"
    unpack=/tmp/deepselect-topk-cutlass
    if [ ! -f "$unpack/cutlass_library/source/include/cutlass/cutlass.h" ]; then
      rm -rf "$unpack" && mkdir -p "$unpack"
      python3 -m zipfile -e "$whl" "$unpack" || fail "cannot unpack $whl"
    fi
    cutlass="$unpack/cutlass_library/source/include"
  fi
fi
[ -f "$cutlass/cute/arch/copy_sm90_tma.hpp" ] || fail "no cute/arch/copy_sm90_tma.hpp under $cutlass"

# The summary line of PROVENANCE.txt, without quotes or backslashes, goes into the JSON.
prov="$(head -1 "$src/PROVENANCE.txt" 2>/dev/null | tr -d '"\\' | cut -c1-400)"
cuda_home="$(cd "$(dirname "$nvcc")/.." && pwd)"
mkdir -p "$(dirname "$bin")"
start=$(date +%s)
"$nvcc" -O3 -std=c++20 -DNDEBUG -DDEEP_SELECT_IS_BUILD_ON_CUDA -Wno-deprecated-declarations \
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ \
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda \
  --use_fast_math --ftz=false "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills" -lineinfo \
  -gencode=arch=compute_90a,code=sm_90a \
  "-DDS_PROVENANCE=\"${prov:-unknown}\"" \
  -I"$src/csrc" -I"$cutlass" -I"$src/csrc/3rdparty/kerutils/include" \
  -I"$cuda_home/targets/x86_64-linux/include/cccl" \
  "$here/deepselect_topk_anchor.cu" -o "$bin.tmp" > "$log" 2>&1 ||
  { tail -30 "$log" >&2; rm -f "$bin.tmp"; fail "the build failed after $(( $(date +%s) - start )) s (log: $log)"; }
mv -f "$bin.tmp" "$bin"
echo "deepselect_topk_anchor: built $bin in $(( $(date +%s) - start )) s with $("$nvcc" --version | tail -1); CUTLASS $cutlass"
grep -A3 "Compiling entry function '_ZN16topk_select_fp32" "$log" | grep -o 'Used [0-9]* registers.*\|[0-9]* bytes spill stores, [0-9]* bytes spill loads' |
  paste - - | sort | uniq -c | sed 's/^/  ptxas (topk_select_fp32 kernels): /'
grep -i 'warning' "$log" | sed 's/^/  /' | head -20
exit 0
