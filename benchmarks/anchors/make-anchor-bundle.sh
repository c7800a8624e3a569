#!/usr/bin/env bash
# Builds the peer-anchor bundle for the GPU machine HERE (a machine with PyPI access and nvcc, no
# GPU needed): the GPU machine has no network, so everything the anchors need beyond its image is
# prepared here into the git-ignored folder .anchors/ and carried (benchmarks/anchors/
# setup-anchors.sh says how). Run from the repository root; takes ~20 min on 2 cores (the
# FlashInfer kernel modules), most of it nvcc.
#
#   benchmarks/anchors/make-anchor-bundle.sh [FLASHINFER_WHEEL]
#     FLASHINFER_WHEEL  flashinfer_python-0.7.x-py3-none-any.whl (default: downloaded from PyPI,
#                       flashinfer-python==$FLASHINFER_VERSION, default 0.7.4)
#   Environment: BUNDLE (the output folder, default .anchors of this checkout: run it in the
#   checkout the device call sends), WORK (scratch, default /tmp/anchor-bundle), PYTHON312 (a python3.12, default
#   the first of python3.12 / pyenv's 3.12.*), MAX_JOBS (nvcc jobs, default 2), NVCC
#   (default /usr/local/cuda/bin/nvcc; CUDA 13.0 like the GPU machine), FI_MODULES (the
#   flashinfer_prebuild.py module names to build, default all: decode_fp16 decode_fp8
#   prefill_fp16 prefill_fp8 topk; one left out is compiled on the GPU machine when .anchors/p2
#   is carried).
#
# What it writes (nothing is committed; .anchors/ must be in .git/info/exclude):
#   .anchors/p1/flashinfer-sm90a.tar.xz  flashinfer's Python files (no kernel sources, headers or
#                                        unrelated .so files) and its dist-info, plus the kernel
#                                        modules the anchors use, compiled for sm_90a by
#                                        flashinfer_prebuild.py into flashinfer/data/aot/
#   .anchors/p1/wheels/                  apache-tvm-ffi (flashinfer's one import that the GPU
#                                        machine lacks) and nvidia-cuda-cccl 13.3 (CUB top-k headers)
#   .anchors/p1/bin/cub_topk_anchor      cub_topk_anchor.cu built here with those headers, sm_90
#   .anchors/p1/bin/deepselect_topk_anchor  deepselect_topk_anchor.cu built here for sm_90a, only when
#                                        .anchors/DeepSelect holds a DeepSelect source tree
#   .anchors/p1/MANIFEST                 versions, sizes and sha256 of the above
#   .anchors/p2/flashinfer-jit-sources.tar.xz  optional: what FlashInfer's JIT needs to compile a
#                                        module on the GPU machine (setup-anchors.sh does, for
#                                        a module the check finds missing)
# A piece over 60 MB is split into .partNN files of 60 MB, each in its own folder .anchors/p3, p4,
# ... (one carry path per device call); setup-anchors.sh joins them.
#   .anchors/pfi0, pfi1, ...             flashinfer-sm90a.tar.xz again, as .partNN files of
#                                        FI_PART_MB (9) MB, one folder each, for the calls that
#                                        cannot carry the whole archive beside the tree
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
here="$repo/benchmarks/anchors"
work="${WORK:-/tmp/anchor-bundle}"
nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
fi_version="${FLASHINFER_VERSION:-0.7.4}"
# A python3.12 that runs (a pyenv shim answers `command -v` but fails when 3.12 is not the
# selected version, so each candidate is tried).
py="${PYTHON312:-}"
if [ -z "$py" ]; then
  for cand in "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12.*/bin/python; do
    if [ -x "$cand" ] && "$cand" -c 'import sys' >/dev/null 2>&1; then py=$cand; break; fi
  done
fi
[ -n "$py" ] && [ -x "$py" ] || { echo "make-anchor-bundle: no python3.12 (set PYTHON312)" >&2; exit 1; }
[ -x "$nvcc" ] || { echo "make-anchor-bundle: no nvcc at $nvcc (set NVCC)" >&2; exit 1; }
bundle="${BUNDLE:-$repo/.anchors}"
out="$bundle/p1"
mkdir -p "$work" "$out/wheels" "$out/bin"
exclude="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.anchors/' "$exclude" 2>/dev/null || echo '/.anchors/' >> "$exclude"

