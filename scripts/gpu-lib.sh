# Shared helpers of the per-session device scripts (scripts/gpu-session*.sh): source it after
# setting $out (the session's result folder). Each helper respects the call's deadline
# (DEADLINE seconds after the start, default 560) and writes one line to $out/summary.txt.
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
t0=$(date +%s)
deadline=${DEADLINE:-560}
left() { echo $(( deadline - ($(date +%s) - t0) )); }
say() { echo "$*" | tee -a "$out/summary.txt"; }
[ "${KEEP_SUMMARY:-0}" = 1 ] || : > "$out/summary.txt"

# Everything (tests, benchmarks, examples) in build-gpu/ through scripts/gpu-check.
build() {
  scripts/gpu-check build > "$out/build-step.log" 2>&1
  say "build: rc=$? at $(( $(date +%s) - t0 )) s"
  compile_times
}

# targets...: only these targets (a session script's build), configured as gpu-check configures
# build-gpu.
build_targets() {
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DKVC_BUILD_EXAMPLES=ON -DKVC_BUILD_BENCHMARKS=ON \
      -DKVC_BUILD_TESTS=ON > "$out/configure.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target "$@" > "$out/build.log" 2>&1; }
  say "build $*: rc=$? at $(( $(date +%s) - t0 )) s"
  grep -E "error" "$out/build.log" | head -20 >> "$out/summary.txt"
  compile_times
}

# The build's slowest objects (scripts/compile-times): the three longest into summary.txt, twenty
# into $out/compile-times.txt.
compile_times() {
  python3 scripts/compile-times build-gpu -n 20 > "$out/compile-times.txt" 2>&1
  head -3 "$out/compile-times.txt" | sed 's/^/  slowest: /' >> "$out/summary.txt"
}

# [limit]: every test through gpu-check (GPU, CPU, mini-decoder; GTEST_FILTER narrows the GPU
# ones), its summary and failed tests into summary.txt.
all_tests() {
  if [ -n "${1:-}" ]; then
    timeout "$1" scripts/gpu-check test > "$out/test-step.log" 2>&1
  else
    scripts/gpu-check test > "$out/test-step.log" 2>&1
  fi
  cat gpu-out/summary.txt >> "$out/summary.txt" 2>/dev/null
  grep -E '^\[  FAILED  \]' gpu-out/gpu-tests.log gpu-out/cpu-tests.log \
    gpu-out/mini-decoder-tests.log 2>/dev/null | head -20 | tee -a "$out/summary.txt"
}

# name tool filter limit: one compute-sanitizer tool over the GPU tests matching filter.
sanitize() {
  local l limit=$4
  l=$(left)
  (( l < 30 )) && { say "sanitizer $1: not run (deadline)"; return; }
  (( limit > l - 15 )) && limit=$(( l - 15 ))
  timeout "$limit" compute-sanitizer --tool "$2" --print-limit 200 --error-exitcode 99 \
    build-gpu/tests/kvc_cuda_tests --gtest_filter="$3" --gtest_brief=1 \
    > "$out/sanitizer-$1.log" 2>&1
  say "sanitizer $1: rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/sanitizer-$1.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$out/sanitizer-$1.log" | tr '\n' ' ')"
}

# name filter limit: GPU tests matching filter under a timeout.
gtests() {
  local l limit=$3
  l=$(left)
  (( l < 20 )) && { say "tests $1: not run (deadline)"; return; }
  (( limit > l - 10 )) && limit=$(( l - 10 ))
  # Not --gtest_brief: a run the deadline cuts still says how many tests passed before it
  # (twenty-ninth session: a cut brief run left an empty log).
  timeout "$limit" build-gpu/tests/kvc_cuda_tests --gtest_filter="$2" > "$out/gtests-$1.log" 2>&1
  local rc=$?
  say "tests $1: rc=$rc $(grep -cE '^\[ +OK \]' "$out/gtests-$1.log") ok, $(grep -E '^\[  (PASSED|FAILED) ' "$out/gtests-$1.log" | tr '\n' ' ')"
  # The per-test lines only (they end with the test's time), not gtest's closing list of them.
  grep -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$out/gtests-$1.log" | head -10 >> "$out/summary.txt"
}

