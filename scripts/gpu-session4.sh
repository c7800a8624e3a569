#!/usr/bin/env bash
# Device calls of the fourth 2026-12-01 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh):
#   first   build; the two commits of session 3 never run on a GPU (context-parallel merge,
#           store_bench's timing hook); racecheck over session 3's store and spread kernels;
#           ncu (with source hot spots) of the token-mass scorer, selected and dense attention
#   mid1    build; the GPU tests of this session's kernels (attention pipeline, token-mass
#           stream kernel, indexer variant 5 and the spread finisher, store append, decode top-k)
#   mid2    old-vs-new benchmark rows of the same kernels (after mid1, on the same machine)
#   final1  build; every test (GPU, CPU, mini-decoder); memcheck / racecheck of the changed kernels
#   final2  the benchmark rows of the session (old and new variants) and the anchors (PyTorch,
#           and FlashInfer / DeepSelect where their bundle was carried: benchmarks/anchors/)
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
  final3)
    # The indexer rows final2's filter missed, then the peer anchors (carry .anchors/p1 and
    # .anchors/p2: benchmarks/anchors/setup-anchors.sh says how the bundle travels).
    build
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/[0-9]+/[0-9]+/0/0/[0345]/'
    grep -hE '_median' "$out"/dsv4_bench.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    l=$(left)
    ANCHORS="flashinfer_decode flashinfer_topk cub torch" DEADLINE=$(( l - 15 )) \
      benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "peer anchors: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
    ;;
  mid3)
    # The store append / LayeredCache write (store4) and the decode top-k default: tests, then
    # their benchmark rows.
    build
    gtests store 'Cuda_StoreUpdate*:Cuda_KvStore*:*LayeredCache*' 150
    gtests select 'Cuda_Selector*' 150
    gtests token 'Cuda_BlockIndex_TokenScores*' 100
    bench 40 store_bench 'BM_AppendStep'
    bench 60 layered_step_bench 'BM_LayeredAppend|BM_LayeredStep/B:8/'
    bench 60 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/token_mass/mxfp4/sum/fast.*'
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
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
  final1)
    build
    GTEST_FILTER='*' all_tests 330
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    sanitize memcheck memcheck 'Cuda_BlockIndex_TokenScores*:Cuda_AttentionMma*:Cuda_DenseDecode*:Cuda_Selector_Decode*:Cuda_Dsv4_Indexer*:Cuda_Dsv4_TopK*:Cuda_StoreUpdate*:*LayeredCache*-*Footprint*:*GraphReplayOfAppend*:*1000Steps*:*OneRoundLargeBatches*:*CountOneWrites*' 110
    sanitize racecheck racecheck 'Cuda_Selector_Decode*:Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu:Cuda_BlockIndex_TokenScores.ExtremeScalesMixedWithOrdinaryBlocks' 60
    grep -E 'Race reported' "$out/sanitizer-racecheck.log" | sed -E 's/\(kvc[^)]*\)//g' | sort | uniq -c | head -5 >> "$out/summary.txt"
    ;;
  final2)
    [ -x build-gpu/benchmarks/step_bench ] || build
    bench 60 step_bench .
    bench 100 layered_step_bench .
    bench 60 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(token_ma.*/mxfp4/sum/fast.*|mean_k/f(32|16)/sum/fast)'
    bench 90 attention_bench '^BM_BlockSelectExact/0/(1|8|32)/3/[1-4]/0/1/|^BM_DenseDecode/0/(1|8)/131072/[1-4]/'
    bench 60 topk_bench "BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/[0-2]/|BM_TopK/(1|64)/(131072|262144)/2048/"
    bench 60 store_bench .
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/.*/0/[01]/[0345]$|BM_Dsv4TopK|BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    l=$(left)
    (( l > 60 )) && { OUT="$out" timeout 90 python3 benchmarks/anchors/torch_anchors.py \
      > "$out/torch_anchors.log" 2>&1; say "torch anchors: rc=$?"; }
    if [ -x benchmarks/anchors/setup-anchors.sh ] && [ -d .anchors ]; then
      l=$(left)
      (( l > 90 )) && { OUT="$out" timeout $(( l - 30 )) benchmarks/anchors/setup-anchors.sh run \
        > "$out/peer_anchors.log" 2>&1; say "peer anchors: rc=$? $(tail -1 "$out/peer_anchors.log")"; }
    fi
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    python3 scripts/perf-report.py "$out" > "$out/performance_table.md" 2>&1
    ;;
  *) echo "gpu-session4.sh: first, mid1, mid2, final1, final2" >&2; exit 2 ;;
esac
finish
