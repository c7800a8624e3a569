#!/usr/bin/env python3
"""FlashInfer paged decode anchors, measured in the same run as kvc's benchmarks
(docs/performance.md): BatchDecodeWithPagedKVCacheWrapper over fp16 and fp8 (e4m3) KV caches,
Hq 32 / Hkv 8 / d 128, at B1 N32K, B1 N128K and B8 N128K, page size 16, HND layout, with the
CUDA-core decode kernel and with the tensor-core one (use_tensor_cores=True, FlashInfer's choice
for GQA).

Timed like torch_anchors.py (its helpers): CUDA events on the current stream, warm-up first,
median of many repetitions, input sets (separate KV caches and queries) rotated past twice the
L2, random data; the plan (host work) runs once, outside the timed region; each row reports the
eager median and the median of CUDA-graph replays of run() (the number to compare with kvc's
graph-replayed benchmarks). Bytes are the KV cache read once (K + V, in its dtype).

Needs FlashInfer 0.7.x (flashinfer_import.load_flashinfer: the whole package, or only
flashinfer.decode and flashinfer.topk when the full import fails). Without it the script prints
why, writes a JSON with "skipped" set and exits 0, so a run without the wheel still completes.
FlashInfer JIT-compiles a kernel module on first use (minutes, with nvcc on PATH) unless a
prebuilt one lies in its data/aot folder: setup-anchors.sh installs the modules that
flashinfer_prebuild.py compiled for sm_90a, and run-anchors.sh sets FLASHINFER_DISABLE_JIT=1 so a
missing module fails its rows at once, naming the module, instead of compiling. Each row records
the backend FlashInfer resolved ("fa2" for both kernels here).

Writes $OUT/flashinfer_anchors.json (or ./flashinfer_anchors.json) and prints a table.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flashinfer_import import load_flashinfer  # noqa: E402
from torch_anchors import graph_us, median_us, n_sets  # noqa: E402

HQ, HKV, D = 32, 8, 128
PAGE = 16
SHAPES = [(1, 32768), (1, 131072), (8, 131072)]


def write(out):
    path = os.path.join(os.environ.get("OUT", "."), "flashinfer_anchors.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return path


def main():
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    meta = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__)
    try:
        flashinfer = load_flashinfer()
    except ImportError as e:
        reason = f"flashinfer is not importable ({e}); no FlashInfer rows"
        print(f"SKIPPED: {reason}")
        write(dict(meta, skipped=reason, rows=[]))
        return 0
    meta.update(flashinfer=flashinfer.version, flashinfer_import=flashinfer.import_mode,
                flashinfer_full_import_error=flashinfer.full_import_error,
                flashinfer_disable_jit=os.environ.get("FLASHINFER_DISABLE_JIT", ""))
    torch.manual_seed(0)
    rows = []
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    for kv_name, kv_dtype in [("fp16", torch.float16), ("fp8", torch.float8_e4m3fn)]:
        for b, ctx in SHAPES:
            pages_per_seq = ctx // PAGE
            num_pages = b * pages_per_seq
            kv_bytes = 2 * b * HKV * ctx * D * torch.empty(0, dtype=kv_dtype).element_size()
            indptr = torch.arange(0, num_pages + 1, pages_per_seq, dtype=torch.int32, device=dev)
            indices = torch.arange(num_pages, dtype=torch.int32, device=dev)
            last_page_len = torch.full((b,), PAGE, dtype=torch.int32, device=dev)
            sets = []
            for _ in range(n_sets(kv_bytes)):
                q = torch.randn(b, HQ, D, device=dev, dtype=torch.float16)
                # HND pages: [num_pages, Hkv, page_size, d]
                k = torch.randn(num_pages, HKV, PAGE, D, device=dev, dtype=torch.float16)
                v = torch.randn(num_pages, HKV, PAGE, D, device=dev, dtype=torch.float16)
                sets.append((q, k.to(kv_dtype), v.to(kv_dtype)))
                del k, v
            for tc in (False, True):
                name = f"flashinfer_decode_{kv_name}_{'tc' if tc else 'cuda'}_B{b}_N{ctx // 1024}K"
                try:
                    # CUDA-graph mode: the page table lives in these fixed buffers, so a
                    # captured run() replays without host work.
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                        workspace, "HND", use_cuda_graph=True, use_tensor_cores=tc,
                        paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                        paged_kv_last_page_len_buffer=last_page_len)
                    w.plan(indptr, indices, last_page_len, HQ, HKV, D, PAGE,
                           q_data_type=torch.float16, kv_data_type=kv_dtype)
                    out = torch.empty(b, HQ, D, device=dev, dtype=torch.float16)
                    scales = {} if kv_dtype == torch.float16 else dict(k_scale=1.0, v_scale=1.0)
                    fn = lambda s: w.run(s[0], (s[1], s[2]), out=out, **scales)
                    t, tmin = median_us(fn, sets)
                    tg, tgmin = graph_us(fn, sets)
                except Exception as e:  # an unsupported variant must not hide the others
                    print(f"{name}: not run ({type(e).__name__}: {e})")
                    rows.append(dict(name=name, error=f"{type(e).__name__}: {e}"))
                    continue
                rows.append(dict(name=name, us=t, us_min=tmin, graph_us=tg, graph_us_min=tgmin,
                                 bytes=kv_bytes, tbps=kv_bytes / tg / 1e6, batch=b, context=ctx,
                                 kv_dtype=kv_name, tensor_cores=tc, page_size=PAGE,
                                 backend=getattr(w, "resolved_backend", None)))
            del sets
            torch.cuda.empty_cache()
    path = write(dict(meta, rows=rows))
    print(f"FlashInfer {meta['flashinfer']} on {meta['gpu']}; written to {path}")
    print(f"{'anchor':44s} {'median us':>10s} {'graph us':>10s}  graph TB/s")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:44s} {'-':>10s} {'-':>10s}  {r['error']}")
        else:
            print(f"{r['name']:44s} {r['us']:10.1f} {r['graph_us']:10.1f}  {r['tbps']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