# The stall reasons ncu's WarpStateStats section charts but does not print: cycles per issued
# instruction each reason accounts for, per warp (profile's NCU_STALLS=1 adds them).
ncu_stall_metrics() {
  local r m=""
  for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle \
    barrier membar not_selected selected no_instruction dispatch_stall tex_throttle drain \
    sleeping branch_resolving imc_miss misc; do
    m+="${m:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
  done
  echo "$m"
}

# The sections of an ncu text report (profile, and gpu-session27.sh's profile_probe).
ncu_sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
  --section ComputeWorkloadAnalysis --section InstructionStats)

# name binary benchmark-filter kernel-regex [extra ncu args]: one ncu report (text) of
# NCU_COUNT (default 1) launches after NCU_SKIP (default 2) of the kernels matching the regex;
# NCU_STALLS=1 adds the stall reasons (ncu_stall_metrics), NCU_LIMIT the timeout (default 60 s).
profile() {
  local l name=$1 bin=$2 filter=$3 kernel=$4 extra=()
  shift 4
  l=$(left)
  (( l < 40 )) && { say "ncu $name: not run (deadline)"; return; }
  [ "${NCU_STALLS:-0}" = 1 ] && extra=(--metrics "$(ncu_stall_metrics)")
  timeout "${NCU_LIMIT:-60}" ncu --target-processes all -k "regex:$kernel" \
    --launch-skip "${NCU_SKIP:-2}" --launch-count "${NCU_COUNT:-1}" \
    "${ncu_sections[@]}" "${extra[@]}" "$@" \
    build-gpu/benchmarks/$bin --benchmark_filter="$filter" --benchmark_min_time=1x \
    --benchmark_repetitions=1 > "$out/ncu-$name.txt" 2>&1
  say "ncu $name: rc=$? $(grep -E '^ +Duration' "$out/ncu-$name.txt" | tr -s ' ' | tr '\n' ';')"
}

# name filter: Nsight Compute (SpeedOfLight, Occupancy, LaunchStats) of every kernel of one
# decode step of step_bench's row `filter`: 14 launches after NCU_SKIP (default 14, past the
# warm-up graphs' launches), clocks as NCU_CLOCK says (default none: as the GPU runs them; the
# twenty-sixth session's calls used base); each kernel's duration into summary.txt.
step_ncu() {
  local l
  l=$(left)
  (( l < 40 )) && { say "ncu $1: not run (deadline)"; return; }
  timeout 90 ncu --target-processes all --clock-control "${NCU_CLOCK:-none}" \
    -k 'regex:summary|topm|spread|set_topk|policy|token|finish|select|attn|attention|decode|score|combine' \
    --launch-skip "${NCU_SKIP:-14}" --launch-count 14 --section SpeedOfLight --section Occupancy \
    --section LaunchStats build-gpu/benchmarks/step_bench --benchmark_filter="$2" \
    --benchmark_min_time=1x --benchmark_repetitions=1 > "$out/ncu-$1.txt" 2>&1
  say "ncu $1: rc=$?"
  awk '/^  [a-z_].*\(/{k=$1; if (k == "void") k = $2} /^    Duration/{print "  " k, $3, $2}' "$out/ncu-$1.txt" |
    head -14 >> "$out/summary.txt"
}

