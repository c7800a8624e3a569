#!/usr/bin/env python3
"""Builds, on a machine without a GPU, the FlashInfer JIT modules that flashinfer_anchors.py
loads, so that the GPU machine only loads .so files (no nvcc, no headers, no build time).

FlashInfer (0.7.x) looks for a prebuilt module at <package>/data/aot/<name>/<name>.so before it
JIT-compiles one (flashinfer/jit/env.py, get_aot_artifacts); this script compiles each module the
anchors need for sm_90a (FLASHINFER_CUDA_ARCH_LIST="9.0") through FlashInfer's own generators (so
names and flags are FlashInfer's), and copies the .so files into --aot-dir (the bundle's
flashinfer/data/aot). The modules, matching the anchors' plan() arguments (fp16 query and
output, int32 page table, head_dim 128, no RoPE, no soft cap, no sliding window):
  decode_fp16 / decode_fp8   CUDA-core decode, KV fp16 / e4m3   (use_tensor_cores=False)
  prefill_fp16 / prefill_fp8 the fa2 paged prefill module the tensor-core decode runs
                             (use_tensor_cores=True). Its companion for K and V caches of
                             different strides (FlashInfer loads it lazily, only then) is not
                             built: the anchors' K and V have the same strides.
  topk                       flashinfer.top_k
FlashInfer renders each module's sources from templates in <package>/data/csrc even when it then
loads the prebuilt .so, so the bundle keeps those files: --record-opens FILE writes the package
files this run opened (make-anchor-bundle.sh copies them into the stripped package).
--check builds nothing: it loads every module through FlashInfer's getters (decode.py's and
prefill.py's get_batch_*_module, topk.get_topk_module; run with FLASHINFER_DISABLE_JIT=1 a module
that is not prebuilt fails) and checks the entry points the anchors call.
Usage: flashinfer_prebuild.py (--aot-dir DIR | --check | --list) [--record-opens FILE] [NAME ...]
       (default NAMEs: all)
Environment: MAX_JOBS (ninja jobs), FLASHINFER_WORKSPACE_BASE (the JIT build tree).
"""
import argparse
import importlib.util
import os
import shutil
import sys
import time

os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0")


def record_opens(path):
    """Records every file under the flashinfer package that this process opens from now on
    (installed before the package is imported, so its import-time reads count too)."""
    root = os.path.dirname(os.path.abspath(importlib.util.find_spec("flashinfer").origin))
    seen = set()

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            name = os.path.abspath(os.fsdecode(args[0]))
            if name.startswith(root + os.sep) and os.path.isfile(name):
                seen.add(os.path.relpath(name, os.path.dirname(root)))

    sys.addaudithook(hook)
    return lambda: open(path, "w").write("".join(f"{n}\n" for n in sorted(seen)))


_RECORD = sys.argv[sys.argv.index("--record-opens") + 1] if "--record-opens" in sys.argv else None
_write_opens = record_opens(_RECORD) if _RECORD else None

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flashinfer_import import load_flashinfer  # noqa: E402

FI = load_flashinfer()  # the anchors' import: the whole package, else decode and topk alone
from flashinfer import decode, prefill, topk  # noqa: E402
from flashinfer.jit import env as jit_env  # noqa: E402

F16, E4M3, I32 = torch.float16, torch.float8_e4m3fn, torch.int32
D = 128
NO_ROPE, NO_WINDOW, NO_SOFTCAP, NO_FP16_QK = 0, False, False, False


def decode_specs(kv):
    # get_batch_decode_module's arguments in decode.py's plan(): q, kv, o, indptr dtypes, d_qk,
    # d_vo, pos_encoding, use_sliding_window, use_logits_soft_cap.
    return [decode.gen_batch_decode_module(F16, kv, F16, I32, D, D, NO_ROPE, NO_WINDOW,
                                           NO_SOFTCAP)]


