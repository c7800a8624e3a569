#!/usr/bin/env bash
# Device calls of the 2026-12-02 (tenth) session (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   probe  build; the summary kernel with the kv head innermost in its grid beside the ninth
#          session's order (tests, rows, ncu of both at B8 f16; the `_hi` variant was a local
#          experiment, reverted after this call measured no gain, so those filters match nothing
#          now); select attention at B1 / B8 per
#          split; the mean-K step over f32 and f16 summaries; racecheck over the tensor-core
#          attention tests with every hazard printed and tallied by kernel
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session10
source scripts/gpu-lib.sh

# name filter limit: racecheck over the GPU tests matching filter, every hazard printed, then
# the hazards tallied by kernel template (the d = 256 attention kernel's are the known artefact).
race_tally() {
  local l limit=$3
  l=$(left)
  (( l < 30 )) && { say "racecheck $1: not run (deadline)"; return; }
  (( limit > l - 15 )) && limit=$(( l - 15 ))
  timeout "$limit" compute-sanitizer --tool racecheck --print-limit 100000 \
    build-gpu/tests/kvc_cuda_tests --gtest_filter="$2" --gtest_brief=1 \
    > "$out/racecheck-$1.log" 2>&1
  say "racecheck $1: rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/racecheck-$1.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$out/racecheck-$1.log" | tr '\n' ' ')"
  grep 'Race reported' "$out/racecheck-$1.log" | grep -oE '[a-z_]+<\(int\)[0-9]+' | sort | uniq -c | sed 's/^/  /' \
    | tee -a "$out/summary.txt"
}

case "${1:-probe}" in
  probe)
    build
    gtests block-index '*Cuda_BlockIndex*' 60
    bench 40 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k|quest)/f(32|16)/sum/fast-tensor_core(_hi)?/'
    NCU_SKIP=2 NCU_COUNT=1 profile mma-b8-f16 index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast-tensor_core/' 'summary_mma'
    NCU_SKIP=2 NCU_COUNT=1 profile mma-b8-f16-hi index_bench \
      'BM_Score/h32x8x128/B8/N131072/mean_k/f16/sum/fast-tensor_core_hi/' 'summary_mma'
    bench 40 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/(2|3)/0/1/|^BM_BlockSelectExact/0/(1|8)/3/2/(1|2|4|8)/1/'
    bench 60 step_bench '^BM_DecodeStep/(1|8)/131072/0/(0|2)/0/|^BM_DecodeStep/32/32768/0/(0|2)/0/'
    race_tally attention-mma '*Cuda_AttentionMma*' 120
    report
    ;;
  *) echo "gpu-session10.sh: probe" >&2; exit 2 ;;
esac
finish