# 1. A python3.12 venv with torch 2.11 (the GPU machine's version) and FlashInfer with its deps.
if [ ! -x "$work/venv/bin/python" ]; then "$py" -m venv "$work/venv"; fi
vpy="$work/venv/bin/python"
whl="${1:-}"
if [ -z "$whl" ]; then
  "$vpy" -m pip download -q --no-deps -d "$work/dl" "flashinfer-python==$fi_version"
  whl=$(ls "$work"/dl/flashinfer_python-"$fi_version"-*.whl)
fi
"$vpy" -m pip install -q torch==2.11.0 "$whl"
# torch needs a libcuda.so.1 to import; the toolkit's stub does for building.
mkdir -p "$work/stub" && ln -sf "$(dirname "$nvcc")/../lib64/stubs/libcuda.so" "$work/stub/libcuda.so.1"
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# 2. The kernel modules, for sm_90a, into the staged package's data/aot.
stage="$work/stage"
rm -rf "$stage" && mkdir -p "$stage"
(cd "$site" && tar cf - --exclude='__pycache__' --exclude='*.pyc' --exclude='*.cu' \
   --exclude='*.cuh' --exclude='*.h' --exclude='*.hpp' --exclude='*.c' --exclude='*.cc' \
   --exclude='*.cpp' --exclude='*.so' --exclude='*.md' --exclude='*.o' \
   --exclude='flashinfer/data/csrc' --exclude='flashinfer/data/include' \
   --exclude='flashinfer/data/cccl' --exclude='flashinfer/data/cutlass' \
   --exclude='flashinfer/data/spdlog' flashinfer flashinfer_python-*.dist-info) | tar xf - -C "$stage"
PATH="$(dirname "$nvcc"):$PATH" LD_LIBRARY_PATH="$work/stub" MAX_JOBS="${MAX_JOBS:-2}" \
  FLASHINFER_WORKSPACE_BASE="$work/fiws" \
  "$vpy" "$here/flashinfer_prebuild.py" --aot-dir "$stage/flashinfer/data/aot" \
  --record-opens "$work/opens.txt" ${FI_MODULES:-} 2>&1 | grep -v 'UserWarning\|_cuda_getDeviceCount' ||
  echo "make-anchor-bundle: some FlashInfer modules did not build (above); the bundle lacks them"
# The template and source files FlashInfer reads while it names and loads a module.
grep -v '\.pyc\?$' "$work/opens.txt" | while read -r f; do
  mkdir -p "$stage/$(dirname "$f")" && cp "$site/$f" "$stage/$f"
done

# 3. Check the staged package the way the GPU machine will use it: a venv holding torch and the
#    image's ordinary packages only, the package and tvm-ffi on PYTHONPATH; both import paths, and
#    each prebuilt module loaded through FlashInfer's own AOT lookup.
"$vpy" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$out/wheels" "apache-tvm-ffi==$("$vpy" -c 'import importlib.metadata as m; print(m.version("apache-tvm-ffi"))')" \
  "nvidia-cuda-cccl==13.3.*"
rm -rf "$work/checksite" && mkdir -p "$work/checksite" && cp -a "$stage/." "$work/checksite/"
"$vpy" -m pip install -q --no-deps --no-index --target "$work/checksite" "$out"/wheels/apache_tvm_ffi-*.whl
if [ ! -x "$work/checkvenv/bin/python" ]; then
  "$py" -m venv "$work/checkvenv"
  "$work/checkvenv/bin/python" -m pip install -q torch==2.11.0 numpy jinja2 requests filelock \
    nvidia-ml-py tqdm einops packaging ninja tabulate click
fi
PYTHONPATH="$work/checksite:$here" LD_LIBRARY_PATH="$work/stub" FLASHINFER_DISABLE_JIT=1 \
  FLASHINFER_WORKSPACE_BASE="$work/checkws" "$work/checkvenv/bin/python" "$here/flashinfer_prebuild.py" \
  --check 2>&1 | grep -v 'UserWarning\|_cuda_getDeviceCount' | tee "$work/check.txt" || true

# 4. The package tarball, the CUB anchor binary, the manifest.
rm -f "$out"/flashinfer-*.tar.xz*
tar cf - -C "$stage" flashinfer flashinfer_python-"$fi_version".dist-info | xz -T2 -6 > "$out/flashinfer-sm90a.tar.xz"
rm -rf "$work/cccl" && mkdir -p "$work/cccl"
"$vpy" -m zipfile -e "$out"/wheels/nvidia_cuda_cccl-*.whl "$work/cccl"
inc=$(dirname "$(dirname "$(find "$work/cccl" -path '*/cub/version.cuh' | head -1)")")
if [ ! "$out/bin/cub_topk_anchor" -nt "$here/cub_topk_anchor.cu" ]; then
  nice "$nvcc" -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr --extended-lambda -I"$inc" \
    "$here/cub_topk_anchor.cu" -o "$out/bin/cub_topk_anchor"
