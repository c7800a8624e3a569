#!/usr/bin/env bash
# One device call: build, GPU tests, the benchmark rows of docs/performance.md, the PyTorch
# anchors (scripts/gpu-check steps with per-benchmark filters), results in $OUT.
set -uo pipefail
export BENCH_TIME=${BENCH_TIME:-0.05s} BENCH_LIMIT=${BENCH_LIMIT:-90}
scripts/gpu-check build test > gpu-out-build-test.log 2>&1
run() {  # name filter
  timeout "$BENCH_LIMIT" build-gpu/benchmarks/$1 --benchmark_min_time=$BENCH_TIME \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_filter="$2" \
    --benchmark_out=gpu-out/$1.json --benchmark_out_format=json > gpu-out/$1.log 2>&1
  echo "$1: rc=$? $(grep -c '^BM_' gpu-out/$1.log) rows"
}
run step_bench .
run index_bench .
run attention_bench 'BM_DenseDecode|BM_BlockSelectExact'
run topk_bench '^BM_TopK/'
run store_bench .
run dsv4_bench .
OUT=gpu-out timeout 150 python3 benchmarks/anchors/torch_anchors.py > gpu-out/torch_anchors.log 2>&1
echo "torch anchors rc=$?"
python3 scripts/perf-report.py gpu-out > gpu-out/performance_table.md 2>&1
cat gpu-out/summary.txt
tar czf "$OUT/results.tar.gz" gpu-out