# name: Nsight Compute of PyTorch SDPA's kernel on the dense decode shape (B8 N128K, Hq 32 / Hkv 8 /
# d 128; scripts/sdpa-probe.py), the same sections and stall counters as profile's, into
# $out/ncu-<name>.txt.
profile_sdpa() {
  timeout 90 ncu --target-processes all -k 'regex:flash|fmha|attn|attention' --launch-skip 3 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --metrics "$(ncu_stall_metrics)" \
    python3 scripts/sdpa-probe.py > "$out/ncu-$1.txt" 2>&1
  say "ncu $1: rc=$? $(grep -E '^ +Duration' "$out/ncu-$1.txt" | tr -s ' ' | tr '\n' ';')"
}

# limit binary filter [tag]: one benchmark binary's matching rows (medians of BENCH_REPS,
# default 3, at BENCH_TIME, default 0.05s) into JSON, at most `limit` seconds (and what the
# deadline leaves).
bench() {
  local l limit=$1 tag=${4:-}
  l=$(left)
  (( l < 25 )) && { say "$2$tag: not run (deadline)"; return; }
  (( limit > l - 10 )) && limit=$(( l - 10 ))
  timeout "$limit" build-gpu/benchmarks/$2 --benchmark_min_time=${BENCH_TIME:-0.05s} \
    --benchmark_repetitions=${BENCH_REPS:-3} --benchmark_report_aggregates_only=true \
    --benchmark_filter="$3" --benchmark_out="$out/$2$tag.json" --benchmark_out_format=json \
    > "$out/$2$tag.log" 2>&1
  say "$2$tag: rc=$? $(grep -c '_median' "$out/$2$tag.log") rows"
}

# The Python package (in-tree module of build-gpu) under pytest on the GPU machine; $@ narrows.
pytest_gpu() {
  local l
  l=$(left)
  (( l < 60 )) && { say "pytest: not run (deadline)"; return; }
  { cmake -S . -B build-gpu -DKVC_BUILD_PYTHON=ON > "$out/python-configure.log" 2>&1 &&
    cmake --build build-gpu --target _kvc -j "$(nproc)" > "$out/python-build.log" 2>&1 &&
    PYTHONPATH=$PWD/build-gpu/python timeout $(( l - 30 )) python3 -X faulthandler -m pytest -q \
      -p no:cacheprovider -rs "${@:-tests/python}" > "$out/pytest.log" 2>&1; }
  say "pytest ${*:-tests/python} (GPU machine): rc=$? $(grep -E 'passed|failed' "$out/pytest.log" | tail -1)"
  grep -E '^FAILED|SKIPPED' "$out/pytest.log" | head -10 >> "$out/summary.txt"
}

# name sha256 parts...: joins model parts into models/<name> once and checks its checksum.
join_model() {
  local name=$1 sum=$2
  shift 2
  [ -f "models/$name" ] || cat "$@" > "models/$name"
  echo "$sum  models/$name" | sha256sum -c --quiet - || { say "$name: checksum mismatch"; return 1; }
}

# The SmolLM2 GGUF joined from models/smollm2.part-* (carried one part per call) and checked.
smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf
join_smollm2() {
  join_model "$(basename $smollm2)" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    models/smollm2.part-*
}

# tag model text-file text-name start end configs-file [jsonl]: one quality_eval run on the GPU
# (positions [start, end), buckets of 512) under the call's deadline, its log in $out/tag.log and
# rows in jsonl (default $out/tag.jsonl); its table goes into summary.txt.
quality_window() {
  local tag=$1 model=$2 text=$3 name=$4 start=$5 end=$6 configs=$7 jsonl=${8:-$out/$1.jsonl} l
  [ -x build-gpu/examples/mini_decoder/quality_eval ] || build
  l=$(left)
  # --time-limit: the rows of the positions reached are written even when the window does not
  # fit the call (timeout is the backstop).
  timeout $(( l - 10 )) build-gpu/examples/mini_decoder/quality_eval --model "$model" \
    --text-file "$text" --text-name "$name" --start "$start" --end "$end" --bucket 512 \
    --time-limit $(( l - 40 )) \
    --device cuda --configs-file "$configs" --jsonl "$jsonl" --note "kvc $rev" \
    > "$out/$tag.log" 2>&1
  say "$tag: rc=$? $(grep -E 'done' "$out/$tag.log" | tail -1)"
  sed -n '/^config/,$p' "$out/$tag.log" >> "$out/summary.txt"
}

