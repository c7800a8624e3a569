#!/usr/bin/env bash
# Device calls of the nineteenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   ingest  the ingest with a warp per (block, head) (block_rows_kernel, StoreKernels::kBlockRows,
#           the library's choice now): the store and layered-cache GPU tests; BM_Ingest with the
#           new kernel (0), the warp-per-row kernel before it (3), legacy (1), lean (7) and
#           staged (9); memcheck / racecheck / synccheck / initcheck over the tests that run it;
#           BM_Ingest again with block_rows_kernel held to 5 CTAs per SM (__launch_bounds__);
#           then the branch wip/cluster-async-merge (carry .anchors/cluster-async-merge.patch)
#           applied on top and synccheck over the cluster tests after the receive barrier's
#           invalidation
#   ingest2 the same after the encoder's per-row work was cut (e2m1_encode without branches, the
#           mxfp4 group's 2^-e once per group, OldRowLayout computed once per kernel, the row's
#           place without a modulo): the store, layered-cache, formats, DeepSeek-V4 store /
#           compressor / indexer and token-score GPU tests; BM_Ingest (0, 3) and BM_AppendStep
#           (0); the four sanitizers over the tests that run block_rows_kernel; Nsight of it
#   ingest3 the same with block_rows_kernel instantiated for the default format's layout
#           (Fp16kQ4vMxfp4Layout: its cases fixed at compile time, 96 registers, 5 CTAs per SM)
#   all     the committed kernels (after ChunkBlock took the two row kernels' shared setup):
#           every GPU test (kvc_cuda_tests) and BM_Ingest 16K (0, 3) again
#   append  (branch wip/append-layout, not run yet) the count-1 append with the default format's
#           layout fixed at compile time (kAuto) against the generic one (kLeanPdl, set 8): the
#           store tests; BM_AppendStep sets 0 and 8 at B1 / B8 / B64, with and without the copy;
#           memcheck / synccheck over the append tests
#   prof    Nsight Compute of block_rows_kernel<4> in BM_Ingest 16K fp16k_q4v with and without
#           the index copy (stall reasons), and its per-instruction source counters with it
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session19
source scripts/gpu-lib.sh

cluster_tests='*Cuda_AttentionMma.ClusterAndCombine*:*Cuda_AttentionMma.SplitExtremes*'
store_tests='*Cuda_StoreUpdate*:*Cuda_Layered*:*Cuda_KvStore*'
block_tests='*Cuda_StoreUpdate.ChunksIntoBlocksOf32MatchCpu*:*Cuda_StoreUpdate_Formats.EveryKernelSetMatchesCpu/FP16K_Q4V_f16_d128*:*Cuda_StoreUpdate_Formats.EveryKernelSetMatchesCpu/q8_bf16_d64*'

case "${1:-ingest}" in
  ingest)
    build_targets kvc_cuda_tests store_bench
    gtests store "$store_tests" 120
    BENCH_REPS=5 bench 90 store_bench '^BM_Ingest/'
    sanitize memcheck memcheck "$block_tests" 60
    sanitize racecheck racecheck "$block_tests" 60
    sanitize synccheck synccheck "$block_tests" 40
    sanitize initcheck initcheck "$block_tests" 50
    sed -i 's/__launch_bounds__(32 \* kBlockRowsWarps)/__launch_bounds__(32 * kBlockRowsWarps, E <= 4 ? 5 : 2)/' \
      kernels/store/update.cuh
    cmake --build build-gpu -j "$(nproc)" --target store_bench > "$out/build-bounded.log" 2>&1
    say "build bounded: rc=$?"
    BENCH_REPS=5 bench 40 store_bench '^BM_Ingest/T:16384/format:(0|3)/index:(0|1)/kernels:0/' -bounded
    sed -i 's/__launch_bounds__(32 \* kBlockRowsWarps, E <= 4 ? 5 : 2)/__launch_bounds__(32 * kBlockRowsWarps)/' kernels/store/update.cuh
    if [ -f .anchors/cluster-async-merge.patch ] && (( $(left) > 200 )); then
      patch -p1 < .anchors/cluster-async-merge.patch > "$out/patch.log" 2>&1
      say "patch cluster-async-merge: rc=$?"
      cmake --build build-gpu -j "$(nproc)" --target kvc_cuda_tests > "$out/build-branch.log" 2>&1
      say "build branch: rc=$?"
      sanitize synccheck-branch synccheck "$cluster_tests" 60
      gtests cluster "$cluster_tests:*Cuda_AttentionMma.GroupsAndHeadDims*" 30
    fi
    report
    ;;
  ingest2 | ingest3)
    build_targets kvc_cuda_tests store_bench
    gtests store "$store_tests:*Cuda_Formats*:*Cuda_Dsv4_Store*:*Cuda_Dsv4_Compressor*:*Cuda_Dsv4_Indexer*:*Cuda_Dsv4_Pipeline*:*Cuda_BlockIndex_TokenScores*:*Cuda_Sharding_Store*" 150
    if [ "$1" = ingest2 ]; then rows='^BM_Ingest/.*/kernels:(0|3)/|^BM_AppendStep/.*/kernels:0/'; else rows='^BM_Ingest/.*/kernels:(0|3)/'; fi
    BENCH_REPS=5 bench 60 store_bench "$rows"
    sanitize memcheck memcheck "$block_tests" 60
    sanitize racecheck racecheck "$block_tests" 60
    sanitize synccheck synccheck "$block_tests" 40
    sanitize initcheck initcheck "$block_tests" 50
    NCU_STALLS=1 NCU_SKIP=3 profile "$1-ix1" store_bench \
      '^BM_Ingest/T:16384/format:3/index:1/kernels:0/' 'block_rows_kernel'
    report
    ;;
  all)
    build_targets kvc_cuda_tests store_bench
    gtests all '*' 330
    BENCH_REPS=5 bench 50 store_bench '^BM_Ingest/T:16384/.*/kernels:(0|3)/'
    report
    ;;
  append)
    build_targets kvc_cuda_tests store_bench
    gtests store "$store_tests" 120
    BENCH_REPS=5 bench 60 store_bench '^BM_AppendStep/.*/kernels:(0|8)/'
    sanitize memcheck memcheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*' 90
    sanitize synccheck synccheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*' 90
    report
    ;;
  prof)
    build_targets store_bench
    for ix in 1 0; do
      NCU_STALLS=1 NCU_SKIP=3 profile ingest-ix$ix store_bench \
        "^BM_Ingest/T:16384/format:3/index:$ix/kernels:0/" 'block_rows_kernel'
    done
    timeout 120 ncu --target-processes all -k regex:block_rows_kernel --launch-skip 3 \
      --launch-count 1 --section SourceCounters --section WarpStateStats --page source \
      --print-source sass --csv build-gpu/benchmarks/store_bench \
      --benchmark_filter='^BM_Ingest/T:16384/format:3/index:1/kernels:0/' \
      --benchmark_min_time=1x --benchmark_repetitions=1 > "$out/ncu-source-ingest.csv" 2>&1
    say "ncu source ingest: rc=$? $(wc -l < "$out/ncu-source-ingest.csv") lines"
    ;;
  *) echo "gpu-session19.sh: ingest | ingest2 | ingest3 | all | append | prof" >&2; exit 2 ;;
esac
finish
