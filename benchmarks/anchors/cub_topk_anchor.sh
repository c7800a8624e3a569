#!/usr/bin/env bash
# cub::DeviceBatchedTopK / cub::DeviceTopK (CCCL >= 3.3) on topk_bench's shapes, timed as
# topk_bench times kvc (benchmarks/anchors/cub_topk_anchor.cu says how), on the GPU machine.
# The headers come from the PyPI wheel nvidia-cuda-cccl, not from the toolkit (whose CCCL, which
# the kvc library builds with, has no top-k); they are placed before the toolkit's for this one
# program only.
#
# Usage: benchmarks/anchors/cub_topk_anchor.sh [OUT_DIR]      (default $OUT, else .)
#   The headers: $CCCL_INCLUDE (a folder holding cub/, thrust/, cuda/), else the wheel in .whl/
#   (here: python3 -m pip download --no-deps -d .whl "nvidia-cuda-cccl==13.3.*"), unpacked
#   into /tmp. Writes cub_topk_anchor.json. Needs nvcc >= 12.x.
#   CUB_TOPK_ANCHOR_BIN: a binary built elsewhere from this .cu with those headers (the anchor
#   bundle's, setup-anchors.sh): run instead of compiling; compiled here only when that binary
#   cannot run here (it does not start, or has no kernel image for this GPU).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${OUT:-.}}"
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
summary() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(f\"{r['name']:36s} {r['us']:9.2f} us\") for r in d['rows']]" "$out/cub_topk_anchor.json"
}
if [ -n "${CUB_TOPK_ANCHOR_BIN:-}" ] && [ -x "$CUB_TOPK_ANCHOR_BIN" ]; then
  "$CUB_TOPK_ANCHOR_BIN" > "$out/cub_topk_anchor.json" 2> /tmp/cub_topk_anchor.err
  rc=$?
  cat /tmp/cub_topk_anchor.err >&2
  [ $rc -eq 0 ] && { summary; exit 0; }
  if [ $rc -ne 126 ] && [ $rc -ne 127 ] &&
     ! grep -qi 'no kernel image\|invalid device function\|GLIBC\|error while loading' /tmp/cub_topk_anchor.err; then
    exit 1  # it ran and failed: a rebuild would fail the same way
  fi
  echo "cub_topk_anchor: the prebuilt $CUB_TOPK_ANCHOR_BIN cannot run here (exit $rc); compiling it" >&2
fi
inc="${CCCL_INCLUDE:-}"
if [ -z "$inc" ]; then
  whl=$(ls "$repo"/.whl/nvidia_cuda_cccl-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { echo "cub_topk_anchor: no CCCL_INCLUDE and no nvidia_cuda_cccl wheel in .whl/" >&2; exit 1; }
  rm -rf /tmp/cccl-anchor && mkdir -p /tmp/cccl-anchor
  python3 -m zipfile -e "$whl" /tmp/cccl-anchor || exit 1
  inc=$(dirname "$(find /tmp/cccl-anchor -path '*/cub/version.cuh' | head -1)")
  inc=$(dirname "$inc")
fi
[ -f "$inc/cub/device/device_topk.cuh" ] || { echo "cub_topk_anchor: no cub/device/device_topk.cuh under $inc" >&2; exit 1; }
nvcc -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr --extended-lambda -I"$inc" \
  "$here/cub_topk_anchor.cu" -o /tmp/cub_topk_anchor 2> "$out/cub_topk_anchor_build.log" ||
  { echo "cub_topk_anchor: build failed, see $out/cub_topk_anchor_build.log" >&2; exit 1; }
/tmp/cub_topk_anchor > "$out/cub_topk_anchor.json" || exit 1
summary
