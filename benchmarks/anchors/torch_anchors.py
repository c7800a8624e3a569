#!/usr/bin/env python3
"""PyTorch anchors measured in the same run as kvc's benchmarks (docs/performance.md).

Times with CUDA events on the current stream, warm-up first, median of many repetitions, and
rotates among input sets whose total exceeds the L2 cache so no timing reads cached data.
Writes JSON to $OUT/torch_anchors.json (or ./torch_anchors.json) and prints a table.
"""
import importlib
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

L2_BYTES = 60 * 2**20
HBM_TBPS = 4.6  # the H200's read bandwidth the fractions are of


def median_us(fn, sets, warmup=10, reps=100):
    """Median time of fn(set) in microseconds over `reps` calls rotating through `sets`."""
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(sets[i % len(sets)])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), min(times)


def graph_us(fn, sets, reps=100):
    """Median of CUDA-graph replays of fn(set) (one graph per set), in microseconds."""
    graphs = []
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for st in sets:
            fn(st)
    torch.cuda.current_stream().wait_stream(s)
    for st in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(st)
        graphs.append(g)
    return median_us(lambda g: g.replay(), graphs, reps=reps)


def n_sets(bytes_per_set):
    return max(2, math.ceil(2 * L2_BYTES / max(bytes_per_set, 1)))


def timed_row(name, fn, sets, nbytes, /, **fields):
    """One anchor row: median_us and graph_us of fn over `sets`, the bytes a call moves and the
    fraction of 4.6 TB/s the graph replay reaches, plus the caller's fields (positional-only
    parameters, so that a field may be called `sets`: the FlashMLA and DeepGEMM rows record how
    many input sets they rotate)."""
    t, tmin = median_us(fn, sets)
    tg, tgmin = graph_us(fn, sets)
    return dict(name=name, us=t, us_min=tmin, graph_us=tg, graph_us_min=tgmin, bytes=nbytes,
                hbm_frac=nbytes / (tg * 1e-6) / (HBM_TBPS * 1e12), **fields)


def write_rows(path, rows, **meta):
    """Writes {gpu, sms, torch, meta..., rows} to path (JSON) and prints each row's times."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    doc = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, **meta,
               rows=rows)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    width = max([len(r["name"]) for r in rows] + [6])
    print(f"{'anchor':{width}s} {'median us':>10s} {'graph us':>10s}")
    for r in rows:
        print(f"{r['name']:{width}s} {r['us']:10.1f} {r['graph_us']:10.1f}")


def import_or_skip(module, out_path):
    """A peer's module, or None after writing {"skipped": why, "rows": []} to out_path, which
    benchmarks/anchors/run-anchors.sh records as the anchor's reason for not running."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # any failure to load the peer is the anchor's reason
        why = f"{module} is not importable: {type(e).__name__}: {e}"
        with open(out_path, "w") as f:
            json.dump(dict(skipped=why, rows=[]), f)
        print(f"SKIPPED: {why}")
        return None


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    rows = []

    # Copy bandwidth (bytes read + written).
    n = 2**30
    src, dst = torch.randn(n // 2, device=dev, dtype=torch.float16), torch.empty(n // 2, device=dev, dtype=torch.float16)
    t, _ = median_us(lambda _: dst.copy_(src), [0], reps=50)
    rows.append(dict(name="copy_1GiB", us=t, bytes=2 * n, tbps=2 * n / t / 1e6))

    # SDPA dense decode fp16, Hq 32 / Hkv 8 / d 128.
    hq, hkv, d = 32, 8, 128
    for b, ctx in [(1, 32768), (1, 131072), (8, 131072)]:
        kv_bytes = 2 * b * hkv * ctx * d * 2
        sets = []
        for _ in range(n_sets(kv_bytes)):
            q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.float16)
            k = torch.randn(b, hkv, ctx, d, device=dev, dtype=torch.float16)
            v = torch.randn(b, hkv, ctx, d, device=dev, dtype=torch.float16)
            sets.append((q, k, v))
        fn = lambda s: F.scaled_dot_product_attention(s[0], s[1], s[2], enable_gqa=True)
        t, tmin = median_us(fn, sets)
        rows.append(dict(name=f"sdpa_decode_B{b}_N{ctx // 1024}K", us=t, us_min=tmin, bytes=kv_bytes,
                         tbps=kv_bytes / t / 1e6, batch=b, context=ctx))
        del sets
        torch.cuda.empty_cache()

    # torch.topk over 131072 candidates, k 2048.
    for r in (64, 1):
        sets = [torch.randn(r, 131072, device=dev) for _ in range(n_sets(r * 131072 * 4))]
        t, tmin = median_us(lambda x: torch.topk(x, 2048, dim=1), sets)
        rows.append(dict(name=f"torch_topk_{r}x131072_k2048", us=t, us_min=tmin, rows=r))

    # A PyTorch block-select decode step: mean-K score, top 8 blocks of 32, gather + ring 1024,
    # SDPA. Graph-replayed so launch gaps shrink; still many small kernels.
    blk, top, ring = 32, 8, 1024
    for b, ctx in [(1, 131072), (8, 131072)]:
        nb = (ctx - ring) // blk
        sets = []
        per = b * hkv * (ctx * d * 2 * 2 + nb * d * 4)
        for _ in range(n_sets(per)):
            k_old = torch.randn(b, hkv, nb, blk, d, device=dev, dtype=torch.float16)
            v_old = torch.randn(b, hkv, nb, blk, d, device=dev, dtype=torch.float16)
            mean_k = k_old.float().mean(dim=3)
            k_ring = torch.randn(b, hkv, ring, d, device=dev, dtype=torch.float16)
            v_ring = torch.randn(b, hkv, ring, d, device=dev, dtype=torch.float16)
            q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.float16)
            sets.append((q, k_old, v_old, mean_k, k_ring, v_ring))

        def step(s):
            q, k_old, v_old, mean_k, k_ring, v_ring = s
            g = hq // hkv
            qg = q.view(b, hkv, g, d).float()
            scores = torch.einsum("bhgd,bhnd->bhn", qg, mean_k)
            idx = torch.topk(scores, top, dim=-1).indices  # [b, hkv, top]
            ix = idx[..., None, None].expand(b, hkv, top, blk, d)
            ks = torch.gather(k_old, 2, ix).reshape(b, hkv, top * blk, d)
            vs = torch.gather(v_old, 2, ix).reshape(b, hkv, top * blk, d)
            kk = torch.cat([ks, k_ring], dim=2)
            vv = torch.cat([vs, v_ring], dim=2)
            return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)

        t, tmin = median_us(step, sets)
        tg, tgmin = graph_us(step, sets[:2])
        rows.append(dict(name=f"torch_block_select_B{b}_N{ctx // 1024}K", us=t, us_min=tmin, graph_us=tg,
                         batch=b, context=ctx))
        del sets
        torch.cuda.empty_cache()

    out = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, rows=rows)
    path = os.path.join(os.environ.get("OUT", "."), "torch_anchors.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'anchor':38s} {'median us':>10s}  extra")
    for r in rows:
        extra = f"{r['tbps']:.2f} TB/s" if "tbps" in r else (f"graph {r['graph_us']:.1f} us" if "graph_us" in r else "")
        print(f"{r['name']:38s} {r['us']:10.1f}  {extra}")


if __name__ == "__main__":
    sys.exit(main())
