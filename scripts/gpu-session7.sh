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
    retrieval_run ring256 $smollm2 1K,2K,4K,8K --recent-window 256 --top-blocks 32
    ;;
  gemma)
    join_model gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 models/gemma.part-? || exit 1
    retrieval_run gemma-default $gemma 1K,2K,4K,8K --top-blocks 8
    retrieval_run gemma-ring256 $gemma 1K,2K,4K,8K --recent-window 256 --top-blocks 32
    for start in 4096 7168; do
      (( $(left) < 150 )) && { say "gemma window $start: not run (deadline)"; continue; }
      quality_window gemma-$start $gemma docs/quality/texts/text_c.md C $start $(( start + 1024 )) \
        docs/quality/configs-gemma-4k8k.txt "$out/gemma-4k8k.jsonl"
    done
    (( $(left) >= 150 )) && quality_window gemma-16384 $gemma docs/quality/texts/text_c.md C 16384 \
      17408 docs/quality/configs-gemma-16k-two-stage.txt
    ;;
  final)
    same_run_final
    ;;
  *) echo "gpu-session7.sh: tests, carry, smol, gemma, final" >&2; exit 2 ;;
esac
finish
