#!/usr/bin/env bash
# DeepGEMM (github.com/deepseek-ai/DeepGEMM, a PyTorch extension that JIT-compiles its kernels) as
# the anchor of kvc's DeepSeek-V4 indexer decode, on the GPU machine: builds its wheel from the
# source archives in the bundle folder (never committed), installs it into a private folder, then
# runs benchmarks/anchors/deepgemm_anchor.py (its SM90 FP8 paged MQA logits on dsv4_bench's
# indexer shape) and writes deepgemm.json.
#
# Usage: benchmarks/anchors/deepgemm_anchor.sh [BUNDLE] [OUT_DIR]
#   BUNDLE   a folder (default .anchors/deepgemm) holding deepgemm-*.tar.xz (a `git archive
#            --prefix=DeepGEMM/` of DeepGEMM; made from 54e2261, 2026-12-04),
#            cutlass-*-include.tar.xz and fmt-*-include.tar.xz (`git archive --prefix=cutlass/`
#            / `--prefix=fmt/` of the include/ folders of its two submodules at their pinned
#            commits, f3fde58 and 553ec11). About 1.3 MB in all: carry [".anchors/deepgemm"].
#            Its MANIFEST says how they were made.
#   OUT_DIR  where deepgemm.json and the build log go (default $OUT, else .)
# Environment: DEEPGEMM_REUSE=1 keeps a previous install in /tmp/deepgemm-build (a second call on
# the same warm machine); DEEPGEMM_ONLY_BUILD=1 stops after the install.
#
# Needs on that machine, and downloads nothing: python3 with torch (CUDA), setuptools, wheel,
# packaging and pip; nvcc (CUDA_HOME, default /usr/local/cuda), which DeepGEMM also runs at the
# first call of each kernel. Its setup.py builds locally (DG_USE_LOCAL_VERSION, the default,
# never downloads a prebuilt wheel). The first build was not timed here.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="${1:-$repo/.anchors/deepgemm}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work=/tmp/deepgemm-build
log="$out/deepgemm_build.log"
py="${PYTHON:-python3}"
fail() { echo "deepgemm_anchor: $*" | tee -a "$log" >&2; exit 1; }
: > "$log"

src_tar=$(ls "$bundle"/deepgemm-*.tar.xz 2>/dev/null | head -1)
cutlass_tar=$(ls "$bundle"/cutlass-*-include.tar.xz 2>/dev/null | head -1)
fmt_tar=$(ls "$bundle"/fmt-*-include.tar.xz 2>/dev/null | head -1)
[ -n "$src_tar" ] && [ -n "$cutlass_tar" ] && [ -n "$fmt_tar" ] ||
  fail "the bundle $bundle lacks deepgemm-*.tar.xz, cutlass-*-include.tar.xz or fmt-*-include.tar.xz"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$PATH:$CUDA_HOME/bin"
command -v nvcc >/dev/null || fail "no nvcc"
"$py" -c "import torch, setuptools, wheel, packaging; assert torch.cuda.is_available()" 2>>"$log" ||
  fail "python3 lacks torch with CUDA, setuptools, wheel or packaging"

site="$work/site"
if [ "${DEEPGEMM_REUSE:-0}" = 1 ] && [ -d "$site/deep_gemm" ]; then
  echo "deepgemm_anchor: reusing the install in $site" >> "$log"
else
  rm -rf "$work" && mkdir -p "$work"
  tar -xJf "$src_tar" -C "$work" || fail "cannot unpack $src_tar"
  tp="$work/DeepGEMM/third-party"
  rm -rf "$tp/cutlass" "$tp/fmt" && mkdir -p "$tp"
  tar -xJf "$cutlass_tar" -C "$tp" && tar -xJf "$fmt_tar" -C "$tp" || fail "cannot unpack the submodules"
  start=$(date +%s)
  (cd "$work/DeepGEMM" && MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$py" setup.py bdist_wheel) >> "$log" 2>&1 ||
    fail "build failed after $(( $(date +%s) - start )) s (log: $log)"
  "$py" -m pip install --no-deps --no-index --target "$site" "$work"/DeepGEMM/dist/*.whl >> "$log" 2>&1 ||
    fail "pip could not install the wheel into $site"
  echo "deepgemm_anchor: built and installed in $(( $(date +%s) - start )) s" | tee -a "$log"
fi
[ "${DEEPGEMM_ONLY_BUILD:-0}" = 1 ] && exit 0
# Its kernels compile at the first call into DG_JIT_CACHE_DIR (default $HOME/.deep_gemm). The first
# run on the H200 (2026-12-04) died of a segmentation fault 14 s in, with no Python trace:
# faulthandler prints the Python stack of a fatal signal, DG_JIT_DEBUG=1 (DEEPGEMM_DEBUG=1) the
# JIT's steps.
export DG_JIT_CACHE_DIR="${DG_JIT_CACHE_DIR:-$work/jit-cache}"
[ "${DEEPGEMM_DEBUG:-0}" = 1 ] && export DG_JIT_DEBUG=1
run_anchor() {
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$py" -X faulthandler "$here/deepgemm_anchor.py" \
    --out "$out/deepgemm.json"
}
run_anchor
rc=$?
if [ $rc -eq 139 ] || [ $rc -eq 134 ]; then
  # The runs of 2026-12-04 died inside get_paged_mqa_logits_metadata, the first call that
  # JIT-compiles a kernel, NVRTC or nvcc alike, before the JIT printed anything (its log is C
  # stdio: line-buffered here by stdbuf); under gdb, where the machine has it, the native stack.
  echo "deepgemm_anchor: exit $rc; again with DG_JIT_DEBUG=1" >&2
  DG_JIT_DEBUG=1 PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" stdbuf -oL -eL "$py" -X faulthandler \
    "$here/deepgemm_anchor.py" --out "$out/deepgemm.json" 2>&1 | tail -60 >&2
  if command -v gdb >/dev/null; then
    echo "deepgemm_anchor: under gdb" >&2
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout 120 gdb -q -batch -ex run -ex bt \
      -ex "info sharedlibrary" --args "$py" "$here/deepgemm_anchor.py" --out "$out/deepgemm.json" \
      2>&1 | grep -vE "^\[(New|Thread) " | tail -80 >&2
  else
    echo "deepgemm_anchor: no gdb on this machine" >&2
  fi
  echo "deepgemm_anchor: and with DG_JIT_USE_NVRTC=1" >&2
  DG_JIT_USE_NVRTC=1 run_anchor
  rc=$?
fi
exit $rc
