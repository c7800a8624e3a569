#!/usr/bin/env python3
"""FlashMLA's SM90 sparse FP8 decode over pages that **kvc wrote** (issue #13: "so an engine can
hand pages to FlashMLA"). An engine owns two page pools (torch uint8 tensors) and their block
tables; kvc's EntryStore.on_pages writes DeepSeek-V4 latents into them in the MODEL1 FP8 layout
(the 128-token window ring and the ratio-4 compressed entries); kvc's physical_entries turns a
CSA index row into the pool rows FlashMLA takes. Then, on the same pages and the same query:

  - kvc's SparseAttention (CUDA) gives out_kvc and lse_kvc;
  - FlashMLA's flash_mla_with_kvcache (window as the main cache, entries as the extra cache, the
    per-head sink) gives out_flashmla and lse_flashmla;
  - a float32 reference dequantizes the rows from the pool bytes themselves (e4m3 x 2^(ue8m0 -
    127) per 64 dims, bf16 RoPE dims) and runs one softmax over window and entries, the sink in
    the denominator only.

Checks (relative L2 over the outputs): kvc against the reference, FlashMLA against the
reference, kvc against FlashMLA; the window's pool rows computed by hand (token p in ring row
p % 128, page = table[slot, row // 64]) against the ring store's physical_entries of the token
positions (-1 for a token the ring no longer holds). FlashMLA's lse
leaves the sink out: log(exp(lse_flashmla) + exp(sink)) is compared with kvc's lse.
The block tables are shuffled (pages out of order, other slots' pages interleaved), so an
identity mapping cannot pass by accident.

  flashmla_kvc_pages.py [--device cuda|cpu] [--out FILE]
--device cpu (no GPU, no FlashMLA): kvc's CPU stores and attention against the reference over
the numpy pools; what the CUDA run adds is FlashMLA and kvc's CUDA path. Needs kvc's Python
package (PYTHONPATH=build-gpu/python on the GPU machine), numpy, and for cuda torch and flash_mla
(benchmarks/anchors/flashmla_anchor.sh builds it; run-anchors.sh's anchor flashmla_pages runs
both). Writes JSON ({"checks": {...}, "ok": bool, ...}) to --out and exits 1 when a check fails.
"""
import argparse
import json
import os
import sys

import numpy as np

import kvc
from kvc import dsv4

D, D_NOPE, HEADS, W, RATIO = 512, 448, 64, 128, 4
PAGE = 64  # entries per MODEL1 page
BOUND = 2e-2  # relative L2: FlashMLA rounds P to bf16 (flashmla_anchor.py's bound)


def dequantize(pool, page_bytes, rows):
    """Rows (physical: page * 64 + offset) of the MODEL1 pages in `pool` (uint8 numpy) as float32
    [len(rows), 512], from the bytes alone."""
    out = np.empty((len(rows), D), np.float32)
    for i, r in enumerate(rows):
        page, off = divmod(int(r), PAGE)
        base = page * page_bytes
        payload = pool[base + off * (D_NOPE + 128): base + (off + 1) * (D_NOPE + 128)]
        codes = e4m3_to_float(payload[:D_NOPE])
        srec = pool[base + PAGE * (D_NOPE + 128) + off * 8: base + PAGE * (D_NOPE + 128) + off * 8 + 7]
        scale = np.exp2(srec.astype(np.float32) - 127.0)
        out[i, :D_NOPE] = (codes.reshape(7, 64) * scale[:, None]).reshape(-1)
        out[i, D_NOPE:] = kvc.from_bf16_bits(payload[D_NOPE:].view(np.uint16))
    return out