def prefill_specs(kv):
    # get_batch_prefill_module("fa2", ...) in decode.py's tensor-core plan(): its primary module
    # (equal K and V strides); the last False is use_token_head_sf.
    args = ("fa2", F16, kv, F16, I32, D, D, NO_ROPE, NO_WINDOW, NO_SOFTCAP, NO_FP16_QK, False)
    # The getter names the lazy companion too (that renders its sources from data/csrc), so
    # create its spec here, unbuilt, for --record-opens to see those files.
    prefill._gen_batch_prefill_independent_paged_module(*args)
    return [prefill._gen_batch_prefill_primary_module(*args)]


MODULES = {
    "decode_fp16": lambda: decode_specs(F16),
    "decode_fp8": lambda: decode_specs(E4M3),
    "prefill_fp16": lambda: prefill_specs(F16),
    "prefill_fp8": lambda: prefill_specs(E4M3),
    "topk": lambda: [topk.gen_topk_module()],
}


# The getters the anchors' calls go through (their functools caches keep the loaded modules), and
# the entry points each must have.
LOADERS = {
    "decode_fp16": lambda: [decode.get_batch_decode_module(F16, F16, F16, I32, D, D, NO_ROPE,
                                                           NO_WINDOW, NO_SOFTCAP)],
    "decode_fp8": lambda: [decode.get_batch_decode_module(F16, E4M3, F16, I32, D, D, NO_ROPE,
                                                          NO_WINDOW, NO_SOFTCAP)],
    "prefill_fp16": lambda: prefill_loaders(F16),
    "prefill_fp8": lambda: prefill_loaders(E4M3),
    "topk": lambda: [topk.get_topk_module()],
}
ENTRY_POINTS = {"decode_fp16": ("plan", "run"), "decode_fp8": ("plan", "run"),
                "prefill_fp16": ("plan", "paged_run"), "prefill_fp8": ("plan", "paged_run"),
                "topk": ("radix_topk", "cub_topk")}


def prefill_loaders(kv):
    args = (F16, kv, F16, I32, D, D, NO_ROPE, NO_WINDOW, NO_SOFTCAP, NO_FP16_QK, False)
    return [prefill.get_batch_prefill_module("fa2", *args)]


def check(names):
    failed = 0
    for name in names:
        try:
            modules = LOADERS[name]()
            missing = [e for e in ENTRY_POINTS[name] if not hasattr(modules[0], e)]
            if missing:
                raise AttributeError(f"no {missing} in the loaded module")
            print(f"check {name}: loaded ({', '.join(ENTRY_POINTS[name])} present)", flush=True)
        except Exception as e:
            failed += 1
            print(f"check {name}: FAILED {type(e).__name__}: {e}", flush=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--aot-dir")
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--list", action="store_true", help="print the module names only")
    ap.add_argument("--record-opens")
    ap.add_argument("names", nargs="*", default=sorted(MODULES))
    args = ap.parse_args()
    write_opens = _write_opens
    print(f"flashinfer {FI.version} ({FI.import_mode} import), torch {torch.__version__}, "
          f"arch list {os.environ['FLASHINFER_CUDA_ARCH_LIST']}, "
          f"jit dir {jit_env.FLASHINFER_JIT_DIR}")
    if args.check:
        status = check(args.names)
        if write_opens:
            write_opens()
        return status
    failed = 0
    for name in args.names:
        for spec in MODULES[name]():
            if args.list:
                print(f"{name}: {spec.name}")
                continue
            start = time.time()
            try:
                spec.build(verbose=False)
            except Exception as e:  # the next module may still build
                failed += 1
                print(f"{name}: {spec.name} FAILED after {time.time() - start:.0f} s: "
                      f"{type(e).__name__}: {str(e)[-2000:]}", flush=True)
                continue
            so = spec.jit_library_path
            dest = os.path.join(args.aot_dir, spec.name, f"{spec.name}.so")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(so, dest)
            print(f"{name}: {spec.name} built in {time.time() - start:.0f} s, "
                  f"{os.path.getsize(dest) / 2**20:.1f} MiB -> {dest}", flush=True)
    if write_opens:
        write_opens()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
