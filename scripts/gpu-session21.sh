#!/usr/bin/env bash
# Device calls of the twenty-first session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   verify  kAuto with two staged slots at d 128 B1 (branch wip/auto-staged-b1, now on main): the
#           attention GPU tests; select B1 on kAuto (0), the register kernel (3) and two staged
#           slots (8); the staged rows that failed with "invalid argument" in the twentieth
#           session's staged2 call (dense x3 / x4 at B1, x4 at B8, select B32 x3); the decode
#           steps at N128K with kAuto's attention against the register kernel (budget 30);
#           Nsight Compute (with source-level stall counters) of the tensor-core summary scorer
#           at B8 N128K mean-K f16, the step's largest kernel
#   score   the tensor-core summary scorer with the query fragments loaded once per warp (one
#           token, one chunk of heads) and at most 168 registers (no spills; 3 CTAs per SM): the
#           block-index and decode-step GPU tests; index_bench's summary rows against the per-tile
#           query loads (fast-tensor_core_qtile); the decode steps; Nsight of the B8 f16 scorer;
#           memcheck / initcheck over the block-index tests
#   score2  the same with a second instantiation for one tile per warp (four CTAs per SM, at most
#           128 registers; B1's 2032 warps then fit one wave): every benchmark the final call
#           needs is built; the block-index and decode-step GPU tests; the summary rows with
#           one / four tiles per warp pinned and the per-tile query loads; the decode steps;
#           memcheck / initcheck over the block-index tests
#   check   the block table's loads beside the length in the summary scorer, and load_packed
#           shared by the store and the staged attention (its SASS unchanged): the block-index,
#           decode-step, staged-attention and store-update GPU tests; the summary rows (one /
#           four tiles per warp pinned) and the steps at N128K; memcheck over the block-index
#           tests (DEADLINE=300: the session's last device minutes)
#   final1  the same-run table's kvc rows (same_run_kvc in scripts/gpu-lib.sh; carry
#           .anchors/p1/flashinfer-sm90a.tar.xz), then, back to back on the same warm machine,
#   final2  its anchors and report (anchors_and_report; carry the rest of .anchors/p1): the
#           tracked tree (35 MB) and the whole bundle (32 MB) no longer fit one call's 64 MiB
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session21
case "${1:-}" in final*) out=$PWD/gpu-out/session21-final ;; esac
[ "${1:-}" = final2 ] && export KEEP_SUMMARY=1  # final1's lines stay in summary.txt
source scripts/gpu-lib.sh

case "${1:-verify}" in
  verify)
    build_targets kvc_cuda_tests attention_bench step_bench index_bench
    gtests attn '*Cuda_Attention*' 200
    BENCH_REPS=3 bench 120 attention_bench \
      '^BM_BlockSelectExact/0/1/3/(0|3|8)/0/1/|^BM_DenseDecode/0/1/131072/(0|3|7|9)/|^BM_DenseDecode/0/8/131072/(0|9)/|^BM_BlockSelectExact/0/32/3/(0|7)/0/1/'
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/(0|30)/'
    BENCH_REPS=3 bench 60 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/mean_k/f16/sum/fast(|-tensor_core1|-tensor_core4)/'
    NCU_STALLS=1 NCU_SKIP=2 profile summary-b8-f16 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast/' 'summary_mma' --section SourceCounters
    report
    ;;
  score)
    build_targets kvc_cuda_tests index_bench step_bench
    gtests score '*Cuda_BlockIndex*:*DecodeStep*' 150
    BENCH_REPS=3 bench 150 index_bench \
      'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k/f(16|32)|quest/f16)/sum/fast(|-tensor_core_qtile)/|BM_Score/h32x8x128/B32/N32768/mean_k/f16/sum/fast(|-tensor_core_qtile)/|BM_Score/smollm2/B8/N131072/mean_k/f16/sum/fast(|-tensor_core_qtile)/'
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|BM_DecodeStep/32/32768/0/(0|2)/0/'
    NCU_STALLS=1 NCU_SKIP=2 profile summary-b8-f16 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast/' 'summary_mma' --section SourceCounters
    sanitize memcheck memcheck '*Cuda_BlockIndex*' 60
    sanitize initcheck initcheck '*Cuda_BlockIndex_MatchesCpu*' 40
    report
    ;;
  score2)
    build_targets kvc_cuda_tests index_bench step_bench attention_bench topk_bench store_bench \
      dsv4_bench
    gtests score '*Cuda_BlockIndex*:*DecodeStep*' 150
    BENCH_REPS=3 bench 150 index_bench \
      'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k/f(16|32)|quest/f16)/sum/fast(|-tensor_core1|-tensor_core4|-tensor_core_qtile)/|BM_Score/h32x8x128/B32/N32768/mean_k/f16/sum/fast(|-tensor_core_qtile)/|BM_Score/smollm2/B(1|8)/N131072/mean_k/f16/sum/fast(|-tensor_core_qtile)/'
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|BM_DecodeStep/32/32768/0/(0|2)/0/'
    sanitize memcheck memcheck '*Cuda_BlockIndex*' 60
    sanitize initcheck initcheck '*Cuda_BlockIndex_MatchesCpu*:*TensorCoreNonFinite*' 40
    report
    ;;
  check)
    build_targets kvc_cuda_tests index_bench step_bench
    gtests check '*Cuda_BlockIndex*:*DecodeStep*:*Cuda_AttentionMma.DensePlainCacheStaged*:*Cuda_AttentionMma.SplitExtremes*:*Cuda_StoreUpdate*' 90
    BENCH_REPS=3 bench 40 index_bench \
      'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k/f16/sum/fast(|-tensor_core1|-tensor_core4)|mean_k/f32/sum/fast|quest/f16/sum/fast)/|BM_Score/smollm2/B8/N131072/mean_k/f16/sum/fast(|-tensor_core1|-tensor_core4)/'
    bench 30 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/0/'
    sanitize memcheck memcheck '*Cuda_BlockIndex*' 50
    report
    ;;
  final1)
    build_targets kvc_cuda_tests index_bench step_bench attention_bench topk_bench store_bench \
      dsv4_bench
    TOPK_FILTER='BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/|BM_TopK/(1|64)/(131072|262144)/2048/' \
      DSV4_FILTER='BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/0/|BM_Dsv4TopK/(1|8)/262144/(512|1024|2048)/0/0/|BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/0/' \
      same_run_kvc
    gtests score '*Cuda_BlockIndex*:*DecodeStep*' 60
    ;;
  final2)
    anchors_and_report
    ;;
  *) echo "gpu-session21.sh: verify | score | score2 | check | final1 | final2" >&2; exit 2 ;;
esac
finish