# name model-file lengths [extra real_retrieval args...]: the retrieval prompts through a model
# on the GPU (fp16k_q4v, top-k policy, kvc's default scoring) into $out/retrieval/results-name.jsonl
# (name "": results.jsonl) under the call's deadline.
retrieval_run() {
  local name=$1 model=$2 lengths=$3 l
  shift 3
  [ -x build-gpu/examples/mini_decoder/real_retrieval ] || build
  l=$(left)
  (( l < 60 )) && { say "retrieval ${name:-default}: not run (deadline)"; return; }
  KVC_MODEL=$PWD/$model timeout $(( l - 20 )) scripts/real-retrieval --gpu --out "$out/retrieval" \
    ${name:+--name "$name"} -- --lengths "$lengths" --formats fp16k_q4v --policies topk "$@" \
    > "$out/retrieval${name:+-$name}.log" 2>&1
  say "retrieval ${name:-default}: rc=$? $(tail -2 "$out/retrieval${name:+-$name}.log" | tr '\n' ' ')"
}

# [lengths] [extra real_retrieval args...]: the SmolLM2 retrieval prompts on the GPU, top 8.
retrieval_gpu() {
  local lengths=$1
  shift
  join_smollm2 || return 1
  retrieval_run "" $smollm2 "$lengths" --top-blocks 8 "$@"
}

