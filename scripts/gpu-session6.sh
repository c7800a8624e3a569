#!/usr/bin/env bash
# Device calls of the sixth 2026-12-01 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh). SmolLM2 travels in parts in the ignored models/ folder, one
# part per call (carry models/smollm2.part-aa, -ab, -ac), on one warm machine:
#   tests     build; every test (GPU, CPU, mini-decoder); memcheck and racecheck over the tests
#             of the kernels that had never run on a GPU (staged attention, resident top-k, the
#             lean store kernels, DeepSeek-V4 indexer variants 6 to 8)
#   variants  the new kernels beside the old ones in one run (attention paths 3 / 5 / 6, top-k
#             resident path, token-scorer streams, store kernel sets, indexer variants)
#   retrieval SmolLM2 (models/smollm2.part-* joined) through the retrieval prompts on the GPU,
#             LENGTHS (default 8K,4K), top 8 fp16k_q4v, the default scorer (the retrieval tests'
#             GPU rows, MiniDecoder_CudaRetrievalRun, run in `tests`)
#   sweep-b   the budget shapes that beat the default on text A, on text B (6144-7168)
#   final     kvc's benchmark rows and every anchor (PyTorch, DeepSeek-V4's PyTorch step,
#             FlashInfer, CUB) in ONE call, then the same-run table (scripts/perf-report.py);
#             carry [".anchors/p1", ".anchors/p2"]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session6
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

new_kernel_tests='*Cuda_AttentionStaged*:*Cuda_Selector_Resident*:*Cuda_StoreUpdate.Lean*:*Cuda_Dsv4_Indexer.EveryMxfp4*:*Cuda_BlockIndex_TokenStreamBound*'

case "${1:-tests}" in
  tests)
    build
    GTEST_FILTER='*' all_tests 300
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    sanitize memcheck memcheck "$new_kernel_tests" 75
    sanitize racecheck racecheck "${RACECHECK:-*Cuda_AttentionStaged.LongRows*:*Cuda_Selector_Resident.Every*:*Cuda_StoreUpdate.LeanIngestCloses*}" 60
    ;;
  variants)
    [ -x build-gpu/benchmarks/attention_bench ] || build
    bench 50 attention_bench 'BM_DenseDecode/0/[18]/131072/[356]/|BM_BlockSelectExact/0/[18]/3/[356]/0/1/|BM_BlockSelectExact/0/1/3/[356]/(1|4|8|16|32)/1/|BM_RecentOnly/'
    bench 35 topk_bench 'BM_TopKVariant/[0-9]+/[0-9]+/[0-9]+/(6|2000|2004|2008|2016|3000)/'
    bench 40 dsv4_bench 'BM_Dsv4TopK/|BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/(0|3|5|6|7|8)/|BM_Dsv4IndexDecode/1/64/0/0/|BM_Dsv4IndexProbe/(3|6)/'
    bench 30 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/token_ma(ss|x)/mxfp4/sum/fast(|-stream|-stream_tc|-stream_lean|-stream_async|-stream_async4)/'
    bench 30 store_bench 'BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:(0|4|6|7|8)/|BM_AppendStepStaggered|BM_AppendFloor|BM_Ingest/T:16384/format:3/index:(0|1)/kernels:(0|7|9)/'
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    ;;
  retrieval)
    retrieval_gpu ${LENGTHS:-8K,4K}
    ;;
  sweep-b)
    join_smollm2 || exit 1
    quality_window sweep-b $smollm2 docs/quality/texts/text_b.md B 6144 7168 \
      docs/quality/configs-sweep-b.txt
    ;;
  final)
    same_run_final
    ;;
  step-torch)
    # The decode step and attention rows beside the PyTorch anchor alone (no bundle to carry).
    bench 60 step_bench 'BM_DecodeStep'
    bench 35 attention_bench '^BM_DenseDecode/0/(1|8)/131072/3/|^BM_BlockSelectExact/0/(1|8)/3/3/0/1/'
    l=$(left)
    ANCHORS="torch" DEADLINE=$(( l - 10 )) benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "torch anchor: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
    report
    ;;
  *) echo "gpu-session6.sh: tests, variants, retrieval, sweep-b, final, step-torch" >&2; exit 2 ;;
esac
finish
