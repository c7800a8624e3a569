#!/usr/bin/env bash
# Device calls of the twentieth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   attn    the staged tensor-core attention (KernelPath::kTensorCoresStaged / Staged2 / Staged4:
#           each warp's tiles through its own shared-memory slots with cp.async) and the count-1
#           append with the default format's layout fixed at compile time: the attention and
#           store GPU tests; BM_DenseDecode and BM_BlockSelectExact at B1 / B8 / B32 with the
#           register-pipelined kernel (path 3, kAuto's) beside the staged ones (7, 8, 9);
#           BM_AppendStep sets 0 (kAuto) and 8 (the generic layout); memcheck / racecheck /
#           synccheck / initcheck over tests that run the staged kernel and the append
#   prof    with every staged kernel held to 168 registers (3 CTAs per SM where two slots per
#           warp fit): the staged tests; the dense and select rows again; Nsight Compute of the
#           dense B8 N128K decode on paths 3 (register-pipelined), 8 (staged x2) and 9 (staged
#           x4), and of PyTorch SDPA's kernel on the same shape (scripts/sdpa-probe.py);
#           racecheck over the dense plain-cache test (every staged slot count)
#   staged  the staged kernel's 16-bit rows copied coalesced (whole rows per copy instruction,
#           swizzled in shared memory; the load probe scripts/load-pattern-probe.cu measured the
#           fragment order 13 % below it): the attention GPU tests; the dense and select rows
#           (paths 3, 7, 8, 9); racecheck over the plain-cache test of the staged kernel alone
#           and of the other kernels alone; memcheck / synccheck / initcheck; Nsight of dense B8
#   staged2 the staged kernel for head_dim 64 / 128 only, its merge state in its own shared memory
#           (not over the slots): the attention GPU tests; dense and select rows of the
#           register-pipelined kernel (3) against the staged (7, 8, 9) on more shapes (B32,
#           T 4, 9/3/64, q8 and f16 stores); the four sanitizers over the staged tests; synccheck
#           over the plain-cache test of the other kernels alone
#   verify  kAuto choosing the staged kernel by shape (auto_staged_slots) and the dynamic
#           shared-memory allowance only ever raised (a smaller size's occupancy query had
#           lowered it below a larger launch: "invalid argument" in `staged2`): every GPU test;
#           the attention rows with kAuto (path 0) beside 3 and 7 (8, 9 on the main rows); the
#           decode steps at N 128K (their attention is kAuto's)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session20
source scripts/gpu-lib.sh

store_tests='*Cuda_StoreUpdate*:*Cuda_Layered*:*Cuda_KvStore*'
staged_tests='*Cuda_AttentionMma.SplitExtremes*:*Cuda_AttentionMma.NanDataPropagatesLikeTheCpu*'
append_tests='*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*'