# The benchmark rows' medians into $out/medians.txt, and the same-run tables of
# scripts/perf-report.py into $out/performance_table.md.
report() {
  grep -hE '_median' "$out"/*.log | awk '{print $1, $2, $3}' | sed 's/manual_time_median//' > "$out/medians.txt"
  python3 scripts/perf-report.py "$out" > "$out/performance_table.md" 2>&1
}

# name limit: builds a peer anchor that compiles from source (flashmla or deepgemm, from
# .anchors/<name>) in the background, only the build (its log under $out/<name>), under a timeout;
# its time into $out/anchor-builds.txt. `wait` for it, then run it with <NAME>_REUSE=1 through
# run-anchors.sh (the FlashMLA and DeepGEMM builds take 100-210 s on the H200's 16 cores).
peer_build_bg() {
  local name=$1 limit=$2 upper
  upper=$(echo "$name" | tr '[:lower:]' '[:upper:]')
  ( s=$(date +%s)
    env "${upper}_ONLY_BUILD=1" MAX_JOBS="${MAX_JOBS:-8}" timeout "$limit" \
      "benchmarks/anchors/${name}_anchor.sh" ".anchors/$name" "$out/$name" \
      > "$out/$name-build-step.log" 2>&1
    echo "$name build: rc=$? in $(( $(date +%s) - s )) s" >> "$out/anchor-builds.txt" ) &
}

# PyTorch's anchors alone (SDPA dense decode, the PyTorch block-select step, torch.topk; ~10 s)
# with what the call has left, for the same-call ratio of a kvc row.
torch_anchors() {
  local l
  l=$(left)
  ANCHORS="torch" DEADLINE=$(( l - 10 )) benchmarks/anchors/run-anchors.sh "$out" \
    > "$out/run-anchors.out" 2>&1
  say "torch anchors: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
}

# name anchors: benchmarks/anchors/run-anchors.sh for the named anchors (its ANCHORS list) with
# what the call has left, output in $out/run-anchors-name.out, one summary line.
named_anchors() {
  local l
  l=$(left)
  ANCHORS="$2" DEADLINE=$(( l - 15 )) benchmarks/anchors/run-anchors.sh "$out" \
    > "$out/run-anchors-$1.out" 2>&1
  say "$1 anchors: rc=$? $(tail -2 "$out/run-anchors-$1.out" | tr '\n' ' ')"
}

# DeepSeek-V4's PyTorch step and every peer anchor (PyTorch, FlashInfer, CUB; the bundle carried
# as .anchors/p1, .anchors/p2; $ANCHORS narrows them where the bundle travels in two calls, see
# benchmarks/anchors/setup-anchors.sh) with what the call has left, then report.
anchors_and_report() {
  local l
  OUT="$out" timeout 60 python3 benchmarks/anchors/dsv4_anchors.py > "$out/dsv4_anchors.log" 2>&1
  say "dsv4 anchors: rc=$?"
  l=$(left)
  ANCHORS="${ANCHORS:-torch flashinfer_decode flashinfer_topk cub}" DEADLINE=$(( l - 15 )) \
    benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors.out" 2>&1
  say "peer anchors: rc=$? $(tail -2 "$out/run-anchors.out" | tr '\n' ' ')"
  report
}

# kvc's rows of the performance page and every anchor in one call, so every ratio is a same-run
# ratio (docs/performance.md). The dense decode rows are a call of their own: sharing one with
# the 20 block-select rows, they were cut off by its limit (seventh session).
same_run_final() {
  same_run_kvc
  anchors_and_report
}

# same_run_final's kvc rows alone: where the tracked tree and the anchor bundle together exceed
# what one call carries, a first call runs these and a second, back to back on the same warm
# machine, anchors_and_report (the twenty-first session).
same_run_kvc() {
  [ -x build-gpu/benchmarks/step_bench ] || build
  bench 90 step_bench 'BM_DecodeStep/|BM_LaunchFloor'
  # The library's own rows only (the ninth session's wider filters were cut off by their limits
  # before the B8 rows: the variants are registered first): the scorers' library choice, and
  # select attention on its library path (kAuto, path 0) beside the register-pipelined kernel
  # (path 3) at B1 / B8 / B32 with B8's pinned splits 2 and 4; dense likewise.
  bench 50 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(token_ma(ss|x)/mxfp4/sum/fast/|(mean_k|quest)/f(32|16)/sum/fast/)'
  bench 50 attention_bench '^BM_BlockSelectExact/0/(1|8|32)/3/(0|3)/0/1/|^BM_BlockSelectExact/0/8/3/2/(2|4)/1/'
  bench 30 attention_bench '^BM_DenseDecode/0/(1|8)/131072/(0|3)/' -dense
  bench 45 topk_bench "${TOPK_FILTER:-BM_TopKDecode/(1|8|64)/(4096|32768)/(8|64)/|BM_TopK/(1|64)/(131072|262144)/2048/}"
  bench 35 store_bench 'BM_AppendStep/|BM_Ingest/'
  bench 60 dsv4_bench "${DSV4_FILTER:-BM_Dsv4IndexDecode/(1|8)/(1|4)/0/0/0/|BM_Dsv4TopK|BM_Dsv4CsaDecode|BM_Dsv4HcaDecode}"
}

# tag args...: the spread top-k's phase probe (scripts/topk-trace-probe.cu, built once) on one
# shape, its table into summary.txt.
topk_trace() {
  local tag=$1
  shift
  [ -x "$out/topk-trace-probe" ] ||
    nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/topk-trace-probe" \
      scripts/topk-trace-probe.cu > "$out/probe-build.log" 2>&1 || { say "probe build failed"; return; }
  timeout 60 "$out/topk-trace-probe" "$@" > "$out/trace-$tag.txt" 2>&1
  say "trace $tag ($*): rc=$?"
  cat "$out/trace-$tag.txt" >> "$out/summary.txt"
}

# Packs $out into $OUT/results.tar.gz (the device tool brings it back) and prints the summary.
finish() {
  say "total $(( $(date +%s) - t0 )) s"
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/results.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
    cp "$out/summary.txt" "$OUT/"
  fi
  cat "$out/summary.txt"
}
