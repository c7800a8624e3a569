#!/usr/bin/env bash
# Device calls of the fourteenth session, 2026-12-03 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   wg     the DSv4 indexer's warpgroup-mma score (variant 9): build (sm_90a) of the CUDA tests
#          and dsv4_bench only; the indexer GPU tests; BM_Dsv4IndexDecode for variants 0 / 8 / 9
#          at B1 / B8, T1 / T4 and the 64-token prefill
#   prof   the same build and tests; variants 8 / 9 at B1 / B8, T1 / T4; Nsight Compute of variant
#          9's kernel at B1 T1 (stall reasons, source counters) and B8 T1, and of variant 8's at
#          B1 T1
#   final  the same build; every DSv4 GPU test; variants 0 / 8 / 9 at B1 / B8, T1 to T4, and 0 / 7 /
#          9 at the 64-token prefill; memcheck over the indexer tests, racecheck / synccheck /
#          initcheck over the tests that run variant 9
#   phys   the CUDA tests only; the DSv4 store tests (dsv4_physical_entries against the host
#          function) and memcheck over the new one
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session14
source scripts/gpu-lib.sh

case "${1:-wg}" in
  wg)
    build_targets kvc_cuda_tests dsv4_bench
    gtests indexer '*Cuda_Dsv4_Indexer*' 200
    bench 120 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/(0|8|9)/|BM_Dsv4IndexDecode/1/64/0/0/(7|9)/'
    report
    ;;
  prof)
    build_targets kvc_cuda_tests dsv4_bench
    gtests indexer '*Cuda_Dsv4_Indexer*' 200
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/(8|9)/'
    NCU_STALLS=1 profile wg-b1 dsv4_bench 'BM_Dsv4IndexDecode/1/1/0/0/9/' mxfp4_score_wgmma \
      --section SourceCounters
    NCU_STALLS=1 profile wg-b8 dsv4_bench 'BM_Dsv4IndexDecode/8/1/0/0/9/' mxfp4_score_wgmma
    NCU_STALLS=1 profile v8-b1 dsv4_bench 'BM_Dsv4IndexDecode/1/1/0/0/8/' mxfp4_score_stream
    report
    ;;
  final)
    build_targets kvc_cuda_tests dsv4_bench
    gtests dsv4 '*Cuda_Dsv4*' 200
    bench 150 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|2|3|4)/0/0/(0|8|9)/|BM_Dsv4IndexDecode/1/64/0/0/(0|7|9)/'
    sanitize memcheck-indexer memcheck '*Cuda_Dsv4_Indexer*' 150
    sanitize racecheck-wgmma racecheck '*Cuda_Dsv4_Indexer.WgmmaVariant*:*Cuda_Dsv4_Indexer*h64_d128_t4*' 80
    sanitize synccheck-wgmma synccheck '*Cuda_Dsv4_Indexer.WgmmaVariant*:*Cuda_Dsv4_Indexer*h64_d128_t4*' 60
    sanitize initcheck-wgmma initcheck '*Cuda_Dsv4_Indexer.WgmmaVariant*:*Cuda_Dsv4_Indexer*h64_d128_t4*' 60
    report
    ;;
  phys)
    build_targets kvc_cuda_tests
    gtests store '*Cuda_Dsv4_Store*:*Cuda_Dsv4_Indexer.WgmmaVariant*' 60
    sanitize memcheck-phys memcheck '*Cuda_Dsv4_Store.PhysicalEntries*' 60
    ;;
  *) echo "gpu-session14.sh: wg | prof | final | phys" >&2; exit 2 ;;
esac
finish
