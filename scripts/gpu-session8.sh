#!/usr/bin/env bash
# Device calls of the 2026-12-02 (eighth) session (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh). The Gemma model travels in parts in the ignored models/
# folder, one part per call (carry models/gemma.part-a..g, split -b 36159004: a 42 MB part and
# the 24.6 MB tree passed the 64 MiB a call carries), on one warm machine:
#   evidence  build; the launch floor (empty-kernel graphs) beside the B1 / B8 default steps in
#             one run; then Nsight Compute over every kernel of the rows that miss #12's and
#             #13's goals (the step's kernels at B1 and B8 with both scorers, select and dense
#             attention at B8, top-k large and decode-size, ingest, append, the DSv4 indexer and
#             top-k), each report with the stall reasons per issued instruction
#   steps     the step profiles of `evidence` with working filters, the token scorer's stalls
#             per SASS line
#   carry     nothing but the carried model part (it stays on the warm machine)
#   gemma     Gemma 3 270M on the H200: the retrieval prompts (the previous default and ring 256 +
#             top 32, the default since session 7), text C at 4096 and 7168
#             (configs-gemma-4k8k.txt) and 16384 (configs-gemma-16k-two-stage.txt)
#   final     build; every test; memcheck, benchmark rows and ncu of the warp-per-row summary
#             kernel
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session8
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
gemma=models/gemma-3-270m-q4_k_m.gguf
# Every kernel a decode step launches (scores, select, attention), not the fixture's ingests.
step_kernels='token_stream|token_mass_finish|summary_fast|score_kernel|topk|topm|policy|mma_decode|combine|merge'

# The launch floor beside the B1 / B8 steps (mean-K and the default scorer), then ncu over every
# kernel of one step of each (skipping the first two steps' launches).
step_profiles() {
  bench 60 step_bench '^BM_LaunchFloor|^BM_DecodeStep/(1|8)/131072/0/(0/0|1/1)/' -floor
  local row
  for row in 8/131072/0/1/1:b8-default 1/131072/0/1/1:b1-default 1/131072/0/0/0:b1-meank \
    8/131072/0/0/0:b8-meank; do
    NCU_STALLS=1 NCU_LIMIT=90 NCU_SKIP=12 NCU_COUNT=6 profile "step-${row#*:}" step_bench \
      "^BM_DecodeStep/${row%%:*}/" "$step_kernels"
  done
}

case "${1:-evidence}" in
  evidence)
    build
    step_profiles
    NCU_COUNT=2 profile attn-select-b8 attention_bench '^BM_BlockSelectExact/0/8/3/3/0/1/' 'mma_decode|combine|merge'
    NCU_COUNT=2 profile dense-b8 attention_bench '^BM_DenseDecode/0/8/131072/3/' 'mma_decode|combine|merge'
    NCU_COUNT=3 profile topk-1x131072 topk_bench '^BM_TopK/1/131072/2048/' 'topm|keys_kernel|clamp'
    NCU_COUNT=3 profile topk-64x131072 topk_bench '^BM_TopK/64/131072/2048/' 'topm|keys_kernel|clamp'
    NCU_COUNT=2 profile topk-decode-8x4096 topk_bench '^BM_TopKDecode/8/4096/8/2/' 'topk|topm'
    NCU_COUNT=4 profile ingest-16k store_bench '^BM_Ingest/T:16384/format:3/index:1/kernels:0/' 'rows|quantise|summarise|ring'
    NCU_COUNT=3 profile append-b64 store_bench '^BM_AppendStep/B:64/index:1/kernels:0/' 'append|plan|ring'
    NCU_COUNT=2 profile dsv4-index-b1 dsv4_bench '^BM_Dsv4IndexDecode/1/1/0/0/0/' 'prep_mxfp4|mxfp4_score'
    NCU_COUNT=3 profile dsv4-topk-b1 dsv4_bench '^BM_Dsv4TopK/1/262144/2048/0/0/' 'topm|keys_kernel|clamp'
    ;;
  steps)
    # The step's kernels alone (the first evidence call's filters ended in '$', which no row
    # name matches: Google Benchmark appends /manual_time), then the token scorer at B8 with
    # its stall samples per source line.
    build
    step_profiles
    NCU_SKIP=2 NCU_COUNT=1 profile token-b8-source step_bench '^BM_DecodeStep/8/131072/0/1/1/' 'token_stream' \
      --section SourceCounters --page source --print-source sass
    ;;
  carry)
    say "carried: $(ls models 2>/dev/null | tr '\n' ' ')"
    ;;
  gemma)
    join_model gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 models/gemma.part-? || exit 1
    [ -x build-gpu/examples/mini_decoder/real_retrieval ] || build
    retrieval_run gemma-ring256 $gemma 1K,2K,4K,8K --recent-window 256 --top-blocks 32
    retrieval_run gemma-ring1024 $gemma 1K,2K,4K,8K --top-blocks 8 --recent-window 1024
    for start in 4096 7168; do
      (( $(left) < 150 )) && { say "gemma window $start: not run (deadline)"; continue; }
      quality_window gemma-$start $gemma docs/quality/texts/text_c.md C $start $(( start + 1024 )) \
        docs/quality/configs-gemma-4k8k.txt "$out/gemma-4k8k.jsonl"
    done
    (( $(left) >= 150 )) && quality_window gemma-16384 $gemma docs/quality/texts/text_c.md C 16384 \
      17408 docs/quality/configs-gemma-16k-two-stage.txt
    ;;
  final)
    # The warp-per-row summary kernel (kernels/index/score_rows.cuh, now the mean-K / Quest
    # default): its tests, its rows beside the old kernel's and the mean-K step, ncu of it at B8,
    # memcheck over its tests, then every test.
    build
    gtests block-index '*Cuda_BlockIndex*:*Cuda_DecodeStep*' 60
    bench 45 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k|quest)/f(32|16)/sum/fast'
    bench 30 step_bench '^BM_DecodeStep/(1|8)/131072/0/0/0/|^BM_DecodeStep/32/32768/0/0/0/'
    NCU_STALLS=1 NCU_SKIP=2 NCU_COUNT=1 profile rows-b8 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f32/sum/fast-warp_row' 'summary_rows'
    sanitize memcheck memcheck '*Cuda_BlockIndex*' 40
    report
    GTEST_FILTER='*' all_tests $(( $(left) - 15 ))
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    ;;
  *) echo "gpu-session8.sh: evidence, carry, gemma, final" >&2; exit 2 ;;
esac
finish
