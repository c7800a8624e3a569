#!/usr/bin/env bash
# Device calls of the fourth 2026-12-01 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh):
#   first   build; the two commits of session 3 never run on a GPU (context-parallel merge,
#           store_bench's timing hook); racecheck over session 3's store and spread kernels;
#           ncu (with source hot spots) of the token-mass scorer, selected and dense attention
#   mid1    build; the GPU tests of this session's kernels (attention pipeline, token-mass
#           stream kernel, indexer variant 5 and the spread finisher, store append, decode top-k)
#   mid2    old-vs-new benchmark rows of the same kernels (after mid1, on the same machine)
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
  mid1)
    build
    gtests attention 'Cuda_Attention*:Cuda_DenseDecode*:Cuda_DecodeStep*' 200
    gtests token 'Cuda_BlockIndex_TokenScores*:*Cuda_BlockIndex*' 120
    gtests dsv4 '*Cuda_Dsv4_Indexer*:*Cuda_Dsv4_TopK*:*Cuda_Selector_Spread*' 150
    gtests select 'Cuda_Selector*-*Spread*' 120
    gtests store 'Cuda_StoreUpdate*:Cuda_KvStore*:*LayeredCache*' 150
    ;;
  mid2)
    [ -x build-gpu/benchmarks/attention_bench ] || build
    bench 90 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/[1-4]/0/1/|^BM_DenseDecode/0/(1|8)/131072/[1-4]/'
    bench 60 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/token_ma.*/mxfp4/sum/fast.*'
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/.*/0/[01]/[0345]$|BM_Dsv4TopK'
    bench 60 topk_bench "${TOPK_FILTER:-BM_TopK/(1|8|64)/(4096|32768)/(8|64)/|BM_TopKDecode|BM_TopKFloor|BM_TopK/1/(131072|262144)/2048/}"
    bench 60 store_bench 'BM_AppendStep'
    bench 60 layered_step_bench .
    bench 60 step_bench .
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    ;;
  *) echo "gpu-session4.sh: first, mid1, mid2, final1, final2" >&2; exit 2 ;;
esac
finish
