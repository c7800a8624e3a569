#!/usr/bin/env bash
# FlashMLA (github.com/deepseek-ai/FlashMLA, a PyTorch CUDA extension) as the anchor of kvc's
# DeepSeek-V4 sparse attention, on the GPU machine: builds its SM90 kernels (sm_90a only) from the
# source archives in the bundle folder (never committed), then runs
# benchmarks/anchors/flashmla_anchor.py, which times its sparse FP8 decode on dsv4_bench's shapes
# and writes flashmla.json.
#
# Usage: benchmarks/anchors/flashmla_anchor.sh [BUNDLE] [OUT_DIR]
#   BUNDLE   a folder (default .anchors/flashmla) holding flashmla-*.tar.xz (a `git archive
#            --prefix=FlashMLA/` of FlashMLA; made from 9241ae3, 2026-12-04) and
#            cutlass-*-include.tar.xz (a `git archive --prefix=cutlass/` of CUTLASS's include/
#            and tools/util/include at FlashMLA's submodule commit, 147f567). About 1.3 MB in
#            all: carry [".anchors/flashmla"]. To make them, from checkouts of both repositories:
#              git -C FlashMLA archive --prefix=FlashMLA/ HEAD | xz > flashmla-<rev>.tar.xz
#              git -C cutlass archive --prefix=cutlass/ <submodule rev> include tools/util/include \
#                | xz > cutlass-<rev>-include.tar.xz
#   OUT_DIR  where flashmla.json and the build log go (default $OUT, else .)
# Environment: FLASHMLA_REUSE=1 keeps a previous build in /tmp/flashmla-build (a second call on
# the same warm machine), or finishes an unfinished one there; FLASHMLA_ONLY_BUILD=1 stops after
# the build.
#
# Needs on that machine, and downloads nothing: python3 with torch (CUDA), setuptools and ninja
# (torch's extension builder), nvcc >= 12.3 and a C++20 host compiler. FlashMLA's setup.py builds
# every source it lists; FLASH_MLA_DISABLE_SM100=1 gives them sm_90a code only (its SM100 kernels
# are compiled out by their own architecture guards). Its first build was not timed here.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="${1:-$repo/.anchors/flashmla}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work=/tmp/flashmla-build
log="$out/flashmla_build.log"
py="${PYTHON:-python3}"
fail() { echo "flashmla_anchor: $*" | tee -a "$log" >&2; exit 1; }
: > "$log"

src_tar=$(ls "$bundle"/flashmla-*.tar.xz 2>/dev/null | head -1)
cutlass_tar=$(ls "$bundle"/cutlass-*-include.tar.xz 2>/dev/null | head -1)
[ -n "$src_tar" ] || fail "no flashmla-*.tar.xz in $bundle"
[ -n "$cutlass_tar" ] || fail "no cutlass-*-include.tar.xz in $bundle"
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || fail "no nvcc"
"$py" -c "import torch, setuptools; assert torch.cuda.is_available()" 2>>"$log" ||
  fail "python3 lacks torch with CUDA or setuptools"
command -v ninja >/dev/null || "$py" -c "import ninja" 2>/dev/null ||
  echo "flashmla_anchor: no ninja; torch builds the extension serially (slow)" | tee -a "$log"

# CUTLASS's headers include <cuda/std/...>, which CUDA 13 keeps under include/cccl: nvcc finds
# it, the host compiler of FlashMLA's C++ sources (api.cpp) does not (the first run on the H200,
# 2026-12-04, failed there after 23 of 24 objects).
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
export CPLUS_INCLUDE_PATH="$cuda_home/include/cccl:$cuda_home/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"

if [ "${FLASHMLA_REUSE:-0}" = 1 ] && ls "$work"/FlashMLA/flash_mla/cuda*.so >/dev/null 2>&1; then
  echo "flashmla_anchor: reusing the build in $work" >> "$log"
else
  if [ "${FLASHMLA_REUSE:-0}" = 1 ] && [ -f "$work/FlashMLA/setup.py" ]; then
    # An unfinished build on this machine: ninja compiles only what is missing.
    echo "flashmla_anchor: resuming the build in $work" | tee -a "$log"
  else
    rm -rf "$work" && mkdir -p "$work"
    tar -xJf "$src_tar" -C "$work" || fail "cannot unpack $src_tar"
    rm -rf "$work/FlashMLA/csrc/cutlass"
    tar -xJf "$cutlass_tar" -C "$work/FlashMLA/csrc" || fail "cannot unpack $cutlass_tar"
  fi
  start=$(date +%s)
  (cd "$work/FlashMLA" &&
    FLASH_MLA_DISABLE_SM100=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" NVCC_THREADS="${NVCC_THREADS:-4}" \
      "$py" setup.py build_ext --inplace) >> "$log" 2>&1 ||
    fail "build failed after $(( $(date +%s) - start )) s (log: $log)"
  echo "flashmla_anchor: built in $(( $(date +%s) - start )) s" | tee -a "$log"
fi
[ "${FLASHMLA_ONLY_BUILD:-0}" = 1 ] && exit 0
PYTHONPATH="$work/FlashMLA${PYTHONPATH:+:$PYTHONPATH}" "$py" -X faulthandler "$here/flashmla_anchor.py" \
  --out "$out/flashmla.json"
