#!/usr/bin/env bash
# Device calls of the third 2026-12-01 session (each under the 10-minute limit; results in $OUT):
#   diagnose  build; the Python package's pytest (alone, then under gdb); the racecheck probe;
#             ncu of the kernels furthest from their goals; memcheck / racecheck of the DeepSeek-V4
#             and tensor-core attention tests
#   pydiag    the module's libstdc++ facts and the --exclude-libs,ALL fix under torch; the probe
#             per mode (scripts/racecheck-probe.cu)
#   verify    every GPU / CPU / mini-decoder test, the probe, the Python package on the GPU
#   dense     kvc's dense decode rows and SDPA in one call
#   quality   the SmolLM2 transformers client (models/smollm2.part-* carried over three calls)
#             and text B over 6144-8192
#   early     the spread top-k and lean indexer tests under a timeout, old vs new rows
#   retest    the same tests after fixes
#   final1    every test, memcheck and racecheck of the new kernels' tests
#   final2    the benchmark rows of the session's kernels (old and new variants) and the anchors
#   final3    the Python package with the SmolLM2 client, and the dense A/B against 2de95ff
#             (ab/2de95ff.tar.gz = `git archive -o ab/2de95ff.tar.gz 2de95ff`, untracked, carried)
#   race      racecheck over the new kernels' tests alone
#   ab-dense  the dense A/B alone
# A step stops early when the call's deadline (DEADLINE seconds after the start, default 560)
# is near, and says so in summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session3
source scripts/gpu-lib.sh

ab_dense() {
  # The dense decode rows of 2de95ff (the first 2026-12-01 run: 972 us at B8 N128K) against
  # this tree's, in one call: ab/2de95ff.tar.gz is `git archive 2de95ff` (untracked, carried).
  [ -x build-gpu/benchmarks/attention_bench ] || build
  rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && tar xzf ab/2de95ff.tar.gz -C /tmp/ab-old
  { cmake -S /tmp/ab-old -B /tmp/ab-old/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DKVC_BUILD_TESTS=OFF -DKVC_BUILD_BENCHMARKS=ON \
      -DKVC_BUILD_EXAMPLES=OFF && cmake --build /tmp/ab-old/build -j "$(nproc)" --target attention_bench; } \
    > "$out/ab-build.log" 2>&1
  say "2de95ff attention_bench build: rc=$? at $(( $(date +%s) - t0 )) s"
  for tree in old new; do
    b=build-gpu/benchmarks/attention_bench
    [ $tree = old ] && b=/tmp/ab-old/build/benchmarks/attention_bench
    timeout 100 $b --benchmark_filter='^BM_DenseDecode/0/(1|8)/131072/(2|1)/' \
      --benchmark_min_time=0.1s --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      > "$out/ab-dense-$tree.log" 2>&1
    grep -E 'median' "$out/ab-dense-$tree.log" | awk -v t=$tree '{print t, $1, $2, $3}' >> "$out/summary.txt"
  done
}

case "${1:-diagnose}" in
  diagnose)
    build
    nvcc -arch=sm_90 -lineinfo -o "$out/named_barrier_race" scripts/racecheck-probe.cu \
      > "$out/probe-build.log" 2>&1 &&
      compute-sanitizer --tool racecheck "$out/named_barrier_race" > "$out/probe-racecheck.log" 2>&1
    say "racecheck probe: rc=$? $(grep -E 'RACECHECK SUMMARY|named=' "$out/probe-racecheck.log" | tr '\n' ' ')"
    # The Python package (in-tree module) on the GPU machine.
    { cmake -S . -B build-gpu -DKVC_BUILD_PYTHON=ON > "$out/python-configure.log" 2>&1 &&
      cmake --build build-gpu --target _kvc -j "$(nproc)" > "$out/python-build.log" 2>&1; }
    say "python module build: rc=$?"
    export PYTHONPATH=$PWD/build-gpu/python
    timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider \
      tests/python/test_compute.py::test_planner > "$out/pytest-planner.log" 2>&1
    say "pytest test_planner alone: rc=$? $(tail -1 "$out/pytest-planner.log")"
    timeout 60 python3 -X faulthandler -c "
