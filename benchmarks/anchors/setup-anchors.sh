#!/usr/bin/env bash
# Installs the peer-anchor bundle on the GPU machine (no network there) from the git-ignored
# folder .anchors/, which benchmarks/anchors/make-anchor-bundle.sh fills on a machine with PyPI
# access. Installs nothing into the image: everything goes under .anchors/site (ignored, so it
# stays on a warm machine between back-to-back calls) and is used through PYTHONPATH and the
# variables in .anchors/site/anchors.env. Idempotent: an unchanged piece is not unpacked again.
# benchmarks/anchors/run-anchors.sh calls it; it can also run alone.
#
# HOW THE BUNDLE TRAVELS (device `run` calls, from the repository root; the tree that travels,
# tracked files included (~20 MB), must stay under 64 MiB; .anchors/p1/MANIFEST lists sizes):
#   one call     carry [".anchors/p1"]    command: benchmarks/anchors/run-anchors.sh
#                p1 (~32 MB): FlashInfer with its prebuilt sm_90a modules, the tvm-ffi and CCCL
#                wheels, the CUB binary. Add ".anchors/p2" (~10 MB, FlashInfer's JIT sources) when
#                p1's MANIFEST lists a module as not prebuilt, or to be safe: setup then compiles
#                what its check finds missing on the GPU machine (minutes, inside the deadline).
#                Since the tracked tree reached ~35 MB (2026-12-04) p1 no longer fits one call
#                beside it; run the anchors in two calls, each with the pieces its anchors use:
#                [".anchors/p1/flashinfer-sm90a.tar.xz", ".anchors/p1/wheels/apache_tvm_ffi-*.whl"
#                (the exact file name), ".anchors/p1/MANIFEST"] with
#                ANCHORS="flashinfer_decode flashinfer_topk", and [".anchors/p1/wheels",
#                ".anchors/p1/bin", ".anchors/p1/MANIFEST"] with ANCHORS="torch cub". A piece
#                carried by an earlier call was gone after a later call carried other paths of
#                .anchors/p1 (twenty-first session), so do not count on it staying.
#   split bundle make-anchor-bundle.sh splits any piece over 60 MB into .partNN files, one per
#                folder .anchors/p3, p4, ... Then, back to back so the machine stays warm, each
#                call carries one [".anchors/pN"] and runs
#                `benchmarks/anchors/setup-anchors.sh --stash` (copies its parts into
#                $KVC_ANCHOR_PARTS, default /tmp/kvc-anchor-parts); the last call carries
#                ".anchors/p1" and runs benchmarks/anchors/run-anchors.sh, which joins the
#                parts. Never carry ".anchors" itself in a later call: that replaces the folder
#                there and drops .anchors/site.
#   FlashInfer in parts  since the tracked tree reached 40 MB (2026-12-07) the 25 MB
#                FlashInfer archive does not fit one call beside it either. make-anchor-bundle.sh
#                also writes it as 9 MB parts, one folder each (.anchors/pfi0, pfi1, pfi2). Back
#                to back: for each part but the last, carry [".anchors/pfiN"] and run
#                `benchmarks/anchors/setup-anchors.sh --stash`; then carry the last part with
#                [".anchors/p1/wheels", ".anchors/p1/MANIFEST"] and run the anchors (e.g.
#                `KEEP_SUMMARY=1 bash scripts/gpu-session27.sh flashinfer`): setup joins the
#                parts and checks the joined file against the MANIFEST's sha256. A carried file
#                is gone once a later call carries other paths, so each part must be stashed in
#                the call that carries it; and the whole of .anchors/ there (site/ too) was gone
#                after a call carrying another .anchors path (forty-eighth session), so the parts
#                wait outside the tree, in /tmp, which stays while the machine is warm.
#   a second run on the same warm machine needs no carry: .anchors/site stays (ignored).
#   DeepSelect   source in .anchors/DeepSelect (its own carry path, e.g. [".anchors/p1",
#                ".anchors/DeepSelect"]); none is in this workplace (see docs/performance.md).
#
# Usage: benchmarks/anchors/setup-anchors.sh [--stash] [BUNDLE_DIR]   (default .anchors)
# Prints one line per piece and writes .anchors/site/SETUP.txt; exits 0 (a missing piece is
# reported, and its anchor records why it skipped).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
stash=0
if [ "${1:-}" = --stash ]; then stash=1; shift; fi
bundle="$(cd "${1:-$repo/.anchors}" 2>/dev/null && pwd)" || { echo "setup-anchors: no bundle folder ${1:-$repo/.anchors}" >&2; exit 1; }
site="$bundle/site"
parts="${KVC_ANCHOR_PARTS:-/tmp/kvc-anchor-parts}"
mkdir -p "$parts" "$site/bin"
report="$site/SETUP.txt"
say() { echo "setup-anchors: $*" | tee -a "$report"; }
: > "$report"
py="${PYTHON:-python3}"

