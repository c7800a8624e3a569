#!/usr/bin/env bash
# Device calls prepared in the twenty-fourth session, 2026-12-04, when no GPU was lent: the
# first session with a device runs them (each under the 10-minute limit; results in $OUT,
# helpers in scripts/gpu-lib.sh):
#   twostage  two-stage token mass (BlockIndexConfig::candidates; written without a GPU): its GPU
#             tests and every token-score GPU test (the general and finish kernels changed),
#             the four compute-sanitizer tools over the two-stage tests, then the decode step
#             with one and two stages (step_bench scorers 1, 3 and 4) beside PyTorch's anchors,
#             then the Python package's tests on the GPU (kvc.dsv4's CUDA objects against the
#             CPU reference, twenty-fifth session; pytest_gpu builds the module into build-gpu)
#   final     the same-run table (kvc's rows, then every peer anchor in the same call) for
#             docs/perf-data/latest.json, and the staged attention's pinned-split rows at B1 / B8
#             (two slots, splits 2 / 4 / 8 / 32) registered in the twenty-third session
#   quality   SmolLM2 through the CUDA two-stage path on a real model: text B 6144-7168 with one
#             and two stages (docs/quality/configs-smollm2-two-stage.txt), to set beside the CPU
#             rows of the twenty-fourth session (docs/quality.md); needs models/smollm2.part-*
#             carried by the calls before it (scripts/model-path says how a model travels)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session24
rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
source scripts/gpu-lib.sh

case "${1:-twostage}" in
  twostage)
    build_targets kvc_cuda_tests step_bench
    gtests twostage '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 150
    two='*Cuda_BlockIndex_TwoStage*'
    sanitize memcheck memcheck "$two" 60
    sanitize racecheck racecheck "$two" 60
    sanitize initcheck initcheck "$two" 60
    sanitize synccheck synccheck "$two" 40
    bench 90 step_bench '/(1|8)/131072/0/(1|3|4)/(0|1)/|/32/32768/0/(1|3)/(0|1)/'
    torch_anchors
    pytest_gpu tests/python/test_dsv4.py tests/python/test_gpu.py
    report
    ;;
  final)
    same_run_kvc
    # Its own tag: the same-run rows of attention_bench (same_run_kvc) keep their file (the
    # twenty-fifth session's call wrote both to attention_bench.json, and the second won).
    bench 40 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/8/(2|4|8|32)/1/' -pinned
    anchors_and_report
    ;;
  quality)
    build_targets quality_eval
    join_smollm2 &&
      quality_window smollm2-b-two-stage $smollm2 docs/quality/texts/text_b.md text_b 6144 7168 \
        docs/quality/configs-smollm2-two-stage.txt
    ;;
  *) echo "gpu-session24.sh: twostage | final | quality" >&2; exit 2 ;;
esac
finish
