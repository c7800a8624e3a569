#!/usr/bin/env bash
# Device calls of the sixteenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   topk   the spread top-k's sampled cut (kernels/select/spread.cuh): build of the CUDA tests,
#          topk_bench and dsv4_bench; the selector and DeepSeek-V4 top-k GPU tests; the spread
#          rows with and without the sampled cut (topk_bench variants 5 / 7, dsv4_bench's top-k
#          variants 0 / 3) and the built-in rows; the phase probe on 1 x 131072 / 262144 with
#          uniform, Gaussian and tied scores, sampled and exact; memcheck over the spread tests,
#          racecheck over the new one
#   topk2  the same after the sample's histogram lost __match_any_sync (warp_hist_add; also in
#          refine_cut): the tests, the rows and the probe again
#   third  the spread path built in up to 64 rows; the 16-warp sparse-attention kernel (variant
#          200) beside the 8-warp one (100): the selector and sparse-attention GPU tests (every
#          variant), dsv4_bench's CSA / HCA rows, the spread / streaming rows at 32 x 65536 and
#          64 x 32768, the probe with the sampled cut's inner marks (the sample's digit picked by
#          one warp from the top; the finisher's fallback starting at the sampled cut); racecheck
#          on one HCA shape
#   final  the sampled cut from 2 rows on (and never across tied scores), 16 warps for MODEL1
#          sparse attention: the selector and DeepSeek-V4 GPU tests; topk_bench's and dsv4_bench's
#          top-k and sparse-attention rows with their variants; dsv4_anchors.py (PyTorch) and
#          FlashInfer's top_k (the .anchors/p1 bundle; large-k shapes) in the same call; memcheck
#          over the spread tests and one sparse-attention shape, synccheck over two. (Its topk_bench
#          variant 8 and dsv4_bench top-k variant 4, the cut on one-row calls, were removed by the
#          commit after the call, which made that the built-in choice.)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session16
source scripts/gpu-lib.sh

topk_rows='BM_TopKVariant/(1|4|16|64)/(131072|262144)/(512|1024|2048)/(5|7)/'
topk_rows+='|BM_TopK/(1|64)/(131072|262144)/2048/'

case "${1:-topk}" in
  topk)
    build_targets kvc_cuda_tests topk_bench dsv4_bench
    gtests select '*Cuda_Selector*:*Cuda_Dsv4*TopK*:*Cuda_Dsv4_Indexer*Select*' 200
    bench 120 topk_bench "$topk_rows"
    bench 60 dsv4_bench 'BM_Dsv4TopK/.*/(0|3)/'
    for n in 131072 262144; do
      for d in 0 1 2; do
        topk_trace "s-$n-$d" "$n" 2048 "$d" 0 1
      done
      topk_trace "e-$n-0" "$n" 2048 0 0 0
    done
    sanitize memcheck memcheck '*Cuda_Selector_Spread*' 90
    sanitize racecheck racecheck '*Cuda_Selector_Spread.MisleadingSample*' 90
    report
    ;;
  topk2)
    build_targets kvc_cuda_tests topk_bench dsv4_bench
    gtests select '*Cuda_Selector*:*Cuda_Dsv4*TopK*:*Cuda_Dsv4_Indexer*Select*' 200
    bench 120 topk_bench "$topk_rows"
    bench 60 dsv4_bench 'BM_Dsv4TopK/.*/(0|3)/'
    for n in 131072 262144; do
      for d in 0 1 2; do
        topk_trace "s-$n-$d" "$n" 2048 "$d" 0 1
      done
    done
    topk_trace "e-262144-2" 262144 2048 2 0 0
    report
    ;;
  third)
    build_targets kvc_cuda_tests topk_bench dsv4_bench
    gtests select '*Cuda_Selector*:*Cuda_Dsv4*TopK*' 150
    gtests dsv4attn '*Cuda_Dsv4_Attention*:*Cuda_Dsv4_Pipeline*' 150
    bench 90 dsv4_bench 'BM_Dsv4(Csa|Hca)Decode'
    bench 90 topk_bench 'BM_TopKVariant/(32|64)/(32768|65536)/(512|2048)/(3|5|7)/'
    topk_trace s-131072-0 131072 2048 0 0 1
    topk_trace s-262144-0 262144 2048 0 0 1
    topk_trace s-131072-2 131072 2048 2 0 1
    bench 60 topk_bench 'BM_TopKVariant/1/(131072|262144)/2048/(5|7)/' -b1
    sanitize racecheck racecheck '*Cuda_Dsv4_Attention*hca_model1_h8*' 60
    report
    ;;
  final)
    build_targets kvc_cuda_tests topk_bench dsv4_bench
    gtests select '*Cuda_Selector*:*Cuda_Dsv4*' 110
    bench 70 topk_bench "$topk_rows|BM_TopKVariant/(32|64)/(32768|65536)/(512|2048)/(3|5|7)/|BM_TopKVariant/1/(131072|262144)/2048/8/"
    bench 70 dsv4_bench 'BM_Dsv4TopK/.*/(0|3|4)/|BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/(0|100|200)/'
    sanitize memcheck memcheck '*Cuda_Selector_Spread*:*Cuda_Dsv4_Attention*hca_model1_h8*' 70
    OUT="$out" timeout 60 python3 benchmarks/anchors/dsv4_anchors.py > "$out/dsv4_anchors.log" 2>&1
    say "dsv4 anchors: rc=$? $(tail -4 "$out/dsv4_anchors.log" | tr -s ' ' | tr '\n' ';')"
    ANCHORS="flashinfer_topk" FLASHINFER_TOPK_ARGS=--large DEADLINE=100 \
      benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "peer anchors: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
    sanitize synccheck synccheck '*Cuda_Dsv4_Attention*hca_model1_h8*:*Cuda_Selector_Spread.Misleading*' 50
    report
    ;;
  *) echo "gpu-session16.sh: topk | topk2 | third | final" >&2; exit 2 ;;
esac
finish
