#!/usr/bin/env python3
"""FlashMLA's SM90 sparse FP8 decode (deepseek-ai/FlashMLA, `flash_mla_with_kvcache` with MODEL1
FP8 pages) as the anchor of kvc's DeepSeek-V4 sparse attention (benchmarks/dsv4_bench.cu,
BM_Dsv4CsaDecode / BM_Dsv4HcaDecode with format 1 = MODEL1 FP8), on the same shapes: one decode
token per sequence, 64 query heads, d 512 (K = V, the last 64 dims bf16 RoPE), scale 512^-0.5,
a per-head sink, the 128-token window ring plus the compressed entries of a 1M-token context:
CSA 512 entries of 262144 (ratio 4) picked by an index row, HCA every entry of 8192 (ratio 128).

Inputs are laid out as FlashMLA's MODEL1_FP8Sparse pages, which are also kvc's MODEL1 pages byte
for byte (docs/dsv4.md): 64 rows per page, [64 x (448 e4m3 | 64 bf16)] [64 x (7 ue8m0 + 1 pad)],
zero-padded to 37,440 bytes. FlashMLA's main cache holds the window (128 indices per query) and its
extra cache the entries (512 or 8192 indices), as its MODEL1 test configurations do; indices are
physical rows (page * 64 + offset). Codes are random finite e4m3 values, scales near 1, RoPE dims
random bf16: never zeros, never NaN. Before timing, each shape's output is checked against a
float32 reference over the dequantized rows (relative L2 below 2e-2, recorded in the JSON).

Timed like torch_anchors.py / dsv4_anchors.py (their median_us / graph_us / n_sets: CUDA events,
warm-up, median, one CUDA graph per input set, sets rotated so their rows span 2x the 60 MB L2).
Writes $OUT/flashmla.json (or --out) and prints a table. Needs the flash_mla package (built by
benchmarks/anchors/flashmla_anchor.sh) on PYTHONPATH and a Hopper GPU.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dsv4_anchors import DECODE_CASES  # noqa: E402
from torch_anchors import import_or_skip, n_sets, timed_row, write_rows  # noqa: E402

D = 512
D_NOPE = 448
WINDOW = 128
HEADS = 64
PAGE = 64  # rows per page
ROW_BYTES = 584  # 448 e4m3 + 128 bf16 bytes + 7 ue8m0 + 1 pad
PAGE_BYTES = 37440  # 64 x 584 = 37376, padded to a multiple of 576


def model1_pages(num_pages, dev, gen):
    """num_pages MODEL1 FP8 pages of random finite rows: the (num_pages, 37440) bytes and
    FlashMLA's k_cache view (num_pages, 64, 1, 584) of them."""
    raw = torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8, device=dev)
    rows = raw[:, : PAGE * (D_NOPE + 128)].view(num_pages, PAGE, D_NOPE + 128)
    # e4m3 codes 0x00..0x7e with a random sign: every finite value, never the NaN codes 0x7f / 0xff.
    mag = torch.randint(0, 0x7F, (num_pages, PAGE, D_NOPE), device=dev, generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, (num_pages, PAGE, D_NOPE), device=dev, generator=gen, dtype=torch.int32) << 7
    rows[:, :, :D_NOPE] = (mag | sign).to(torch.uint8)
    rope = torch.randn(num_pages, PAGE, 64, device=dev, generator=gen).to(torch.bfloat16)
    rows[:, :, D_NOPE:] = rope.view(torch.uint8).view(num_pages, PAGE, 128)
    scales = raw[:, PAGE * (D_NOPE + 128) : PAGE * (D_NOPE + 128) + PAGE * 8].view(num_pages, PAGE, 8)
    # ue8m0 bytes 2^-3 .. 2^3 (127 = 1.0); byte 7 of each record stays 0.
    scales[:, :, :7] = torch.randint(124, 131, (num_pages, PAGE, 7), device=dev, generator=gen,
                                     dtype=torch.int32).to(torch.uint8)
    return raw, raw.view(torch.float8_e4m3fn)[:, : PAGE * ROW_BYTES].view(num_pages, PAGE, 1, ROW_BYTES)


