#!/usr/bin/env bash
# Device calls of the eighteenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   attn   the tensor-core attention's selected ids and block-table entries read together with
#          the slot (p.early_ids) and its launch as a programmatic dependent: build of the CUDA
#          tests, attention_bench and step_bench; the attention GPU tests; block-select rows at
#          B1 / B8 for paths 3 (library), 5 (ids after the length) and 6 (plain launch) and the
#          splits; the decode step; ncu of the B1 kernel; memcheck / racecheck / synccheck /
#          initcheck over the tests that run the changed kernel
#   ab     the same in the decode step: step_bench with the attention's library path against
#          paths 5 and 6 (budget argument + 50 / 60), attention_bench B1 / B8 paths 3 / 5 / 6
#   tests  everything built (scripts/gpu-check build) and every test (scripts/gpu-check test)
#   final  the same-run table (same_run_final; carry .anchors/p1) on the warm machine of `tests`
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session18
source scripts/gpu-lib.sh

case "${1:-attn}" in
  attn)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests attention '*Cuda_Attention*:*Cuda_Layered*:*Cuda_DecodeStep*:*Cuda_DenseDecode*:*Cuda_Merge*:*Cuda_Sharding*:*Cuda_ContextParallel*:*Cuda_Reliability*:*Cuda_Telemetry*' 150
    BENCH_REPS=5 bench 60 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/(3|5|6)/0/1/|^BM_BlockSelectExact/0/1/3/2/(4|8|16|32)/1/|^BM_BlockSelectExact/0/32/3/2/0/1/'
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|1)/0/|BM_DecodeStep/32/32768/0/1/0/'
    NCU_STALLS=1 NCU_SKIP=5 profile attn-b1 attention_bench '^BM_BlockSelectExact/0/1/3/3/0/1/' 'mma_decode_kernel' --clock-control none
    local_filter='*Cuda_AttentionMma.ClusterAndCombineMergesAgree*:*Cuda_AttentionMma.OutOfRange*'
    sanitize memcheck memcheck "$local_filter" 70
    sanitize racecheck racecheck "$local_filter" 70
    sanitize synccheck synccheck "$local_filter" 40
    sanitize initcheck initcheck "$local_filter" 50
    report
    ;;
  ab)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests attention '*Cuda_AttentionMma*:*Cuda_Attention.*' 100
    bench 100 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/(3|5|6)/0/1/'
    bench 200 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/(0|50|60)/|BM_DecodeStep/8/131072/0/1/(0|60)/'
    sanitize memcheck memcheck '*Cuda_AttentionMma.OutOfRange*' 60
    report
    ;;
  tests)
    build
    all_tests 300
    cp gpu-out/*.log "$out/" 2>/dev/null
    report
    ;;
  final)
    same_run_final
    ;;
  *) echo "gpu-session18.sh: attn | tests | final" >&2; exit 2 ;;
esac
finish
