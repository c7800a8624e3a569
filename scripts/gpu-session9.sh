#!/usr/bin/env bash
# Device calls of the 2026-12-02 (ninth) session (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   mma    build; the tensor-core summary kernel (kernels/index/score_mma.cuh): the BlockIndex
#          and decode-step tests, its index_bench rows beside the CUDA-core kernels', the mean-K
#          step, ncu of it at B8, memcheck over its tests; then select attention at B1 / B8
#          under ncu with the stall reasons per SASS line (the next kernel to work on)
#   pushed the summary kernel's tiles per warp and the attention kernels' pushed cluster merge:
#          tests, memcheck, benchmark rows, ncu
#   tests  build; every test; racecheck, synccheck, initcheck over the changed kernels' tests
#   final  the same-run table with every peer (carry .anchors/p1, p2) on the warm machine
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session9
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

case "${1:-mma}" in
  mma)
    build
    gtests block-index '*Cuda_BlockIndex*:*Cuda_DecodeStep*' 90
    bench 70 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k|quest)/(f32|f16|bf16)/(sum|max)/fast|BM_Score/h9x3x64/B(1|8)/N131072/(mean_k|quest)/f(32|16)/sum/fast'
    bench 40 step_bench '^BM_DecodeStep/(1|8)/131072/0/0/0/|^BM_DecodeStep/32/32768/0/0/0/'
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 profile mma-b8-f16 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast-tensor_core' 'summary_mma'
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 profile mma-b8-f32 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f32/sum/fast-tensor_core' 'summary_mma'
    sanitize memcheck memcheck '*Cuda_BlockIndex_MatchesCpu*:*TensorCoreNonFinite*' 50
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 NCU_LIMIT=70 profile attn-b8-source attention_bench \
      '^BM_BlockSelectExact/0/8/3/3/0/1/' 'mma_decode' --section SourceCounters --page source \
      --print-source sass
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 NCU_LIMIT=70 profile attn-b1-source attention_bench \
      '^BM_BlockSelectExact/0/1/3/3/0/1/' 'mma_decode' --section SourceCounters --page source \
      --print-source sass
    report
    ;;
  pushed)
    # The tensor-core summary kernel's tiles per warp measured (fast-tensor_core1 / 4 beside the
    # library's choice and the CUDA-core kernels) and the pushed cluster merge of the attention
    # kernels (kernels/attention/decode.cuh finish_cta): their tests, memcheck, the rows.
    build
    gtests changed '*Cuda_BlockIndex*:*Cuda_DecodeStep*:*Cuda_Attention*:*Cuda_DenseDecode*' 150
    bench 40 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/[23]/0/1/|^BM_BlockSelectExact/0/32/3/2/0/1/|^BM_BlockSelectExact/0/(1|8)/3/2/(4|8|16)/1/'
    bench 90 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k|quest)/f(32|16)/sum/fast-(warp_row|tensor_core)'
    bench 40 step_bench '^BM_DecodeStep/(1|8)/131072/0/0/0/|^BM_DecodeStep/32/32768/0/0/0/|^BM_DecodeStep/(1|8)/131072/0/1/1/'
    sanitize memcheck memcheck '*Cuda_AttentionMma*:*Cuda_Attention_Shapes*:*TensorCoreNonFinite*' 60
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 profile attn-b8 attention_bench \
      '^BM_BlockSelectExact/0/8/3/3/0/1/' 'mma_decode'
    report
    ;;
  tests)
    # Every test at the final code, then racecheck / synccheck / initcheck over the changed
    # kernels' tests (the pushed cluster merge of the attention kernels, the tensor-core summary
    # kernel; memcheck ran over both in the `pushed` call).
    build
    GTEST_FILTER='*' all_tests 220
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    changed='*Cuda_AttentionMma*:*Cuda_Attention_Shapes*:*TensorCoreNonFinite*:*Cuda_BlockIndex_MatchesCpu*'
    sanitize racecheck racecheck "$changed" 70
    sanitize synccheck synccheck "$changed" 50
    sanitize initcheck initcheck "$changed" 50
    ;;
  final)
    # The same-run table with every peer (carry .anchors/p1 and p2), on the warm machine of the
    # `tests` call (its build is reused).
    same_run_final
    ;;
  *) echo "gpu-session9.sh: mma, final" >&2; exit 2 ;;
esac
finish