def e4m3_to_float(b):
    """OCP e4m3 codes (uint8) as float32 (0x7f / 0xff are NaN)."""
    b = b.astype(np.int32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return (sign * v).astype(np.float32)


def reference(q, window_rows, entry_rows, sink, scale):
    """out [H, 512] and lse [H] in float64 from dequantized rows (window then entries)."""
    kv = np.concatenate([window_rows, entry_rows]).astype(np.float64)
    logits = scale * (q.astype(np.float64) @ kv.T)  # [H, rows]
    m = np.maximum(logits.max(axis=1), sink)
    p = np.exp(logits - m[:, None])
    z = p.sum(axis=1) + np.exp(sink - m)
    return (p @ kv) / z[:, None], m + np.log(z)


def rel_l2(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "flashmla_kvc_pages.json"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--entries", type=int, default=1024, help="compressed entries per sequence")
    ap.add_argument("--topk", type=int, default=512)
    args = ap.parse_args()
    B, E, K = args.batch, args.entries, args.topk
    L = E * RATIO  # tokens per sequence: its E entries are exactly the visible ones
    rng = np.random.default_rng(0)
    result = dict(device=args.device, batch=B, entries=E, topk=K, tokens=L, checks={})

    torch = flash_mla = None
    if args.device == "cuda":
        import torch  # noqa: F811
        try:
            import flash_mla  # noqa: F811
        except ImportError as e:
            result.update(ok=False, reason=f"flash_mla not importable: {e}")
            json.dump(result, open(args.out, "w"), indent=1)
            print(result["reason"])
            return 1

    # The engine's pools and block tables: pages handed out shuffled across slots.
    ecfg = dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.model1_fp8, D, RATIO, L, B)
    rcfg = dsv4.EntryStoreConfig.window_ring(dsv4.EntryFormat.model1_fp8, D, W, B)
    assert ecfg.page_entries == PAGE and rcfg.page_entries == PAGE, "MODEL1 pages hold 64 entries"
    stores = {}
    for name, cfg, used in (("entries", ecfg, (E + PAGE - 1) // PAGE), ("ring", rcfg, W // PAGE)):
        pages = B * used + 3  # three pages nobody uses
        order = rng.permutation(pages)
        table = np.full((B, cfg.pages_per_slot()), -1, np.int32)
        for b in range(B):
            table[b, :used] = order[b::B][:used]
        pool = np.zeros(pages * cfg.page_bytes(), np.uint8)
        if torch is not None:
            pool_t, table_t = torch.from_numpy(pool).cuda(), torch.from_numpy(table).cuda()
            store = dsv4.EntryStore.on_pages(cfg, "cuda", pool_t, table_t)
        else:
            pool_t, table_t = pool, table
            store = dsv4.EntryStore.on_pages(cfg, "cpu", pool, table)
        stores[name] = dict(cfg=cfg, table=table, pool=pool_t, store=store, pages=pages)
    def to_dev(a):
        """numpy as is on the CPU; a CUDA torch tensor otherwise (uint16 bf16 bits as bfloat16)."""
        if torch is None:
            return a
        t = torch.from_numpy(np.ascontiguousarray(a))
        return (t.view(torch.bfloat16) if t.dtype == torch.uint16 else t).cuda()

    slots = list(range(B))
    # kvc writes the latents: E entries and L ring tokens per sequence (f32 in, MODEL1 out).
    for b in slots:
        stores["entries"]["store"].append([b], to_dev(rng.standard_normal((1, E, D)).astype(np.float32)))
        stores["ring"]["store"].append([b], to_dev(rng.standard_normal((1, L, D)).astype(np.float32)))
    q_bits = kvc.to_bf16_bits(rng.standard_normal((B, 1, HEADS, D)))
    q = kvc.from_bf16_bits(q_bits).reshape(B, 1, HEADS, D)
    sink = rng.standard_normal(HEADS).astype(np.float32)
    ids = np.stack([np.sort(rng.choice(E, K, replace=False)) for _ in slots]).astype(np.int32)

    # kvc's attention over its own stores.
    attn = dsv4.SparseAttention(dsv4.SparseAttentionConfig(
        num_heads=HEADS, head_dim=D, ratio=RATIO, window=W, max_batch=B, max_query_tokens=1,
        max_indices=K), args.device)
    out_kvc, lse_kvc = attn.forward(stores["ring"]["store"], stores["entries"]["store"], slots,
                                    [L] * B, to_dev(q_bits), indices=to_dev(ids),
                                    sink=to_dev(sink), return_lse=True)
    host = (lambda t: t.cpu().numpy()) if torch else (lambda a: a)
    out_kvc, lse_kvc = host(out_kvc), host(lse_kvc)

    # The pool rows: entries through kvc's physical_entries; the window by hand, checked against
    # the ring store's own map.
    ent_rows = host(stores["entries"]["store"].physical_entries(slots, 1, to_dev(ids)))
    win_rows = np.empty((B, W), np.int32)
    for b in slots:
        for i, p in enumerate(range(L - W, L)):
            row = p % W
            win_rows[b, i] = stores["ring"]["table"][b, row // PAGE] * PAGE + row % PAGE
    ring_ids = np.stack([np.arange(L - W, L) for _ in slots]).astype(np.int32)  # token positions
    try:
        ring_map = host(stores["ring"]["store"].physical_entries(slots, 1, to_dev(ring_ids)))
        result["checks"]["ring_physical_entries_equal_hand_map"] = bool((ring_map == win_rows).all())
    except kvc.Error as e:  # recorded, not fatal: the hand map below is what FlashMLA gets
        result["checks"]["ring_physical_entries_equal_hand_map"] = False
        result["ring_physical_entries_error"] = str(e)

    scale = attn.config.scale()
    pools = {n: host(s["pool"]) for n, s in stores.items()}
    ok = result["checks"]["ring_physical_entries_equal_hand_map"]
    out_ref = np.empty((B, HEADS, D))
    lse_ref = np.empty((B, HEADS))
    for b in slots:
        out_ref[b], lse_ref[b] = reference(
            q[b, 0], dequantize(pools["ring"], rcfg.page_bytes(), win_rows[b]),
            dequantize(pools["entries"], ecfg.page_bytes(), ent_rows[b]), sink, scale)
    e = rel_l2(out_kvc.reshape(B, HEADS, D), out_ref)
    result["checks"]["kvc_vs_reference_rel_l2"] = e
    result["checks"]["kvc_lse_max_abs_diff"] = float(np.abs(lse_kvc.reshape(B, HEADS) - lse_ref).max())
    ok = ok and e < 1e-4 and result["checks"]["kvc_lse_max_abs_diff"] < 1e-3

    if torch is not None:
        def pages_view(name):
            s = stores[name]
            raw = s["pool"].view(s["pages"], s["cfg"].page_bytes())
            return raw.view(torch.float8_e4m3fn)[:, : PAGE * 584].view(s["pages"], PAGE, 1, 584)

        meta, _ = flash_mla.get_mla_metadata()
        out_fm, lse_fm = flash_mla.flash_mla_with_kvcache(
            to_dev(q_bits),
            pages_view("ring"), None, None, D, meta, None, softmax_scale=scale, is_fp8_kvcache=True,
            indices=to_dev(win_rows).view(B, 1, W), attn_sink=to_dev(sink),
            extra_k_cache=pages_view("entries"), extra_indices_in_kvcache=to_dev(ent_rows).view(B, 1, K))
        torch.cuda.synchronize()
        out_fm = out_fm.float().cpu().numpy().reshape(B, HEADS, D)
        lse_fm = lse_fm.float().cpu().numpy().reshape(B, HEADS)
        result["checks"]["flashmla_vs_reference_rel_l2"] = rel_l2(out_fm, out_ref)
        result["checks"]["flashmla_vs_kvc_rel_l2"] = rel_l2(out_fm, out_kvc.reshape(B, HEADS, D))
        with_sink = np.logaddexp(lse_fm, sink[None, :])  # FlashMLA's lse leaves the sink out
        result["checks"]["flashmla_lse_with_sink_max_abs_diff_vs_kvc"] = float(
            np.abs(with_sink - lse_kvc.reshape(B, HEADS)).max())
        result["flash_mla"] = getattr(flash_mla, "__version__", None)
        ok = (ok and result["checks"]["flashmla_vs_reference_rel_l2"] < BOUND
              and result["checks"]["flashmla_vs_kvc_rel_l2"] < BOUND)
    result["ok"] = bool(ok)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
