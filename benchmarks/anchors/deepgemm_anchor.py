#!/usr/bin/env python3
"""DeepGEMM's SM90 FP8 paged MQA logits (deepseek-ai/DeepGEMM, `fp8_fp4_paged_mqa_logits`: the
DeepSeek-V3.2 lightning indexer's decode scores) as the anchor of kvc's indexer decode
(benchmarks/dsv4_bench.cu, BM_Dsv4IndexDecode: format 1 = fp8 keys with one fp32 scale per key,
the same shape; format 0 = kvc's mxfp4 keys, which DeepGEMM has no SM90 kernel for). Shape: one
query token per sequence, 64 index heads of dim 128, 131072 keys per sequence in pages of 64,
fp32 logits, fp32 head weights.

The key cache is DeepGEMM's fused fp8 page (blocks, 64, 1, 132): [64 x 128 e4m3][64 x fp32 scale]
per page, which is kvc's kFp8Scaled page byte for byte (docs/dsv4.md). Codes are random finite
e4m3 values, scales powers of two near 1: never zeros, never NaN. Each set has its own keys,
queries and weights (a key is read once per call), its block table a random permutation. Before
timing, each shape's first logits row is checked against a float32 reference from the quantized
keys (relative L2 below 1e-3, recorded in the JSON).

Timed like torch_anchors.py (its median_us / graph_us / n_sets: CUDA events, warm-up, median,
one CUDA graph per input set, sets rotated past 2x the 60 MB L2). Writes $OUT/deepgemm.json (or
--out). Needs the deep_gemm package (built by benchmarks/anchors/deepgemm_anchor.sh) and a
Hopper GPU; DeepGEMM compiles its kernels at first use (nvcc, outside the timed region).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_anchors import import_or_skip, n_sets, timed_row, write_rows  # noqa: E402

HEADS = 64
DIM = 128
BLOCK_KV = 64
KEYS = 131072


def fp8_pages(num_blocks, dev, gen):
    """num_blocks fused fp8 key pages (num_blocks, 64, 1, 132) of random finite keys."""
    raw = torch.empty(num_blocks, BLOCK_KV * (DIM + 4), dtype=torch.uint8, device=dev)
    mag = torch.randint(0, 0x7F, (num_blocks, BLOCK_KV * DIM), device=dev, generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, (num_blocks, BLOCK_KV * DIM), device=dev, generator=gen, dtype=torch.int32) << 7
    raw[:, : BLOCK_KV * DIM] = (mag | sign).to(torch.uint8)
    exps = torch.randint(-3, 4, (num_blocks, BLOCK_KV), device=dev, generator=gen).float()
    raw[:, BLOCK_KV * DIM :] = torch.exp2(exps).view(torch.uint8).view(num_blocks, BLOCK_KV * 4)
    return raw.view(num_blocks, BLOCK_KV, 1, DIM + 4)


def reference_logits(s, i):
    """Sequence i's logits in float32 from the quantized keys and query: sum over heads of
    w_h * relu(q_h . k_j) with k_j = its e4m3 codes x its scale (DeepGEMM's definition)."""
    raw = s["kv"].view(-1, BLOCK_KV * (DIM + 4))[s["table"][i].long()]  # [blocks, 8448] in order
    codes = raw[:, : BLOCK_KV * DIM].contiguous().view(torch.float8_e4m3fn).float().view(-1, DIM)
    sf = raw[:, BLOCK_KV * DIM :].contiguous().view(torch.float32).reshape(-1)
    k = codes * sf[:, None]  # [KEYS, DIM]
    q = s["q"][i, 0].float()  # [HEADS, DIM]
    return (torch.relu(q @ k.T) * s["w"][i][:, None]).sum(dim=0)


def bytes_read(b):
    """Keys (132 bytes each), queries, weights, and the fp32 logits written."""
    return b * (KEYS * (DIM + 4) + HEADS * DIM + HEADS * 4 + KEYS * 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "deepgemm.json"))
    args = ap.parse_args()
    deep_gemm = import_or_skip("deep_gemm", args.out)
    if deep_gemm is None:
        return 0
    # Progress on stderr: where a crash happens (the first run died of a segmentation fault).
    def stage(what):
        print(f"deepgemm_anchor: {what}", file=sys.stderr, flush=True)
    stage(f"imported deep_gemm {getattr(deep_gemm, '__version__', '?')}, {deep_gemm.get_num_sms()} SMs")

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    blocks = KEYS // BLOCK_KV
    rows = []
    for b in (1, 8):
        sets = []
        for _ in range(n_sets(bytes_read(b))):
            q = torch.randn(b, 1, HEADS, DIM, device=dev, generator=gen).to(torch.float8_e4m3fn)
            w = torch.randn(b, HEADS, device=dev, generator=gen)
            kv = fp8_pages(b * blocks, dev, gen)
            table = torch.randperm(b * blocks, device=dev, generator=gen).to(torch.int32).view(b, blocks)
            lens = torch.full((b, 1), KEYS, dtype=torch.int32, device=dev)
            stage(f"B{b}: set {len(sets)}: schedule metadata")
            meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, deep_gemm.get_num_sms())
            sets.append(dict(q=q, w=w, kv=kv, table=table, lens=lens, meta=meta))

        def step(s):
            return deep_gemm.fp8_fp4_paged_mqa_logits(
                (s["q"], None), s["kv"], s["w"], s["lens"], s["table"], s["meta"], KEYS,
                clean_logits=False, logits_dtype=torch.float)

        # The JIT compile happens here, outside the timed region; and the call computes what
        # kvc's indexer does: its first sequence's logits against the float32 reference (a
        # wrong layout or block order gives an error near 1).
        stage(f"B{b}: first call (JIT compile)")
        logits = step(sets[0])
        torch.cuda.synchronize()
        stage(f"B{b}: checking against the reference")
        ref = reference_logits(sets[0], 0)
        err = float((logits[0].float() - ref).norm() / ref.norm())
        if not err < 1e-3:
            raise SystemExit(f"deepgemm_anchor: B{b}: logits against the reference: relative L2 "
                             f"{err:.3g} (bound 1e-3)")
        torch.cuda.synchronize()
        rows.append(timed_row(f"deepgemm_fp8_paged_mqa_logits_B{b}_T1_N131072", step, sets,
                              bytes_read(b), batch=b, heads=HEADS, dim=DIM, keys=KEYS,
                              sets=len(sets), rel_l2_vs_reference=err))
        del sets
        torch.cuda.empty_cache()
    # deepgemm_anchor.sh's retry after a crash preloads the system libstdc++: a row from that run
    # says so.
    write_rows(args.out, rows, deep_gemm=getattr(deep_gemm, "__version__", None),
               ld_preload=os.environ.get("LD_PRELOAD") or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