import kvc
spec = kvc.planner.with_block_select(kvc.planner.smollm2_135m(), kvc.planner.BlockSelectParams(recent_window=128))
print('spec', spec.num_layers(), flush=True)
fp = kvc.planner.footprint(spec, 8192, 2)
print('fp', fp.total, len(fp.layers), flush=True)
cfg = kvc.planner.store_config(spec, kvc.planner.BlockSelectParams(recent_window=128), 8192, 2)
print('cfg', flush=True)
print(kvc.compute_footprint(cfg, []).total(), flush=True)
print(fp.layers[0].bytes.total(), fp.compression_ratio(), flush=True)
print(fp.table()[:200], flush=True)
" > "$out/planner-no-torch.log" 2>&1
    say "planner without torch: rc=$? $(tail -2 "$out/planner-no-torch.log" | tr '\n' ' ')"
    gdb=$(command -v gdb || echo /usr/local/cuda/bin/cuda-gdb)
    timeout 120 "$gdb" -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 -m pytest -q \
      -p no:cacheprovider tests/python/test_compute.py > "$out/pytest-gdb.log" 2>&1
    say "pytest test_compute under $gdb: rc=$? $(grep -m3 -E '^#[0-9]' "$out/pytest-gdb.log" | tr '\n' ' ')"
    timeout 150 python3 -X faulthandler -m pytest -q -p no:cacheprovider tests/python \
      > "$out/pytest-all.log" 2>&1
    say "pytest all: rc=$? $(tail -1 "$out/pytest-all.log")"
    unset PYTHONPATH
    profile dsv4-index dsv4_bench '^BM_Dsv4IndexDecode/1/1/0/0/0/' 'mxfp4_score'
    profile dsv4-topk dsv4_bench '^BM_Dsv4TopK/1/262144/2048/0/' 'topm'
    profile topk-64x131072 topk_bench '^BM_TopK/64/131072/2048/' 'topm'
    profile token-mass index_bench 'h32x8x128/B8/N131072/token_mass/mxfp4/sum/fast' 'token_fast'
    profile ingest store_bench '^BM_Ingest/16384/' 'quantise|summarise'
    profile append store_bench '^BM_AppendStep/64' 'plan|quantise|summarise|ring'
    sanitize memcheck memcheck '*Dsv4*:*AttentionMma*-*Footprint*:*1000Steps*' 150
    sanitize racecheck racecheck '*Dsv4_Attention*:*Dsv4_Indexer*:*AttentionMma.GroupsAndHeadDims*' 120
    ;;
  pydiag)
    # Which C++ runtime the module carries and binds, and whether hiding the static libraries'
    # symbols (-Wl,--exclude-libs,ALL) stops the crash under torch; the racecheck probe per mode.
    nvcc -arch=sm_90 -lineinfo -o "$out/nbr" scripts/racecheck-probe.cu > "$out/probe-build.log" 2>&1
    for m in 0 1 2; do
      compute-sanitizer --tool racecheck "$out/nbr" $m > "$out/probe-racecheck-$m.log" 2>&1
      say "racecheck probe mode $m: $(grep -E 'RACECHECK SUMMARY|mode=' "$out/probe-racecheck-$m.log" | tr '\n' ' ')"
    done
    cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DKVC_BUILD_TESTS=OFF -DKVC_BUILD_BENCHMARKS=OFF \
      -DKVC_BUILD_EXAMPLES=OFF -DKVC_BUILD_PYTHON=ON > "$out/py-configure.log" 2>&1
    cmake --build build-py --target _kvc -j "$(nproc)" > "$out/py-build.log" 2>&1
    say "module build: rc=$? at $(( $(date +%s) - t0 )) s"
    mod=$(ls build-py/python/kvc/_kvc*.so)
    { g++ --version | head -1; ldd "$mod"; echo "--- defined std symbols (all / dynamic):";
      nm -C --defined-only "$mod" | grep -c ' std::'; nm -DC --defined-only "$mod" | grep -c ' std::';
      echo "--- codecvt / _M_insert:"; nm -C --defined-only "$mod" | grep -E 'codecvt<char16_t|_M_insert<long>' | head;
      echo "--- link:"; ninja -C build-py -t commands _kvc | tail -1;
      echo "--- libstdc++ after import torch:";
      python3 -c "import torch; print(torch.__version__); print(open('/proc/self/maps').read())" | grep -E 'libstdc|^2' | awk '{print $NF}' | sort -u;
      echo "--- ar members of static libs linked:"; } > "$out/py-facts.txt" 2>&1
    for a in $(ninja -C build-py -t commands _kvc | tail -1 | tr ' ' '\n' | grep '\.a$'); do
      echo "$a: $(nm -C --defined-only "$a" 2>/dev/null | grep -c 'codecvt<char16_t')" >> "$out/py-facts.txt"
    done
    export PYTHONPATH=$PWD/build-py/python
    timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider \
      tests/python/test_compute.py::test_planner > "$out/pytest-planner-a.log" 2>&1
    say "test_planner (as built): rc=$? $(tail -1 "$out/pytest-planner-a.log")"
    cmake -S . -B build-py -DCMAKE_MODULE_LINKER_FLAGS="-Wl,--exclude-libs,ALL" > /dev/null 2>&1
    cmake --build build-py --target _kvc -j "$(nproc)" > "$out/py-build-b.log" 2>&1
    nm -DC --defined-only "$mod" | grep -c ' std::' > "$out/py-facts-b.txt"
    timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider \
      tests/python/test_compute.py::test_planner > "$out/pytest-planner-b.log" 2>&1
    say "test_planner (--exclude-libs,ALL): rc=$? $(tail -1 "$out/pytest-planner-b.log")"
    timeout 200 python3 -X faulthandler -m pytest -q -p no:cacheprovider tests/python \
      > "$out/pytest-all-b.log" 2>&1
    say "pytest all (--exclude-libs,ALL): rc=$? $(tail -1 "$out/pytest-all-b.log")"
    grep -E "FAILED|Error" "$out/pytest-all-b.log" | head -20 >> "$out/summary.txt"
    ;;
  verify)
    # Every GPU / CPU / mini-decoder test, the Python package on the GPU (torch loaded), and the
    # racecheck probe of named barriers per mode.
    build
    all_tests
    nvcc -arch=sm_90 -lineinfo -o "$out/nbr" scripts/racecheck-probe.cu > "$out/probe-build.log" 2>&1
    for m in 0 1 2; do
      compute-sanitizer --tool racecheck "$out/nbr" $m > "$out/probe-racecheck-$m.log" 2>&1
      say "racecheck probe mode $m: $(grep -E 'RACECHECK SUMMARY' "$out/probe-racecheck-$m.log")"
    done
    pytest_gpu
    ;;
  dense)
    # Dense decode against SDPA in one run: kvc's dense rows (f16, bf16-free; CUDA-core and
    # tensor-core variants) at B1 / B8 N128K, then the PyTorch anchors.
    [ -x build-gpu/benchmarks/attention_bench ] || build
    timeout 150 build-gpu/benchmarks/attention_bench --benchmark_filter='^BM_DenseDecode/0/(1|8)/131072/' \
      --benchmark_min_time=0.05s --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="$out/attention_bench_dense.json" --benchmark_out_format=json \
      > "$out/attention_bench_dense.log" 2>&1
    say "attention_bench dense: rc=$? $(grep -c _median "$out/attention_bench_dense.log") rows"
    OUT="$out" timeout 150 python3 benchmarks/anchors/torch_anchors.py > "$out/torch_anchors.log" 2>&1
    say "torch anchors: rc=$?"
    grep -E 'DenseDecode.*median' "$out/attention_bench_dense.log" | awk '{print $1, $2, $3}' >> "$out/summary.txt"
    grep -E 'sdpa' "$out/torch_anchors.log" | head -5 >> "$out/summary.txt"
    ;;
  early)
    # The spread top-k and the lean indexer kernels (helpers' branches, never run before): their
    # GPU tests under a timeout (a barrier bug would hang), then old vs new in one run.
    build
    timeout 300 build-gpu/tests/kvc_cuda_tests --gtest_brief=1 --gtest_filter='Cuda_Selector_*' \
      > "$out/gpu-tests-selector.log" 2>&1
    say "selector GPU tests: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu-tests-selector.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/gpu-tests-selector.log" | head -10 >> "$out/summary.txt"
    timeout 200 build-gpu/tests/kvc_cuda_tests --gtest_brief=1 \
      --gtest_filter='Shapes/Cuda_Dsv4_Indexer.*:Cuda_Dsv4_Indexer.*:Cuda_Dsv4_Pipeline.*' \
      > "$out/gpu-tests-indexer.log" 2>&1
    say "indexer GPU tests: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu-tests-indexer.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/gpu-tests-indexer.log" | head -10 >> "$out/summary.txt"
    bench 120 topk_bench 'BM_TopK/[0-9]+/(131072|262144)/|BM_TopKVariant/[0-9]+/[0-9]+/[0-9]+/(3|5|1016|1032)/' -early
    bench 120 dsv4_bench 'BM_Dsv4IndexDecode/[0-9]+/[0-9]+/0/0/|BM_Dsv4IndexProbe|BM_Dsv4TopK' -early
    grep -E '_median' "$out/topk_bench-early.log" "$out/dsv4_bench-early.log" | sed 's#.*/session3/##' | \
      awk '{print $1, $2, $3}' >> "$out/summary.txt"
    timeout 60 ncu -k regex:mxfp4_score --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section InstructionStats --section Occupancy build-gpu/benchmarks/dsv4_bench \
      --benchmark_filter='BM_Dsv4IndexProbe/3' --benchmark_min_time=1x > "$out/ncu-lean.txt" 2>&1
    say "ncu lean: $(grep -E 'Duration|Executed Instructions  ' "$out/ncu-lean.txt" | tr -s ' ' | tr '\n' ' ')"
    ;;
  retest)
    # After the fixes: the spread top-k and indexer GPU tests again (a timeout guards the
    # spread barriers), each twice with fresh seeds.
    build
    timeout 300 build-gpu/tests/kvc_cuda_tests --gtest_brief=1 --gtest_repeat=2 \
      --gtest_filter='Cuda_Selector_Spread.*:Cuda_Selector_Graph.*:Shapes/Cuda_Dsv4_Indexer.*:Cuda_Dsv4_Indexer.*' \
      > "$out/gpu-tests-retest.log" 2>&1
    say "spread + indexer GPU tests x2: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu-tests-retest.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/gpu-tests-retest.log" | head -10 >> "$out/summary.txt"
    ;;
  final1)
    # Every test after the session's kernels (store update, spread top-k, lean indexer), then
    # memcheck and racecheck over the new kernels' tests.
    build
    GTEST_FILTER='*' all_tests 400
    sanitize memcheck memcheck '*StoreUpdate*:*Cuda_KvStore*:*Selector_Spread*:*Dsv4_Indexer*-*Footprint*:*GraphReplayOfAppend*' 110
    sanitize racecheck racecheck '*StoreUpdate*:Cuda_Selector_Spread.DispatchBoundariesMatchCpu' 70
    ;;
  final2)
    # The benchmark rows of this session's kernels, old and new variants in one run, and the
    # decode steps that use them; the PyTorch anchors last.
    [ -x build-gpu/benchmarks/store_bench ] || build
    bench 60 store_bench .
    bench 60 topk_bench 'BM_TopK/[0-9]+/(131072|262144)/|BM_TopK/(8|64)/4096/8/|BM_TopKVariant/[0-9]+/[0-9]+/[0-9]+/(3|5)/'
    bench 60 dsv4_bench 'BM_Dsv4IndexDecode/[0-9]+/[0-9]+/0/0/|BM_Dsv4TopK|BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    bench 70 step_bench .
    bench 40 layered_step_bench .
    l=$(left)
    (( l > 60 )) && { OUT="$out" timeout $(( l - 20 )) python3 benchmarks/anchors/torch_anchors.py \
      > "$out/torch_anchors.log" 2>&1; say "torch anchors: rc=$?"; }
    python3 scripts/perf-report.py "$out" > "$out/performance_table.md" 2>&1
    ;;
  final3)
    # The Python package with the SmolLM2 client (the GGUF joined from the three parts), then the
    # dense decode A/B against 2de95ff.
    mkdir -p "$HOME/.cache/kvc"
    cat models/smollm2.part-* > "$HOME/.cache/kvc/SmolLM2-135M-Instruct.Q4_1.gguf"
    python3 -m pip install --no-deps --no-index .whl/gguf-*.whl > "$out/gguf-install.log" 2>&1
    say "gguf wheel: rc=$? $(python3 -c 'import gguf; print(gguf.__file__)' 2>&1 | tail -1)"
    pytest_gpu tests/python
    ab_dense
    ;;
  race)
    # racecheck over the new kernels' tests only (the test binary alone is built).
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DKVC_BUILD_TESTS=ON -DKVC_BUILD_BENCHMARKS=OFF \
      -DKVC_BUILD_EXAMPLES=OFF > "$out/configure.log" 2>&1
    cmake --build build-gpu -j "$(nproc)" --target kvc_cuda_tests > "$out/build.log" 2>&1
    say "build: rc=$? at $(( $(date +%s) - t0 )) s"
    sanitize racecheck-new racecheck 'Cuda_StoreUpdate.AppendBatchesOfEverySizeMatchCpu:Cuda_StoreUpdate.NonFiniteZeroAndExtremeRowsMatchCpu:Cuda_Selector_Spread.DispatchBoundariesMatchCpu:Cuda_Dsv4_Indexer.EveryMxfp4KernelMatchesCpuOnSmallPagesAndFallbacks' 90
    grep -E 'Race reported' "$out/sanitizer-racecheck-new.log" | sed -E 's/\(kvc[^)]*\)//g' | sort | uniq -c | head -5 >> "$out/summary.txt"
    ;;
  ab-dense)
    ab_dense
    ;;
  quality)
    # The transformers client on the GPU (the SmolLM2 GGUF joined from models/smollm2.part-*,
    # the gguf wheel from .whl/), then text B over 6144-8192 with the main configurations.
    [ -x build-gpu/tests/kvc_cuda_tests ] || build
    mkdir -p "$HOME/.cache/kvc"
    cat models/smollm2.part-* > "$HOME/.cache/kvc/SmolLM2-135M-Instruct.Q4_1.gguf"
    python3 -m pip install --no-deps --no-index .whl/gguf-*.whl > "$out/gguf-install.log" 2>&1
    say "gguf wheel: rc=$?"
    pytest_gpu tests/python/test_hf_client.py
    l=$(left)
    if (( l > 120 )); then
      KVC_MODEL="$HOME/.cache/kvc/SmolLM2-135M-Instruct.Q4_1.gguf" timeout $(( l - 30 )) \
        scripts/quality-real --gpu --configs docs/quality/configs-gpu-b.txt --out gpu-out/qb \
        --texts b --start 6144 --end 8192 > "$out/quality-b.log" 2>&1
      say "quality text B 6144-8192: rc=$? $(tail -2 "$out/quality-b.log" | tr '\n' ' ')"
      cp -r gpu-out/qb "$out/" 2>/dev/null
    fi
    ;;
  *) echo "gpu-session3.sh: diagnose, pydiag, verify or quality" >&2; exit 2 ;;
esac
finish
