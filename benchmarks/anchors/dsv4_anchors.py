#!/usr/bin/env python3
"""PyTorch anchors for DeepSeek-V4 sparse-attention decode, beside benchmarks/dsv4_bench.cu.

Plain torch, no custom kernels: what an engine without kvc (or FlashMLA) would run for one decode
token per sequence. CSA: 64 query heads over one 512-dim latent per row (K = V), the 128-token
window ring and 512 compressed entries picked by an index list (-1 = skip), one softmax over both
with a per-head sink in the denominator, scale 512^-0.5. HCA: the same over the ring and every
visible entry (1M tokens / 128 = 8192 entries). bf16 rows and queries, float32 softmax.

Timed like torch_anchors.py (its median_us / graph_us / n_sets: CUDA events, warm-up, median,
input sets rotated past the 60 MB L2). Writes $OUT/dsv4_anchors.json and prints a table.

  python3 benchmarks/anchors/dsv4_anchors.py            # on a CUDA device
  python3 benchmarks/anchors/dsv4_anchors.py --check    # the step against a float64 loop (CPU)
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_anchors import n_sets, timed_row, write_rows  # noqa: E402

D = 512
WINDOW = 128
# dsv4_bench's decode shapes at 1M tokens of context: (name, batch, k, entries); k = None is HCA
# (every entry of 2^20 / 128), else CSA's k of 2^20 / 4. FlashMLA's anchor times the same.
DECODE_CASES = ([("csa_decode_1M", b, 512, (1 << 20) // 4) for b in (1, 8)] +
                [("hca_decode_1M", b, None, (1 << 20) // 128) for b in (1, 8)])


def make_set(b, h, entries, k, dev, gen, ent=None):
    """One input set: queries, rings, entries (or the shared `ent`), indices with -1 holes, sink."""
    q = torch.randn(b, h, D, device=dev, generator=gen).to(torch.bfloat16)
    ring = torch.randn(b, WINDOW, D, device=dev, generator=gen).to(torch.bfloat16)
    if ent is None:
        ent = torch.randn(b, entries, D, device=dev, generator=gen).to(torch.bfloat16)
    sink = torch.randn(h, device=dev, generator=gen)
    if k is None:
        idx = None  # HCA: every entry
    else:
        idx = torch.randint(0, entries, (b, k), device=dev, generator=gen, dtype=torch.int32)
        idx[:, 7::16] = -1  # holes, as a top-k over fewer visible entries leaves
    return q, ring, ent, idx, sink


def decode_step(s):
    """One CSA (idx given) or HCA (idx None) decode step: out [b, h, D] and lse [b, h]."""
    q, ring, ent, idx, sink = s
    b = q.shape[0]
    if idx is None:
        rows = torch.cat([ring, ent], dim=1)  # [b, W + N, D]
        valid = None
    else:
        safe = idx.clamp(min=0).long()
        picked = torch.gather(ent, 1, safe[..., None].expand(b, idx.shape[1], D))
        rows = torch.cat([ring, picked], dim=1)  # [b, W + k, D]
        valid = torch.cat([torch.ones(b, WINDOW, dtype=torch.bool, device=q.device), idx >= 0], dim=1)
    logits = torch.einsum("bhd,bnd->bhn", q.float(), rows.float()) * (D ** -0.5)
    if valid is not None:
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    m = torch.maximum(logits.amax(dim=-1), sink[None, :])  # the sink joins the max
    p = torch.exp(logits - m[..., None])
    denom = p.sum(dim=-1) + torch.exp(sink[None, :] - m)  # sink in the denominator only
    out = torch.einsum("bhn,bnd->bhd", p, rows.float()) / denom[..., None]
    return out.to(torch.bfloat16), m + torch.log(denom)


def reference(s):
    """The same step in float64, row by row over the union, for --check."""
    q, ring, ent, idx, sink = s
    b, h, _ = q.shape
    out = torch.zeros(b, h, D, dtype=torch.float64)
    lse = torch.zeros(b, h, dtype=torch.float64)
    for bi in range(b):
        ids = range(ent.shape[1]) if idx is None else [int(j) for j in idx[bi] if j >= 0]
        rows = [ring[bi, r].double() for r in range(WINDOW)] + [ent[bi, j].double() for j in ids]
        kv = torch.stack(rows)
        for hi in range(h):
            lg = kv @ q[bi, hi].double() / math.sqrt(D)
            m = max(float(lg.max()), float(sink[hi]))
            p = torch.exp(lg - m)
            den = float(p.sum()) + math.exp(float(sink[hi]) - m)
            out[bi, hi] = (p @ kv) / den
            lse[bi, hi] = m + math.log(den)
    return out, lse


def check():
    gen = torch.Generator().manual_seed(1)
    for k, entries in [(24, 40), (None, 33)]:
        s = make_set(2, 4, entries, k, "cpu", gen)
        out, lse = decode_step(s)
        ref, ref_lse = reference(s)
        err = (out.double() - ref).norm() / ref.norm()
        lerr = (lse.double() - ref_lse).abs().max()
        print(f"{'csa' if k else 'hca'}: out rel L2 {err:.2e}, lse max err {lerr:.2e}")
        if err > 1e-2 or lerr > 1e-4:
            return 1
    return 0


def bytes_read(b, h, rows):
    return b * (rows * D * 2 + h * D * 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="compare with a float64 loop on the CPU")
    args = ap.parse_args()
    if args.check:
        return check()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, b, k, entries in DECODE_CASES:
        touched = WINDOW + (entries if k is None else k)
        # Sets rotate past L2 by the rows a step reads: CSA sets share one entry tensor (1M
        # tokens) and differ in queries, rings and random indices; HCA sets own their entries.
        shared = None
        if k is not None:
            shared = torch.randn(b, entries, D, device=dev, generator=gen).to(torch.bfloat16)
        sets = [make_set(b, 64, entries, k, dev, gen, shared) for _ in range(n_sets(bytes_read(b, 64, touched)))]
        rows.append(timed_row(f"torch_{name}_B{b}", decode_step, sets, bytes_read(b, 64, touched),
                              batch=b, heads=64, rows_per_query=touched))
        del sets, shared
        torch.cuda.empty_cache()
    write_rows(os.path.join(os.environ.get("OUT", "."), "dsv4_anchors.json"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
