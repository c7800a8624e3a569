#!/usr/bin/env bash
# Writes gpu-base/: BASE's versions (default main) of the library and benchmark files this
# checkout changed (kernels/, src/, include/, benchmarks/, the top-k phase probe), for a device
# script that builds the base's benchmarks beside this checkout's in one call
# (scripts/gpu-session27.sh tokens, land: a same-run before / after). gpu-base/ is untracked and
# not ignored, so a device call carries it; delete it afterwards, never commit it. A file this
# checkout added is left as is (the base build then compiles it too).
#   scripts/make-gpu-base.sh [BASE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="${1:-main}"
rm -rf gpu-base
git diff --name-only "$base" HEAD -- kernels src include benchmarks scripts/topk-trace-probe.cu | while read -r f; do
  if git cat-file -e "$base:$f" 2>/dev/null; then
    mkdir -p "gpu-base/$(dirname "$f")"
    git show "$base:$f" > "gpu-base/$f"
  fi
done
echo "gpu-base/ holds $(find gpu-base -type f 2>/dev/null | wc -l) files of $base"
