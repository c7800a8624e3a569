#!/usr/bin/env bash
# Device calls of the thirteenth session, 2026-12-03 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   rank   the spread top-k's phases (scripts/topk-trace-probe.cu, rank_select's inner marks
#          included) at 131072 / 262144 scores, k 512 / 2048, uniform / Gaussian / tied scores;
#          build; the Selector tests; topk_bench / dsv4_bench's large-k rows; the anchors in the
#          same call: cub::DeviceTopK (build-anchor/cub_topk_anchor, built from
#          benchmarks/anchors/cub_topk_anchor.cu against the nvidia-cuda-cccl 13.3 headers; carry
#          build-anchor) and torch.topk; memcheck over the spread and streaming tests, racecheck
#          and synccheck over the counting-rank test
#   final  build; the Selector and DeepSeek-V4 GPU tests (what uses the changed kernels); the traces at 131072 /
#          262144 (the row candidate bound of 32768, the finisher's loads of the next digit's
#          counts first); topk_bench / dsv4_bench's large-k rows; torch.topk; memcheck over the
#          spread tests, racecheck over the counting-rank test
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session13
source scripts/gpu-lib.sh

# torch.topk, k 2048, on topk_bench's large shapes (timed as torch_anchors.py times).
torch_topk() {
  timeout 120 python3 - "$out/torch_topk.json" > "$out/torch_topk.log" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "benchmarks/anchors")
import torch
from torch_anchors import median_us, n_sets
rows = []
for r, n in [(1, 131072), (64, 131072), (1, 262144), (64, 262144)]:
    sets = [torch.randn(r, n, device="cuda") for _ in range(n_sets(r * n * 4))]
    t, tmin = median_us(lambda x: torch.topk(x, 2048, dim=1), sets)
    rows.append(dict(name=f"torch_topk_{r}x{n}_k2048", us=t, us_min=tmin))
    print(f"{rows[-1]['name']:32s} {t:9.2f} us")
json.dump({"rows": rows}, open(sys.argv[1], "w"), indent=1)
PY
  say "torch_topk: rc=$? $(tr '\n' ';' < "$out/torch_topk.log")"
}

cub_topk() {
  CUB_TOPK_ANCHOR_BIN=$PWD/build-anchor/cub_topk_anchor timeout 120 \
    benchmarks/anchors/cub_topk_anchor.sh "$out" > "$out/cub_topk.log" 2>&1
  say "cub_topk: rc=$? $(tr -s ' ' < "$out/cub_topk.log" | tr '\n' ';')"
}

case "${1:-rank}" in
  rank)
    topk_trace u131k-2048 131072 2048 0
    topk_trace g131k-2048 131072 2048 1
    topk_trace u131k-512 131072 512 0
    topk_trace t131k-2048 131072 2048 2
    topk_trace u262k-2048 262144 2048 0
    topk_trace g262k-2048 262144 2048 1
    build
    gtests selector '*Cuda_Selector*' 150
    bench 60 topk_bench 'BM_TopK/(1|4|64)/(131072|262144)/(512|2048)/'
    bench 40 dsv4_bench 'BM_Dsv4TopK/(1|8)/262144/(512|2048)/0/0/'
    cub_topk
    torch_topk
    sanitize memcheck-select memcheck '*Cuda_Selector_Spread*:*Cuda_Selector_Stream*' 100
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 60
    sanitize synccheck-rank synccheck '*Cuda_Selector_Spread.CountingRank*' 60
    report
    ;;
  final)
    build
    gtests select-dsv4 '*Cuda_Selector*:*Cuda_Dsv4*' 120
    topk_trace u131k-2048 131072 2048 0
    topk_trace t131k-2048 131072 2048 2
    topk_trace u262k-2048 262144 2048 0
    topk_trace g262k-2048 262144 2048 1
    bench 50 topk_bench 'BM_TopK/(1|4|64)/(131072|262144)/(512|2048)/'
    bench 30 dsv4_bench 'BM_Dsv4TopK/(1|8)/262144/(512|2048)/0/0/'
    torch_topk
    sanitize memcheck-spread memcheck '*Cuda_Selector_Spread*' 50
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 40
    report
    ;;
  *) echo "gpu-session13.sh: rank | final" >&2; exit 2 ;;
esac
finish
