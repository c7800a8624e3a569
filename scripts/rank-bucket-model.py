#!/usr/bin/env python3
"""The spread top-k's shared finish on the host: how many pairwise compares a candidate costs.

After the sampled cut a row holds about lo * n / S candidates (spread_sample_ranks, tuning.h);
the shared finish buckets them by their 64-bit rank key's offset from the smallest
(bucket_by_rank, kernels/select/stream.cuh) and ranks each key by comparing it with every key of
its bucket (bucket_rank_of), so a key costs about its bucket's size: the mean over keys is the
sum of the squared bucket sizes over the count. Two bucketings: `shift`, the offset shifted by
the range's bit length less 12 (the library's), and `scale`, the offset times 2^64 * 4096 /
range (the forty-first session's pending patch; measured in the forty-second on an H100 it was
0.3-0.6 us slower on every large-k row, 64 x 262144 included, and was dropped: fewer compares
did not pay for the 64-bit multiply per key). Gaussian and uniform rows, k 2048, four rows each.

    python3 scripts/rank-bucket-model.py
"""
import math

import numpy as np

BINS = 4096


def rank_keys(scores, id_bits):
    """KeyCodec.encode(score_key(s), id) for each score, id = its index."""
    u = scores.astype(np.float32).view(np.uint32).astype(np.uint64)
    sk = np.where(u & np.uint64(0x80000000), (~u) & np.uint64(0xFFFFFFFF), u | np.uint64(0x80000000))
    ids = np.arange(len(scores), dtype=np.uint64)
    return (sk << np.uint64(id_bits)) | (np.uint64((1 << id_bits) - 1) - ids)


def buckets(keys, mode):
    lo = int(keys.min())
    span = int(keys.max()) - lo
    offsets = [int(k) - lo for k in keys]
    if mode == "shift":
        shift = max(span.bit_length() - 12, 0)
        return np.array([o >> shift for o in offsets])
    if span < BINS:
        return np.array([max(o - 1, 0) for o in offsets])
    f = np.float32(BINS) / np.float32(span)
    scale = int(f * np.float32(1.0 - 2.0**-20) * np.float32(2.0**64))
    return np.array([min((o * scale) >> 64, BINS - 1) for o in offsets])


def main():
    rng = np.random.default_rng(1)
    k = 2048
    for name, draw in (("gaussian", rng.standard_normal), ("uniform", rng.random)):
        for n, sample in ((262144, 4096), (262144, 8192), (131072, 4096), (131072, 8192)):
            r0 = -(-k * sample // n)
            lo = r0 + math.ceil(4 * math.sqrt(r0)) + 8
            cand = lo * n // sample
            row = []
            for mode in ("shift", "scale"):
                per_key, used, largest = [], [], 0
                for _ in range(4):
                    top = np.sort(draw(n).astype(np.float32))[::-1][:cand]
                    counts = np.bincount(buckets(rank_keys(top, (n - 1).bit_length()), mode),
                                         minlength=BINS)
                    per_key.append(float((counts.astype(float) ** 2).sum()) / cand)
                    used.append(int((counts > 0).sum()))
                    largest = max(largest, int(counts.max()))
                row.append(f"{mode}: {np.mean(per_key):.1f} compares a key, {np.mean(used):.0f} "
                           f"buckets used, largest {largest}")
            print(f"{name:8s} n {n} sample {sample} (~{cand} candidates) | " + " | ".join(row))


if __name__ == "__main__":
    main()
