#!/usr/bin/env bash
# Device calls of the twenty-sixth session, 2026-12-05 (each under the 10-minute limit; results
# in $OUT, helpers in scripts/gpu-lib.sh):
#   baseline  the two-stage step as main has it (the ring-part rule of 67b624a was never run):
#             its GPU tests, memcheck over them, the step rows with one and two stages, and
#             Nsight Compute of one two-stage step at B1 and at B8 N128K, every kernel
#   setpath   the set path (kernels/select/set.cuh: topk / anchor in id order, no ranks) and the
#             two-stage step on it (with chunks of 8 candidates where they fit two CTAs per SM,
#             and the finish as a programmatic dependent): the selector's set, decode and graph
#             tests, the two-stage and token tests, the four sanitizers over the set path and the
#             two-stage tests,
#             topk_bench's set rows against the ranked paths, the step rows, Nsight Compute of
#             the two-stage step at B1 and B8
#   confirm   after setpath: the set path as the built-in choice on rows of up to 4096 blocks only
#             (longer rows were slower than the ranked paths there), the two-stage chunks back to
#             16, the small path's cluster CTAs waiting for each other before writing into the
#             leader (racecheck in setpath): the same tests and the small path's, memcheck over
#             the set and two-stage tests, racecheck over those and Cuda_Selector_Sets, the set
#             and step rows (what the remaining device time allows, in that order)
#   final     the same-run table for latest.json: kvc's rows (with the set rows and the
#             pinned-split attention rows), then PyTorch's and CUB's anchors in the same call
#             (carry [".anchors/p1/wheels", ".anchors/p1/bin", ".anchors/p1/MANIFEST"])
#   flashinfer  FlashInfer's anchors, back to back after `final` on the same warm machine
#             (carry [".anchors/p1/flashinfer-sm90a.tar.xz", ".anchors/p1/wheels/apache_tvm_ffi-
#             <version>.whl", ".anchors/p1/MANIFEST"]): the tree and the whole bundle exceed one
#             call's 64 MiB
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session26
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
source scripts/gpu-lib.sh

case "${1:-baseline}" in
  baseline)
    build_targets kvc_cuda_tests step_bench
    gtests twostage '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 150
    sanitize memcheck memcheck '*Cuda_BlockIndex_TwoStage*' 60
    bench 90 step_bench '/(1|8)/131072/0/(1|2|3|4)/(0|1)/|/32/32768/0/(1|2|3)/(0|1)/'
    NCU_SKIP=40 NCU_CLOCK=base step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    NCU_SKIP=40 NCU_CLOCK=base step_ncu two-stage-B8 'BM_DecodeStep/8/131072/0/3/1/'
    NCU_SKIP=40 NCU_CLOCK=base step_ncu mean-k-f16-B1 'BM_DecodeStep/1/131072/0/2/0/'
    report
    ;;
  setpath)
    build_targets kvc_cuda_tests step_bench topk_bench
    gtests set '*Cuda_Selector_Set*:*Cuda_Selector_Decode*:*Cuda_Selector_Graph*:*Cuda_Selector_Random*' 120
    gtests twostage '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 120
    set_tests='*Cuda_Selector_Set*:*Cuda_BlockIndex_TwoStage*'
    KVC_TEST_MAX_ROW=8192 sanitize memcheck memcheck "$set_tests" 60
    KVC_TEST_MAX_ROW=8192 sanitize racecheck racecheck "$set_tests" 60
    KVC_TEST_MAX_ROW=8192 sanitize initcheck initcheck "$set_tests" 45
    KVC_TEST_MAX_ROW=8192 sanitize synccheck synccheck "$set_tests" 45
    bench 40 topk_bench 'BM_TopKSet/'
    bench 90 step_bench '/(1|8)/131072/0/(1|2|3|4)/(0|1)/|/32/32768/0/(1|2|3)/(0|1)/'
    NCU_SKIP=14 NCU_CLOCK=base step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    NCU_SKIP=14 NCU_CLOCK=base step_ncu two-stage-B8 'BM_DecodeStep/8/131072/0/3/1/'
    report
    ;;
  confirm)
    build_targets kvc_cuda_tests step_bench topk_bench
    gtests set '*Cuda_Selector_Set*:*Cuda_Selector_Small*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 100
    KVC_TEST_MAX_ROW=8192 sanitize racecheck racecheck '*Cuda_Selector_Set*:*Cuda_BlockIndex_TwoStage*' 60
    bench 50 step_bench '/(1|8)/131072/0/(1|3)/1/|/32/32768/0/3/1/'
    bench 25 topk_bench 'BM_TopKSet/(8|64)/4096/128/'
    sanitize memcheck memcheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*' 45
    report
    ;;
  final)
    build_targets kvc_cuda_tests step_bench index_bench attention_bench topk_bench store_bench \
      dsv4_bench
    gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 90
    sanitize memcheck memcheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*' 60
    sanitize racecheck racecheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*' 60
    same_run_kvc
    bench 30 topk_bench 'BM_TopKSet/' -set
    bench 40 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/8/(2|4|8|32)/1/' -pinned
    ANCHORS="torch cub" anchors_and_report
    ;;
  flashinfer)
    named_anchors flashinfer "flashinfer_decode flashinfer_topk"
    ;;
  *) echo "gpu-session26.sh: baseline | setpath | confirm | final | flashinfer" >&2; exit 2 ;;
esac
finish
