#!/usr/bin/env bash
# Device calls of the eighteenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh; which code each call ran: docs/perf-data/
# 2026-12-04-session18/README.md):
#   attn   the tensor-core attention's selected ids and block-table entries read together with
#          the slot (p.early_ids) and its launch as a programmatic dependent: build of the CUDA
#          tests, attention_bench and step_bench; the attention GPU tests; block-select rows at
#          B1 / B8 for paths 3 (library), 5 (ids after the length) and 6 (then: plain launch;
#          now: programmatic launch) and the splits; the decode step; ncu of the B1 kernel;
#          memcheck / racecheck / synccheck / initcheck over the tests that run the changed kernel
#   ab     the same in the decode step: step_bench with the attention's library path against
#          paths 5 and 6 (budget argument + 50 / 60), attention_bench B1 / B8 paths 3 / 5 / 6
#   prof   ncu's per-instruction source counters (SASS, stall samples) of the block-select
#          attention kernel at B1 and B8 N128K
#   merge  (branch wip/cluster-async-merge) the cluster merge by asynchronous stores against
#          e1de36b's binaries (old_*, carried as .anchors/old-bins.tar.xz with the Google
#          Benchmark 1.7 library they were linked with), alternated in one call; the attention
#          and step tests; synccheck, racecheck and memcheck over the cluster tests
#   tests  everything built (scripts/gpu-check build) and every test (scripts/gpu-check test);
#          synccheck / racecheck over the cluster tests; attention and step rows
#   sync   (branch wip/cluster-async-merge, not run yet) synccheck over the cluster tests after
#          the receive barrier's invalidation
#   final  the same-run table (same_run_final; carry .anchors/p1) on the warm machine of `tests`
#          (not run this session)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session18
source scripts/gpu-lib.sh

cluster_tests='*Cuda_AttentionMma.ClusterAndCombine*:*Cuda_AttentionMma.SplitExtremes*'
attn_rows='^BM_BlockSelectExact/0/(1|8)/3/3/0/1/'
step_rows='BM_DecodeStep/(1|8)/131072/0/(0|1|2)/0/'

# limit: this tree's attention and step rows alternated with e1de36b's binaries (old_*, from
# .anchors/old-bins.tar.xz; linked with Google Benchmark 1.7, carried beside them, whose
# --benchmark_min_time takes a plain number).
against_old() {
  local round old_lib=$PWD/build-gpu/benchmarks/oldlib
  tar xJf .anchors/old-bins.tar.xz -C build-gpu/benchmarks
  for round in 1 2; do
    BENCH_REPS=5 bench "$1" attention_bench "$attn_rows" -new$round
    LD_LIBRARY_PATH=$old_lib BENCH_TIME=0.05 BENCH_REPS=5 bench "$1" old_attention_bench \
      "$attn_rows" -$round
  done
  bench $(( 2 * $1 )) step_bench "$step_rows" -new
  LD_LIBRARY_PATH=$old_lib BENCH_TIME=0.05 bench $(( 2 * $1 )) old_step_bench "$step_rows"
}

case "${1:-attn}" in
  attn)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests attention '*Cuda_Attention*:*Cuda_Layered*:*Cuda_DecodeStep*:*Cuda_DenseDecode*:*Cuda_Merge*:*Cuda_Sharding*:*Cuda_ContextParallel*:*Cuda_Reliability*:*Cuda_Telemetry*' 150
    BENCH_REPS=5 bench 60 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/(3|5|6)/0/1/|^BM_BlockSelectExact/0/1/3/2/(4|8|16|32)/1/|^BM_BlockSelectExact/0/32/3/2/0/1/'
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|1)/0/|BM_DecodeStep/32/32768/0/1/0/'
    NCU_STALLS=1 NCU_SKIP=5 profile attn-b1 attention_bench '^BM_BlockSelectExact/0/1/3/3/0/1/' 'mma_decode_kernel' --clock-control none
    local_filter='*Cuda_AttentionMma.ClusterAndCombineMergesAgree*:*Cuda_AttentionMma.OutOfRange*'
    sanitize memcheck memcheck "$local_filter" 70
    sanitize racecheck racecheck "$local_filter" 70
    sanitize synccheck synccheck "$local_filter" 40
    sanitize initcheck initcheck "$local_filter" 50
    report
    ;;
  ab)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests attention '*Cuda_AttentionMma*:*Cuda_Attention.*' 100
    bench 100 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/(3|5|6)/0/1/'
    bench 200 step_bench 'BM_DecodeStep/(1|8)/131072/0/(0|2)/(0|50|60)/|BM_DecodeStep/8/131072/0/1/(0|60)/'
    sanitize memcheck memcheck '*Cuda_AttentionMma.OutOfRange*' 60
    report
    ;;
  merge)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests attention '*Cuda_Attention*:*Cuda_Layered*:*Cuda_DecodeStep*:*Cuda_DenseDecode*:*Cuda_Merge*' 120
    sanitize synccheck synccheck "$cluster_tests" 50
    sanitize racecheck racecheck "$cluster_tests" 50
    sanitize memcheck memcheck "$cluster_tests" 50
    against_old 25
    report
    ;;
  sync)
    build_targets kvc_cuda_tests
    sanitize synccheck synccheck "$cluster_tests" 60
    gtests cluster "$cluster_tests:*Cuda_AttentionMma.GroupsAndHeadDims*" 30
    ;;
  prof)
    build_targets attention_bench
    for b in 1 8; do
      timeout 90 ncu --target-processes all -k regex:mma_decode_kernel --launch-skip 5 \
        --launch-count 1 --clock-control none --section SourceCounters --section WarpStateStats \
        --page source --print-source sass --csv \
        build-gpu/benchmarks/attention_bench --benchmark_filter="^BM_BlockSelectExact/0/$b/3/3/0/1/" \
        --benchmark_min_time=1x --benchmark_repetitions=1 > "$out/ncu-source-b$b.csv" 2>&1
      say "ncu source b$b: rc=$? $(wc -l < "$out/ncu-source-b$b.csv") lines"
    done
    ;;
  tests)
    build
    all_tests 300
    cp gpu-out/*.log "$out/" 2>/dev/null
    sanitize synccheck synccheck "$cluster_tests" 60
    sanitize racecheck racecheck "$cluster_tests" 60
    against_old 30
    report
    ;;
  final)
    same_run_final
    ;;
  *) echo "gpu-session18.sh: attn | ab | prof | merge | tests | sync | final" >&2; exit 2 ;;
esac
finish
