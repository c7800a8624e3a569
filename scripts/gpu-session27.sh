#!/usr/bin/env bash
# Device calls of the twenty-seventh session, 2026-12-05 (each under the 10-minute limit; results
# in $OUT, helpers in scripts/gpu-lib.sh):
#   tokens    branch gpu-pending/token-latency (written without a GPU, 2026-12-05): the two-stage
#             token kernels' latency chains cut (the ring CTA's K rows loaded 32 elements per round
#             trip, dot_heads having waited for each 16-byte load in turn; a shared row's kv heads
#             over grid.z; the candidates' block ids loaded beside their count; the finish
#             kernel's lse values and partials batched) and the chunk kernel a programmatic
#             dependent of the selection; the set path's narrowing (kernels/select/set.cuh,
#             BM_TopKSet variant 1 against 4, set_exact); the attention's open-block table entry
#             loaded once in the prologue (twenty-eighth session). The selector's set / decode tests (with session 26's
#             review mend, never run on a GPU), the two-stage, token and decode-step tests,
#             memcheck / racecheck / synccheck over the two-stage and token tests, the step rows,
#             Nsight Compute (clocks not locked) of one B1 two-stage step. When gpu-base/ exists
#             (main's versions of the files the branch changes, laid over a copy of the tree:
#             scripts/make-gpu-base.sh; untracked, so it travels), main's step_bench is built
#             beside it in the background and its step rows run in the same call, for a same-run
#             before / after.
#   short     tokens cut for a short lease: the branch's tests and every selector / attention
#             test (main's launcher rewrite; the cluster merge's relaxed first barrier), then the
#             step rows before / after (twenty-ninth session)
#   epilogue  the thirtieth session's two pending fixes (the token chunk CTAs' epilogue loads
#             batched; the streaming kernel's barrier between kv heads): tests, the step rows
#             against main's (gpu-base/), racecheck over the token tests, memcheck, Nsight Compute
#   lean      the thirty-first session's branch gpu-pending/lean-reduce (the warps' log-sum-exp
#             merged in two passes instead of five levels of pairwise merges; the chunk CTAs'
#             partials from registers; one candidate per warp where the grid is one wave):
#             epilogue's calls, then the source page of the B1 step's token, finish and top-k
#   lean-rows lean's tests and step rows against main's on another GPU, Nsight Compute of the B1,
#             B8 and B32 two-stage steps
#   fused     the thirty-second session's branch fused-select (two-stage scoring's finish kernel
#             selects topk itself: kernels::block_scores_select, one launch fewer per step): the
#             sparse-row, two-stage and decode-step tests, the step rows against main's
#             (gpu-base/), racecheck / memcheck / synccheck / initcheck over the new kernel's tests
#   candidates  the two-stage step with 255 candidates (step_bench scorer 5, the most one finish
#             CTA takes) beside 128 and one stage: what the thirty-second session's synthetic and
#             Gemma results (docs/quality.md, "Two stages with 255 candidates") would cost as a
#             default; and the attention launched as a programmatic dependent of the two-stage
#             finish kernel (budget 61) against the plain launch (1); first the decode-step
#             guard tests (one new, not yet run on a GPU) and the two-stage tests
#   prefetch  the summary scorer's L2-prefetch variants: tests, memcheck, index_bench rows
#             (measured in the thirtieth session: every variant slower than kTensorCore)
#   grid      step_bench's BM_DecodeStepGrid: issue #12's head shapes and top 4 / 8 / 16
#             (thirty-fourth session, not yet run)
#   profiles  ncu source pages of the B1 two-stage step's candidate set and attention, and of the
#             large-k top-k at 64 x 131072 k 2048 (thirty-fourth session)
#   final-tests  final's build, the selector / two-stage / decode-step tests (the decode-step
#             guards among them) and the DeepSeek-V4 attention tests; then, on the same warm
#             machine, final (thirty-fourth session)
#   wide      the wide tensor-core token kernel (G > 8, d 256 / 512; thirty-seventh session):
#             its tests, four sanitizers, the grid's MQA rows beside main's (gpu-base/)
#   wide-summary  the wide tensor-core summary kernel (mean K at MQA d 512; written in the
#             thirty-seventh session, landed in the thirty-eighth): its tests, four sanitizers, the
#             grid's MQA mean-K rows beside main's (gpu-base/)
#   decode-cluster  the decode path's cluster shapes (kernels/select/decode.cuh, kCtas > 1;
#             thirty-eighth session): the decode tests, BM_TopKDecode's long rows for every
#             variant, the four sanitizers over the cluster test (rows capped at 8192 blocks), then
#             every GPU test the deadline leaves room for
#   decode-default  the decode path with its cluster shapes as the built-in choice: the selector,
#             decode-step and DeepSeek-V4 top-k tests, racecheck over the cluster test (rows capped
#             at 4096 blocks), BM_TopKDecode (the built-in choice against one CTA per row, same
#             call) and DeepSelect's decode-size rows (carry [".anchors/p1/bin"])
#   decode-verify  every GPU test after the decode path's defaults moved, then where the one-CTA
#             decode path spends a 4096-block row's k 64 (2 us more than k 8; DeepSelect takes
#             4.76 us there): Nsight Compute with stall reasons at k 8 and k 64, and the source page
#   decode-threads  the decode path's thread count on 4096-block rows (thirty-eighth session):
#             the selector tests, BM_TopKDecode at 4096 blocks (every thread count with PDL, and
#             the built-in choice) and DeepSelect's rows (carry [".anchors/p1/bin"])
#   decode-count  the decode path's count threshold (written without a GPU in the thirty-eighth
#             session, built in since the thirty-ninth; SelectTuning::decode_listed_threshold
#             pins the listed maxima): the decode and block-index tests, BM_TopKDecode with the
#             count threshold against the listed maxima on one CTA (k 33 / 64, 4096 and 8192
#             blocks, same call), DeepSelect's rows (carry [".anchors/p1/bin"]), racecheck and
#             synccheck over the threshold test (rows capped at 4096 blocks)
#   rolled | topk-ab  a large-k top-k branch (first the thirty-ninth session's rolled-rank)
#             against main (gpu-base/): every selector test, the large-k rows as tree / base /
#             tree again, the phase probes, memcheck and racecheck over the counting-rank test
#   share     the spread path's shared finish by whole buckets of bucketed positions (fortieth
#             session) against main (gpu-base/: main's spread.cuh and stream.cuh): the selector
#             tests, the large-k rows as tree / base / tree again, racecheck over the counting rank
#   verify42  every GPU test, the large-k rows against main (gpu-base/), memcheck over the
#             counting rank, the indexer's phase probe (forty-second session's first call)
#   index-ab  an indexer branch against main (gpu-base/), first gpu-pending/early-lookup: the
#             DeepSeek-V4 tests, indexer rows and phase probes of both, memcheck and racecheck
#   pairs-ab  variant 10 of the DeepSeek-V4 indexer (octet pairs) against variant 8 in the same
#             tree: phase probes, the decode rows, the DeepSeek-V4 tests, three sanitizers
#             (forty-third session)
#   query-ab  gpu-pending/query-smem against main (gpu-base/) in one call: every GPU test, the
#             indexer rows and phase probes of both, racecheck over the indexer tests
#   index-probe  the DeepSeek-V4 mxfp4 indexer's decode launch by phase (index-trace-probe.cu)
#   verify41b every GPU test and DeepSeek-V4's top-k rows after the forty-first session's landing
#   verify41  the late-barrier branch against main, a 4096-score sample in the probe, tests and
#             sanitizers over the spread top-k (the forty-first session's one call)
#   verify40  the fortieth session's end state: every GPU test, the large-k rows against the main
#             before the shared finish's change (gpu-base/ from 5b3767e), racecheck over the
#             counting rank and every spread variant (the next session's first call)
#   verify39  every GPU test at the thirty-ninth session's end, then Nsight Compute of the spread
#             top-k (1 and 64 rows of 131072, k 2048; stall reasons, the one-row source page)
#   ingest    the forty-ninth session's store encoders against main (gpu-base/): the format and
#             store tests, the ingest and append rows as tree / base / tree again, Nsight
#             Compute's instruction counts of both ingest kernels, memcheck over the store updates
#   ingest-verify  every GPU test, then the ingest and append rows against main (gpu-base/)
#   rows-lanes16  units of 16 lanes for OldRowLayout too (pending) against main: the format and
#             store tests, the store rows tree / base / tree, memcheck and synccheck
#   s50-append  the append's stepped summary rows and host-formed divisors against main
#   s50-summary  the mean-K-only summary loop against main
#   s50-closing  the lean append's closed summaries shared by the CTA's warps, against main
#   s51-sums  the open blocks' running mean-K sums kept by the count-1 appends, against main
#   s51-parts  block_rows_kernel in two parts a block (pending rows-parts), against main
#   s51-lean  the lean append's read-back in one call site (pending lean-one-site), against main
#   store-h200  the store tests and the ingest / append rows of this tree alone (no base build)
#   s52-sample  the spread top-k's 2048-score sample against the 4096 one (one binary), and the
#             store rows
#   s52-probe  s52-sample's phase probes alone (a short lease)
#   spread-ab  a spread top-k branch against main (gpu-base/): the selector and DeepSeek-V4 top-k
#             tests, the large-k rows tree / main / tree again, the phase probes of both over
#             Gaussian scores, memcheck over the spread variants
#   spread-probe  this tree's spread top-k phase probe alone at the large-k shapes over Gaussian
#             scores (one nvcc, no library build: a short lease), with each CTA's end of the
#             sampled pass ("pass done") beside the grid barrier
#   index-ncu  Nsight Compute of the indexer's decode score kernel (variant 10) at B1 T1 and
#             B8 T1: executed instructions, stalls, occupancy (about two minutes with the build)
#   store-prof  after final, same warm machine: Nsight Compute (stalls) of the 16K ingest and the
#             B64 append
#   append-prof  the count-1 append at B64: its rows beside BM_AppendFloor, Nsight Compute with
#             stall reasons and the source page of the library's append kernel
#   evidence48  the H200's phase probes and Nsight Compute of the missed rows (spread top-k,
#             the indexer's decode and prefill), no library build
#   final     the same-run table for latest.json: kvc's rows, then PyTorch's, CUB's and
#             DeepSelect's (deepselect_bin: its fp32 kernel in kvc's harness, first run) anchors in
#             the same call (carry [".anchors/p1/wheels", ".anchors/p1/bin", ".anchors/p1/MANIFEST"])
#   flashinfer  FlashInfer's anchors, back to back after `final` on the same warm machine (with
#             TOPK_PROF=1 then Nsight Compute of the 64 x 131072 k 2048 top-k)
#             (carry [".anchors/p1/flashinfer-sm90a.tar.xz", ".anchors/p1/wheels/apache_tvm_ffi-
#             <version>.whl", ".anchors/p1/MANIFEST"]; with the tree at 40 MB the archive goes
#             in parts, .anchors/pfi0, pfi1, pfi2: benchmarks/anchors/setup-anchors.sh's header)
#   spread    the thirty-fifth session's spread top-k (written without a GPU): the sampled pass
#             tests each score against the cut's floor (cut_floor_score, raw_score_floor) and
#             appends 16 scores a thread with one atomic per warp (warp_append_run); it streams the tiles
#             past the resident ones through a cp.async ring of 8 tiles issued before the sample
#             cut (SelectTuning::spread_no_ring keeps register groups). The spread tests (ring on
#             and off, the ring's overflow row), the DeepSeek-V4 top-k test, the large-k rows with
#             the ring (topk_bench variant 5) and without (11) in the same call, the phase probe
#             both ways at 64 rows, CUB's and DeepSelect's top-k when .anchors/p1/bin is carried,
#             memcheck and racecheck over the fallback test
#   rotate    spread's tests and rows again, with the floor test free of branches (the first
#             spread run's SASS: a BSSY / BSYNC per score) and the ring's CTAs starting their
#             streams at different tiles (that run's sampled pass at 64 rows drew about 1 TB/s);
#             main's topk_bench built beside it (run scripts/make-gpu-base.sh first: gpu-base/
#             travels untracked) and its rows in the same call; DeepSelect's top-k in the same
#             call (carry [".anchors/p1/bin"])
#   probe-ab  the phase probe of this tree, of main (gpu-base/ from scripts/make-gpu-base.sh, with
#             main's scripts/topk-trace-probe.cu copied in) and of gpu-prev/ (an earlier
#             spread.cuh) at the large-k shapes, same call
#   land      what landing the spread branch needs, one call: its tests, the four sanitizers over
#             the spread tests, its topk_bench rows beside main's (gpu-base/), probe-ab, DeepSelect
#   flashmla  issue #13's open check: FlashMLA's SM90 sparse FP8 decode over MODEL1 pages that kvc
#             wrote into engine-owned pools (benchmarks/anchors/flashmla_kvc_pages.py: against
#             kvc's CUDA attention and a float32 reference over the pool bytes), then FlashMLA's
#             timed rows (flashmla_anchor.py) if the call has time left; carry [".anchors/flashmla"]
#             (1.2 MB: FlashMLA 9241ae3 and CUTLASS 147f567 include/, made 2026-12-05 as
#             flashmla_anchor.sh's header says). FlashMLA's build took about 200 s (session 22).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session27
source scripts/gpu-lib.sh