fi
# The DeepSelect fp32 top-k anchor binary, only when a DeepSelect source tree lies in .anchors/DeepSelect
# (kept outside kvc's history; deepselect_topk_anchor.sh says what it needs). Without it the bundle is as before.
if [ -d "$repo/.anchors/DeepSelect/csrc" ]; then
  # Its CUTLASS headers: where none are given (deepselect_topk_anchor.sh's three ways), the
  # nvidia-cutlass wheel its usage names, downloaded and unpacked here.
  if [ -z "${CUTLASS_INCLUDE:-}" ] &&
     [ ! -f "$repo/.anchors/DeepSelect/csrc/3rdparty/cutlass/include/cutlass/cutlass.h" ] &&
     ! ls "$repo"/.whl/nvidia_cutlass-*.whl > /dev/null 2>&1; then
    rm -rf "$work/cutlass-whl" "$work/cutlass"
    "$vpy" -m pip download -q --no-deps -d "$work/cutlass-whl" "nvidia-cutlass==4.2.0.0" &&
      "$vpy" -m zipfile -e "$work"/cutlass-whl/nvidia_cutlass-*.whl "$work/cutlass" &&
      export CUTLASS_INCLUDE="$work/cutlass/cutlass_library/source/include"
  fi
  NVCC="$nvcc" "$here/deepselect_topk_anchor.sh" "$repo/.anchors/DeepSelect" "$out/bin/deepselect_topk_anchor" ||
    echo "make-anchor-bundle: deepselect_topk_anchor did not build; the bundle lacks it"
fi
{
  echo "made $(date -u +%FT%TZ) on $(uname -n) by benchmarks/anchors/make-anchor-bundle.sh"
  echo "flashinfer $fi_version from $(basename "$whl"); torch $("$vpy" -c 'import torch; print(torch.__version__)'); $("$nvcc" --version | tail -1)"
  echo "aot modules:"; ls "$stage/flashinfer/data/aot"
  echo "check in a torch-only venv (FLASHINFER_DISABLE_JIT=1):"; cat "$work/check.txt"
  echo "files:"; (cd "$out" && find . -type f ! -name MANIFEST -exec sha256sum {} + | sort -k2)
  (cd "$out" && du -ab . | sort -k2)
} > "$out/MANIFEST"
# 5. Optional piece .anchors/p2: the sources FlashInfer's JIT reads (its headers, CCCL, CUTLASS,
#    spdlog, the top-level csrc files), so setup-anchors.sh can compile a module the bundle
#    lacks on the GPU machine. Not needed when the --check above passed for every module.
mkdir -p "$bundle/p2"
(cd "$site" && { find flashinfer/data/csrc -maxdepth 1 -type f;
   echo flashinfer/data/include; echo flashinfer/data/cccl; echo flashinfer/data/cutlass;
   echo flashinfer/data/spdlog; } | tar cf - --exclude='__pycache__' -T -) |
  xz -T2 -6 > "$bundle/p2/flashinfer-jit-sources.tar.xz"
# 6. Split what is over 60 MB (none was, for 0.7.4): .anchors/pN/<file>.partNN.
find "$out" -type f -size +60M | while read -r f; do
  split -b 60M -d --additional-suffix= "$f" "$f.part" && rm "$f"
  n=3; for part in "$f".part*; do mkdir -p "$bundle/p$n"; mv "$part" "$bundle/p$n/"; n=$((n + 1)); done
done
# 7. FlashInfer's archive again as parts of FI_PART_MB (default 9) MB, one a folder
#    .anchors/pfi0, pfi1, ..., for when the tracked tree leaves too little of a call's 64 MiB
#    beside the whole archive (since the forty-seventh session: 40 MB tracked, 25 MB archive).
#    setup-anchors.sh's header has the calls.
fi_part_mb="${FI_PART_MB:-9}"
rm -rf "$bundle"/pfi[0-9]*
if [ -f "$out/flashinfer-sm90a.tar.xz" ]; then
  split -b "${fi_part_mb}M" -d -a 2 "$out/flashinfer-sm90a.tar.xz" "$work/flashinfer-sm90a.tar.xz.part"
  n=0; for part in "$work"/flashinfer-sm90a.tar.xz.part[0-9][0-9]; do
    mkdir -p "$bundle/pfi$n"; mv "$part" "$bundle/pfi$n/"; n=$((n + 1))
  done
fi
du -sh "$bundle"/p*
