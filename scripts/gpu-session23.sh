#!/usr/bin/env bash
# Device calls of the twenty-third session, 2026-12-04 (each under the 10-minute limit; results
# in $OUT, helpers in scripts/gpu-lib.sh):
#   slots   the staged tensor-core kernel with its shared memory cut to fit two CTAs per SM at
#           d 128 with three slots (no scale bytes in 16-bit slots; the selected ids share their
#           bytes with the merge state): every attention GPU test, racecheck / synccheck /
#           memcheck over the staged tests, dense and block-select rows with every staged slot
#           count beside the register-pipelined kernel (to set kAuto's rule), Nsight of the
#           dense B8 kernel, and PyTorch SDPA in the same call. Its bench rows were cut off at
#           150 s (24 block-select rows); Nsight found dense B8's 64 clusters of 4 CTAs (two CTAs
#           per SM) not all resident at once (SMs active 55 % of the time)
#   clusters  the same kernel with the split rule asking how many clusters fit at once
#           (cluster_capacity; long chunks merge through the combine where a wave cannot hold
#           every row's cluster, short ones take smaller clusters): the dense rows first, then
#           block-select, every staged slot count beside the register-pipelined kernel, SDPA in
#           the same call, the attention GPU tests, Nsight of dense B8 on three slots
#   final   kAuto on three slots for one query token at d 64 / 128, the staged kernel's clusters
#           held to its pushed merge (8 CTAs; select B1 ran 16-CTA clusters with the pulled merge
#           in `clusters`): the attention rows of every path that kAuto chose between, d 64 and
#           verify, the decode step (step_bench), SDPA in the same call, the attention GPU tests
#           and racecheck over the staged ones
#   probe   the session's last device seconds: scripts/cluster-capacity-probe.cu (clusters of
#           1-16 CTAs resident at once at one, two and three CTAs per SM; copied to $OUT at once),
#           then kAuto's block-select B1 / B8 and dense B8 rows with two slots at d 128 where the
#           rows number at most the SMs (the rule chosen from `clusters` / `final`'s pinned rows)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session23
source scripts/gpu-lib.sh

case "${1:-slots}" in
  slots)
    build_targets kvc_cuda_tests attention_bench
    BENCH_REPS=3 bench 150 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(0|3|7|8|9)/|^BM_DenseDecode/0/1/32768/(0|3|7|8)/|^BM_DenseDecode/0/32/32768/(0|3|7)/|^BM_DenseDecode/1/(1|8)/131072/(0|3|7)/|^BM_BlockSelectExact/0/(1|8|32)/3/(0|3|7|8|9)/0/1/|^BM_BlockSelectExact/0/(1|8)/3/(0|3|7)/0/4/|^BM_BlockSelectExact/1/(1|8|32)/3/(0|3|7)/0/1/|^BM_BlockSelectExact/0/(1|8)/(2|0)/(0|3|7)/0/1/'
    torch_anchors
    gtests attn '*Cuda_Attention*:*Cuda_DenseDecode*' 200
    staged='*Cuda_AttentionMma.DensePlainCacheStaged*:*Cuda_AttentionMma.SplitExtremes*'
    sanitize racecheck racecheck "$staged" 70
    sanitize synccheck synccheck "$staged" 50
    sanitize memcheck memcheck "$staged:*Cuda_AttentionMma.ClusterAndCombine*" 60
    NCU_STALLS=1 NCU_SKIP=2 profile dense-b8-p7 attention_bench '^BM_DenseDecode/0/8/131072/7/' \
      'mma_decode'
    report
    ;;
  clusters)
    build_targets kvc_cuda_tests attention_bench
    BENCH_REPS=3 bench 130 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(0|3|7|8|9)/|^BM_DenseDecode/0/32/32768/(0|3|7)/' -dense
    BENCH_REPS=3 bench 100 attention_bench \
      '^BM_BlockSelectExact/0/(1|8|32)/3/(0|3|7|8|9)/0/1/|^BM_BlockSelectExact/0/8/3/2/(2|4)/1/' \
      -select
    torch_anchors
    gtests attn '*Cuda_Attention*:*Cuda_DenseDecode*' 120
    NCU_STALLS=1 NCU_SKIP=2 profile dense-b8-p7 attention_bench '^BM_DenseDecode/0/8/131072/7/' \
      'mma_decode'
    report
    ;;
  final)
    build_targets kvc_cuda_tests attention_bench step_bench
    BENCH_REPS=3 bench 90 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(0|3|7)/|^BM_DenseDecode/0/32/32768/(0|3)/|^BM_BlockSelectExact/0/(1|8|32)/3/(0|3|7|8|9)/0/1/|^BM_BlockSelectExact/0/(1|8)/3/(0|3)/0/4/|^BM_BlockSelectExact/1/(1|8|32)/3/(0|3)/0/1/'
    bench 70 step_bench .
    torch_anchors
    gtests attn '*Cuda_Attention*:*Cuda_DenseDecode*' 90
    sanitize racecheck racecheck \
      '*Cuda_AttentionMma.DensePlainCacheStaged*:*Cuda_AttentionMma.SplitExtremes*' 60
    report
    ;;
  probe)
    nvcc -O3 -arch=sm_90a -o "$out/cluster-probe" scripts/cluster-capacity-probe.cu &&
      "$out/cluster-probe" > "$out/cluster-capacity.txt" 2>&1
    say "cluster probe: rc=$?"
    cat "$out/cluster-capacity.txt" >> "$out/summary.txt"
    [ -n "${OUT:-}" ] && cp "$out/cluster-capacity.txt" "$OUT/"
    build_targets attention_bench
    bench 40 attention_bench '^BM_BlockSelectExact/0/(1|8)/3/0/0/1/|^BM_DenseDecode/0/8/131072/0/'
    report
    ;;
  *) echo "gpu-session23.sh: slots | clusters | final | probe" >&2; exit 2 ;;
esac
finish
