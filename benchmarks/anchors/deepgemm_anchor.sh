#!/usr/bin/env bash
# DeepGEMM (github.com/deepseek-ai/DeepGEMM, a PyTorch extension that JIT-compiles its kernels) as
# the anchor of kvc's DeepSeek-V4 indexer decode, on the GPU machine: builds its wheel from the
# source archives in the bundle folder (never committed), installs it into a private folder, then
# runs benchmarks/anchors/deepgemm_anchor.py (its SM90 FP8 paged MQA logits on dsv4_bench's
# indexer shape) and writes deepgemm.json.
#
# Usage: benchmarks/anchors/deepgemm_anchor.sh [BUNDLE] [OUT_DIR]
#   BUNDLE   a folder (default .anchors/deepgemm) holding deepgemm-*.tar.xz (a `git archive
#            --prefix=DeepGEMM/` of DeepGEMM; made from 54e2261, 2026-12-04),
#            cutlass-*-include.tar.xz and fmt-*-include.tar.xz (`git archive --prefix=cutlass/`
#            / `--prefix=fmt/` of the include/ folders of its two submodules at their pinned
#            commits, f3fde58 and 553ec11). About 1.3 MB in all: carry [".anchors/deepgemm"].
#            Its MANIFEST says how they were made.
#   OUT_DIR  where deepgemm.json and the build log go (default $OUT, else .)
# Environment: DEEPGEMM_REUSE=1 keeps a previous install in /tmp/deepgemm-build (a second call on
# the same warm machine); DEEPGEMM_ONLY_BUILD=1 stops after the install; DEEPGEMM_PREFLIGHT=0 skips
# the pre-flight facts printed before the first run (~10 s); DEEPGEMM_GDB_TIMEOUT (default 150 s)
# bounds the debugger run after a crash.
#
# Needs on that machine, and downloads nothing: python3 with torch (CUDA), setuptools, wheel,
# packaging and pip; nvcc (CUDA_HOME, default /usr/local/cuda), which DeepGEMM also runs at the
# first call of each kernel. Its setup.py builds locally (DG_USE_LOCAL_VERSION, the default,
# never downloads a prebuilt wheel). The first build was not timed here.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="${1:-$repo/.anchors/deepgemm}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work=/tmp/deepgemm-build
log="$out/deepgemm_build.log"
py="${PYTHON:-python3}"
fail() { echo "deepgemm_anchor: $*" | tee -a "$log" >&2; exit 1; }
: > "$log"

src_tar=$(ls "$bundle"/deepgemm-*.tar.xz 2>/dev/null | head -1)
cutlass_tar=$(ls "$bundle"/cutlass-*-include.tar.xz 2>/dev/null | head -1)
fmt_tar=$(ls "$bundle"/fmt-*-include.tar.xz 2>/dev/null | head -1)
[ -n "$src_tar" ] && [ -n "$cutlass_tar" ] && [ -n "$fmt_tar" ] ||
  fail "the bundle $bundle lacks deepgemm-*.tar.xz, cutlass-*-include.tar.xz or fmt-*-include.tar.xz"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$PATH:$CUDA_HOME/bin"
command -v nvcc >/dev/null || fail "no nvcc"
"$py" -c "import torch, setuptools, wheel, packaging; assert torch.cuda.is_available()" 2>>"$log" ||
  fail "python3 lacks torch with CUDA, setuptools, wheel or packaging"

site="$work/site"
if [ "${DEEPGEMM_REUSE:-0}" = 1 ] && [ -d "$site/deep_gemm" ]; then
  echo "deepgemm_anchor: reusing the install in $site" >> "$log"
