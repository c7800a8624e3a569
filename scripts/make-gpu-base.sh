#!/usr/bin/env bash
# Writes gpu-base/: BASE's versions (default main) of the library and benchmark files this
# checkout changed (kernels/, src/, include/, benchmarks/, the top-k and indexer phase probes),
# for a device script that builds the base's benchmarks beside this checkout's in one call
# (scripts/gpu-session27.sh tokens, land: a same-run before / after). gpu-base/ is untracked and
# not ignored, so a device call carries it; delete it afterwards, never commit it. The files this
# checkout added are listed in gpu-base/.added, and the base build deletes them from its copy.
#   scripts/make-gpu-base.sh [BASE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="${1:-main}"
rm -rf gpu-base
probes="scripts/topk-trace-probe.cu scripts/index-trace-probe.cu scripts/index-prefill-probe.cu
  scripts/index-probe-inputs.cuh"
# shellcheck disable=SC2086  # $probes: one path a word
git diff --name-only "$base" HEAD -- kernels src include benchmarks $probes | while read -r f; do
  if git cat-file -e "$base:$f" 2>/dev/null; then
    mkdir -p "gpu-base/$(dirname "$f")"
    git show "$base:$f" > "gpu-base/$f"
  fi
done
# The files this checkout added, which the base build must not compile (they may need this
# checkout's versions of the files above): base_build_bg (gpu-session27.sh) deletes them from its
# copy.
mkdir -p gpu-base
git diff --name-only --diff-filter=A "$base" HEAD -- kernels src include benchmarks > gpu-base/.added
echo "gpu-base/ holds $(find gpu-base -type f 2>/dev/null | wc -l) files of $base"