def dequantize_rows(raw, rows):
    """Rows (physical ids page * 64 + offset, a 1-D tensor) of MODEL1 pages `raw` as float32
    [len(rows), 512]: e4m3 code x 2^(scale byte - 127) per block of 64 dims, then the bf16 RoPE."""
    page, off = rows // PAGE, rows % PAGE
    base = off * (D_NOPE + 128)
    cols = torch.arange(D_NOPE + 128, device=raw.device)
    payload = raw[page[:, None], base[:, None] + cols[None, :]]  # [n, 576] bytes
    codes = payload[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    rope = payload[:, D_NOPE:].contiguous().view(torch.bfloat16).float()
    sbase = PAGE * (D_NOPE + 128) + off * 8
    sbytes = raw[page[:, None], sbase[:, None] + torch.arange(7, device=raw.device)[None, :]]
    scale = torch.exp2(sbytes.float() - 127.0)  # [n, 7]
    nope = (codes.view(-1, 7, 64) * scale[:, :, None]).view(-1, D_NOPE)
    return torch.cat([nope, rope], dim=1)


def reference(s, sink):
    """The step in float32 from the dequantized rows: one softmax over the window and the
    entries, the sink in the denominator only; out [b, 1, H, 512]."""
    b = s["q"].shape[0]
    outs = []
    for i in range(b):
        rows = torch.cat([dequantize_rows(s["window_raw"], s["win_idx"][i, 0].long()),
                          dequantize_rows(s["ent_raw"], s["ent_idx"][i, 0].long())])
        q = s["q"][i, 0].float()  # [H, 512]
        logits = (q @ rows.T) * D ** -0.5
        m = torch.maximum(logits.amax(dim=-1), sink)
        p = torch.exp(logits - m[:, None])
        den = p.sum(dim=-1) + torch.exp(sink - m)
        outs.append((p @ rows) / den[:, None])
    return torch.stack(outs)[:, None]


def bytes_read(b, entries_read):
    """Rows the step reads (window + entries, 584 bytes each) plus the bf16 queries and outputs."""
    return b * ((WINDOW + entries_read) * ROW_BYTES + HEADS * D * 2 * 2)


def make_sets(b, k, entries, dev, gen):
    """Input sets for one shape. CSA (k given): one shared entry cache of b x entries rows; each
    set its own queries, window pages and k distinct random entries per sequence. HCA (k None):
    each set its own entry pages (every entry is read) and window pages."""
    entry_pages = entries // PAGE
    touched = entries if k is None else k
    count = n_sets(bytes_read(b, touched))
    shared_raw, shared = model1_pages(b * entry_pages, dev, gen) if k is not None else (None, None)
    sink = torch.randn(HEADS, device=dev, generator=gen)
    sets = []
    for _ in range(count):
        q = torch.randn(b, 1, HEADS, D, device=dev, generator=gen).to(torch.bfloat16)
        window_raw, window = model1_pages(b * (WINDOW // PAGE), dev, gen)
        # Window: sequence i's 128 tokens are its two pages, in order.
        win_idx = (torch.arange(b, device=dev)[:, None] * WINDOW +
                   torch.arange(WINDOW, device=dev)[None, :]).to(torch.int32).view(b, 1, WINDOW)
        if k is None:
            ent_raw, ent = model1_pages(b * entry_pages, dev, gen)
            ent_idx = torch.arange(b * entries, device=dev, dtype=torch.int32).view(b, 1, entries)
        else:
            ent_raw, ent = shared_raw, shared
            picks = torch.stack([torch.randperm(entries, device=dev, generator=gen)[:k].sort().values
                                 for _ in range(b)])
            ent_idx = (picks + torch.arange(b, device=dev)[:, None] * entries).to(torch.int32).view(b, 1, k)
        sets.append(dict(q=q, window=window, window_raw=window_raw, win_idx=win_idx, ent=ent,
                         ent_raw=ent_raw, ent_idx=ent_idx))
    return sets, sink


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "flashmla.json"))
    args = ap.parse_args()
    flash_mla = import_or_skip("flash_mla", args.out)
    if flash_mla is None:
        return 0
    flash_mla_with_kvcache, get_mla_metadata = flash_mla.flash_mla_with_kvcache, flash_mla.get_mla_metadata

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, b, k, entries in DECODE_CASES:
        sets, sink = make_sets(b, k, entries, dev, gen)
        meta, _ = get_mla_metadata()  # one schedule for every set: the same shapes and lengths

        def step(s):
            return flash_mla_with_kvcache(
                s["q"], s["window"], None, None, D, meta, None, softmax_scale=D ** -0.5,
                is_fp8_kvcache=True, indices=s["win_idx"], attn_sink=sink,
                extra_k_cache=s["ent"], extra_indices_in_kvcache=s["ent_idx"])

        # The call computes what kvc's sparse attention does: its output against the float32
        # reference over the dequantized rows (a wrong index mapping gives an error near 1).
        out, _ = step(sets[0])
        ref = reference(sets[0], sink)
        err = float((out.float() - ref).norm() / ref.norm())
        if not err < 2e-2:
            raise SystemExit(f"flashmla_anchor: {name} B{b}: output against the reference: "
                             f"relative L2 {err:.3g} (bound 2e-2)")
        torch.cuda.synchronize()
        touched = entries if k is None else k
        rows.append(timed_row(f"flashmla_{name}_B{b}", step, sets, bytes_read(b, touched), batch=b,
                              heads=HEADS, rows_per_query=WINDOW + touched, sets=len(sets),
                              rel_l2_vs_reference=err,
                              layout="MODEL1_FP8Sparse, window as the main cache, entries as the extra"))
        del sets
        torch.cuda.empty_cache()
    write_rows(args.out, rows, flash_mla=getattr(flash_mla, "__version__", None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