else
  rm -rf "$work" && mkdir -p "$work"
  tar -xJf "$src_tar" -C "$work" || fail "cannot unpack $src_tar"
  tp="$work/DeepGEMM/third-party"
  rm -rf "$tp/cutlass" "$tp/fmt" && mkdir -p "$tp"
  tar -xJf "$cutlass_tar" -C "$tp" && tar -xJf "$fmt_tar" -C "$tp" || fail "cannot unpack the submodules"
  start=$(date +%s)
  (cd "$work/DeepGEMM" && MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$py" setup.py bdist_wheel) >> "$log" 2>&1 ||
    fail "build failed after $(( $(date +%s) - start )) s (log: $log)"
  "$py" -m pip install --no-deps --no-index --target "$site" "$work"/DeepGEMM/dist/*.whl >> "$log" 2>&1 ||
    fail "pip could not install the wheel into $site"
  echo "deepgemm_anchor: built and installed in $(( $(date +%s) - start )) s" | tee -a "$log"
fi
[ "${DEEPGEMM_ONLY_BUILD:-0}" = 1 ] && exit 0
# Its kernels compile at the first call into DG_JIT_CACHE_DIR (default $HOME/.deep_gemm). The first
# run on the H200 (2026-12-04) died of a segmentation fault 14 s in, with no Python trace:
# faulthandler prints the Python stack of a fatal signal, DG_JIT_DEBUG=1 (DEEPGEMM_DEBUG=1) the
# JIT's steps.
export DG_JIT_CACHE_DIR="${DG_JIT_CACHE_DIR:-$work/jit-cache}"
[ "${DEEPGEMM_DEBUG:-0}" = 1 ] && export DG_JIT_DEBUG=1
say() { echo "deepgemm_anchor: $*" | tee -a "$log" >&2; }
dg_path="$site${PYTHONPATH:+:$PYTHONPATH}"

# Pre-flight (DEEPGEMM_PREFLIGHT=0 skips it, ~10 s): the facts the analysis of the segmentation
# fault (2026-12-05, on a machine without a GPU) rests on, printed before the first JIT call so
# that a run that still crashes confirms or refutes them. There the same DeepGEMM commit and
# submodules, the torch 2.11.0+cu130 wheel, Python 3.12, nvcc 13.0 and this script's build and
# `pip install --target` ran the whole host path of the crashing call with a faked H200: the
# headers were found, nvcc JIT-compiled the kernel, nothing crashed. So what is printed is what
# may differ on the GPU machine: the host compiler that built _C.so (torch 2.11's libraries are
# GCC 13.3 builds), the libraries that serve _C.so's C++ standard-library symbols (torch's
# libraries and libcufile export copies of libstdc++ code, and come before libstdc++.so.6 in
# _C.so's search order), the headers the JIT reads, the environment.
preflight() {
  local inc="$site/deep_gemm/include" so d
  so=$(ls "$site"/deep_gemm/_C*.so 2>/dev/null | head -1)
  say "pre-flight: $(uname -r) ($(uname -m)); stack limit $(ulimit -s) KB; $(nproc) cores"
  say "pre-flight: c++ = $(c++ --version 2>/dev/null | head -1) (CXX=${CXX:-unset}, CC=${CC:-unset}); $(nvcc --version 2>/dev/null | tail -1)"
  [ -n "$so" ] && say "pre-flight: _C.so built by: $(readelf -p .comment "$so" 2>/dev/null | sed -n 's/^ *\[ *[0-9a-f]*\] *//p' | sort -u | tr '\n' ';')"
  [ -n "$so" ] && say "pre-flight: _C.so NEEDED: $(readelf -d "$so" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  for d in "$inc/deep_gemm" "$inc/cute" "$inc/cutlass" "$CUDA_HOME/include/cccl" "$CUDA_HOME/include/cuda/std"; do
    say "pre-flight: $d: $(find "$d" -type f 2>/dev/null | wc -l) files"
  done
  say "pre-flight: the metadata kernel's header: $(ls -l "$inc/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh" 2>&1)"
  say "pre-flight: $(cat "$site/deep_gemm/envs.py" 2>/dev/null | tr '\n' ' ')"
  say "pre-flight: cuobjdump $(command -v cuobjdump || echo missing); gdb $(command -v gdb || echo missing); cuda-gdb $(command -v cuda-gdb || ls "$CUDA_HOME/bin/cuda-gdb" 2>/dev/null || echo missing); addr2line $(command -v addr2line || echo missing)"
  env | grep -E '^(CUDA_HOME|CUDA_PATH|HOME|DG_[A-Z_]*|LD_LIBRARY_PATH|LD_PRELOAD|PYTHONPATH|CPATH|CPLUS_INCLUDE_PATH|LIBRARY_PATH|PYTHONUNBUFFERED|TORCH_USE_RTLD_GLOBAL)=' |
    sed 's/^/deepgemm_anchor: pre-flight: env /' | tee -a "$log" >&2
  PYTHONPATH="$dg_path" "$py" - <<'EOF' 2>&1 | sed 's/^/deepgemm_anchor: pre-flight: /' | tee -a "$log" >&2
import os, sys, torch
print(f"python {sys.version.split()[0]} at {sys.executable}; torch {torch.__version__} (CUDA {torch.version.cuda}) at {os.path.dirname(torch.__file__)}")
import deep_gemm
print(f"deep_gemm {deep_gemm.__version__} at {deep_gemm.__file__}; _C at {deep_gemm._C.__file__}")
print(f"legacy (Triton) kernels loaded: {hasattr(deep_gemm, 'legacy')}; triton imported: {'triton' in sys.modules}")
maps = open("/proc/self/maps").read().split("\n")
libs = sorted({l.split()[-1] for l in maps if "libstdc++" in l or "libgcc_s" in l or "libcudart" in l or "libnvrtc.so" in l or "libcufile" in l})
print("loaded: " + " ".join(libs))
EOF
  # Which library serves each of _C.so's symbols (glibc's own log of the binding, at import).
  rm -f "$work"/ld-bind.*
  LD_DEBUG=bindings LD_DEBUG_OUTPUT="$work/ld-bind" PYTHONPATH="$dg_path" "$py" -c "import torch, deep_gemm" \
    > /dev/null 2>&1
  if ls "$work"/ld-bind.* > /dev/null 2>&1; then
    grep -h "binding file [^ ]*/deep_gemm/_C" "$work"/ld-bind.* > "$work/ld-bind-C.txt"
    rm -f "$work"/ld-bind.*  # tens of MB; _C.so's lines are kept in ld-bind-C.txt
    say "pre-flight: _C.so's symbols by the library serving them: $(sed -E 's/.* to ([^ ]+) \[.*/\1/' "$work/ld-bind-C.txt" | xargs -rn1 basename | sort | uniq -c | sort -rn | awk '{printf "%s %s; ", $2, $1}')"
    # Functions first (std::filesystem, std::string, the string streams), then shared statics.
    grep -vE " to [^ ]*(/libstdc\+\+\.so|/deep_gemm/_C)" "$work/ld-bind-C.txt" |
      sed -E "s/.* to ([^ ]+) \[.*symbol .([^']+)'.*/\2 @\1/" | grep -E "^_Z(N?K?St|ZN|GVZN)|fmt" |
      { c++filt 2>/dev/null || cat; } | sed -E 's| @.*/([^/]+)$| @\1|' | grep -E "std::|fmt::" |
      awk '/::__[a-z_]+ @|^guard variable/ {late[n++] = $0; next} {print} END {for (i = 0; i < n; i++) print late[i]}' |
      head -30 | cut -c1-220 | sed 's/^/deepgemm_anchor: pre-flight: bound outside libstdc++: /' | tee -a "$log" >&2
  else
    say "pre-flight: no LD_DEBUG log (LD_DEBUG ignored here?)"
  fi
}
[ "${DEEPGEMM_PREFLIGHT:-1}" = 1 ] && preflight