case "${1:-attn}" in
  attn)
    build_targets kvc_cuda_tests attention_bench store_bench
    gtests attn '*Cuda_Attention*' 200
    gtests store "$store_tests" 100
    BENCH_REPS=3 bench 150 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(3|7|8|9)/|^BM_DenseDecode/0/32/32768/(3|7)/|^BM_BlockSelectExact/0/(1|8)/3/(3|7|8|9)/0/1/|^BM_BlockSelectExact/0/32/3/(3|7)/0/1/'
    BENCH_REPS=5 bench 40 store_bench '^BM_AppendStep/.*/kernels:(0|8)/'
    sanitize memcheck memcheck "$staged_tests:$append_tests" 60
    sanitize racecheck racecheck "$staged_tests" 60
    sanitize synccheck synccheck "$staged_tests:$append_tests" 40
    sanitize initcheck initcheck "$staged_tests" 40
    report
    ;;
  prof)
    build_targets kvc_cuda_tests attention_bench
    gtests staged '*Cuda_AttentionMma.ClusterAndCombine*:*Cuda_AttentionMma.DensePlainCache*:*Cuda_AttentionMma.SplitExtremes*' 90
    BENCH_REPS=3 bench 120 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(3|7|8|9)/|^BM_BlockSelectExact/0/(1|8)/3/(3|7|8|9)/0/1/'
    for path in 3 8 9; do
      NCU_STALLS=1 NCU_SKIP=2 profile "dense-b8-p$path" attention_bench \
        "^BM_DenseDecode/0/8/131072/$path/" 'mma_decode'
    done
    profile_sdpa sdpa-b8
    sanitize racecheck-plain racecheck '*Cuda_AttentionMma.DensePlainCache*' 60
    report
    ;;
  staged)
    build_targets kvc_cuda_tests attention_bench
    gtests attn '*Cuda_Attention*' 200
    BENCH_REPS=3 bench 150 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(3|7|8|9)/|^BM_DenseDecode/0/32/32768/(3|7|8)/|^BM_BlockSelectExact/0/(1|8)/3/(3|7|8|9)/0/1/|^BM_BlockSelectExact/0/32/3/(3|7|8)/0/1/'
    sanitize racecheck-staged racecheck '*Cuda_AttentionMma.DensePlainCacheStaged*' 60
    sanitize racecheck-plain racecheck '*Cuda_AttentionMma.DensePlainCache' 60
    sanitize memcheck memcheck '*Cuda_AttentionMma.DensePlainCacheStaged*:*Cuda_AttentionMma.SplitExtremes*' 60
    sanitize synccheck synccheck '*Cuda_AttentionMma.DensePlainCacheStaged*' 40
    sanitize initcheck initcheck '*Cuda_AttentionMma.DensePlainCacheStaged*' 40
    NCU_STALLS=1 NCU_SKIP=2 profile dense-b8-p7 attention_bench '^BM_DenseDecode/0/8/131072/7/' 'mma_decode'
    report
    ;;
  staged2)
    build_targets kvc_cuda_tests attention_bench
    gtests attn '*Cuda_Attention*' 200
    BENCH_REPS=3 bench 200 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(3|7|8|9)/|^BM_DenseDecode/0/32/32768/(3|7|9)/|^BM_DenseDecode/1/(1|8)/131072/(3|7|9)/|^BM_BlockSelectExact/0/(1|8)/3/(3|7|8|9)/0/1/|^BM_BlockSelectExact/0/32/3/(3|7|9)/0/1/|^BM_BlockSelectExact/0/(1|8)/3/(3|7|9)/0/4/|^BM_BlockSelectExact/1/(1|8|32)/3/(3|7|9)/0/1/|^BM_BlockSelectExact/0/8/(2|0)/(3|7|9)/0/1/'
    staged_only='*Cuda_AttentionMma.DensePlainCacheStaged*'
    sanitize racecheck racecheck "$staged_only:*Cuda_AttentionMma.SplitExtremes*" 70
    sanitize synccheck synccheck "$staged_only:*Cuda_AttentionMma.SplitExtremes*" 50
    sanitize memcheck memcheck "$staged_only:*Cuda_AttentionMma.ClusterAndCombine*" 60
    sanitize initcheck initcheck "$staged_only" 40
    sanitize synccheck-plain synccheck '*Cuda_AttentionMma.DensePlainCache' 40
    report
    ;;
  verify)
    build_targets kvc_cuda_tests attention_bench step_bench
    gtests all '*' 240
    BENCH_REPS=3 bench 130 attention_bench \
      '^BM_DenseDecode/0/(1|8)/131072/(0|3|7|8|9)/|^BM_DenseDecode/0/32/32768/(0|3)/|^BM_DenseDecode/1/(1|8)/131072/(0|3|7)/|^BM_BlockSelectExact/0/(1|8)/3/(0|3|7|8|9)/0/1/|^BM_BlockSelectExact/0/32/3/(0|3|7)/0/1/|^BM_BlockSelectExact/0/(1|8)/3/(0|3)/0/4/|^BM_BlockSelectExact/1/(1|8|32)/3/(0|3|7)/0/1/'
    bench 50 step_bench 'BM_DecodeStep/(1|8)/131072/'
    report
    ;;
  *) echo "gpu-session20.sh: attn | prof | staged | staged2 | verify" >&2; exit 2 ;;
esac
finish
