#!/usr/bin/env bash
# Device calls of the eleventh session, 2026-12-02 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   staged  build; the BlockIndex tests (every summary kernel pinned against the CPU, the staged
#           one on its full grid and on one CTA); index_bench's tensor-core summary kernel beside
#           the staged one (Hq 32 / Hkv 8 / d 128 at B1 / B8 N128K and B32 N32K, Hq 9 / Hkv 3 /
#           d 64 at B8; mean-K and Quest over f32 and f16 summaries); ncu of both at B8 f16; the
#           mean-K step (f32 / f16 summaries); memcheck and racecheck over the BlockIndex tests.
#           Run three times over the staged kernel's three forms (cp.async ring, the same with the
#           table entries a tile ahead, TMA bulk copies); all were slower than the register
#           kernel and only the last is kept, on branch staged11, where this mode still runs
#   epilogue build; the BlockIndex tests, the tensor-core summary rows (sum and max) and the
#           mean-K step after the kSum epilogue became two xor shuffles; memcheck over BlockIndex
#   kmax    build; the BlockIndex tests (the non-finite test now over both aggregates) and the
#           kMax rows after its epilogue took the kSum form where no product is NaN; the GPU
#           tests over default_block_select() (its summaries now in the 16-bit dtype)
#   final   build; every GPU test (the shared launch helpers and mbarrier header, the summary
#           kernel's shared tile body); the mean-K step and the register kernel's rows again
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session11
source scripts/gpu-lib.sh

case "${1:-staged}" in
  staged)
    build
    gtests block-index '*Cuda_BlockIndex*' 90
    gtests dsv4-indexer '*Dsv4_Indexer*' 60
    bench 110 index_bench 'BM_Score/h32x8x128/(B(1|8)/N131072|B32/N32768)/(mean_k|quest)/f(32|16)/sum/fast-tensor_core(_staged)?/|BM_Score/h9x3x64/B8/N131072/mean_k/f(32|16)/sum/fast-tensor_core(_staged)?/'
    NCU_SKIP=2 NCU_COUNT=1 profile staged-b8-f16 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast-tensor_core_staged/' 'summary_mma_staged'
    NCU_SKIP=2 NCU_COUNT=1 profile staged-b8-f32q index_bench \
      'BM_Score/h32x8x128/B8/N131072/quest/f32/sum/fast-tensor_core_staged/' 'summary_mma_staged'
    bench 60 step_bench '^BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|^BM_DecodeStep/32/32768/0/(0|2)/0/'
    sanitize memcheck-index memcheck '*Cuda_BlockIndex_MatchesCpu*:*Cuda_BlockIndex_TensorCoreNonFinite*' 80
    sanitize racecheck-index racecheck '*Cuda_BlockIndex_MatchesCpu*:*Cuda_BlockIndex_TensorCoreNonFinite*' 80
    report
    ;;
  final)
    build
    all_tests 300
    bench 60 step_bench '^BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|^BM_DecodeStep/32/32768/0/(0|2)/0/'
    bench 60 index_bench 'BM_Score/h32x8x128/B8/N131072/(mean_k|quest)/f(32|16)/sum/fast-tensor_core/'
    report
    ;;
  epilogue)
    build
    gtests block-index '*Cuda_BlockIndex*' 90
    bench 90 index_bench 'BM_Score/h32x8x128/(B(1|8)/N131072|B32/N32768)/(mean_k|quest)/f(32|16)/(sum/fast-tensor_core|max/fast)/'
    bench 60 step_bench '^BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|^BM_DecodeStep/32/32768/0/(0|2)/0/'
    sanitize memcheck-index memcheck '*Cuda_BlockIndex_MatchesCpu*:*Cuda_BlockIndex_TensorCoreNonFinite*' 60
    report
    ;;
  kmax)
    build
    gtests block-index '*Cuda_BlockIndex*' 90
    gtests defaults '*DecodeStep*:*Defaults*:*Layered*:*Parallel*' 60
    bench 60 index_bench 'BM_Score/h32x8x128/(B(1|8)/N131072|B32/N32768)/mean_k/f(32|16)/max/fast/|BM_Score/h32x8x128/B8/N131072/(mean_k|quest)/f(32|16)/sum/fast-tensor_core/'
    report
    ;;
  *) echo "gpu-session11.sh: staged | final | epilogue | kmax" >&2; exit 2 ;;
esac
finish
