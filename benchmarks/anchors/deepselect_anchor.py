#!/usr/bin/env python3
"""DeepSelect's and torch.topk's top-k on topk_bench's shapes, timed as topk_bench times kvc.

Run by benchmarks/anchors/deepselect_anchor.sh after it built DeepSelect (deep_select on
PYTHONPATH); without deep_select only torch.topk is timed. Float32 scores, random normal, in
enough sets to span 2x the L2 (at most 1024). Two timings, both CUDA-graph replays whose host
enqueue happens while a spin (torch.cuda._sleep, ~100 us) holds the stream:
  us            one graph of R calls (R = the number of sets, each call on the next set),
                replay time / R: one call's cost inside a captured step (topk_bench BM_TopK);
  lone_graph_us one graph per set holding one call, one replayed per timing (BM_TopKLatency).
Medians over 5 x 30 replays, like topk_bench. DeepSelect's modes: unsorted (indices only, its
fastest), sorted (values and indices by descending value: kvc's score order), sorted_index
(indices ascending: kvc's chronological order). torch.topk returns values and indices, sorted.
DeepSelect breaks ties arbitrarily and traps on NaN; these rows have neither.
Writes JSON ({"gpu", "torch", "deep_select", "rows": [...]}) to --out and prints a table.
"""
import argparse
import json
import math
import statistics
import sys

import torch

DECODE = [(r, n, k) for r in (8, 64) for n in (4096, 32768) for k in (8, 16, 64)]
LARGE = [(64, 131072, 2048), (1, 131072, 2048), (64, 262144, 2048),
         (4, 262144, 512), (4, 262144, 1024), (4, 262144, 2048)]
SLEEP_CYCLES = 200_000  # ~100 us at the H200's ~2 GHz
REPS, ITERS = 5, 30
MAX_SETS = 1024


def n_sets(set_bytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(MAX_SETS, math.ceil(2 * l2 / max(set_bytes, 1))))


def timed_replays(replay, per_replay):
    """Median over REPS x ITERS of (one replay's time / per_replay), in microseconds."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    it = 0
    for _ in range(REPS * ITERS):
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        replay(it)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / per_replay)
        it += 1
    # topk_bench reports the median of the 5 repetitions' means; do the same.
    means = [statistics.mean(times[i * ITERS:(i + 1) * ITERS]) for i in range(REPS)]
    return statistics.median(means)


def time_fn(fn, sets):
    """(in-graph us, lone-graph us, timing) of fn(x) over the sets."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x in sets[:2]:
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            for x in sets:
                fn(x)
        lone = []
        for x in sets:
            h = torch.cuda.CUDAGraph()
            with torch.cuda.graph(h, pool=pool):
                fn(x)
            lone.append(h)
        g.replay()
        torch.cuda.synchronize()
        in_graph = timed_replays(lambda i: g.replay(), len(sets))
        lone_us = timed_replays(lambda i: lone[i % len(lone)].replay(), 1)
        return in_graph, lone_us, "graph"
    except RuntimeError as e:  # not capturable: back-to-back eager calls behind the spin
        print(f"  graph capture failed ({e}); timing eager calls", file=sys.stderr)
        torch.cuda.synchronize()

        def eager(i):
            for x in sets:
                fn(x)
        return timed_replays(eager, len(sets)), float("nan"), "eager"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="deepselect_anchor.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    try:
        import deep_select
        ds_version = getattr(deep_select, "__version__", "unknown")
        in_align, out_align = deep_select.get_stride_requirement()
    except ImportError as e:
        print(f"deep_select not importable ({e}): timing torch.topk only", file=sys.stderr)
        deep_select, ds_version, in_align, out_align = None, None, 1, 1
    rows_out = []
    for rows, n, k in DECODE + LARGE:
        set_bytes = rows * n * 4
        sets = [torch.randn(rows, n, device=dev) for _ in range(n_sets(set_bytes))]
        moved = set_bytes + rows * k * 4
        base = dict(rows=rows, n=n, k=k, bytes=moved, sets=len(sets))

        def record(name, fn, **extra):
            us, lone, how = time_fn(fn, sets)
            rows_out.append(dict(base, name=name, us=us, lone_graph_us=lone, timing=how,
                                 tbps=moved / us / 1e6, **extra))
            print(f"{name:44s} {us:9.2f} us  lone graph {lone:9.2f} us  ({how})", flush=True)

        record(f"torch_topk_{rows}x{n}_k{k}", lambda x: torch.topk(x, k, dim=1))
        if deep_select is not None and (n * 4) % in_align == 0:
            pitch = -(-k * 4 // out_align) * out_align // 4  # index row pitch the stride rule wants
            idx = torch.empty(rows, pitch, device=dev, dtype=torch.int32)[:, :k]
            # Agreement with torch.topk on the first set (no ties in random floats).
            _, ref = torch.topk(sets[0], k, dim=1)
            _, got = deep_select.topk(sets[0], k, indices_type=torch.int32, return_value=False,
                                      output_idx=idx)
            agree = bool(torch.equal(torch.sort(ref.int(), dim=1)[0], torch.sort(got, dim=1)[0]))
            modes = {
                "unsorted": dict(return_value=False),
                "sorted": dict(sorted=True, return_value=True),
                "sorted_index": dict(sorted_index=True, return_value=False),
            }
            for mode, kw in modes.items():
                record(f"deepselect_{mode}_{rows}x{n}_k{k}",
                       lambda x, kw=kw: deep_select.topk(x, k, indices_type=torch.int32,
                                                         output_idx=idx, **kw),
                       mode=mode, agrees_with_torch=agree)
        del sets
        torch.cuda.empty_cache()
    doc = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__,
               deep_select=ds_version, method="CUDA-graph replay behind a ~100 us spin; "
               "us = in-graph per call (R calls per graph), lone_graph_us = one call per graph; "
               "median of 5 means of 30 replays", rows=rows_out)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
