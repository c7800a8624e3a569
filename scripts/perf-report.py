#!/usr/bin/env python3
"""Turns one GPU run's raw JSON (Google Benchmark outputs; torch_anchors.json, dsv4_anchors.json and
run-anchors.sh's anchors.json of the peers) into the tables of docs/performance.md, with
kvc-to-anchor ratios measured in the same run (scripts/perf-pairs.json lists the pairs).

Usage: scripts/perf-report.py RESULTS_DIR > table.md
"""
import glob
import gzip
import json
import os
import re
import sys


def read_text(path):
    """A raw result's text: PATH itself, or PATH.gz (the runs kept under docs/perf-data are
    gzipped once their session is logged, so that the working tree the device copies stays
    small)."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    if path.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return f.read()
    with open(path) as f:
        return f.read()


def raw_exists(path):
    return os.path.exists(path) or os.path.exists(path + ".gz")


def load_benchmarks(d):
    rows = {}
    paths = {p[:-3] if p.endswith(".gz") else p
             for p in glob.glob(os.path.join(d, "*_bench*.json")) +
             glob.glob(os.path.join(d, "*_bench*.json.gz"))}
    for path in sorted(paths):
        text = read_text(path)
        # Google Benchmark writes bare nan / inf for empty counters; make them JSON.
        text = re.sub(r":\s*-?nan\b", ": NaN", text)
        text = re.sub(r":\s*(-?)inf\b", r": \1Infinity", text)
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            # A binary cut off by its timeout leaves an unterminated file: keep every complete
            # row (each ends with a 4-space "}") and say so.
            cut = text.rfind("\n    }")
            if cut < 0:
                print(f"{os.path.basename(path)}: no complete row", file=sys.stderr)
                continue
            data = json.loads(text[:cut] + "\n    }\n  ]\n}")
            print(f"{os.path.basename(path)}: cut off by its timeout; "
                  f"{len(data.get('benchmarks', []))} complete rows kept", file=sys.stderr)
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


def load_anchors(d):
    """Every anchor row of a run: {name: row + "source"}, the first metadata found (GPU, torch
    version) and each peer's (status, reason). The PyTorch anchors' own file (torch_anchors.py),
    DeepSeek-V4's (dsv4_anchors.py), and the peers' combined file of
    benchmarks/anchors/run-anchors.sh (anchors.json: one entry per anchor, each with its own rows);
    a row keeps the name its anchor gave it."""
    anchors, meta, peer_status = {}, {}, {}
    for fname in ("torch_anchors.json", "dsv4_anchors.json"):
        path = os.path.join(d, fname)
        if raw_exists(path):
            a = json.loads(read_text(path))
            meta = meta or {k: v for k, v in a.items() if k != "rows"}
            anchors.update({r["name"]: dict(r, source=fname) for r in a.get("rows", [])})
    peers_path = os.path.join(d, "anchors.json")
    if raw_exists(peers_path):
        for name, entry in json.loads(read_text(peers_path)).get("anchors", {}).items():
            peer_status[name] = (entry.get("status"), entry.get("reason", ""))
            result = entry.get("result")
            if isinstance(result, dict):
                meta = meta or {k: v for k, v in result.items() if k != "rows"}
                for r in result.get("rows", []):
                    anchors.setdefault(r["name"], dict(r, source=name))
    return anchors, meta, peer_status


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    bench = load_benchmarks(d)
    anchors, meta, peer_status = load_anchors(d)
    if meta:
        print(f"GPU: {meta.get('gpu')} ({meta.get('sms')} SMs), PyTorch {meta.get('torch')}\n")
    print("| benchmark | label | median µs | GB/s | fraction of 4.6 TB/s |")
    print("|---|---|---:|---:|---:|")
    for name, r in bench.items():
        hbm = f"{r['hbm']:.2f}" if r["hbm"] else ""
        gbps = f"{r['gbps']:.0f}" if r["gbps"] else ""
        print(f"| `{name}` | {r['label']} | {r['us']:.2f} | {gbps} | {hbm} |")
    if peer_status:
        print("\n| peer anchor | status | reason |")
        print("|---|---|---|")
        for n, (st, why) in peer_status.items():
            print(f"| {n} | {st} | {why} |")
    if anchors:
        print("\n| anchor row | from | median µs | graph replay µs | TB/s |")
        print("|---|---|---:|---:|---:|")
        for n, r in anchors.items():
            graph = f"{r['graph_us']:.1f}" if r.get("graph_us") else ""
            tbps = f"{r['tbps']:.2f}" if r.get("tbps") else ""
            if r.get("us") is None:  # a row the anchor could not run or check (e.g. a module
                # the bundle lacks, or DeepSelect's output failing its check)
                why = str(r.get("error") or r.get("reason") or "no time").replace("|", "/")
                print(f"| `{n}` | {r['source']} | not run: {why} | | |")
                continue
            print(f"| `{n}` | {r['source']} | {r['us']:.1f} | {graph} | {tbps} |")
    # Same-run comparisons: (kvc benchmark name prefix, anchor name, what).
    pairs = json.load(open(os.path.join(os.path.dirname(__file__), "perf-pairs.json")))
    lines = []
    for p in pairs:
        k = next((bench[n] for n in bench if n.startswith(p["kvc"])), None)
        a = anchors.get(p["anchor"])
        if not k or not a:
            continue
        ref = a.get(p.get("anchor_field", "us"))
        if not ref:
            continue
        lines.append(f"| {p['what']} | {k['us']:.2f} | {ref:.1f} | {ref / k['us']:.2f}x |")
    if lines:
        print("\n| same-run comparison | kvc µs | anchor µs | anchor / kvc |")
        print("|---|---:|---:|---:|")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
