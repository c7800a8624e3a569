#!/usr/bin/env bash
# Device calls of the seventeenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   topk   the spread top-k's shared finish (every CTA of a row ranks its share of the sampled
#          cut's candidates: spread_share_finish in kernels/select/spread.cuh) and the sample's tie
#          guard (no pass into the id bits): build of the CUDA tests, topk_bench and dsv4_bench;
#          the selector and DeepSeek-V4 top-k GPU tests; the spread rows shared (5), finished by one
#          CTA (9) and exact (7), dsv4_bench's top-k rows (0 / 4 / 3); the phase probe on uniform,
#          Gaussian and tied rows (ONE_FINISHER=1: also one finisher, and the exact passes on the
#          tied row); memcheck over the spread tests,
#          racecheck and synccheck over the misleading-sample test
#   tests  everything built (scripts/gpu-check build) and every test (scripts/gpu-check test);
#          the spread rows with the sample cut by key ranges (5) and by radix passes (10)
#   final  the same-run table (same_run_final: kvc's rows, PyTorch, DeepSeek-V4's PyTorch step,
#          FlashInfer 0.7.4 decode and top_k, CUB; carry .anchors/p1) on the warm machine of
#          `tests`
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session17
source scripts/gpu-lib.sh

case "${1:-topk}" in
  topk)
    build_targets kvc_cuda_tests topk_bench dsv4_bench
    gtests select '*Cuda_Selector*:*Cuda_Dsv4*TopK*:*Cuda_Dsv4_Indexer*Select*' 150
    bench 110 topk_bench 'BM_TopKVariant/(1|4|16|64)/(131072|262144)/(512|1024|2048)/(5|7|9)/|BM_TopKVariant/(32|64)/(32768|65536)/(512|2048)/(5|9)/|BM_TopK/(1|64)/(131072|262144)/2048/'
    bench 50 dsv4_bench 'BM_Dsv4TopK/.*/(0|3|4)/'
    for n in 131072 262144; do
      topk_trace "s-$n-0" "$n" 2048 0 0 1 1
      [ -n "${ONE_FINISHER:-}" ] && topk_trace "o-$n-0" "$n" 2048 0 0 1 0
    done
    topk_trace s-131072-1 131072 2048 1 0 1 1
    topk_trace s-131072-2 131072 2048 2 0 1 1
    [ -n "${ONE_FINISHER:-}" ] && topk_trace e-131072-2 131072 2048 2 0 0 1
    sanitize memcheck memcheck '*Cuda_Selector_Spread*' 90
    sanitize racecheck racecheck '*Cuda_Selector_Spread.MisleadingSample*' 80
    sanitize synccheck synccheck '*Cuda_Selector_Spread.MisleadingSample*' 50
    report
    ;;
  tests)
    build
    all_tests 300
    cp gpu-out/*.log "$out/" 2>/dev/null
    bench 40 topk_bench 'BM_TopKVariant/(1|64)/(131072|262144)/2048/(5|10)/'
    bench 25 dsv4_bench 'BM_Dsv4TopK/(1|8)/262144/2048/0/(0|5)/'
    report
    ;;
  final)
    TOPK_FILTER='BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/|BM_TopK/(1|64)/(131072|262144)/2048/|BM_TopKVariant/(1|4|64)/(131072|262144)/2048/(5|7|9|10)/' \
      DSV4_FILTER='BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/0/|BM_Dsv4TopK/(1|8)/262144/(512|1024|2048)/0/(0|3|4|5)/|BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/0/' \
      same_run_final
    ;;
  *) echo "gpu-session17.sh: topk | tests | final" >&2; exit 2 ;;
esac
finish