run_anchor() {
  PYTHONPATH="$dg_path" "$py" -X faulthandler "$here/deepgemm_anchor.py" --out "$out/deepgemm.json"
}
run_anchor
rc=$?
if [ $rc -eq 139 ] || [ $rc -eq 134 ]; then
  # The runs of 2026-12-04 died inside get_paged_mqa_logits_metadata, the first call that
  # JIT-compiles a kernel, NVRTC or nvcc alike, before the JIT printed anything: its first line
  # under DG_JIT_DEBUG=1 ("Generated kernel code", kernel_runtime.hpp:133) comes after the
  # include scan and before nvcc or NVRTC run, so the fault is on the host, between the call's
  # entry and that line (fmt, std::regex, the header reads of include_parser.hpp). The machine
  # has no gdb, so (1) a preloaded signal handler, built here, prints the native frames
  # (library + offset) of the fault, and addr2line turns _C.so's into function and file:line
  # (setuptools passes Python's own CFLAGS, -g included where they have it); Python's
  # faulthandler is off in that run, so the first frame is the fault's own.
  say "exit $rc; again with DG_JIT_DEBUG=1 and a native backtrace"
  bt=""
  if command -v cc > /dev/null && cat > "$work/segv_bt.c" <<'EOF' && cc -shared -fPIC -O1 -o "$work/segv_bt.so" "$work/segv_bt.c" -ldl 2>>"$log"; then
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
static char alt[1 << 16];
static void put(const char* s) { ssize_t r = write(2, s, strlen(s)); (void)r; }
static void frame(int i, void* pc) {
  Dl_info di; char line[1024];
  if (dladdr(pc, &di) && di.dli_fname)
    snprintf(line, sizeof line, "segv-bt: #%-2d %s 0x%lx %s\n", i, di.dli_fname,
             (unsigned long)((char*)pc - (char*)di.dli_fbase), di.dli_sname ? di.dli_sname : "?");
  else
    snprintf(line, sizeof line, "segv-bt: #%-2d ? %p\n", i, pc);
  put(line);
}
static void handler(int sig, siginfo_t* si, void* ctx) {
  char line[128];
  snprintf(line, sizeof line, "segv-bt: signal %d, fault address %p\n", sig, si->si_addr);
  put(line);
  frame(0, (void*)((ucontext_t*)ctx)->uc_mcontext.gregs[REG_RIP]);
  void* pcs[48];
  int n = backtrace(pcs, 48);
  for (int i = 0; i < n; i++) frame(i + 1, pcs[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) {
  void* warm[2];
  backtrace(warm, 2); /* loads libgcc_s now, not inside the handler */
  stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
EOF
    bt="$work/segv_bt.so"
  else
    say "no C compiler for the backtrace handler; the debug run without it"
  fi
  PYTHONUNBUFFERED=1 DG_JIT_DEBUG=1 LD_PRELOAD="$bt${LD_PRELOAD:+:$LD_PRELOAD}" PYTHONPATH="$dg_path" \
    "$py" "$here/deepgemm_anchor.py" --out "$out/deepgemm.json" > "$work/debug-run.txt" 2>&1
  tail -70 "$work/debug-run.txt" | tee -a "$log" >&2
  if command -v addr2line > /dev/null; then
    grep "^segv-bt: #" "$work/debug-run.txt" | awk '{print $3, $4}' | while read -r f o; do
      case "$f" in
        */deep_gemm/_C*|*libtorch*|*libc10*|*libstdc++*) echo "deepgemm_anchor: frame $(basename "$f")+$o: $(addr2line -f -C -i -e "$f" "$o" 2>/dev/null | tr '\n' ' ')" ;;
      esac
    done | tee -a "$log" >&2
  fi
  # (2) The standard-library binding: _C.so's std:: references are served first by torch's
  # libraries (their GCC 13.3 copies of libstdc++ code) and only then by libstdc++.so.6 (see the
  # pre-flight's list). Preloading the system libstdc++ puts it first; harmless where the binding
  # is not the cause. The JSON records LD_PRELOAD when a row comes from this run. (DG_JIT_USE_NVRTC=1
  # is no fallback on CUDA 13: NVRTC gets -I$CUDA_HOME/include only, and CUDA 13 keeps cuda/std in
  # include/cccl; a failed NVRTC compile is cached as an empty cubin, compiler.hpp:314-347.)
  stdcxx=$(c++ -print-file-name=libstdc++.so.6 2>/dev/null)
  case "$stdcxx" in /*) ;; *) stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}') ;; esac
  if [ -n "$stdcxx" ] && [ -f "$stdcxx" ]; then
    say "again with LD_PRELOAD=$stdcxx"
    LD_PRELOAD="$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}" run_anchor
    rc=$?
  fi
  # (3) A debugger's view where (2) did not help: gdb, or the CUDA toolkit's cuda-gdb, which the
  # GPU image has and which debugs host code too (loading torch's symbols takes a while).
  dbg=$(command -v gdb || command -v cuda-gdb || ls "$CUDA_HOME/bin/cuda-gdb" 2>/dev/null)
  if { [ $rc -eq 139 ] || [ $rc -eq 134 ]; } && [ -n "$dbg" ]; then
    say "under $dbg"
    pybin=$("$py" -c "import sys; print(sys.executable)" 2>/dev/null)  # gdb needs the binary itself
    PYTHONPATH="$dg_path" timeout "${DEEPGEMM_GDB_TIMEOUT:-150}" "$dbg" -q -batch -ex "set pagination off" \
      -ex run -ex "bt 30" -ex "x/4i \$pc" --args "${pybin:-$py}" "$here/deepgemm_anchor.py" \
      --out "$out/deepgemm.json" > "$work/gdb-run.txt" 2>&1
    # From the signal on (the frames nearest the fault first), else the end of what it printed.
    if grep -q "received signal" "$work/gdb-run.txt"; then
      sed -n '/received signal/,$p' "$work/gdb-run.txt" | cut -c1-300 | head -45
    else
      grep -vE "^\[(New|Thread|Detaching) " "$work/gdb-run.txt" | tail -20
    fi | tee -a "$log" >&2
  elif [ -z "$dbg" ]; then
    say "no gdb or cuda-gdb on this machine"
  fi
fi
exit $rc