# Parts of split pieces: stash those carried in this call, then join complete sets.
for part in "$bundle"/p*/*.part[0-9][0-9]; do
  [ -f "$part" ] && cp -f "$part" "$parts/" && say "stashed $(basename "$part")"
done
[ "$stash" = 1 ] && exit 0
for first in "$parts"/*.part00; do
  [ -f "$first" ] || continue
  name="$(basename "${first%.part00}")"
  cat "$parts/$name".part[0-9][0-9] > "$parts/$name.joined" && mv "$parts/$name.joined" "$parts/$name"
  say "joined $name from $(ls "$parts/$name".part[0-9][0-9] | wc -l) parts"
  # The bundle's MANIFEST records each whole piece's sha256 ("<sum>  ./<path>").
  want=$(grep -h " \./\(.*/\)\?$name\$" "$bundle"/p*/MANIFEST 2>/dev/null | head -1 | cut -d' ' -f1)
  if [ -n "$want" ]; then
    got=$(sha256sum "$parts/$name" | cut -d' ' -f1)
    if [ "$got" = "$want" ]; then say "$name: sha256 matches the MANIFEST"
    else say "$name: sha256 $got, the MANIFEST says $want: a part is missing or stale"; rm -f "$parts/$name"; fi
  fi
done
find_piece() {  # the newest file matching $1 among the carried folders and the joined parts
  ls -t "$bundle"/p*/$1 "$bundle"/p*/wheels/$1 "$parts"/$1 2>/dev/null | head -1
}

