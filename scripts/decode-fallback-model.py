#!/usr/bin/env python3
"""Host model of the decode top-k's exact fallback (kernels/select/decode.cuh), for rows whose
scores crowd a range small beside their magnitude (uniform(-2, 2) + offset): the count threshold
T (key bits 31..16, 512 threads), then the 8-bit radix descent over the rank keys until at most
256 keys remain, once from the top (main before the forty-fourth session) and once from below the
leading bits T shares with the row's largest key (gpu-pending/fallback-prefix). Prints, per row
shape, the candidates past T, those common bits, the radix passes (each a full re-read of the
row) of both, and whether every kept set is a rank prefix holding the target largest keys.

    python3 scripts/decode-fallback-model.py
"""
import numpy as np


def score_keys(scores):
    """select_rules::score_key: order-preserving u32 keys of the floats."""
    b = np.frombuffer(np.asarray(scores, np.float32).tobytes(), np.uint32).astype(np.uint64)
    return np.where((b >> 31) == 1, (~b) & 0xFFFFFFFF, b | 0x80000000).astype(np.uint64)


def descent(rank_keys, bits, target, prefix, pbits, cap=256):
    """The fallback's loop from (prefix, pbits) with no key above it: passes and the kept set."""
    n = len(rank_keys)
    above, eq, passes = 0, n, 0
    while above + eq > cap:
        w = min(bits - pbits, 8)
        shift = bits - pbits - w
        live = (rank_keys >> np.uint64(bits - pbits)) == prefix if pbits else np.ones(n, bool)
        digits = ((rank_keys[live] >> np.uint64(shift)) & np.uint64((1 << w) - 1)).astype(int)
        hist = np.bincount(digits, minlength=1 << w)
        need, run = target - above, 0
        for d in range((1 << w) - 1, -1, -1):
            if run < need <= run + hist[d]:
                prefix, pbits, above, eq = (prefix << w) | d, pbits + w, above + run, hist[d]
                break
            run += hist[d]
        passes += 1
    return passes, (rank_keys >> np.uint64(bits - pbits)) >= prefix


def row(rng, n, k, offset, threads=512):
    key = score_keys(rng.uniform(-2, 2, n) + offset)
    id_bits = max(1, int(np.ceil(np.log2(n))))
    ids = np.arange(n, dtype=np.uint64)
    rank_keys = (key << np.uint64(id_bits)) | (np.uint64((1 << id_bits) - 1) - ids)
    target = k + 1 if k < n else k
    # Thread t holds elements ((i / 4) * threads + t) * 4 + i % 4.
    tmax = key.reshape(-1, threads, 4).transpose(1, 0, 2).reshape(threads, -1).max(1)
    t = 0
    for bit in range(31, 15, -1):
        if (tmax >= (t | (1 << bit))).sum() >= target:
            t |= 1 << bit
    candidates = int((key >= t).sum())
    if candidates <= 256:
        return None
    common = 32 - (t ^ int(tmax.max())).bit_length()
    old_passes, _ = descent(rank_keys, 32 + id_bits, target, 0, 0)
    start = t >> (32 - common) if common else 0
    new_passes, kept = descent(rank_keys, 32 + id_bits, target, start, common)
    top = np.argsort(-rank_keys.astype(np.float64), kind="stable")[:target]
    cut = rank_keys[kept].min()
    prefix_ok = bool(kept[top].all()) and bool((rank_keys[~kept] < cut).all())
    return candidates, common, old_passes, new_passes, prefix_ok


def main():
    rng = np.random.default_rng(44)
    print("rows (20 each)          fallback  candidates  common bits  passes main -> new  ok")
    for n in (4096, 8192):
        for k in (33, 64):
            for offset in (100.0, 1000.0, 200000.0):
                rs = [r for r in (row(rng, n, k, offset) for _ in range(20)) if r]
                if not rs:
                    print(f"n {n:5d} k {k:2d} + {offset:8.0f}  0")
                    continue
                print(f"n {n:5d} k {k:2d} + {offset:8.0f}  {len(rs):8d}  "
                      f"{int(np.median([r[0] for r in rs])):10d}  "
                      f"{sorted({r[1] for r in rs})!s:>11}  "
                      f"{sorted({r[2] for r in rs})!s:>6} -> {sorted({r[3] for r in rs})!s:<6}  "
                      f"{all(r[4] for r in rs)}")


if __name__ == "__main__":
    main()
