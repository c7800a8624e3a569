#!/usr/bin/env python3
"""Host model of the decode top-k's count threshold (kernels/select/decode.cuh, step 3): how many
candidates (blocks with a score key >= T) one CTA's threshold lets through on rows of a few score
distributions, against the kDecodeCandidates cap of 256 past which the exact fallback runs.

  exact     T = the target-th largest thread maximum (what the listed maxima find)
  absolute  T = that with its low 16 bits cleared: the built-in descent over key bits 31..16
  relative  the descent over the 16 bits below the common leading bits of the largest and the
            smallest non-zero thread maximum (a proposed form, docs/dev/pending/count-range)

Thread t of a kBlock-thread CTA holds elements ((i / 4) * kBlock + t) * 4 + i % 4, i < n / kBlock,
as the kernel does; keys are select_rules::score_key's order-preserving map of the float bits.

  python3 scripts/decode-threshold-model.py        (needs numpy; prints one line per case)
"""
import numpy as np

CAP = 256          # kDecodeCap
DESCENT_BITS = 16  # kDecodeDescentBits


def score_keys(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return np.where(b >> 31, (~b) & 0xFFFFFFFF, b | 0x80000000).astype(np.uint64)


def candidates(scores, threads, k):
    n = len(scores)
    items = n // threads
    keys = score_keys(scores)
    t = np.arange(threads)[:, None]
    i = np.arange(items)[None, :]
    tmax = keys[((i // 4) * threads + t) * 4 + i % 4].max(axis=1)
    target = k + 1
    exact = np.sort(tmax)[::-1][target - 1]
    absolute = exact & ~np.uint64((1 << (32 - DESCENT_BITS)) - 1)
    live = tmax[tmax != 0]
    span = int(live.max() ^ live.min()).bit_length()
    shift = np.uint64(max(span - DESCENT_BITS, 0))
    relative = (exact >> shift) << shift
    return [int((keys >= T).sum()) for T in (exact, absolute, relative)]


def main():
    rng = np.random.default_rng(1)
    dists = {
        "topk_bench's rows (4 uniforms - 2)": lambda n: rng.random((n, 4)).sum(1) - 2 + 1e-7,
        "N(0, 1)": lambda n: rng.standard_normal(n),
        "uniform [0, 1)": lambda n: rng.random(n),
        "-8 + 0.5 N(0, 1)": lambda n: -8 + 0.5 * rng.standard_normal(n),
        "10 + N(0, 1)": lambda n: 10 + rng.standard_normal(n),
        "100 + N(0, 1)": lambda n: 100 + rng.standard_normal(n),
        "100 + 0.2 N(0, 1)": lambda n: 100 + 0.2 * rng.standard_normal(n),
        "1000 + N(0, 1)": lambda n: 1000 + rng.standard_normal(n),
    }
    print(f"candidates (median of 9 rows; cap {CAP}): exact / absolute (built in) / relative")
    for name, f in dists.items():
        for n, threads, k in ((4096, 512, 64), (8192, 512, 64), (4096, 256, 32)):
            r = np.median([candidates(f(n), threads, k) for _ in range(9)], axis=0)
            over = " (over the cap: the exact fallback)" if r[1] > CAP else ""
            print(f"{name:36s} {n:5d} blocks, {threads} threads, k {k:2d}: "
                  f"{r[0]:5.0f} / {r[1]:5.0f} / {r[2]:5.0f}{over}")


if __name__ == "__main__":
    main()
