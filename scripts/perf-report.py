#!/usr/bin/env python3
"""Turns one GPU run's raw JSON (Google Benchmark outputs + torch_anchors.json) into the tables of
docs/performance.md, with kvc-to-anchor ratios measured in the same run.

Usage: scripts/perf-report.py RESULTS_DIR > table.md
"""
import glob
import json
import os
import re
import sys


def load_benchmarks(d):
    rows = {}
    for path in sorted(glob.glob(os.path.join(d, "*_bench.json"))):
        text = open(path).read()
        # Google Benchmark writes bare nan / inf for empty counters; make them JSON.
        text = re.sub(r":\s*-?nan\b", ": NaN", text)
        text = re.sub(r":\s*(-?)inf\b", r": \1Infinity", text)
        data = json.loads(text)
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            name = b.get("run_name", b["name"])
            t = b.get("real_time")
            unit = b.get("time_unit", "us")
            us = t * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[unit]
            rows[name] = dict(us=us, gbps=b.get("bytes_per_second", 0) / 1e9,
                              hbm=b.get("hbm_frac"), label=b.get("label", ""),
                              file=os.path.basename(path))
    return rows


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    bench = load_benchmarks(d)
    anchors_path = os.path.join(d, "torch_anchors.json")
    anchors = {}
    meta = {}
    if os.path.exists(anchors_path):
        a = json.load(open(anchors_path))
        meta = {k: v for k, v in a.items() if k != "rows"}
        anchors = {r["name"]: r for r in a["rows"]}
    if meta:
        print(f"GPU: {meta.get('gpu')} ({meta.get('sms')} SMs), PyTorch {meta.get('torch')}\n")
    print("| benchmark | label | median µs | GB/s | fraction of 4.6 TB/s |")
    print("|---|---|---:|---:|---:|")
    for name, r in bench.items():
        hbm = f"{r['hbm']:.2f}" if r["hbm"] else ""
        gbps = f"{r['gbps']:.0f}" if r["gbps"] else ""
        print(f"| `{name}` | {r['label']} | {r['us']:.2f} | {gbps} | {hbm} |")
    if anchors:
        print("\n| PyTorch anchor | median µs | notes |")
        print("|---|---:|---|")
        for n, r in anchors.items():
            note = f"{r['tbps']:.2f} TB/s" if "tbps" in r else (f"graph replay {r['graph_us']:.1f} µs" if "graph_us" in r else "")
            print(f"| `{n}` | {r['us']:.1f} | {note} |")
    # Same-run comparisons: (kvc benchmark name prefix, anchor name, what).
    pairs = json.load(open(os.path.join(os.path.dirname(__file__), "perf-pairs.json")))
    lines = []
    for p in pairs:
        k = next((bench[n] for n in bench if n.startswith(p["kvc"])), None)
        a = anchors.get(p["anchor"])
        if not k or not a:
            continue
        ref = a.get(p.get("anchor_field", "us"))
        lines.append(f"| {p['what']} | {k['us']:.2f} | {ref:.1f} | {ref / k['us']:.2f}x |")
    if lines:
        print("\n| same-run comparison | kvc µs | anchor µs | anchor / kvc |")
        print("|---|---:|---:|---:|")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
