#!/usr/bin/env bash
# Device calls of the 2026-12-02 session (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh). The models travel in parts in the ignored models/ folder, one
# part per call (carry models/smollm2.part-aa..ac, models/gemma.part-a..f), on one warm machine:
#   tests   build; every test (GPU, CPU, mini-decoder): the session-6 defaults (store kLeanPdl,
#           token scorer kStreamLean, indexer variants 7/8) and the launch helper had never run
#           on a GPU; racecheck over the default attention path's tests (d 64..512, groups 1..16),
#           memcheck over the tests of every launch that goes through launch_kernel
#   carry   nothing but the carried model part (it stays on the warm machine)
#   smol    SmolLM2: the two-stage scorers on text B (docs/quality/configs-two-stage.txt), then
#           the retrieval prompts 1K-8K with ring 256 + top 32 (the candidate default)
#   gemma   Gemma 3 270M: the retrieval prompts (default and ring 256 + top 32), then text C at
#           4096 and 7168 (configs-gemma-4k8k.txt) and 16384 (configs-gemma-16k-two-stage.txt)
#   final   kvc's benchmark rows and every anchor in ONE call, the same-run table, and ncu
#           reports of the step's kernels; carry [".anchors/p1", ".anchors/p2"]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session7
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
gemma=models/gemma-3-270m-q4_k_m.gguf

# kvc_retrieval name model-file lengths [args...]: the retrieval prompts on the GPU into
# $out/retrieval/results-name.jsonl under the call's deadline.
kvc_retrieval() {
  local name=$1 model=$2 lengths=$3 l
  shift 3
  l=$(left)
  (( l < 60 )) && { say "retrieval $name: not run (deadline)"; return; }
  KVC_MODEL=$PWD/$model timeout $(( l - 20 )) scripts/real-retrieval --gpu --out "$out/retrieval" \
    --name "$name" -- --lengths "$lengths" --formats fp16k_q4v --policies topk "$@" \
    > "$out/retrieval-$name.log" 2>&1
  say "retrieval $name: rc=$? $(tail -1 "$out/retrieval-$name.log")"
}

case "${1:-tests}" in
  tests)
    build
    GTEST_FILTER='*' all_tests 300
    cp gpu-out/gpu-tests.log "$out/" 2>/dev/null
    sanitize racecheck racecheck '*Cuda_AttentionMma.GroupsAndHeadDims*:*Cuda_AttentionMma.VerifyT1To8*' 90
    sanitize memcheck memcheck '*Cuda_StoreUpdate.Lean*:*Cuda_BlockIndex_TokenStreamBound*:*Cuda_Dsv4_Indexer.EveryMxfp4*:*Cuda_AttentionMma.ClusterAndCombine*:*Cuda_Selector*Decode*' 75
    ;;
  carry)
    say "carried: $(ls models 2>/dev/null | tr '\n' ' ')"
    ;;
  smol)
    join_smollm2 || exit 1
    quality_window two-stage-b $smollm2 docs/quality/texts/text_b.md B 6144 7168 \
      docs/quality/configs-two-stage.txt
    kvc_retrieval ring256 $smollm2 1K,2K,4K,8K --recent-window 256 --top-blocks 32
    ;;
  gemma)
    join_model gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 models/gemma.part-? || exit 1
    kvc_retrieval gemma-default $gemma 1K,2K,4K,8K --top-blocks 8
    kvc_retrieval gemma-ring256 $gemma 1K,2K,4K,8K --recent-window 256 --top-blocks 32
    for start in 4096 7168; do
      (( $(left) < 150 )) && { say "gemma window $start: not run (deadline)"; continue; }
      quality_window gemma-$start $gemma docs/quality/texts/text_c.md C $start $(( start + 1024 )) \
        docs/quality/configs-gemma-4k8k.txt "$out/gemma-4k8k.jsonl"
    done
    (( $(left) >= 150 )) && quality_window gemma-16384 $gemma docs/quality/texts/text_c.md C 16384 \
      17408 docs/quality/configs-gemma-16k-two-stage.txt
    ;;
  final)
    # kvc's rows and every anchor in one call, so every ratio is a same-run ratio.
    [ -x build-gpu/benchmarks/step_bench ] || build
    bench 60 step_bench .
    bench 50 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(token_ma.*/mxfp4/sum/|mean_k/f(32|16)/sum/fast)'
    bench 70 attention_bench '^BM_BlockSelectExact/0/(1|8|32)/3/|^BM_DenseDecode/0/(1|8)/131072/'
    bench 45 topk_bench "${TOPK_FILTER:-BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/|BM_TopK/(1|64)/(131072|262144)/2048/}"
    bench 35 store_bench 'BM_AppendStep/|BM_Ingest/'
    bench 45 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/0/|BM_Dsv4TopK|BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    OUT="$out" timeout 60 python3 benchmarks/anchors/dsv4_anchors.py > "$out/dsv4_anchors.log" 2>&1
    say "dsv4 anchors: rc=$?"
    l=$(left)
    ANCHORS="torch flashinfer_decode flashinfer_topk cub" DEADLINE=$(( l - 15 )) \
      benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "peer anchors: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
    grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
    python3 scripts/perf-report.py "$out" > "$out/performance_table.md" 2>&1
    ;;
  *) echo "gpu-session7.sh: tests, carry, smol, gemma, final" >&2; exit 2 ;;
esac
finish
