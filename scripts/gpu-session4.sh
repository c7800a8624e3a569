#!/usr/bin/env bash
# Device calls of the fourth 2026-12-01 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh):
#   first   build; the two commits of session 3 never run on a GPU (context-parallel merge,
#           store_bench's timing hook); racecheck over session 3's store and spread kernels;
#           ncu (with source hot spots) of the token-mass scorer, selected and dense attention
#   mid     every GPU test of this session's kernels, then old-vs-new benchmark rows
#   final1  every test; memcheck / racecheck of the changed kernels
#   final2  the benchmark rows and the anchors
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session4
source scripts/gpu-lib.sh

case "${1:-first}" in
  first)
    build
    gtests context-parallel 'Cuda_ContextParallel_OneGpu*:Cuda_Merge*' 120
    bench 60 store_bench .
    sanitize racecheck-s3 racecheck 'Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu:Cuda_StoreUpdate.NonFiniteZeroAndExtremeRowsMatchCpu:Cuda_Selector_Spread.DispatchBoundariesMatchCpu' 100
    grep -E 'Race reported' "$out/sanitizer-racecheck-s3.log" | sed -E 's/\(kvc[^)]*\)//g' | sort | uniq -c | head -5 >> "$out/summary.txt"
    profile token-mass index_bench 'h32x8x128/B8/N131072/token_mass/mxfp4/sum/fast' 'token_fast' \
      --section SourceCounters
    profile attn-select-b8 attention_bench '^BM_BlockSelectExact/0/8/3/2/0/1' 'mma_decode|decode_kernel|combine'
    profile dense-b8 attention_bench '^BM_DenseDecode/0/8/131072/2' 'mma_decode|decode_kernel|combine'
    ;;
  *) echo "gpu-session4.sh: first, mid, final1, final2" >&2; exit 2 ;;
esac
finish
