#!/usr/bin/env bash
# Device calls of the twelfth session, 2026-12-02 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   trace  build; the BlockIndex tests and the summary rows after the eleventh session's review
#          commits (not run on a GPU then); the spread top-k's phases (scripts/topk-trace-probe.cu:
#          when the last CTA reaches each phase) at 131072 / 262144 scores, k 512 / 2048,
#          uniform / Gaussian / tied scores, 32 / 64 / 128 CTAs; the top-k rows of topk_bench and
#          dsv4_bench in the same call
#   rank   build; the Selector tests (the finishers' counting rank, rank_select, and the spread
#          finisher's loads ahead of its narrowing); the same traces; topk_bench / dsv4_bench's
#          large-k rows; memcheck over the spread and streaming tests, racecheck over the new one
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session12
source scripts/gpu-lib.sh

case "${1:-trace}" in
  trace)
    topk_trace u131k-2048 131072 2048 0
    topk_trace g131k-2048 131072 2048 1
    topk_trace u131k-512 131072 512 0
    topk_trace t131k-2048 131072 2048 2
    topk_trace u131k-2048-c32 131072 2048 0 32
    topk_trace u262k-2048 262144 2048 0
    topk_trace g262k-2048 262144 2048 1
    topk_trace u262k-2048-c64 262144 2048 0 64
    build
    gtests block-index '*Cuda_BlockIndex*' 90
    bench 60 index_bench 'BM_Score/h32x8x128/(B(1|8)/N131072|B32/N32768)/(mean_k|quest)/f(32|16)/sum/fast-tensor_core/'
    bench 40 topk_bench 'BM_TopK/(1|64)/(131072|262144)/2048/'
    bench 40 dsv4_bench 'BM_Dsv4TopK/(1|8)/262144/(512|2048)/0/0/'
    report
    ;;
  rank)
    topk_trace u131k-2048 131072 2048 0
    topk_trace g131k-2048 131072 2048 1
    topk_trace u131k-512 131072 512 0
    topk_trace t131k-2048 131072 2048 2
    topk_trace u262k-2048 262144 2048 0
    topk_trace g262k-2048 262144 2048 1
    build
    gtests selector '*Cuda_Selector*' 150
    bench 60 topk_bench 'BM_TopK/(1|4|64)/(131072|262144)/(512|2048)/|BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/'
    bench 40 dsv4_bench 'BM_Dsv4TopK/(1|8)/262144/(512|2048)/0/0/'
    sanitize memcheck-select memcheck '*Cuda_Selector_Spread*:*Cuda_Selector_Stream*' 100
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 60
    report
    ;;
  *) echo "gpu-session12.sh: trace | rank" >&2; exit 2 ;;
esac
finish
