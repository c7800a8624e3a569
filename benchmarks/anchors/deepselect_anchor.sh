#!/usr/bin/env bash
# DeepSelect (github.com/deepseek-ai/DeepSelect, a PyTorch CUDA extension) as an anchor for kvc's
# top-k, on the GPU machine: builds it for sm_90a from a source folder outside kvc's history
# (never committed; ignore it with .git/info/exclude and carry it to the GPU machine), then runs
# benchmarks/anchors/deepselect_anchor.py, which times deep_select.topk, and torch.topk beside it,
# on topk_bench's shapes exactly as benchmarks/topk_bench.cu times kvc (CUDA-graph replay, inputs
# rotated past 2x L2, medians) and writes deepselect_anchor.json.
#
# Usage: benchmarks/anchors/deepselect_anchor.sh [SRC] [OUT_DIR]
#   SRC      DeepSelect's source tree (default .anchors/DeepSelect): its setup.py, csrc/, deep_select/,
#            tests/kernelkit/ and scripts/. The CUTLASS headers it includes (its git submodule
#            csrc/3rdparty/cutlass) come from SRC when checked out there, else from
#            $CUTLASS_INCLUDE (a folder holding cutlass/ and cute/), else from the PyPI wheel
#            nvidia-cutlass (cutlass_library/source/include inside it) when one lies in .whl/
#            (here: python3 -m pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0).
#   OUT_DIR  where the JSON and the build log go (default $OUT, else .)
# Environment: DEEPSELECT_REUSE=1 keeps a previous build in /tmp/deepselect-build (a second call on
# the same warm machine); DEEPSELECT_ONLY_BUILD=1 stops after the build.
#
# Needs on that machine, and downloads nothing: python3 with torch (CUDA) and setuptools, nvcc >= 12.3,
# ninja (torch's extension builder runs it, MAX_JOBS jobs), and a C++20 host compiler with
# <format> (DeepSelect's api.cpp uses std::format: g++ >= 13). Each missing piece stops the script
# with a line saying which. The build compiles DeepSelect's ~90 translation units (every dtype,
# index type and flag combination its dispatch instantiates); time it with the first call. Its
# setup.py fails a build whose kernels spill registers; that check is switched off here
# (DEEP_SELECT_DISABLE_REG_SPILL_CHECK=1) so that an sm_90a spill costs speed, not the anchor:
# the build log keeps ptxas's spill lines.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${1:-$repo/.anchors/DeepSelect}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
work=/tmp/deepselect-build
log="$out/deepselect_build.log"
fail() { echo "deepselect_anchor: $*" | tee -a "$log" >&2; exit 1; }
: > "$log"

[ -f "$src/setup.py" ] && [ -d "$src/csrc" ] || fail "no DeepSelect source at $src (setup.py, csrc/)"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || fail "no nvcc"
export PATH="$PATH:/usr/local/cuda/bin"
python3 -c 'import torch, setuptools; assert torch.cuda.is_available()' 2>>"$log" ||
  fail "python3 lacks torch with a CUDA device, or setuptools"
echo '#include <format>
int main() { return static_cast<int>(std::format("{}", 1).size()) - 1; }' > /tmp/ds_format.cpp
"${CXX:-c++}" -std=c++20 /tmp/ds_format.cpp -o /tmp/ds_format 2>>"$log" ||
  fail "the host compiler ($("${CXX:-c++}" --version | head -1)) has no C++20 <format>; DeepSelect's api.cpp needs it (g++ >= 13)"

if [ "${DEEPSELECT_REUSE:-0}" != 1 ] || ! ls "$work"/site/deep_select/deep_select_cuda*.so >/dev/null 2>&1; then
  rm -rf "$work" && mkdir -p "$work" && cp -a "$src/." "$work/src" || fail "cannot copy $src"
  cutlass="$work/src/csrc/3rdparty/cutlass/include"
  if [ ! -f "$cutlass/cutlass/cutlass.h" ]; then
    mkdir -p "$cutlass"
    if [ -n "${CUTLASS_INCLUDE:-}" ] && [ -f "$CUTLASS_INCLUDE/cutlass/cutlass.h" ]; then
      cp -a "$CUTLASS_INCLUDE/." "$cutlass/"
    elif whl=$(ls "$repo"/.whl/nvidia_cutlass-*.whl 2>/dev/null | head -1) && [ -n "$whl" ]; then
      python3 - "$whl" "$cutlass" <<'EOF' || fail "cannot unpack CUTLASS from $whl"
import sys, zipfile, os
whl, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            path = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(z.read(name))
EOF
    else
      fail "no CUTLASS headers: check out DeepSelect's submodule csrc/3rdparty/cutlass, set CUTLASS_INCLUDE, or put the nvidia-cutlass wheel in .whl/"
    fi
    echo "CUTLASS headers: $(grep -m1 -o 'CUTLASS_MAJOR [0-9]*' "$cutlass/cutlass/version.h") $(grep -m1 -o 'CUTLASS_MINOR [0-9]*' "$cutlass/cutlass/version.h") (not DeepSelect's pinned submodule)" | tee -a "$log"
  fi
  # The explicit instantiations are generated files; make them when the tree lacks them.
  for d in csrc/cuda_kernels/v3/instantiations csrc/cuda_kernels/v3_fp32/instantiations \
           csrc/cuda_kernels/v3_cluster/instantiations; do
    if [ ! -d "$work/src/$d" ] && [ -f "$work/src/scripts/generate_instantiations.py" ]; then
      (cd "$work/src" && python3 scripts/generate_instantiations.py "$d" >> "$log" 2>&1) ||
        fail "generating $d failed"
    fi
  done
  start=$(date +%s)
  (cd "$work/src" &&
     DEEP_SELECT_CUDA_ARCHS=90a DEEP_SELECT_BUILD_TARGET_PLATFORM=CUDA \
     DEEP_SELECT_DISABLE_REG_SPILL_CHECK=1 \
     MAX_JOBS="${MAX_JOBS:-$(nproc)}" NVCC_THREADS="${NVCC_THREADS:-1}" \
     python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
       --target "$work/site" -v . >> "$log" 2>&1) ||
    fail "the build failed after $(( $(date +%s) - start )) s: the end of $log says why"
  echo "DeepSelect built in $(( $(date +%s) - start )) s" | tee -a "$log"
fi
[ "${DEEPSELECT_ONLY_BUILD:-0}" = 1 ] && exit 0
PYTHONUNBUFFERED=1 PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" \
  python3 "$here/deepselect_anchor.py" --out "$out/deepselect_anchor.json"
