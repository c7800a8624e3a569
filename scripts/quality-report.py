#!/usr/bin/env python3
"""Tables and summary.json from the teacher-forced quality harness (quality_eval --jsonl).

usage: scripts/quality-report.py [--default NAME] [--summary-json PATH] [--retrieval JSONL ...]
                                 RESULTS.jsonl [...] > tables.md

For every (model, text, positions) group: one row per configuration with its mean KL(dense ||
kvc), top-1 agreement, attention-mass recall, bytes read per step as a fraction of dense f16
attention, and the oracle's KL and top-1 at the same budget (the row of the same group whose
scoring is "oracle", policy topk, and whose top / window / block / dense_layers match), with the
ratio KL / oracle KL. --default names the library's default configuration: summary.json then
holds, per model and group, its figures next to the oracle's, and (with --retrieval) the
dense-valid retrieval pass counts of real_retrieval rows.
"""
import argparse
import json
import math
import sys
from collections import OrderedDict


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def budget_key(r):
    return (r["top"], r["window"], r["block"], r.get("dense_layers", 0))


def fmt(x, spec):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--default", help="config name of the library default")
    ap.add_argument("--summary-json")
    ap.add_argument("--retrieval", nargs="*", default=[], help="real_retrieval JSONL files")
    a = ap.parse_args()
    rows = load(a.results)
    groups = OrderedDict()
    for r in rows:  # the last row of a (group, config) wins: reruns replace earlier rows
        g = (r["model"], r["text"], r["start"], r["end"])
        groups.setdefault(g, OrderedDict())[r["config"]] = r
    summary = {"default": a.default, "groups": []}
    for (model, text, start, end), cfgs in groups.items():
        # The oracle: the probe's exact rule, or kvc's token_mass over the old blocks' own K
        # (the same rule; MiniDecoder_QualityProbe.LibraryTokenMassSelectsTheOraclesBlocks).
        oracles = {budget_key(r): r for r in cfgs.values()
                   if r["scoring"] in ("oracle", "token_mass/old_blocks") and r["policy"] == "topk"}
        print(f"\n### {model}, text {text}, positions [{start}, {end})\n")
        print("| config | scoring | policy | top x block | ring | mean KL | top-1 | mass recall "
              "| read / dense | oracle KL | KL / oracle | oracle top-1 |")
        print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in cfgs.items():
            o = oracles.get(budget_key(r))
            sel = r["mode"] == "block_select_exact"
            ratio = r["mean_kl"] / o["mean_kl"] if (o and sel and o["mean_kl"]) else None
            print(f"| {name} | {r['scoring'] if sel else r['mode']} | {r['policy'] if sel else '—'} "
                  f"| {str(r['top']) + ' x ' + str(r['block']) if sel else '—'} | {r['window']} "
                  f"| {fmt(r['mean_kl'], '.4f')} | {fmt(100 * r['top1_agreement'], '.1f')} % "
                  f"| {fmt(r['mass_recall'], '.3f')} | {fmt(100 * r['read_fraction'], '.1f')} % "
                  f"| {fmt(o['mean_kl'], '.4f') if o and sel else '—'} "
                  f"| {fmt(ratio, '.2f') if ratio else '—'} "
                  f"| {fmt(100 * o['top1_agreement'], '.1f') + ' %' if o and sel else '—'} |")
        if a.default and a.default in cfgs:
            d = cfgs[a.default]
            o = oracles.get(budget_key(d))
            summary["groups"].append({
                "model": model, "text": text, "start": start, "end": end,
                "config": d["config"], "spec": d["spec"],
                "mean_kl": d["mean_kl"], "top1_agreement": d["top1_agreement"],
                "mass_recall": d["mass_recall"], "read_fraction": d["read_fraction"],
                "oracle_kl": o["mean_kl"] if o else None,
                "oracle_top1": o["top1_agreement"] if o else None,
                "oracle_mass_recall": o["mass_recall"] if o else None,
            })
    if a.retrieval:
        rr = load(a.retrieval)
        dense = {}
        for r in rr:
            if r["mode"] == "dense":
                dense[(r["task"], r["target_tokens"])] = r["pass"]
        counts = OrderedDict()
        for r in rr:
            if r["mode"] != "block_select_exact" or not dense.get((r["task"], r["target_tokens"])):
                continue
            k = (f"{r['format']} top {r['top_blocks']} {r.get('policy') or 'topk'} "
                 f"{r.get('scoring') or 'mean_k'} ring {r['recent_window']}")
            c = counts.setdefault(k, [0, 0])
            c[0] += 1 if r["pass"] else 0
            c[1] += 1
        summary["retrieval_dense_valid"] = sum(1 for v in dense.values() if v)
        summary["retrieval_prompts"] = len(dense)
        summary["retrieval_pass"] = {k: {"pass": v[0], "of": v[1]} for k, v in counts.items()}
        print("\n### Retrieval prompts where dense passes\n")
        print(f"dense passes {summary['retrieval_dense_valid']} of {len(dense)} prompts\n")
        print("| setting | pass |")
        print("|---|---:|")
        for k, v in counts.items():
            print(f"| {k} | {v[0]} / {v[1]} |")
    if a.summary_json:
        with open(a.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
