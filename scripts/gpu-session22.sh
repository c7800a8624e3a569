#!/usr/bin/env bash
# Device calls of the twenty-second session, 2026-12-04 (each under the 10-minute limit; results
# in $OUT, helpers in scripts/gpu-lib.sh):
#   peers   the FlashMLA and DeepGEMM anchors' first run (carry [".anchors/flashmla",
#           ".anchors/deepgemm"]): both build in the background (only-build) while kvc's
#           dsv4_bench and index_bench build; then both anchors (reusing those builds), kvc's
#           DeepSeek-V4 rows they compare with (CSA / HCA decode bf16 and MODEL1 FP8, the indexer
#           decode mxfp4 and fp8 at B1 / B8 T1), the PyTorch DeepSeek-V4 anchor (dsv4_anchors.py,
#           first run since torch_anchors.py's shared helpers), and the summary scorer's one-tile
#           rule as kAuto (mean K / Quest f16 at B8 / B32)
#   fp8     the same anchors again (FlashMLA's host compile given CUDA 13's cccl headers;
#           DeepGEMM under faulthandler) and the fp8 indexer's score kernel with eight heads'
#           chains interleaved per lane: the DeepSeek-V4 indexer GPU tests, memcheck over the fp8
#           ones, the indexer rows (mxfp4 and fp8, B1 / B8, T1 / T4) beside DeepGEMM's
#   fp8b    the same with the fp8 score kernel taking a key per lane (every query value a
#           shared-memory broadcast; `fp8` measured 160 us, bound by shared-memory wavefronts),
#           the anchors' fixes (timed_row's `sets` field; DeepGEMM's JIT log and NVRTC on a
#           crash), and Nsight Compute of the fp8 kernel at B1 T1
#   fp8c    the fp8 kernel holding its key quarter as f16x2 words (at most 85 registers, three
#           CTAs per SM; `fp8b`: 101 us, 108 registers, 53 % of issue slots busy), and DeepGEMM's
#           crash under stdbuf / gdb; FlashMLA not rebuilt (its rows are `fp8b`'s)
#   dense   evidence for the dense B8 miss (0.94x SDPA): Nsight Compute of kAuto's staged
#           tensor-core kernel (three slots) at B8 N128K, never profiled since its whole-row
#           copies, and of SDPA's kernel on the same shape, with the dense rows beside it
#   slots   the same kernel at B8 with two / three / four slots per warp (paths 8 / 7 / 9): `dense`
#           found kAuto's three slots at one CTA of 4 warps per SM (124 KB of shared memory),
#           issue-latency bound (1.32 ms at ncu's base clocks against 998 us in the benchmark);
#           two slots leave room for two CTAs per SM. Nsight of path 8 (DEADLINE=260: the
#           session's last device minutes)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session22
source scripts/gpu-lib.sh

case "${1:-peers}" in
  peers)
    MAX_JOBS=8 peer_build_bg flashmla 400
    MAX_JOBS=8 peer_build_bg deepgemm 400
    build_targets dsv4_bench index_bench
    wait
    cat "$out/anchor-builds.txt" >> "$out/summary.txt"
    tail -5 "$out"/flashmla/flashmla_build.log "$out"/deepgemm/deepgemm_build.log \
      >> "$out/summary.txt" 2>/dev/null
    l=$(left)
    FLASHMLA_REUSE=1 DEEPGEMM_REUSE=1 ANCHORS="flashmla deepgemm" DEADLINE=$(( l - 120 )) \
      T_flashmla=150 T_deepgemm=150 benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "peer anchors: rc=$? $(tail -3 "$out/run-anchors.out" | tr '\n' ' ')"
    bench 40 dsv4_bench 'BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/0/|BM_Dsv4IndexDecode/(1|8)/1/(0|1)/0/0/'
    OUT="$out" timeout 50 python3 benchmarks/anchors/dsv4_anchors.py > "$out/dsv4_anchors.log" 2>&1
    say "dsv4 anchors: rc=$? $(tail -2 "$out/dsv4_anchors.log" | tr '\n' ' ')"
    BENCH_REPS=3 bench 40 index_bench \
      'BM_Score/h32x8x128/B(8|32)/N(131072|32768)/(mean_k|quest)/f16/sum/fast/|BM_Score/smollm2/B8/N131072/mean_k/f16/sum/fast/'
    report
    ;;
  fp8 | fp8b | fp8c)
    peers="deepgemm flashmla"
    [ "$1" = fp8c ] && peers=deepgemm
    [ "$1" != fp8c ] && MAX_JOBS=10 peer_build_bg flashmla 330
    MAX_JOBS=10 peer_build_bg deepgemm 330
    build_targets kvc_cuda_tests dsv4_bench
    gtests dsv4 '*Cuda_Dsv4_Indexer*' 120
    wait
    cat "$out/anchor-builds.txt" >> "$out/summary.txt"
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|4)/(0|1)/0/0/|BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/0/'
    l=$(left)
    FLASHMLA_REUSE=1 DEEPGEMM_REUSE=1 ANCHORS="$peers" DEADLINE=$(( l - 50 )) \
      T_flashmla=200 T_deepgemm=240 benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
    say "peer anchors: rc=$? $(tail -3 "$out/run-anchors.out" | tr '\n' ' ')"
    sanitize memcheck memcheck '*Cuda_Dsv4_Indexer.ScoresMatchCpuBitForBit/fp8*' 40
    [ "$1" != fp8 ] && NCU_SKIP=3 profile fp8-b1 dsv4_bench 'BM_Dsv4IndexDecode/1/1/1/0/0/' 'fp8_score'
    report
    ;;
  dense)
    build_targets attention_bench
    BENCH_REPS=3 bench 60 attention_bench '^BM_DenseDecode/0/8/131072/(0|3|7)/'
    NCU_STALLS=1 NCU_SKIP=2 profile dense-b8-auto attention_bench '^BM_DenseDecode/0/8/131072/0/' \
      'mma_decode'
    profile_sdpa sdpa-b8
    report
    ;;
  slots)
    build_targets attention_bench
    BENCH_REPS=3 bench 50 attention_bench '^BM_DenseDecode/0/8/131072/(7|8|9)/'
    NCU_STALLS=1 NCU_SKIP=2 profile dense-b8-p8 attention_bench '^BM_DenseDecode/0/8/131072/8/' \
      'mma_decode'
    report
    ;;
  *) echo "gpu-session22.sh: peers | fp8 | fp8b | fp8c | dense | slots" >&2; exit 2 ;;
esac
finish
