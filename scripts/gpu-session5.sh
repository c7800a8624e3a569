#!/usr/bin/env bash
# Device calls of the fifth 2026-12-01 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh). The models travel in parts in the ignored models/ folder, one
# part per call (carry models/gemma.part-X or models/smollm2.part-XX), on one warm machine:
#   build     build; the tensor-core attention refactor of session 4 never run on a GPU
#   carry     nothing but the carried part (and what the previous call left running: nothing)
#   gemma     Gemma 3 270M (models/gemma.part-a..f joined, sha256 checked) through the quality
#             harness on the GPU: text C, three windows of 1024 positions at 16K, 24K and 32K
#   sweep     SmolLM2 (models/smollm2.part-aa..ac): the setting sweep of configs-sweep.txt,
#             text A 4096-6144
#   retrieval SmolLM2 retrieval prompts 1K-8K on the GPU, default scorer (and mean-K)
#   tests F   build; GPU tests matching filter F
#   w2, w2b   build and every test; then the helpers' old-vs-new benchmark rows
#   final1    build; every test (GPU, CPU, mini-decoder); MEMCHECK / RACECHECK filters
#   final2    kvc's benchmark rows and every anchor (PyTorch, DeepSeek-V4's PyTorch step,
#             FlashInfer, CUB) in ONE call, then the same-run table (scripts/perf-report.py)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session5
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

case "${1:-build}" in
  build)
    build
    gtests attention '*Cuda_Attention*:*Cuda_DenseDecode*:*Cuda_DecodeStep*' 150
    ;;
  carry)
    say "carried: $(ls models 2>/dev/null | tr '\n' ' ')"
    ;;
  gemma)
    join_model gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 models/gemma.part-? || exit 1
    # The longest context first: each window is one process (dense prefill of `start` tokens).
    for start in 31744 16384 24576; do
      (( $(left) < 150 )) && { say "gemma window $start: not run (deadline)"; continue; }
      quality_window gemma-$start models/gemma-3-270m-q4_k_m.gguf docs/quality/texts/text_c.md C \
        $start $(( start + 1024 )) docs/quality/configs-gemma-long.txt "$out/gemma-long.jsonl"
    done
    ;;
  sweep)
    join_smollm2 || exit 1
    quality_window sweep $smollm2 docs/quality/texts/text_a.md A 4096 ${SWEEP_END:-6144} \
      docs/quality/configs-sweep.txt
    ;;
  sweep-b)
    join_smollm2 || exit 1
    quality_window sweep-b $smollm2 docs/quality/texts/text_b.md B 6144 7168 \
      docs/quality/configs-sweep-b.txt
    ;;
  retrieval)
    retrieval_gpu ${LENGTHS:-8K,4K,2K,1K}
    ;;
  tests)
    build
    gtests filtered "${2:-*}" 300
    ;;
  w2)
    # The helpers' first deliveries: every test (GPU, CPU, mini-decoder), then their old-vs-new
    # benchmark rows (w2b, next call).
    build
    GTEST_FILTER='*' all_tests 240
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    ;;
  w2b)
    bench 40 topk_bench 'BM_TopKVariant/[0-9]+/[0-9]+/[0-9]+/(6|2000|2004|2008|2016|3000)/'
    bench 50 dsv4_bench 'BM_Dsv4TopK/|BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/(0|3|5|6|7)/|BM_Dsv4IndexDecode/1/64/0/0/|BM_Dsv4IndexProbe/(3|6)/'
    bench 60 attention_bench 'BM_DenseDecode/0/[18]/131072/[356]/|BM_BlockSelectExact/0/[18]/3/[356]/0/1/|BM_BlockSelectExact/0/1/3/[356]/(1|4|8|16|32)/1/|BM_RecentOnly/'
    bench 40 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/token_ma(ss|x)/mxfp4/sum/fast-(stream|stream_tc|stream_lean|stream_async|stream_async4)/'
    bench 40 store_bench 'BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:(0|4|6|7|8)/|BM_AppendStepStaggered|BM_AppendFloor|BM_Ingest/T:16384/format:3/index:(0|1)/kernels:(0|7|9)/'
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    ;;
  final1)
    build
    GTEST_FILTER='*' all_tests 300
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    [ -n "${MEMCHECK:-}" ] && sanitize memcheck memcheck "$MEMCHECK" 90
    [ -n "${RACECHECK:-}" ] && sanitize racecheck racecheck "$RACECHECK" 60
    ;;
  final2)
    # kvc's rows and every anchor in one call, so every ratio is a same-run ratio.
    [ -x build-gpu/benchmarks/step_bench ] || build
    bench 60 step_bench .
    bench 50 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(token_ma.*/mxfp4/sum/|mean_k/f(32|16)/sum/fast)'
    bench 80 attention_bench '^BM_BlockSelectExact/0/(1|8|32)/3/|^BM_DenseDecode/0/(1|8)/131072/'
    bench 50 topk_bench "${TOPK_FILTER:-BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/|BM_TopK/(1|64)/(131072|262144)/2048/}"
    bench 40 store_bench 'BM_AppendStep|BM_Ingest'
    bench 50 dsv4_bench 'BM_Dsv4IndexDecode|BM_Dsv4TopK|BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    anchors_and_report
    ;;
  *) echo "gpu-session5.sh: build, carry, gemma, sweep, retrieval, tests, w2, final1, final2" >&2; exit 2 ;;
esac
finish
