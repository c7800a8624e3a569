#!/usr/bin/env python3
"""flashinfer.top_k on topk_bench's shapes, timed exactly as deepselect_anchor.py times DeepSelect
and torch.topk (its time_fn: CUDA-graph replays behind a ~100 us spin, one graph of R calls and
one graph per call, medians of 5 means of 30 replays; float32 random normal scores in enough sets
to span 2x the L2).

Modes (flashinfer.top_k's own dispatch picks the kernel: radix, or CUB's DeviceBatchedTopK
where FlashInfer judges it faster; FLASHINFER_TOPK_ALGO is left unset):
  unsorted         top_k(x, k): values and int64 indices, any order (its fastest)
  sorted           top_k(x, k, sorted=True): by descending value (kvc's score order)
  det_sorted_lowid top_k(x, k, sorted=True, deterministic=True, tie_break=1): repeatable, ties
                   to the lower index, by descending value: the nearest to kvc's contract
Every mode's selection is checked against torch.topk on the first set (random floats, no ties).

Needs FlashInfer 0.7.x (flashinfer_import.load_flashinfer: the whole package, or only
flashinfer.decode and flashinfer.topk). Without it: a JSON with "skipped" and exit 0.
Usage: flashinfer_topk_anchor.py [--out PATH] [--quick]   (--quick: the first shape of each list)
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepselect_anchor import DECODE, LARGE, n_sets, time_fn  # noqa: E402
from flashinfer_import import load_flashinfer  # noqa: E402

MODES = {
    "unsorted": dict(),
    "sorted": dict(sorted=True),
    "det_sorted_lowid": dict(sorted=True, deterministic=True, tie_break=1),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                  "flashinfer_topk_anchor.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--large", action="store_true", help="the large-k shapes only (LARGE)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    doc = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__,
               method="deepselect_anchor.time_fn: CUDA-graph replay behind a ~100 us spin; "
               "us = in-graph per call (R calls per graph), lone_graph_us = one call per graph; "
               "median of 5 means of 30 replays", rows=[])
    try:
        fi = load_flashinfer()
    except ImportError as e:
        doc["skipped"] = f"flashinfer is not importable: {e}"
        print(f"SKIPPED: {doc['skipped']}")
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        return 0
    doc.update(flashinfer=fi.version, flashinfer_import=fi.import_mode,
               flashinfer_full_import_error=fi.full_import_error)
    torch.manual_seed(0)
    shapes = [DECODE[0], LARGE[0]] if args.quick else LARGE if args.large else DECODE + LARGE
    for rows, n, k in shapes:
        set_bytes = rows * n * 4
        sets = [torch.randn(rows, n, device=dev) for _ in range(n_sets(set_bytes))]
        moved = set_bytes + rows * k * 4
        _, ref = torch.topk(sets[0], k, dim=1)
        ref = torch.sort(ref, dim=1)[0]
        for mode, kw in MODES.items():
            name = f"flashinfer_topk_{mode}_{rows}x{n}_k{k}"
            row = dict(name=name, rows=rows, n=n, k=k, bytes=moved, sets=len(sets), mode=mode)
            try:
                _, got = fi.top_k(sets[0], k, **kw)
                row["agrees_with_torch"] = bool(torch.equal(torch.sort(got, dim=1)[0], ref))
                us, lone, how = time_fn(lambda x, kw=kw: fi.top_k(x, k, **kw), sets)
            except Exception as e:  # one unsupported mode must not hide the others
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"{name:44s} not run ({row['error']})", flush=True)
                doc["rows"].append(row)
                continue
            row.update(us=us, lone_graph_us=lone, timing=how, tbps=moved / us / 1e6)
            doc["rows"].append(row)
            print(f"{name:44s} {us:9.2f} us  lone graph {lone:9.2f} us  ({how}; agrees "
                  f"{row['agrees_with_torch']})", flush=True)
        del sets
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
