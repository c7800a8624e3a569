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
#   bench     the benchmark rows of the session's kernels (old and new variants)
#   final1    build; every test (GPU, CPU, mini-decoder); memcheck / racecheck of new kernels
#   final2    kvc's benchmark rows and every anchor (PyTorch, FlashInfer, CUB) in ONE call
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session5
source scripts/gpu-lib.sh
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# name sha256 parts...: joins model parts into models/<name> once and checks its checksum.
join_model() {
  local name=$1 sum=$2
  shift 2
  [ -f "models/$name" ] || cat "$@" > "models/$name"
  echo "$sum  models/$name" | sha256sum -c --quiet - || { say "$name: checksum mismatch"; return 1; }
}

case "${1:-build}" in
  build)
    build
    gtests attention '*Cuda_Attention*:*Cuda_DenseDecode*:*Cuda_DecodeStep*' 150
    ;;
  carry)
    say "carried: $(ls models 2>/dev/null | tr '\n' ' ')"
    ;;
  gemma)
    [ -x build-gpu/examples/mini_decoder/quality_eval ] || build
    join_model gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 models/gemma.part-? || exit 1
    # The longest context first: each window is one process (dense prefill of `start` tokens).
    for start in 31744 16384 24576; do
      l=$(left)
      (( l < 150 )) && { say "gemma window $start: not run (deadline)"; continue; }
      timeout $(( l - 10 )) build-gpu/examples/mini_decoder/quality_eval \
        --model models/gemma-3-270m-q4_k_m.gguf --text-file docs/quality/texts/text_c.md \
        --text-name C --start $start --end $(( start + 1024 )) --bucket 512 --device cuda \
        --configs-file docs/quality/configs-gemma-long.txt --jsonl "$out/gemma-long.jsonl" \
        --note "kvc $rev" > "$out/gemma-$start.log" 2>&1
      say "gemma window $start: rc=$? $(grep -E 'done' "$out/gemma-$start.log" | tail -1)"
      sed -n '/^config/,$p' "$out/gemma-$start.log" >> "$out/summary.txt"
    done
    ;;
  sweep)
    [ -x build-gpu/examples/mini_decoder/quality_eval ] || build
    join_model SmolLM2-135M-Instruct.Q4_1.gguf \
      b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 models/smollm2.part-* || exit 1
    l=$(left)
    timeout $(( l - 10 )) build-gpu/examples/mini_decoder/quality_eval \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text-file docs/quality/texts/text_a.md \
      --text-name A --start 4096 --end ${SWEEP_END:-6144} --bucket 512 --device cuda \
      --configs-file docs/quality/configs-sweep.txt --jsonl "$out/sweep.jsonl" \
      --note "kvc $rev" > "$out/sweep.log" 2>&1
    say "sweep: rc=$? $(grep -E 'done' "$out/sweep.log" | tail -1)"
    sed -n '/^config/,$p' "$out/sweep.log" >> "$out/summary.txt"
    ;;
  retrieval)
    [ -x build-gpu/examples/mini_decoder/real_retrieval ] || build
    join_model SmolLM2-135M-Instruct.Q4_1.gguf \
      b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 models/smollm2.part-* || exit 1
    l=$(left)
    KVC_MODEL=$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf timeout $(( l - 10 )) \
      scripts/real-retrieval --gpu --out "$out/retrieval" -- --lengths ${LENGTHS:-8K,4K,2K,1K} \
      --top-blocks 8 --formats fp16k_q4v --policies topk > "$out/retrieval.log" 2>&1
    say "retrieval: rc=$? $(tail -2 "$out/retrieval.log" | tr '\n' ' ')"
    ;;
  tests)
    build
    gtests filtered "${2:-*}" 300
    ;;
  *) echo "gpu-session5.sh: build, carry, gemma, sweep, retrieval, tests" >&2; exit 2 ;;
esac
finish