unpack_once() {  # file stamp-name command...: run the command unless this file was unpacked
  local file=$1 stamp="$site/.$2.sha256"
  shift 2
  local sum
  sum=$(sha256sum "$file" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then return 0; fi
  "$@" && echo "$sum" > "$stamp"
}

# FlashInfer: the stripped package with its sm_90a modules, and apache-tvm-ffi.
fi_tar=$(find_piece 'flashinfer-sm90a.tar.xz')
tvm_whl=$(find_piece 'apache_tvm_ffi-*.whl')
if [ -n "$fi_tar" ] && [ -n "$tvm_whl" ]; then
  unpack_once "$fi_tar" flashinfer sh -c "rm -rf '$site/flashinfer' '$site'/flashinfer_python-*.dist-info '$site/.jit_sources.sha256' && xz -dc '$fi_tar' | tar xf - -C '$site'" ||
    say "FAILED to unpack $fi_tar"
  # Optional: the sources FlashInfer's JIT needs, so a module missing from the bundle can be
  # compiled here (see below).
  jit_tar=$(find_piece 'flashinfer-jit-sources.tar.xz')
  if [ -n "$jit_tar" ]; then
    unpack_once "$jit_tar" jit_sources sh -c "xz -dc '$jit_tar' | tar xf - -C '$site'" ||
      say "FAILED to unpack $jit_tar"
  fi
  unpack_once "$tvm_whl" tvm_ffi "$py" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$site" "$tvm_whl" || say "FAILED to install $tvm_whl"
  say "flashinfer: $(ls -d "$site"/flashinfer_python-*.dist-info 2>/dev/null | sed 's/.*flashinfer_python-//; s/.dist-info//') with $(ls "$site/flashinfer/data/aot" 2>/dev/null | wc -l) prebuilt modules; $(basename "$tvm_whl")"
else
  say "flashinfer: not in the bundle (flashinfer-sm90a.tar.xz: ${fi_tar:-missing}, apache_tvm_ffi wheel: ${tvm_whl:-missing})"
fi

# CUB top-k: the CCCL 13.3 headers and the binary built with them.
cccl_whl=$(find_piece 'nvidia_cuda_cccl-*.whl')
cccl_inc=""
if [ -n "$cccl_whl" ]; then
  unpack_once "$cccl_whl" cccl sh -c "rm -rf '$site/cccl' && mkdir -p '$site/cccl' && '$py' -m zipfile -e '$cccl_whl' '$site/cccl'" ||
    say "FAILED to unpack $cccl_whl"
  version_h=$(find "$site/cccl" -path '*/cub/version.cuh' | head -1)
  [ -n "$version_h" ] && cccl_inc=$(dirname "$(dirname "$version_h")")
fi
cub_bin=$(find_piece 'cub_topk_anchor')
[ -z "$cub_bin" ] && cub_bin=$(ls "$bundle"/p*/bin/cub_topk_anchor 2>/dev/null | head -1)
if [ -n "$cub_bin" ]; then cp -f "$cub_bin" "$site/bin/cub_topk_anchor" && chmod +x "$site/bin/cub_topk_anchor"; fi
say "cub top-k: headers ${cccl_inc:-missing}; prebuilt binary $([ -x "$site/bin/cub_topk_anchor" ] && echo present || echo missing)"

# DeepSelect: a source tree (built by deepselect_anchor.sh), or a prebuilt wheel if it has sm_90.
ds_src=""
[ -f "$bundle/DeepSelect/setup.py" ] && ds_src="$bundle/DeepSelect"
ds_whl=$(find_piece '*deepselect*.whl')
ds_note=""
if [ -n "$ds_src" ]; then
  ds_note="source at $ds_src (deepselect_anchor.sh builds it for sm_90a)"
elif [ -n "$ds_whl" ]; then
  mkdir -p "$site/deepselect" &&
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site/deepselect" "$ds_whl"
  so=$(ls "$site"/deepselect/deep_select/deep_select_cuda*.so 2>/dev/null | head -1)
  if [ -n "$so" ] && command -v cuobjdump >/dev/null && ! cuobjdump --list-elf "$so" 2>/dev/null | grep -q 'sm_90'; then
    ds_note="prebuilt $(basename "$ds_whl") has no sm_90 code ($(cuobjdump --list-elf "$so" | grep -o 'sm_[0-9]*a*' | sort -u | tr '\n' ' ')); not used"
    rm -rf "$site/deepselect"
  else
    ds_note="prebuilt $(basename "$ds_whl") in $site/deepselect"
  fi
else
  ds_note="neither source (.anchors/DeepSelect) nor a wheel in the bundle"
fi
say "deepselect: $ds_note"

{
  echo "export PYTHONPATH=\"$site:$here\${PYTHONPATH:+:\$PYTHONPATH}\""
  echo "export FLASHINFER_WORKSPACE_BASE=\"$site/fi-workspace\""
  echo "export FLASHINFER_CUDA_ARCH_LIST=\"9.0\""
  echo "export CCCL_INCLUDE=\"$cccl_inc\""
  echo "export CUB_TOPK_ANCHOR_BIN=\"$([ -x "$site/bin/cub_topk_anchor" ] && echo "$site/bin/cub_topk_anchor")\""
  echo "export DEEPSELECT_SRC=\"$ds_src\""
  echo "export DEEPSELECT_SITE=\"$([ -d "$site/deepselect" ] && echo "$site/deepselect")\""
  echo "export DEEPSELECT_NOTE=\"$ds_note\""
} > "$site/anchors.env"

# The modules load through FlashInfer's own lookup, with JIT compilation off (seconds). A module
# that does not load is compiled here when the JIT sources were carried (flashinfer-jit-sources,
# .anchors/p2) and ANCHORS_DEVICE_JIT is not 0: nvcc, $(nproc) jobs, at most T_JIT seconds
# (default 360), into .anchors/site, where later calls on the warm machine find it.
check_modules() {
  (. "$site/anchors.env" && FLASHINFER_DISABLE_JIT=1 "$py" "$here/flashinfer_prebuild.py" --check "$@" 2>&1) |
    grep -v 'UserWarning\|_cuda_getDeviceCount' | tee -a "$report"
}
if [ -d "$site/flashinfer" ]; then
  check_modules > "$site/check.txt"
  cat "$site/check.txt"
  missing=$(sed -n 's/^check \([a-z0-9_]*\): FAILED.*/\1/p' "$site/check.txt" | tr '\n' ' ')
  if [ -n "$missing" ] && [ -d "$site/flashinfer/data/include" ] && [ "${ANCHORS_DEVICE_JIT:-1}" != 0 ]; then
    say "compiling the missing FlashInfer modules here: $missing"
    start=$(date +%s)
    (. "$site/anchors.env" && unset FLASHINFER_DISABLE_JIT && MAX_JOBS="$(nproc)" \
       timeout -k 10 "${T_JIT:-360}" "$py" "$here/flashinfer_prebuild.py" \
       --aot-dir "$site/flashinfer/data/aot" $missing 2>&1) | grep -v 'UserWarning\|_cuda_getDeviceCount' |
      tail -20 | tee -a "$report"
    say "device JIT took $(( $(date +%s) - start )) s"
    check_modules $missing
  elif [ -n "$missing" ]; then
    say "missing FlashInfer modules: $missing (their rows will fail; carry .anchors/p2 to compile them here)"
  fi
fi
echo "setup-anchors: wrote $site/anchors.env"