step_rows='/(1|8)/131072/0/(1|3)/1/|/32/32768/0/3/1/'

# name binary filter kernel-regex: Nsight Compute's source page (SASS with per-instruction
# warp-state samples, CSV, gzipped) of the matching kernels of a benchmark binary's run, for
# reading where they stall on a machine without a GPU (ncu's text, not a .ncu-rep, which needs
# ncu to open).
bench_source() {
  local l
  l=$(left)
  (( l < 60 )) && { say "ncu source $1: not run (deadline)"; return; }
  timeout 90 ncu --target-processes all --clock-control none -k "regex:$4" \
    --launch-skip "${NCU_SKIP:-14}" --launch-count "${NCU_COUNT:-3}" --section SourceCounters \
    --section WarpStateStats --page source --csv --print-source sass \
    "build-gpu/benchmarks/$2" --benchmark_filter="$3" --benchmark_min_time=1x \
    --benchmark_repetitions=1 > "$out/ncu-source-$1.csv" 2>&1
  say "ncu source $1: rc=$? $(wc -l < "$out/ncu-source-$1.csv") lines"
  gzip -9f "$out/ncu-source-$1.csv"
}

# name filter kernel-regex: bench_source over one decode step of step_bench.
step_source() { bench_source "$1" step_bench "$2" "$3"; }

# The phase probe (scripts/topk-trace-probe.cu) of this tree and of overlays of it, built in the
# background: gpu-base/ (main's kernels, with main's probe laid in by hand) and gpu-prev/ (an
# earlier spread.cuh of this branch), where present.
probe_ab_build() {
  nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/probe-tree" \
    scripts/topk-trace-probe.cu > "$out/probe-build.log" 2>&1 &
  variants=tree
  for v in base prev; do
    [ -d "gpu-$v" ] || continue
    variants="$variants $v"
    ( rm -rf "/tmp/kvc-probe-$v" && mkdir -p "/tmp/kvc-probe-$v" && cp -a kernels include src scripts "/tmp/kvc-probe-$v/" &&
      cp -a "gpu-$v/." "/tmp/kvc-probe-$v/" && cd "/tmp/kvc-probe-$v" &&
      nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/probe-$v" \
        scripts/topk-trace-probe.cu > "$out/probe-$v-build.log" 2>&1 ) &
  done
}

# Each built probe at the large-k shapes, the versions of a shape one after another; the scores
# uniform, or PROBE_DIST's distribution (1 Gaussian, 2 heavy ties: topk-trace-probe.cu's usage).
probe_ab_run() {
  say "probes built: $(ls "$out" | grep -c '^probe-[a-z]*$') of: $variants"
  for shape in "131072 1" "131072 64" "262144 1" "262144 64" "131072 4" "131072 16"; do
    set -- $shape
    for v in $variants; do
      [ -x "$out/probe-$v" ] || continue
      (( $(left) > 20 )) || return 0
      local f="$out/trace-$v-$1x$2${PROBE_DIST:+-dist$PROBE_DIST}.txt"
      timeout 30 "$out/probe-$v" "$1" 2048 "${PROBE_DIST:-0}" 0 1 1 1 "$2" > "$f" 2>&1
      say "== $v rows $2 N $1 dist ${PROBE_DIST:-0}: rc=$?"
      grep -E "ids wrong|grid sync|pass done|sample (cut|append|count|hist|pick)|rank (counted|scattered)|end \\(|graph replay" \
        "$f" >> "$out/summary.txt"
    done
  done
}

# An indexer branch against main (gpu-base/): both builds of dsv4_bench (main's in the
# background), the phase probes of the tree and of main (gpu-base/ laid over a copy) at batch 1
# and 8 (and of a third tree, gpu-mid/ laid over a copy, where it exists), then the dsv4_bench
# rows $1 as tree / main / tree again (query-ab, index-ab).
index_ab_probes_and_rows() {
  BASE_TARGETS=dsv4_bench base_build_bg
  build_targets kvc_cuda_tests dsv4_bench
  local v b src variants="tree base"
  [ -d gpu-mid ] && variants="tree mid base"  # gpu-mid/: a third tree's files, probes only
  for v in $variants; do
    src=.
    if [ $v != tree ]; then
      rm -rf /tmp/kvc-probe-$v && mkdir -p /tmp/kvc-probe-$v &&
        cp -a kernels include src scripts benchmarks /tmp/kvc-probe-$v/ &&
        cp -a gpu-$v/. /tmp/kvc-probe-$v/ && src=/tmp/kvc-probe-$v
    fi
    (cd $src && nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -Ikernels -Iinclude \
      -Isrc -Ibenchmarks -o "$out/index-probe-$v" scripts/index-trace-probe.cu) \
      > "$out/index-probe-$v-build.log" 2>&1
    say "index probe $v build: rc=$?"
  done
  for b in 1 8; do
    for v in $variants; do
      timeout 25 "$out/index-probe-$v" $b > "$out/index-trace-$v-b$b.txt" 2>&1
      say "== index probe $v batch $b: rc=$?"
      grep -E "prep (entry|written)|score entry|streams issued|pdl waited|query loaded|first page|pages scored|after score|graph replay" \
        "$out/index-trace-$v-b$b.txt" >> "$out/summary.txt"
    done
  done
  dsv4_rows_ab "$1"
}

# nvcc of the standalone probe scripts/$1.cu into $probes/$1 (no library build; about 5 s), out
# of the results folder so that no binary comes back with them.
probes=/tmp/kvc-probes
probe_build() {
  mkdir -p "$probes"
  nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -Ikernels -Iinclude -Isrc \
    -Ibenchmarks -o "$probes/$1" "scripts/$1.cu" > "$out/$1-build.log" 2>&1
  say "$1 build: rc=$? at $(( $(date +%s) - t0 )) s"
}

# name kernel-regex probe args...: Nsight Compute of a standalone probe's kernel (its third
# launch of that kernel; the probes replay graphs, whose kernel nodes are profiled one by one),
# with profile's sections and the stall counters, into $out/ncu-<name>.txt; the lines that say
# what limits it into summary.txt.
profile_probe() {
  local name=$1 kernel=$2 bin=$3
  shift 3
  (( $(left) > 45 )) || { say "ncu $name: not run (deadline)"; return; }
  timeout 60 ncu --target-processes all -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
    "${ncu_sections[@]}" --metrics "$(ncu_stall_metrics)" "$probes/$bin" "$@" \
    > "$out/ncu-$name.txt" 2>&1
  say "ncu $name: rc=$? $(grep -E '^ +Duration' "$out/ncu-$name.txt" | tr -s ' ' | tr '\n' ';')"
  grep -E "Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc A|stalled_" \
    "$out/ncu-$name.txt" | head -30 >> "$out/summary.txt"
}

# The decode phase probe (probe_build index-trace-probe first) of variants 8, 10 and 8 again at
# B1 and B8, each run with its scores' hash (equal hashes: variant 10 wrote variant 8's bits).
index_probes_8_10() {
  local b v
  for b in 1 8; do
    for v in 8 10 8; do
      timeout 25 "$probes/index-trace-probe" $b 131072 $v > "$out/index-trace-v$v-b$b.txt" 2>&1
      say "== index probe variant $v batch $b: rc=$?"
      grep -E "FNV|streams issued|query loaded|after score|graph replay" \
        "$out/index-trace-v$v-b$b.txt" >> "$out/summary.txt"
    done
  done
}

# BM_Dsv4IndexDecode of the pending indexer variants: 10 against 8 at B1 / B8 and T1 / T2; 11
# against 9 (and 7, the prefill's choice before 9) at B1 T64, and 11 against 9 at B1 / B8 T4.
index_rows_8_10() {
  BENCH_REPS=5 bench 40 dsv4_bench 'BM_Dsv4IndexDecode/(1|8)/(1|2)/0/0/(8|10)/'
}
index_rows_9_11() {
  BENCH_REPS=5 bench 40 dsv4_bench \
    'BM_Dsv4IndexDecode/1/64/0/0/(7|9|11)/|BM_Dsv4IndexDecode/(1|8)/4/0/0/(9|11)/' -pairs11
}

# Nsight Compute of the B1 T64 prefill under variants 9 and 11 (stall reasons), while the call
# has more than 80 s left.
prefill_profiles() {
  local v
  for v in 9 11; do
    (( $(left) > 80 )) || break
    NCU_STALLS=1 NCU_SKIP=3 profile prefill-t64-v$v dsv4_bench "BM_Dsv4IndexDecode/1/64/0/0/$v/" \
      'wgmma'
    grep -E "Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|DRAM Throughput|stalled_" \
      "$out/ncu-prefill-t64-v$v.txt" | head -30 >> "$out/summary.txt"
  done
}

# racecheck and synccheck over the decode top-k's threshold test (rows up to 4096 blocks).
decode_threshold_sanitizers() {
  export KVC_TEST_MAX_ROW=4096
  sanitize racecheck racecheck '*Cuda_Selector_Decode.BothThresholdsMatchCpu*' 120
  sanitize synccheck synccheck '*Cuda_Selector_Decode.BothThresholdsMatchCpu*' 60
  unset KVC_TEST_MAX_ROW
}

# BM_TopKDecode on ordinary and offset rows (scores 1000 + (-2, 2): the exact fallback), this
# tree then main's (build-base from gpu-base/, base_build_bg): fallback-prefix's measurement.
fallback_rows_ab() {
  local rows='BM_TopKDecode/(1|8|64)/(4096|8192)/(33|64)/(2|100002|200002|300002)/'
  BENCH_REPS=5 bench 90 topk_bench "$rows"
  BASE_TIMEOUT=90 topk_base_rows "$rows"
}

# Memcheck, racecheck and synccheck over the indexer test that runs every mxfp4 kernel (small
# pages, fallbacks, 1-4 and 8 tokens): racecheck over every indexer test ran past 70 s
# (forty-second session).
indexer_sanitizers() {
  local every='*Cuda_Dsv4_Indexer.EveryMxfp4Kernel*'
  sanitize memcheck-index memcheck "$every" 60
  sanitize racecheck-index racecheck "$every" 150
  sanitize synccheck-index synccheck "$every" 60
}

# The dsv4_bench rows $1 of this tree, of main (build-base, after waiting for its build) and of
# this tree again (verify41b, index_ab_probes_and_rows).
dsv4_rows_ab() {
  BENCH_REPS=5 bench 30 dsv4_bench "$1"
  wait
  cat "$out/base-build.txt" >> "$out/summary.txt" 2>/dev/null
  [ -x build-base/benchmarks/dsv4_bench ] && timeout 30 build-base/benchmarks/dsv4_bench \
    --benchmark_min_time=0.05s --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_filter="$1" --benchmark_out="$out/dsv4_bench-base.json" \
    --benchmark_out_format=json > "$out/dsv4_bench-base.log" 2>&1
  say "dsv4_bench-base: rc=$? $(grep -c '_median' "$out/dsv4_bench-base.log" 2>/dev/null) rows"
  BENCH_REPS=5 bench 30 dsv4_bench "$1" -again
}

# main's step_bench (gpu-base/ laid over a copy of the tree) into build-base, in the background
# ($BASE_TARGETS: other targets).
base_build_bg() {
  [ -d gpu-base ] || return 0
  ( s=$(date +%s)
    rm -rf /tmp/kvc-base && mkdir -p /tmp/kvc-base &&
      tar cf - --exclude=./build-gpu --exclude=./build-base --exclude=./gpu-out --exclude=./gpu-base \
        --exclude=./.anchors . | tar xf - -C /tmp/kvc-base && cp -a gpu-base/. /tmp/kvc-base/ &&
      { [ ! -f gpu-base/.added ] || (cd /tmp/kvc-base && xargs -r rm -f < .added); } &&
      cmake -S /tmp/kvc-base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a -DKVC_BUILD_BENCHMARKS=ON -DKVC_BUILD_TESTS=OFF \
        > "$out/base-configure.log" 2>&1 &&
      cmake --build build-base -j 8 --target ${BASE_TARGETS:-step_bench} > "$out/base-build.log" 2>&1
    echo "base build: rc=$? in $(( $(date +%s) - s )) s" > "$out/base-build.txt" ) &
}

# binary filter [limit]: the rows `filter` of main's `binary` (build-base, base_build_bg with
# BASE_TARGETS naming it), after waiting for its build, within limit seconds (default
# $BASE_TIMEOUT, else 60): <binary>-base.json.
base_rows() {
  wait
  cat "$out/base-build.txt" >> "$out/summary.txt" 2>/dev/null
  [ -x "build-base/benchmarks/$1" ] && timeout "${3:-${BASE_TIMEOUT:-60}}" "build-base/benchmarks/$1" \
    --benchmark_min_time=0.05s --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_filter="$2" --benchmark_out="$out/$1-base.json" \
    --benchmark_out_format=json > "$out/$1-base.log" 2>&1
  say "$1-base: rc=$? $(grep -c '_median' "$out/$1-base.log" 2>/dev/null) rows"
}

# The topk_bench rows $1 of main's topk_bench (base_rows; land, rolled / topk-ab).
topk_base_rows() { base_rows topk_bench "$1"; }

# binary filter limit: the rows of this tree, of main (base_rows) and of this tree again, each
# within `limit` seconds: a same-call before / after with the drift between the two runs of the
# tree in view.
rows_ab() {
  BENCH_REPS=5 bench "$3" "$1" "$2"
  base_rows "$1" "$2" "$3"
  BENCH_REPS=5 bench "$3" "$1" "$2" -again
}

# The store rows the ingest modes time: the 16K ingest in three formats with and without the
# index copy, the append step at B1 / B8 / B64 with and without it, and the staggered B64 append.
store_rows='BM_Ingest/T:16384/format:(0|2|3)/index:(0|1)/kernels:0/|BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:0/|BM_AppendStepStaggered/B:64/index:1/kernels:0/'

# The large-k top-k rows the A/B modes time (rolled / topk-ab, share, verify40).
topk_large_rows='BM_TopKVariant/(1|16|64)/131072/2048/5/|BM_TopKVariant/64/262144/2048/5/|BM_TopKVariant/(32|64)/(65536|32768)/2048/5/|BM_TopK/(1|64)/(131072|262144)/2048/|BM_TopK/(1|4)/262144/(512|2048)/'

# The topk_bench rows $1 of this tree, of main (topk_base_rows) and of this tree again, each
# within $2 seconds (default 60): a same-call before / after with the drift between the two
# runs of the tree in view (rolled / topk-ab, share, verify40).
topk_rows_ab() { rows_ab topk_bench "$1" "${2:-60}"; }

# The phase probe ($out/probe-tree, scripts/topk-trace-probe.cu) of the spread top-k, k 2048 over
# Gaussian scores, at each shape "N rows" of the arguments with the sample's segments of 8, 4 and
# 8 again (SpreadParams::sample_run; a same-call before / after with its drift in view), each
# launch's ids checked against a CPU top-k (s52-sample, s52-probe).
sample_run_probes() {
  local shape run rep f
  for shape in "$@"; do
    set -- $shape
    rep=0
    for run in 8 4 8; do
      rep=$(( rep + 1 ))
      (( $(left) > 15 )) || return 0
      f="$out/trace-$rep-run$run-$1x$2.txt"
      timeout 25 "$out/probe-tree" "$1" 2048 1 0 1 1 1 "$2" 1 "$run" > "$f" 2>&1
      say "== probe run $run rows $2 N $1 (Gaussian): rc=$?"
      grep -E "ids wrong|sample (cut|append|count)|rank (counted|scattered)|end \\(|graph replay" \
        "$f" >> "$out/summary.txt"
    done
  done
}

# A spread top-k branch against main (gpu-base/ from scripts/make-gpu-base.sh; spread-ab):
# spread_ab_tests builds both (main's topk_bench in the background, the phase probes of both) and
# runs the selector and DeepSeek-V4 top-k tests; spread_ab_rows EXTRA times the large-k rows (and
# the rows matching |EXTRA) as tree / main / tree again and the probes of both over Gaussian
# scores; spread_memcheck runs memcheck over the spread variants, rows capped at 16385 blocks.
spread_ab_tests() {
  probe_ab_build
  BASE_TARGETS=topk_bench BASE_TIMEOUT=40 base_build_bg
  build_targets kvc_cuda_tests topk_bench
  gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 120
}
spread_ab_rows() {
  BASE_TIMEOUT=40 topk_rows_ab "$topk_large_rows$1" 40
  PROBE_DIST=1 probe_ab_run
}
spread_memcheck() {
  KVC_TEST_MAX_ROW=16385 sanitize memcheck-spread memcheck \
    '*Cuda_Selector_Spread.EveryVariant*:*Cuda_Selector_Spread.Misleading*' 60
}

# The step rows of main's step_bench (build-base), tagged -base, after the branch's.
base_bench() {
  [ -d gpu-base ] || return 0
  wait
  cat "$out/base-build.txt" >> "$out/summary.txt" 2>/dev/null
  [ -x build-base/benchmarks/step_bench ] || return 0
  local l
  l=$(left)
  (( l < 30 )) && { say "step_bench-base: not run (deadline)"; return; }
  timeout $(( l - 15 < 50 ? l - 15 : 50 )) build-base/benchmarks/step_bench \
    --benchmark_min_time=${BENCH_TIME:-0.05s} --benchmark_repetitions=${BENCH_REPS:-3} \
    --benchmark_report_aggregates_only=true --benchmark_filter="$step_rows" \
    --benchmark_out="$out/step_bench-base.json" --benchmark_out_format=json \
    > "$out/step_bench-base.log" 2>&1
  say "step_bench-base: rc=$? $(grep -c '_median' "$out/step_bench-base.log") rows"
}
# filter limit: this checkout's GPU tests (the gtest filter, within limit seconds) and its step
# rows, then main's step rows from gpu-base/ (built beside it while the tests run): the same-call
# before / after of a pending branch.
branch_against_main() {
  build_targets kvc_cuda_tests step_bench
  base_build_bg
  gtests set "$1" "$2"
  bench 40 step_bench "$step_rows"
  base_bench
}

mode=${1:-tokens}
case "$mode" in
  tokens)
    # In order of need: correctness, the same-run figures, the sanitizers, the profiles (each
    # helper skips what the deadline no longer leaves room for).
    build_targets kvc_cuda_tests step_bench topk_bench
    base_build_bg
    gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 100
    bench 50 step_bench "$step_rows"
    bench 30 topk_bench 'BM_TopKSet/(8|64)/(4096|32768)/128/1/'
    base_bench
    # Main's launchers were rewritten without a GPU in the twenty-eighth session (src/cuda/launch.h:
    # LaunchConfig for the selector's cluster, cooperative and resident launches and the
    # attention's cluster query and launch; device code identical): every selector and attention
    # GPU test exercises them.
    gtests launches '*Cuda_Selector*:*Cuda_Attention*' 150
    KVC_TEST_MAX_ROW=8192 sanitize memcheck memcheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 60
    KVC_TEST_MAX_ROW=8192 sanitize racecheck racecheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 60
    # The cluster merge's relaxed first barrier (twenty-ninth session): racecheck and synccheck
    # over the cluster merge's test.
    sanitize racecheck-cluster racecheck '*Cuda_AttentionMma.ClusterAndCombineMergesAgree*:*Cuda_AttentionMma.SplitExtremes*' 60
    sanitize synccheck-cluster synccheck '*Cuda_AttentionMma.ClusterAndCombineMergesAgree*' 40
    step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    KVC_TEST_MAX_ROW=8192 sanitize synccheck synccheck '*Cuda_BlockIndex_TwoStage*' 30
    step_source two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/' 'token_fast|mma_decode|set_topk'
    report
    ;;
  short)
    # tokens for a short lease (twenty-ninth session: most start requests refused): the branch's
    # tests and main's launcher tests first, then the same-run step rows before / after.
    build_targets kvc_cuda_tests step_bench
    base_build_bg
    gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 100
    gtests launches '*Cuda_Selector*:*Cuda_Attention*' 120
    bench 50 step_bench "$step_rows"
    base_bench
    report
    ;;
  epilogue | lean)
    # The thirtieth session's two fixes (the token chunk CTAs' epilogue loads batched; the
    # streaming kernel's barrier between kv heads), and the thirty-first session's branch (lean):
    # the branch's tests, the step rows against main's in one call (gpu-base/ from
    # scripts/make-gpu-base.sh), racecheck over the token tests, memcheck over the two-stage and
    # token tests, Nsight Compute of one B1 step; lean then adds the source page of the B1 step's
    # token, finish and final top-k kernels (where their time goes).
    branch_against_main '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 90
    # The streaming kernel's barrier between kv heads (the thirtieth session's racecheck warnings
    # at d 64, blocks of 16): racecheck over the token tests (about 80 s with the set and
    # two-stage tests on the H200), then memcheck.
    KVC_TEST_MAX_ROW=8192 sanitize racecheck-token racecheck '*Cuda_BlockIndex_TokenScores*:*Cuda_BlockIndex_TwoStage*' 120
    KVC_TEST_MAX_ROW=8192 sanitize memcheck memcheck '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 60
    step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    [ "$1" = lean ] &&
      NCU_COUNT=3 step_source two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/' 'token_fast|token_mass_finish|set_topk'
    report
    ;;
  lean-rows)
    # lean's tests and same-call step rows on a second GPU (the first lean call ran on an H100),
    # then Nsight Compute of one B1, B8 and B32 two-stage step (the token kernel's duration).
    branch_against_main '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 90
    step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    step_ncu two-stage-B8 'BM_DecodeStep/8/131072/0/3/1/'
    step_ncu two-stage-B32 'BM_DecodeStep/32/32768/0/3/1/'
    report
    ;;
  fused)
    # The thirty-second session's fused finish + topk (kernels/select/sparse_row.cuh in
    # token_mass_finish_kernel<true>): correctness first, then the same-call rows, then the
    # sanitizers over the new kernel's tests.
    branch_against_main '*Cuda_SparseRowTopk*:*Cuda_BlockIndex_TwoStage*:*Cuda_DecodeStep*' 100
    sanitize racecheck racecheck '*Cuda_SparseRowTopk*:*Cuda_BlockIndex_TwoStage.WorkspaceContract*:*Cuda_BlockIndex_TwoStage.MatchCpu/*c24*' 60
    sanitize memcheck memcheck '*Cuda_SparseRowTopk*:*Cuda_BlockIndex_TwoStage*' 60
    sanitize synccheck synccheck '*Cuda_SparseRowTopk*:*Cuda_BlockIndex_TwoStage.MatchCpu/*c24*' 40
    sanitize initcheck initcheck '*Cuda_SparseRowTopk*:*Cuda_BlockIndex_TwoStage.MatchCpu/*c24*' 40
    report
    ;;
  candidates)
    build_targets kvc_cuda_tests step_bench
    # The thirty-second session's decode-step guard past 65535 rows with two stages (not run on
    # a GPU when it was written), with the two-stage tests.
    gtests guards '*Cuda_DecodeStepGuards*:*Cuda_BlockIndex_TwoStage*' 120
    bench 90 step_bench '/(1|8)/131072/0/(1|3|5)/1/|/32/32768/0/(3|5)/1/|/32/32768/0/1/0/|/(1|8)/131072/0/3/61/'
    step_ncu two-stage-c255-B8 'BM_DecodeStep/8/131072/0/5/1/'
    report
    ;;
  grid)
    # The rest of issue #12's grid (item 6): every head shape (32 / 8 / 128, 9 / 3 / 64,
    # 64 / 1 / 512) at top 4 / 8 / 16, B1 / B8 N128K and B32 N32K, kvc's default scorer and mean K
    # over f16 summaries (step_bench BM_DecodeStepGrid, never run yet).
    build_targets step_bench
    bench 400 step_bench 'BM_DecodeStepGrid/' -grid
    # The token-mass finish kernel of the MQA row (one row of 64 heads: 16 CTAs, 38 us under
    # Nsight Compute in the thirty-seventh session, latency-bound): where its warps stall.
    NCU_STALLS=1 profile finish-mqa step_bench 'BM_DecodeStepGrid/1/131072/1/2/8/' 'token_mass_finish'
    report
    ;;
  spread)
    build_targets kvc_cuda_tests topk_bench
    gtests spread '*Cuda_Selector_Spread*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 240
    BENCH_REPS=5 bench 100 topk_bench 'BM_TopKVariant/[0-9]+/[0-9]+/[0-9]+/(5|11)/|BM_TopK/(1|64)/(131072|262144)/2048/'
    # CUB's and DeepSelect's top-k in the same call where the bundle's binaries are carried
    # (carry [".anchors/p1/bin", ".anchors/p1/MANIFEST"]).
    [ -d .anchors/p1/bin ] && named_anchors topk "cub deepselect_bin"
    topk_trace rows64-ring 131072 2048 0 0 1 1 1 64 1
    topk_trace rows64-no-ring 131072 2048 0 0 1 1 1 64 0
    topk_trace rows1-ring 131072 2048 0 0 1 1 1 1 1
    sanitize memcheck memcheck '*Cuda_Selector_Spread.MisleadingSample*:Selector_CutScoreFloor*' 75
    sanitize racecheck racecheck '*Cuda_Selector_Spread.MisleadingSample*' 75
    report
    ;;
  probe-ab)
    # The phase probe of this checkout's spread top-k beside overlays of it, same call: which
    # phase a version's time comes from (probe_ab_build, probe_ab_run above).
    probe_ab_build
    wait
    probe_ab_run
    ;;
  wide)
    # The thirty-seventh session's wide tensor-core token kernel (kernels/index/token_wide.cuh:
    # G > 8 or d 256 / 512 under kAuto, written without a GPU): the token-score and two-stage
    # tests (the wide cases are TokenScores 24-28 and the TwoStage d512 / d256 rows), the four
    # sanitizers over the smaller wide cases (memcheck over the MQA ones too), and the grid's MQA
    # rows (scorer 1, shape 2) beside main's step_bench from gpu-base/ (built in the same call).
    BASE_TARGETS=step_bench base_build_bg
    build_targets kvc_cuda_tests step_bench
    gtests wide '*Cuda_BlockIndex_TokenScores*:*Cuda_BlockIndex_TwoStage*' 200
    step_rows='BM_DecodeStepGrid/(1|8)/131072/1/2/8/|BM_DecodeStepGrid/32/32768/1/2/16/|BM_DecodeStepGrid/1/131072/1/0/8/'
    BENCH_REPS=3 bench 60 step_bench "$step_rows"
    base_bench
    small='*TokenScores.MatchCpu/26:*TokenScores.MatchCpu/27:*TwoStage.MatchCpu/*_d256_g12_*'
    for tool in memcheck synccheck initcheck racecheck; do
      sanitize "$tool" "$tool" "$small" 90
    done
    sanitize memcheck-mqa memcheck '*TokenScores.MatchCpu/24:*TwoStage.MatchCpu/*_d512_g64_*' 90
    report
    ;;
  wide-summary)
    # The wide tensor-core summary kernel (kernels/index/score_wide.cuh: mean K, rows per kv
    # head, 16-bit summaries, Hq * d > 12288 or d 256 / 512; written without a GPU in the
    # thirty-seventh session, landed in the thirty-eighth): the summary tests (the four new MatchesCpu shapes are its last
    # four), its non-finite test, the two-stage tests (their first stage takes it at MQA), the
    # four sanitizers over the non-finite test, and the grid's MQA mean-K rows (scorer 2,
    # shape 2) beside main's step_bench from gpu-base/.
    BASE_TARGETS=step_bench base_build_bg
    build_targets kvc_cuda_tests step_bench
    gtests wsum '*Cuda_BlockIndex_MatchesCpu*:*Cuda_BlockIndex_WideSummaryNonFinite*:*Cuda_BlockIndex_TwoStage*' 240
    step_rows='BM_DecodeStepGrid/(1|8)/131072/2/2/8/|BM_DecodeStepGrid/32/32768/2/2/16/|BM_DecodeStepGrid/1/131072/2/0/8/'
    BENCH_REPS=3 bench 60 step_bench "$step_rows"
    base_bench
    for tool in memcheck synccheck initcheck racecheck; do
      sanitize "$tool" "$tool" '*Cuda_BlockIndex_WideSummaryNonFinite*' 90
    done
    report
    ;;
  decode-cluster)
    # The decode path over clusters of 2 / 4 / 8 CTAs per row (kDecodeClusterShapes; written
    # without a GPU in the thirty-eighth session) against one CTA per row (with and without PDL)
    # and the small path on the benchmark's long rows (8192 and 32768 blocks), the same call.
    build_targets kvc_cuda_tests topk_bench
    gtests decode '*Cuda_Selector_Decode*' 150
    BENCH_REPS=3 bench 100 topk_bench 'BM_TopKDecode/(1|8|64)/(8192|32768)/(8|64)/|BM_TopKFloor/(1|8|64)/32768/'
    export KVC_TEST_MAX_ROW=8192
    for tool in memcheck synccheck initcheck racecheck; do
      sanitize "$tool" "$tool" '*Cuda_Selector_Decode.EveryClusterShapeMatchesCpu*' 70
    done
    unset KVC_TEST_MAX_ROW
    gtests all '*' 400
    report
    ;;
  decode-default)
    build_targets kvc_cuda_tests topk_bench
    gtests select '*Cuda_Selector*:*Cuda_DecodeStep*:*Cuda_Dsv4_TopK*' 150
    BENCH_REPS=3 bench 60 topk_bench 'BM_TopKDecode/(1|8|64)/(4096|8192|32768)/(8|64)/(2|[0-9]{4}[13579])/|BM_TopKFloor/(1|8|64)/32768/'
    [ -d .anchors/p1/bin ] && named_anchors topk "deepselect_bin"
    export KVC_TEST_MAX_ROW=4096
    sanitize racecheck racecheck '*Cuda_Selector_Decode.EveryClusterShapeMatchesCpu*' 150
    unset KVC_TEST_MAX_ROW
    report
    ;;
  decode-verify)
    build_targets kvc_cuda_tests topk_bench
    gtests all '*' 220
    NCU_STALLS=1 profile decode-4096-k64 topk_bench 'BM_TopKDecode/8/4096/64/2/' 'decode_topk'
    NCU_STALLS=1 profile decode-4096-k8 topk_bench 'BM_TopKDecode/8/4096/8/2/' 'decode_topk'
    NCU_COUNT=2 bench_source decode-4096-k64 topk_bench 'BM_TopKDecode/8/4096/64/2/' 'decode_topk'
    report
    ;;
  decode-threads)
    build_targets kvc_cuda_tests topk_bench
    gtests select '*Cuda_Selector*' 120
    BENCH_REPS=5 bench 60 topk_bench 'BM_TopKDecode/(1|8|64)/4096/(8|16|64)/(2|257|513|1025)/'
    [ -d .anchors/p1/bin ] && named_anchors topk "deepselect_bin"
    report
    ;;
  decode-count)
    build_targets kvc_cuda_tests topk_bench
    gtests decode '*Cuda_Selector_Decode*' 150
    # The block-index tests: the thirty-eighth session's review mends (summary_params, the shared
    # non-finite setup) were compiled but never run on a GPU.
    gtests blockindex '*Cuda_BlockIndex*' 120
    BENCH_REPS=5 bench 60 topk_bench 'BM_TopKDecode/(1|8|64)/(4096|8192)/(33|64)/(1?00)?(257|513)/'
    [ -d .anchors/p1/bin ] && named_anchors topk "deepselect_bin"
    decode_threshold_sanitizers
    report
    ;;
  wide-prof)
    # Where the grid's MQA step (Hq 64 / Hkv 1 / d 512, B1 N128K, top 8) spends its time after
    # the wide token kernel: every kernel of one step under Nsight Compute, for kvc's default
    # scorer (token mass) and mean K over f16 summaries.
    build_targets step_bench
    step_ncu mqa-token 'BM_DecodeStepGrid/1/131072/1/2/8/'
    step_ncu mqa-meank 'BM_DecodeStepGrid/1/131072/2/2/8/'
    report
    ;;
  rolled | topk-ab)
    # A large-k top-k branch against main (gpu-base/, built in the same call), first for the
    # thirty-ninth session's gpu-pending/rolled-rank (bucket_rank's comparison loop rolled: the
    # spread kernel 29,840 -> 20,752 sm_90a instructions), then its share-slots: every selector
    # test, the large-k rows of this tree and of main as tree, base, tree again, the phase probes
    # of both, memcheck and racecheck over the counting-rank test.
    probe_ab_build
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:Selector_RankBucket*:*Cuda_Dsv4_TopK*' 150
    rows="$topk_large_rows"
    topk_rows_ab "$rows"
    probe_ab_run
    sanitize memcheck memcheck '*Cuda_Selector_Spread.CountingRank*:*Cuda_Selector_Stream*' 60
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 75
    report
    ;;
  share)
    # The fortieth session's gpu-pending/share: the spread path's shared finish by whole buckets
    # of bucketed positions, so a warp's stores land on consecutive ranks (its first call also
    # had a ring of 12 tiles, dropped: the phase probes put the shared finish alone ahead), against
    # main (gpu-base/: main's spread.cuh and stream.cuh): the selector and DeepSeek-V4 top-k
    # tests, the large-k rows as tree / base / tree again with a few decode rows as a control,
    # racecheck over the counting-rank test (the shared finish among its variants).
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 150
    rows="BM_TopKDecode/(1|8)/4096/(8|64)/2/|$topk_large_rows"
    topk_rows_ab "$rows"
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 60
    report
    ;;
  index-probe)
    # Issue #13's mxfp4 indexer at B1 T1 (12.7 us against a 5 us goal): where the decode launch's
    # time goes, by the phase probe of the preparation and page-stream kernels
    # (scripts/index-trace-probe.cu, no library build) at batch 1 and 8, variant 10 (the
    # library's choice at one token); since the fifty-third session with each stream's first
    # page landed and its pages scored, which split the 4.6 -> 11 us after the query between the
    # pages' arrival and the scoring. About a minute.
    probe_build index-trace-probe
    for b in 1 8; do
      timeout 60 "$probes/index-trace-probe" "$b" 131072 10 > "$out/index-trace-b$b.txt" 2>&1
      say "== index probe batch $b: rc=$?"
      cat "$out/index-trace-b$b.txt" >> "$out/summary.txt"
    done
    report
    ;;
  verify42)
    # The forty-second session's first call (gpu-pending/bucket-scale with gpu-base/ from
    # `scripts/make-gpu-base.sh main`): every GPU test (the fortieth and forty-first sessions'
    # landings never ran the full suite; the branch's host test Selector_RankBucket among them),
    # the large-k top-k rows as tree / main / tree again, memcheck over the counting rank, then the
    # DeepSeek-V4 indexer's phase probe with what time is left.
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests all '*' 240
    topk_rows_ab "BM_TopKDecode/(1|8)/4096/(8|64)/2/|$topk_large_rows" 40
    sanitize memcheck memcheck '*Cuda_Selector_Spread.CountingRank*' 45
    probe_build index-trace-probe
    for b in 1 8; do
      (( $(left) > 30 )) || break
      timeout 25 "$probes/index-trace-probe" "$b" > "$out/index-trace-b$b.txt" 2>&1
      say "== index probe batch $b: rc=$?"
      cat "$out/index-trace-b$b.txt" >> "$out/summary.txt"
    done
    report
    ;;
  attn-ncu)
    # Nsight Compute of the selected-block attention at B8 and B1 N128K (kAuto: the staged
    # tensor-core kernel, two or three shared-memory slots a warp): DRAM throughput, occupancy,
    # stalls, for the #12 attention row (B8 48 % of HBM against 80; B1 9.3 against 5 us). The
    # staged kernel has had source-page stall samples at B1 inside the step (thirty-sixth
    # session: 40 % no_inst) but no such profile at B8 (the eighth session's was of the register
    # kernel). About 60 s on a warm machine with attention_bench built.
    build_targets attention_bench
    NCU_STALLS=1 profile attn-b8 attention_bench 'BM_BlockSelectExact/0/8/3/0/0/1/' 'mma_decode'
    NCU_STALLS=1 profile attn-b1 attention_bench 'BM_BlockSelectExact/0/1/3/0/0/1/' 'mma_decode'
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Grid Size|stalled_(long|wait|barrier|no_inst|short|mio|lg)" \
      "$out"/ncu-attn-*.txt | head -40 >> "$out/summary.txt"
    ;;
  index-ncu)
    # Nsight Compute of the indexer's decode score kernel, variant 10 (the automatic choice at
    # T1), at B1 T1 and B8 T1: executed instructions (a 64-key page's count is about the B1 total
    # over 2,048 pages, the prologue included), stall reasons, occupancy. Run in the fifty-sixth
    # session (docs/perf-data/2026-12-07-session56/index-ncu).
    build_targets dsv4_bench
    NCU_STALLS=1 NCU_SKIP=5 profile index-b1t1-v10 dsv4_bench 'BM_Dsv4IndexDecode/1/1/0/0/10/' 'mxfp4_score'
    NCU_STALLS=1 NCU_SKIP=5 profile index-b8t1-v10 dsv4_bench 'BM_Dsv4IndexDecode/8/1/0/0/10/' 'mxfp4_score'
    grep -E "Executed Instructions|Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|DRAM Throughput|stalled_" \
      "$out"/ncu-index-*.txt | head -60 >> "$out/summary.txt"
    ;;
  index-ab)
    # An indexer branch against main in one call (gpu-base/ from `scripts/make-gpu-base.sh main`),
    # first the forty-second session's gpu-pending/early-lookup: the DeepSeek-V4 tests, the
    # indexer rows (BM_Dsv4IndexDecode B1 / B8, T1 / T2, and the kernels alone) and phase probes
    # of both (and of gpu-mid/), memcheck, racecheck and synccheck over the indexer tests.
    index_ab_probes_and_rows 'BM_Dsv4IndexDecode/(1|8)/(1|2)/0/0/0/|BM_Dsv4IndexProbe/(0|6)/'
    gtests dsv4 '*Dsv4*' 120
    indexer_sanitizers
    report
    ;;
  pairs-probe)
    # pairs-ab's phase probes alone, no library build (an estimate: 100 s with a fresh start):
    # variants 8, 10, 8 again at B1 and B8, graph replay, and each run's hash of the scores' bits
    # (the same inputs every run, so equal hashes say variant 10 wrote variant 8's bits). For a
    # call with little device time left; pairs-ab is the landing run.
    probe_build index-trace-probe
    index_probes_8_10
    ;;
  s45)
    # The forty-fifth session's first call over gpu-pending/octet-pairs + fallback-prefix + the
    # DeepSeek-V4 indexer's variant 11, sharing one build, most needed first: the index probes of
    # variants 8 / 10 / 8 and their rows, variant 11 against 9 at T4 and T64, the DeepSeek-V4
    # and decode tests, the decode top-k rows of this tree then main's (gpu-base/ holding main's
    # decode.cuh alone), then the sanitizers while time is left. s45b, on the same warm machine
    # right after, runs the sanitizers and the prefill profiles over the same build.
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests dsv4_bench topk_bench
    probe_build index-trace-probe
    index_probes_8_10
    index_rows_8_10
    index_rows_9_11
    gtests dsv4 '*Dsv4*' 120
    gtests decode '*Cuda_Selector_Decode*' 150
    fallback_rows_ab
    # What time is left: s45b's sanitizers (each helper skips itself past the deadline).
    indexer_sanitizers
    decode_threshold_sanitizers
    report
    ;;
  s45-rows)
    # s45's indexer measurements alone, for a call with little device time (no tests, no
    # sanitizers: not enough to land): dsv4_bench and the probe built, the probes of variants
    # 8 / 10 / 8 with their hashes, the rows of 8 and 10 at T1 / T2, of 9 and 11 at T4 and T64.
    build_targets dsv4_bench
    probe_build index-trace-probe
    index_rows_9_11
    index_probes_8_10
    index_rows_8_10
    report
    ;;
  s46)
    # The forty-sixth session's one call for little device time (about 480 s): the DeepSeek-V4
    # indexer's two pending variants and what landing them needs, nothing of fallback-prefix
    # (the decode top-k: its own call later). s45-rows' measurements first (variant 11 against 9
    # at T4 / T64, the probes and rows of 10 against 8), then the DeepSeek-V4 tests (every
    # variant against the CPU's bits), the indexer's sanitizers, and the prefill profiles of
    # variants 9 and 11 while time is left.
    build_targets kvc_cuda_tests dsv4_bench
    probe_build index-trace-probe
    index_rows_9_11
    index_probes_8_10
    index_rows_8_10
    gtests dsv4 '*Dsv4*' 120
    indexer_sanitizers
    prefill_profiles
    report
    ;;
  s46-short)
    # s46 for about 260 s: variant 11 against 9 (T4, T64), the DeepSeek-V4 tests, the rows of
    # variant 10 against 8 (T1, T2; no probes), then the indexer's sanitizers while time is left.
    build_targets kvc_cuda_tests dsv4_bench
    index_rows_9_11
    gtests dsv4 '*Dsv4*' 120
    index_rows_8_10
    indexer_sanitizers
    report
    ;;
  probes46)
    # No library build (about a minute on the device): the indexer's two standalone probes.
    # scripts/index-prefill-probe.cu times variants 9 and 11 (9, 11, 9, 11) at B1 T64 and T256
    # with their scores' hashes; scripts/index-trace-probe.cu times variants 8 / 10 / 8 at B1 and
    # B8 by phase, with hashes.
    probe_build index-prefill-probe
    probe_build index-trace-probe
    for T in 64 256; do
      timeout 60 "$probes/index-prefill-probe" 1 $T > "$out/index-prefill-t$T.txt" 2>&1
      say "== index prefill probe B1 T$T: rc=$?"
      cat "$out/index-prefill-t$T.txt" >> "$out/summary.txt"
    done
    index_probes_8_10
    ;;
  s45b)
    # After s45 on the same warm machine (its build-gpu kept): the indexer's sanitizers (variants
    # 10 and 11 among every mxfp4 kernel), the decode top-k's racecheck and synccheck, then the
    # prefill profile of variant 9 and, if time is left, of variant 11 (run it with
    # KEEP_SUMMARY=1 to keep s45's summary.txt).
    build_targets kvc_cuda_tests dsv4_bench
    indexer_sanitizers
    decode_threshold_sanitizers
    prefill_profiles
    report
    ;;
  pairs-ab)
    # The forty-third session's gpu-pending/octet-pairs: variant 10 (the page-stream kernel over
    # octet pairs, the query's fragments loaded per k step) against variant 8 in the same tree:
    # the phase probe of both (8, 10, 8 again) at B1 and B8, BM_Dsv4IndexDecode of both at B1 /
    # B8 and T1 / T2, the DeepSeek-V4 tests (every variant against the CPU's bits), memcheck,
    # racecheck and synccheck over the test that runs every mxfp4 kernel.
    build_targets kvc_cuda_tests dsv4_bench
    probe_build index-trace-probe
    index_probes_8_10
    index_rows_8_10
    gtests dsv4 '*Dsv4*' 120
    indexer_sanitizers
    report
    ;;
  query-ab)
    # gpu-pending/query-smem against main in one call (gpu-base/ from `scripts/make-gpu-base.sh
    # main`: main's index_stream.cuh): every GPU test of the branch (the fortieth and forty-first
    # sessions' landings never ran the full suite), the indexer rows and phase probes of both,
    # racecheck over the indexer tests with what time is left. (The rows' filter ends in `$` and
    # matched only BM_Dsv4IndexProbe.)
    index_ab_probes_and_rows 'BM_Dsv4IndexDecode/(1|8)/(1|2)/0/0/0$|BM_Dsv4IndexProbe/'
    gtests all '*' 250
    sanitize racecheck-index racecheck '*Cuda_Dsv4_Indexer*' 70
    report
    ;;
  verify41b)
    # The forty-first session's landing (the late barrier and the 4096-score sample): every GPU
    # test, DeepSeek-V4's top-k rows (issue #13's 2048 of 262144 at B1) as tree / base / tree
    # again against the main before it (gpu-base/ from `scripts/make-gpu-base.sh 41db1bf`),
    # racecheck over every spread variant with what time is left.
    BASE_TARGETS=dsv4_bench base_build_bg
    build_targets kvc_cuda_tests dsv4_bench
    gtests all '*' 220
    rows='BM_Dsv4TopK/(1|8)/262144/2048/0/0/|BM_Dsv4TopK/1/262144/(512|1024)/0/0/'
    dsv4_rows_ab "$rows"
    export KVC_TEST_MAX_ROW=16385
    sanitize racecheck-spread racecheck '*Cuda_Selector_Spread.EveryVariant*' 300
    unset KVC_TEST_MAX_ROW
    report
    ;;
  sample4096)
    # verify41's second call on the same warm machine: this tree with the 4096-score sample built
    # in (tuning.h), its selector tests, sanitizers and large-k rows against main's topk_bench left
    # in build-base/ by verify41.
    build_targets kvc_cuda_tests topk_bench
    gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 90
    BASE_TIMEOUT=40 topk_rows_ab "$topk_large_rows|BM_TopKDecode/(1|8)/4096/(8|64)/" 40
    export KVC_TEST_MAX_ROW=16385
    sanitize memcheck-spread memcheck '*Cuda_Selector_Spread.EveryVariant*' 60
    unset KVC_TEST_MAX_ROW
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 75
    report
    ;;
  verify41)
    # The forty-first session's one call (two failed starts left the budget for one): the pending
    # late-barrier branch (this tree: the fortieth session's landed shared finish plus the
    # barrier moved) against main (gpu-base/ from `scripts/make-gpu-base.sh main`), and for the
    # phase probe only gpu-prev/ = this tree with a 4096-score sample (tuning.h,
    # kSpreadSampleSegments 512): the selector and DeepSeek-V4 top-k tests, the large-k rows as
    # tree / base / tree again, the three phase probes, memcheck and racecheck over the counting
    # rank and every spread variant (rows capped at 16385 blocks).
    probe_ab_build
    BASE_TARGETS=topk_bench BASE_TIMEOUT=40 base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 90
    BASE_TIMEOUT=40 topk_rows_ab "$topk_large_rows" 40
    probe_ab_run
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 75
    export KVC_TEST_MAX_ROW=16385
    sanitize memcheck-spread memcheck '*Cuda_Selector_Spread.EveryVariant*' 60
    sanitize racecheck-spread racecheck '*Cuda_Selector_Spread.EveryVariant*' 150
    unset KVC_TEST_MAX_ROW
    report
    ;;
  verify40)
    # The fortieth session's end state, for the next session's first call (the landed shared
    # finish by bucketed positions never ran topk_bench or the full suite in its own form): every
    # GPU test, the large-k rows as tree / base / tree again against the main before it
    # (gpu-base/ from `scripts/make-gpu-base.sh 5b3767e`: its spread.cuh and stream.cuh),
    # racecheck over the counting-rank test
    # and over every spread variant with rows capped at 16385 blocks, longer limits than the
    # fortieth session's (whose spread racecheck ran past 70 s).
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests all '*' 220
    rows="$topk_large_rows"
    topk_rows_ab "$rows"
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 90
    export KVC_TEST_MAX_ROW=16385
    sanitize racecheck-spread racecheck '*Cuda_Selector_Spread.EveryVariant*' 150
    unset KVC_TEST_MAX_ROW
    report
    ;;
  verify39)
    # The thirty-ninth session's end state: every GPU test (the count threshold is now the
    # decode path's built-in choice; the rolled counting-rank loop), then the spread top-k under
    # Nsight Compute with its stall reasons at 1 and 64 rows of 131072 (k 2048) and the source
    # page of the one-row launch (where its instruction-fetch stalls sit).
    build_targets kvc_cuda_tests topk_bench
    gtests all '*' 220
    NCU_STALLS=1 NCU_SKIP=3 profile topk-64x131072 topk_bench 'BM_TopK/64/131072/2048/' 'spread'
    NCU_STALLS=1 NCU_SKIP=3 profile topk-1x131072 topk_bench 'BM_TopK/1/131072/2048/' 'spread'
    NCU_SKIP=3 NCU_COUNT=1 bench_source topk-1x131072 topk_bench 'BM_TopK/1/131072/2048/' 'spread'
    report
    ;;
  land)
    # Everything a landing of the spread top-k's branch needs from one call: its tests, the four
    # sanitizers over the spread tests, its topk_bench rows beside main's (gpu-base/, built in
    # the same call), the phase probes of this tree, main and gpu-prev/, and DeepSelect's rows
    # (carry [".anchors/p1/bin"]).
    probe_ab_build
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests spread '*Cuda_Selector_Spread*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 60
    rows='BM_TopKVariant/(1|16|64)/131072/2048/5/|BM_TopKVariant/64/262144/2048/5/|BM_TopKVariant/(32|64)/(65536|32768)/2048/5/|BM_TopK/(1|64)/(131072|262144)/2048/'
    BENCH_REPS=5 bench 60 topk_bench "$rows"
    topk_base_rows "$rows"
    probe_ab_run
    [ -d .anchors/p1/bin ] && named_anchors topk "deepselect_bin"
    # racecheck takes about 27 s and 38 s over these two tests on an H100 (thirty-sixth session),
    # over 60 s together: one test a run. Give the call DEADLINE=540 for all six.
    for tool in memcheck synccheck initcheck; do
      sanitize "$tool" "$tool" '*Cuda_Selector_Spread.MisleadingSample*:*Cuda_Selector_Spread.CountingRank*' 60
    done
    sanitize racecheck-sample racecheck '*Cuda_Selector_Spread.MisleadingSample*' 60
    sanitize racecheck-rank racecheck '*Cuda_Selector_Spread.CountingRank*' 75
    report
    ;;
  rotate)
    build_targets kvc_cuda_tests topk_bench
    # main's topk_bench beside this branch's when gpu-base/ is carried (scripts/make-gpu-base.sh).
    BASE_TARGETS=topk_bench base_build_bg
    gtests spread '*Cuda_Selector_Spread*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 60
    BENCH_REPS=5 bench 60 topk_bench 'BM_TopKVariant/(1|16|64)/131072/2048/(5|11)/|BM_TopKVariant/64/262144/2048/(5|11)/|BM_TopKVariant/(32|64)/(65536|32768)/2048/(5|11)/|BM_TopK/(1|64)/(131072|262144)/2048/'
    topk_trace rows64-ring 131072 2048 0 0 1 1 1 64 1
    topk_trace rows1-ring 131072 2048 0 0 1 1 1 1 1
    if [ -d gpu-base ]; then
      wait
      cat "$out/base-build.txt" >> "$out/summary.txt" 2>/dev/null
      [ -x build-base/benchmarks/topk_bench ] && BENCH_REPS=5 timeout 60 build-base/benchmarks/topk_bench \
        --benchmark_min_time=0.05s --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
        --benchmark_filter='BM_TopKVariant/(1|16|64)/131072/2048/5/|BM_TopKVariant/64/262144/2048/5/|BM_TopKVariant/(32|64)/(65536|32768)/2048/5/|BM_TopK/(1|64)/(131072|262144)/2048/' \
        --benchmark_out="$out/topk_bench-base.json" --benchmark_out_format=json > "$out/topk_bench-base.log" 2>&1
      say "topk_bench-base: rc=$? $(grep -c '_median' "$out/topk_bench-base.log" 2>/dev/null) rows"
    fi
    [ -d .anchors/p1/bin ] && named_anchors topk "deepselect_bin"
    report
    ;;
  profiles)
    # The instruction-level profiles the thirty-third session asked for: the candidate set
    # (set_topk) and the attention of the B1 two-stage step, and the large-k top-k at
    # 64 x 131072 k 2048 (DeepSelect's fp32 kernel 50.0 against kvc's 55.2 µs in the
    # thirty-fourth session's same-run table, H100); Speed of Light of the last for its phases.
    build_targets step_bench topk_bench
    # Where the spread top-k's time goes at 64 rows (the phase probe, now for several rows)
    # beside one row.
    topk_trace rows64-131072 131072 2048 0 0 1 1 1 64
    topk_trace rows1-131072 131072 2048 0 0 1 1 1 1
    # kvc's large-k top-k in id order, DeepSelect's sorted_index order (score order in BM_TopK).
    BENCH_REPS=3 bench 60 topk_bench 'BM_TopKOrder/(1|64)/(131072|262144)/2048/|BM_TopK/64/131072/2048/'
    NCU_COUNT=2 bench_source set-topk-B1 step_bench 'BM_DecodeStep/1/131072/0/3/1/' 'set_topk'
    NCU_COUNT=2 bench_source attention-B1 step_bench 'BM_DecodeStep/1/131072/0/3/1/' 'decode_kernel'
    NCU_SKIP=8 NCU_COUNT=4 bench_source topk-64x131072 topk_bench 'BM_TopK/64/131072/2048/' '.'
    l=$(left)
    (( l > 60 )) && timeout 60 ncu --target-processes all --clock-control none --launch-skip 8 \
      --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
      build-gpu/benchmarks/topk_bench --benchmark_filter='BM_TopK/64/131072/2048/' \
      --benchmark_min_time=1x --benchmark_repetitions=1 > "$out/ncu-topk-64x131072.txt" 2>&1
    grep -E "^  [a-z_:]+.*\(|Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occ" \
      "$out/ncu-topk-64x131072.txt" | head -40 >> "$out/summary.txt"
    ;;
  prefill-prof)
    # Where the DeepSeek-V4 indexer's prefill scoring (variant 9, warpgroup mma; B1 T64 over
    # 131072 entries, 26 % of the fp8 tensor-core rate since the fourteenth session) spends its
    # time: Nsight Compute's sections with the stall reasons, then the per-instruction stall
    # samples (SASS), one launch each. Never profiled before the forty-fourth session.
    build_targets dsv4_bench
    BENCH_REPS=3 bench 40 dsv4_bench 'BM_Dsv4IndexDecode/1/64/0/0/(7|9)/'
    NCU_STALLS=1 NCU_SKIP=3 profile prefill-t64 dsv4_bench 'BM_Dsv4IndexDecode/1/64/0/0/9/' \
      'wgmma'
    # (profile wrote the duration into summary.txt already.)
    grep -E "Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued" \
      "$out/ncu-prefill-t64.txt" | head -10 >> "$out/summary.txt"
    grep -E "Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|stalled_" \
      "$out/ncu-prefill-t64.txt" | head -30 >> "$out/summary.txt"
    NCU_SKIP=3 NCU_COUNT=1 bench_source prefill-t64 dsv4_bench 'BM_Dsv4IndexDecode/1/64/0/0/9/' \
      'wgmma'
    report
    ;;
  fallback-prefix)
    # The forty-fourth session's gpu-pending/fallback-prefix: the decode path's exact fallback
    # (rows whose candidates overflow kDecodeCap) starts its radix descent below the leading bits
    # T shares with the row's largest key, with gpu-base/ holding main's decode.cuh ALONE (so
    # that main's build has this branch's topk_bench and its offset rows): the decode tests,
    # BM_TopKDecode on ordinary and offset rows (scores 1000 + (-2, 2): the fallback) for the
    # built-in choice and the listed maxima, this tree then main, racecheck and synccheck over
    # the threshold test.
    BASE_TARGETS=topk_bench base_build_bg
    build_targets kvc_cuda_tests topk_bench
    gtests decode '*Cuda_Selector_Decode*' 150
    fallback_rows_ab
    decode_threshold_sanitizers
    report
    ;;
  prefetch)
    # The summary scorer's L2-prefetch variants (twenty-ninth session, written without a GPU):
    # the summary tests (every variant against the CPU, the prefetch variants bit for bit against
    # kTensorCore), memcheck over them, then the variants side by side at B1 / B8 / B32.
    build_targets kvc_cuda_tests index_bench
    gtests summary '*Cuda_BlockIndex_MatchesCpu*' 120
    sanitize memcheck-summary memcheck '*Cuda_BlockIndex_MatchesCpu*' 120
    BENCH_REPS=3 bench 120 index_bench 'BM_Score/h32x8x128/B(1|8)/N131072/(mean_k|quest)/f16/sum/fast-tensor_core(|_l2w1|_l2w2|_l2next)/|BM_Score/h32x8x128/B32/N32768/mean_k/f16/sum/fast-tensor_core(|_l2w1|_l2w2)/'
    report
    ;;
  ingest)
    # The forty-ninth session's store encoders (division-free q8 / q4 codes and scales, mxfp4
    # codes by rounding, block_rows_kernel's stepped row addresses and units of 16 lanes at d 128)
    # against main (gpu-base/, built in the same call): the format and store tests (the encoders'
    # exhaustive device checks among them), the ingest and append rows as tree / base / tree
    # again, Nsight Compute's instruction counts of both ingest kernels and the tree's source page,
    # memcheck over the store update tests, synccheck over those of block_rows_kernel.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_Formats*:*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 150
    rows_ab store_bench "$store_rows|BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:8/" 45
    NCU_SKIP=4 profile ingest-tree store_bench 'BM_Ingest/T:16384/format:3/index:1/kernels:0/' \
      'block_rows'
    NCU_SKIP=4 profile ingest-base ../../build-base/benchmarks/store_bench \
      'BM_Ingest/T:16384/format:3/index:1/kernels:0/' 'block_rows'
    NCU_SKIP=4 NCU_COUNT=1 bench_source ingest-tree store_bench \
      'BM_Ingest/T:16384/format:3/index:1/kernels:0/' 'block_rows'
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    sanitize synccheck-store synccheck '*Cuda_StoreUpdate_Formats*:*ChunksIntoBlocksOf32*' 60
    report
    ;;
  ingest-verify)
    # The landing run of the forty-ninth session's store encoders (units of 16 lanes for the
    # default format's layout only): every GPU test, then the ingest and append rows as tree /
    # base (gpu-base/: main's files) / tree again.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests all '*' 280
    rows_ab store_bench "$store_rows" 40
    report
    ;;
  rows-lanes16)
    # The forty-ninth session's gpu-pending/rows-lanes16 (written without a GPU): units of 16
    # lanes at d 128 for OldRowLayout too (q8, f16, fp16k_q4v without the index copy), compiled
    # for 4 CTAs an SM, against main (gpu-base/: main's rows.cuh and store_rows.cu): the format
    # and store tests, the store rows as tree / base / tree again, memcheck and synccheck.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_Formats*:*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 150
    rows_ab store_bench "$store_rows" 45
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    sanitize synccheck-store synccheck '*Cuda_StoreUpdate_Formats*:*ChunksIntoBlocksOf32*' 60
    report
    ;;
  s50-append | s50-summary)
    # The fiftieth session's count-1 append against main (gpu-base/). s50-append: a closing
    # block's summary reads its pool rows at a stride from row 0 (PoolRows), and the appends
    # divide by the ring length, block size, kv heads and shards with multipliers formed at launch
    # (StoreDividers); its tests take the attention's too (FastDiv moved out of its header).
    # s50-summary: the summary loop for stores that keep mean K alone (kvc's default), and the
    # source page of the B64 append where every slot closes together. Both: the format and store
    # tests, the store rows (staggered B8 too) as tree / base / tree again, memcheck over the
    # updates, Nsight Compute of the staggered B64 append.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    tests='*Cuda_Formats*:*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*'
    extra_rows=''
    if [ "$mode" = s50-append ]; then
      tests="$tests:*Cuda_Attention*"
      extra_rows='|BM_AppendFloor/64'
    fi
    gtests store "$tests" 200
    rows_ab store_bench "$store_rows|BM_AppendStepStaggered/B:8/index:1/kernels:0/$extra_rows" 45
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    NCU_SKIP=200 NCU_STALLS=1 profile append-stag store_bench \
      'BM_AppendStepStaggered/B:64/index:1/kernels:0/' 'append_lean'
    NCU_SKIP=200 NCU_COUNT=1 bench_source append-stag store_bench \
      'BM_AppendStepStaggered/B:64/index:1/kernels:0/' 'append_lean'
    if [ "$mode" = s50-summary ]; then
      NCU_SKIP=200 NCU_COUNT=1 bench_source append-b64 store_bench \
        'BM_AppendStep/B:64/index:1/kernels:0/' 'append_lean'
    fi
    report
    ;;
  s50-closing)
    # The fiftieth session's lean append with the closed blocks' summaries shared by the CTA's
    # warps after a barrier (summarise_closing), against main (gpu-base/): the store tests,
    # the append rows (staggered too) as tree / base / tree again, racecheck and synccheck over
    # the append batches of every size (block sizes 1, 3, 32: every warp of a CTA closing a
    # block), memcheck over the updates.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 150
    rows_ab store_bench 'BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:0/|BM_AppendStepStaggered/B:(8|64)/index:1/kernels:0/' 40
    sanitize racecheck-append racecheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*' 150
    sanitize synccheck-append synccheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*:*Cuda_StoreUpdate_Graph*' 45
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    report
    ;;
  s51-sums)
    # The fifty-first session's running mean-K sums of the open blocks (StoreView::open_sum_k),
    # against main (gpu-base/): the store and layered-cache tests, the append rows
    # (staggered too) as tree / base / tree again, memcheck over the updates and initcheck over
    # the new test (the sums' memory read before an append wrote it).
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 200
    rows_ab store_bench 'BM_Ingest/T:16384/format:0/index:(0|1)/kernels:0/|BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:0/|BM_AppendStepStaggered/B:(8|64)/index:1/kernels:0/' 60
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    sanitize initcheck-sums initcheck '*Cuda_StoreUpdate.OpenBlockSums*' 60
    report
    ;;
  s51-parts)
    # docs/dev/pending/rows-parts (block_rows_kernel in two units a block where the default
    # format's layout serves the store and no mean V is kept; written without a GPU) against main
    # (gpu-base/): the store and layered-cache tests, the ingest rows (fp16k_q4v with the mxfp4
    # index copy takes the parts; without it, OldRowLayout, is the control) as tree / base / tree
    # again, memcheck over the chunk tests.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 200
    rows_ab store_bench 'BM_Ingest/T:(16384|131072)/format:3/index:(0|1)/kernels:0/|BM_AppendStep/B:64/index:1/kernels:0/' 60
    sanitize memcheck-parts memcheck '*Cuda_StoreUpdate.BlockRowsInParts*:*Cuda_StoreUpdate.ChunksIntoBlocksOf32*:*Cuda_StoreUpdate.OpenBlockSums*' 90
    report
    ;;
  s51-lean)
    # docs/dev/pending/lean-one-site (the lean append's read-back in one call site; written
    # without a GPU) against main (gpu-base/): the store and layered-cache tests, the append rows
    # (staggered too) as tree / base / tree again, racecheck and synccheck over the append
    # batches, memcheck over the updates.
    BASE_TARGETS=store_bench base_build_bg
    build_targets kvc_cuda_tests store_bench
    gtests store '*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 200
    rows_ab store_bench 'BM_AppendStep/B:(1|8|64)/index:(0|1)/kernels:0/|BM_AppendStepStaggered/B:(8|64)/index:1/kernels:0/' 60
    sanitize racecheck-append racecheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*' 150
    sanitize synccheck-append synccheck '*Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu*:*Cuda_StoreUpdate.OpenBlockSums*' 60
    sanitize memcheck-store memcheck '*Cuda_StoreUpdate*' 90
    report
    ;;
  store-h200)
    # The store's rows on main alone (no base build), for the goal rows on the lent H200: the
    # store and layered-cache tests, the ingest and append rows (staggered too), five repeats.
    # STORE_TESTS=0: the rows alone (a short call).
    if [ "${STORE_TESTS:-1}" = 1 ]; then
      build_targets kvc_cuda_tests store_bench
      gtests store '*Cuda_StoreUpdate*:*Cuda_KvStore*:*Cuda_LayeredCache*' 150
    else
      build_targets store_bench
    fi
    BENCH_REPS=5 bench 60 store_bench "$store_rows|BM_AppendStepStaggered/B:8/index:1/kernels:0/"
    report
    ;;
  s52-sample)
    # The fifty-second session's shorter sample for the spread top-k (SelectTuning::
    # spread_sample_run: segments of 4 scores, a 2048-score sample, beside the built-in 4096; one
    # binary, so no base build): the selector and DeepSeek-V4 top-k tests, the large-k rows of
    # BM_TopKVariant with the built-in sample (5), the short one (12) and the long one pinned
    # (13), the phase probe with each (run 8 / 4 / 8 again), memcheck over every spread variant;
    # then, on an H200 only, the store rows of main (this branch leaves the store alone). Also
    # the layered cache's allocation test, whose warm-up the same session mended.
    nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/probe-tree" \
      scripts/topk-trace-probe.cu > "$out/probe-build.log" 2>&1 &
    h200=0
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
    if [ $h200 = 1 ]; then build_targets kvc_cuda_tests topk_bench store_bench
    else build_targets kvc_cuda_tests topk_bench; fi
    gtests selector '*Cuda_Selector*:Selector_CutScoreFloor*:*Cuda_Dsv4_TopK*' 120
    gtests layered '*Cuda_LayeredCache.DecodeStepsAllocateNothing*' 30  # its warm-up, mended
    BENCH_REPS=3 bench 100 topk_bench 'BM_TopKVariant/(1|4|16|32|64)/(65536|131072|262144)/2048/(5|12|13)/'
    wait
    sample_run_probes "131072 1" "262144 1" "131072 64"
    export KVC_TEST_MAX_ROW=16385
    sanitize memcheck-spread memcheck '*Cuda_Selector_Spread.EveryVariant*:*Cuda_Selector_Spread.Misleading*' 60
    unset KVC_TEST_MAX_ROW
    [ $h200 = 1 ] && BENCH_REPS=5 bench 60 store_bench "$store_rows|BM_AppendStepStaggered/B:8/index:1/kernels:0/"
    report
    ;;
  s52-probe)
    # s52-sample's phase probes alone (about a minute and a half: one nvcc and 21 probe runs), for
    # a lease too short for the library build: each shape with the 4096-score sample, the
    # 2048-score one and the 4096 again, Gaussian scores, ids checked against a CPU top-k.
    nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/probe-tree" \
      scripts/topk-trace-probe.cu > "$out/probe-build.log" 2>&1
    say "probe build: rc=$? at $(( $(date +%s) - t0 )) s"
    sample_run_probes "131072 1" "262144 1" "131072 64" "262144 4" "131072 16" "262144 64" \
      "65536 32"
    ;;
  spread-ab)
    # A spread top-k branch against main (gpu-base/ from scripts/make-gpu-base.sh): its tests, its
    # large-k rows and phase probes beside main's, memcheck over the spread variants.
    spread_ab_tests
    spread_ab_rows ''
    spread_memcheck
    report
    ;;
  spread-probe)
    # The fifty-fourth session's question for the 64-row calls: the sampled pass streams about
    # 20 MB at under 2 TB/s after the cut, though neither a deeper ring (fortieth session) nor an
    # L2 prefetch (fifty-fourth) shortened the time to the grid barrier. "pass done" (each CTA's
    # end of the pass, before the barrier) says whether every CTA is slow or a few late ones
    # hold the barrier.
    nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o "$out/probe-tree" \
      scripts/topk-trace-probe.cu > "$out/probe-build.log" 2>&1
    say "probe build: rc=$? at $(( $(date +%s) - t0 )) s"
    variants=tree
    PROBE_DIST=1 probe_ab_run
    ;;
  store-prof)
    # On the machine `final` left warm (store_bench built): Nsight Compute with stall reasons of
    # the default format's 16K ingest (block_rows_kernel; #12 asks >= 70 % of HBM) and of the
    # count-1 append at B64 with the index copy, for the goal rows' evidence on the lent GPU.
    build_targets store_bench
    NCU_STALLS=1 NCU_SKIP=4 profile ingest store_bench \
      'BM_Ingest/T:16384/format:3/index:1/kernels:0/' 'block_rows'
    NCU_STALLS=1 NCU_SKIP=200 profile append-b64 store_bench \
      'BM_AppendStep/B:64/index:1/kernels:0/' 'append'
    for f in ingest append-b64; do
      grep -E "Registers Per|Achieved Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc A|Duration|stalled_" \
        "$out/ncu-$f.txt" | head -30 | sed "s/^/$f: /" >> "$out/summary.txt"
    done
    report
    ;;
  append-prof)
    # Where the count-1 append of a decode batch spends its time (#12: B64 <= 4 us; 4.65 on an
    # H100 in the forty-ninth session): the append rows beside BM_AppendFloor (a launch, two
    # dependent loads and the ring stores), Nsight Compute with stall reasons and the source page
    # of the library's append kernel at B64 with the index copy.
    build_targets store_bench
    BENCH_REPS=5 bench 40 store_bench 'BM_AppendFloor|BM_AppendStep/B:(1|8|64)/index:1/kernels:(0|6|8)/'
    NCU_SKIP=200 NCU_STALLS=1 profile append-b64 store_bench \
      'BM_AppendStep/B:64/index:1/kernels:0/' 'append_once'
    NCU_SKIP=200 NCU_COUNT=1 bench_source append-b64 store_bench \
      'BM_AppendStep/B:64/index:1/kernels:0/' 'append_once'
    report
    ;;
  evidence48)
    # No library build (about 200 s on a fresh machine): the H200's evidence for the missed rows
    # of the forty-eighth session's table, for the next session. The spread top-k's phase probe
    # (uniform scores, the library's choices) at 1 and 64 rows of 131072 and 262144, k 2048; the
    # indexer's decode phase probe (variant 10, B1 and B8 T1) and prefill probe (9 and 11, B1
    # T64); then Nsight Compute (profile_probe: the sections of gpu-lib.sh's profile plus the
    # stall counters) of the spread kernel at 1 x 131072 and 64 x 131072, and of variant 10 at B1
    # T1; last, the source page (SASS with warp-state samples) of variant 11 at B1 T64.
    probe_build topk-trace-probe
    probe_build index-trace-probe
    probe_build index-prefill-probe
    for shape in "131072 1" "131072 64" "262144 64" "262144 1"; do
      set -- $shape
      timeout 30 "$probes/topk-trace-probe" "$1" 2048 0 0 1 1 1 "$2" > "$out/trace-$2x$1.txt" 2>&1
      say "== spread probe rows $2 N $1: rc=$?"
      grep -E "ids wrong|grid sync|sample (cut|append|count)|rank (counted|scattered)|end \\(|graph replay" \
        "$out/trace-$2x$1.txt" >> "$out/summary.txt"
    done
    for b in 1 8; do
      timeout 25 "$probes/index-trace-probe" $b 131072 10 > "$out/index-trace-v10-b$b.txt" 2>&1
      say "== index probe variant 10 batch $b: rc=$?"
      cat "$out/index-trace-v10-b$b.txt" >> "$out/summary.txt"
    done
    timeout 60 "$probes/index-prefill-probe" 1 64 > "$out/index-prefill-t64.txt" 2>&1
    say "== index prefill probe B1 T64: rc=$?"
    cat "$out/index-prefill-t64.txt" >> "$out/summary.txt"
    profile_probe spread-1x131072 spread_topm_kernel topk-trace-probe 131072 2048 0 0 1 1 1 1
    profile_probe spread-64x131072 spread_topm_kernel topk-trace-probe 131072 2048 0 0 1 1 1 64
    profile_probe index-v10-b1 mxfp4_score_stream index-trace-probe 1 131072 10
    if (( $(left) > 60 )); then
      timeout 60 ncu --target-processes all --clock-control none \
        --kernel-name-base mangled -k "regex:mxfp4_score_wgmma_kernelILb1E" \
        --launch-skip 1 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
        "$probes/index-prefill-probe" 1 64 > "$out/ncu-source-prefill-v11.csv" 2>&1
      say "ncu source prefill v11: rc=$? $(wc -l < "$out/ncu-source-prefill-v11.csv") lines"
      gzip -9f "$out/ncu-source-prefill-v11.csv"
    fi
    ;;
  final-tests | final)
    build_targets kvc_cuda_tests step_bench index_bench attention_bench topk_bench store_bench \
      dsv4_bench
    # final-tests, then final on the same warm machine (its build is then a no-op): the tests and
    # the same-run rows each had a call of their own since the thirty-fourth session, as together
    # they no longer fit one call's 560 s with a build from scratch.
    if [ "$mode" = final-tests ]; then
      gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 180
      # The DeepSeek-V4 attention's variants, 300 (P in one bf16) among them: its relative L2
      # against the CPU is printed ("[ P in one bf16 ]"); dsv4_bench's CSA / HCA rows time it.
      gtests dsv4-attention '*Cuda_Dsv4_Attention*' 120
      grep -h "P in one bf16" "$out/gtests-dsv4-attention.log" >> "$out/summary.txt"
      report
      finish
      exit 0
    fi
    same_run_kvc
    bench 45 topk_bench 'BM_TopKSet/' -set
    ANCHORS="torch cub deepselect_bin" anchors_and_report
    ;;
  flashmla)
    { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a -DKVC_BUILD_PYTHON=ON > "$out/configure.log" 2>&1 &&
      cmake --build build-gpu -j "$(nproc)" --target _kvc > "$out/python-build.log" 2>&1; }
    say "build _kvc: rc=$? at $(( $(date +%s) - t0 )) s"
    FLASHMLA_REUSE=1 named_anchors flashmla "flashmla_pages flashmla"
    ;;
  flashinfer)
    named_anchors flashinfer "flashinfer_decode flashinfer_topk"
    # TOPK_PROF=1 (thirty-ninth session): then Nsight Compute of the spread top-k at 64 x 131072,
    # k 2048 with its stall reasons (the row's miss had no profile since the lean ring loop).
    if [ "${TOPK_PROF:-0}" = 1 ] && [ -x build-gpu/benchmarks/topk_bench ]; then
      NCU_STALLS=1 NCU_SKIP=3 profile topk-64x131072 topk_bench 'BM_TopK/64/131072/2048/' 'spread'
    fi
    ;;
  *)
    # The modes are this case statement's labels.
    echo "gpu-session27.sh MODE, MODE one of: $(grep -oE '^  [a-z0-9 |-]+\)$' "$0" |
      tr -d ' )' | tr '|\n' '  ')" >&2
    exit 2
    ;;
esac
finish
