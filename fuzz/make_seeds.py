#!/usr/bin/env python3
"""Writes the committed seed corpora fuzz/corpus/<target>/ (run from the repository root).

Each target reads its input front to back with fuzz::Input (fuzz/fuzz_common.h): u8/u16/u32
little-endian fields, zeros past the end. The helpers below write the same encodings, so every
seed is a meaningful starting point (a valid config, policy, model or GGUF file) that the fuzzer
then mutates. Re-running rewrites the same files.
"""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def u8(v):
    return struct.pack("<B", v & 0xFF)


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def f32(x):
    return struct.pack("<f", x)


def small(v):  # Input::biased_int: tag < 160, then u8 % (small_max + 1)
    return u8(0) + u8(v)


def raw_int(v):  # Input::biased_int: tag >= 230, then u32
    return u8(240) + u32(v)


def rng(v, lo=0):  # Input::range(lo, hi)
    return u32(v - lo)


def flt(x):  # Input::biased_float: tag >= 128, then the raw float
    return u8(200) + f32(x)


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def formats():
    # Decoders: mode odd, then (byte, scale, scale byte, half bits, float) records.
    rec = b""
    for byte, scale, sb, h, x in [(0x00, 1.0, 127, 0x3C00, 1.5), (0x7F, 0.5, 0xFF, 0x7E00, -0.0),
                                  (0x80, 3e-39, 0, 0x0001, 65520.0), (0xFE, 2.0, 254, 0x7C00, 1e-8),
                                  (0x4A, float("inf"), 253, 0xFFFF, 3.4e38)]:
        rec += u8(byte) + flt(scale) + u8(sb) + u16(h) + flt(x)
    write("formats", "decoders", u8(1) + rec)
    # Encoders: mode even, kind, n byte, fill byte, values.
    for kind, n in [(0, 64), (1, 64), (2, 64), (3, 128)]:
        vals = b"".join(flt((i - n / 2) * 0.37) for i in range(n + 32))
        write("formats", "encode_%d" % kind, u8(0) + u8(kind) + u8(n - 1) + u8(0) + vals)
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, 3.4028235e38]
    vals = b"".join(flt(specials[i % len(specials)]) for i in range(96))
    write("formats", "encode_special", u8(0) + u8(0) + u8(40) + u8(0) + vals)
    vals = b"".join(u8(0) + u8(i % 20) for i in range(64))  # tag < 64: special floats by index
    write("formats", "encode_extreme", u8(0) + u8(3) + u8(63) + u8(2) + vals)


def store_config():
    def cfg(hkv, dpick, slots, ctx, w, b, dtype, fmt, pool, summ):
        return (small(hkv) + u8(1) + u8(dpick) + small(slots) + small(ctx) + small(w) + small(b) +
                u8(dtype) + u8(fmt) + (u8(1) if pool == 0 else u8(0) + small(pool)) + u8(0) +
                u8(summ) + u8(1))  # 1: not a shard
    ops = b""
    # open, open, ingest 40 into slot 0, append to {0, 1}, ingest 3 into slot 1, reset 0, free 1
    ops += u8(0) + rng(0, -1) + u8(0) + rng(0, -1)
    ops += u8(1) + rng(0, -1) + rng(40)
    ops += u8(3) + rng(0, -1) + u8(2) + rng(0, -1) + rng(1, -1)
    ops += u8(1) + rng(1, -1) + rng(3)
    ops += u8(4) + rng(0, -1) + u8(5) + rng(1, -1)
    seed = u32(12345)
    # (fields, lengths count) -- f16 ring, q8 / fp16k_q4v / f16 / bf16 old blocks
    write("store_config", "q4v", cfg(2, 0, 2, 200, 16, 8, 0, 3, 0, 7) + u8(0) + seed + ops)
    write("store_config", "q8", cfg(1, 0, 3, 120, 8, 4, 0, 2, 0, 1) + u8(0) + seed + ops)
    write("store_config", "f16_pool", cfg(2, 0, 2, 100, 4, 8, 0, 0, 6, 5) + u8(0) + seed + ops)
    write("store_config", "bf16", cfg(1, 0, 2, 90, 10, 3, 1, 1, 0, 3) + u8(0) + seed + ops)
    shard = cfg(2, 0, 2, 200, 16, 4, 0, 2, 0, 7)[:-1] + u8(0) + u8(1) + u8(2) + u8(1) + u8(1)
    write("store_config", "shard_1_of_3", shard + u8(0) + seed + ops)
    lens = u8(2) + u8(1) + rng(50) + u8(1) + rng(7)
    write("store_config", "lengths", cfg(4, 1, 3, 250, 32, 16, 0, 3, 0, 1) + lens)
    big = (raw_int(256) + u8(1) + u8(3) + raw_int(65536) + raw_int(1 << 29) + raw_int(1 << 29) +
           small(1) + u8(0) + u8(3) + u8(1) + u8(0) + u8(1) + u8(1))
    write("store_config", "huge", big)


def selector():
    def policy(kind, order, k, radius, delta, mn, mx, anchors, include, exclude, p, scale):
        def ids(v):
            return u8(len(v)) + b"".join(u8(1) + u8(i) for i in v)
        out = u8(kind) + u8(order) + small(k) + u8(1) + u8(radius)
        out += u8(1) + u8(int(delta * 4))
        out += small(mn) + (u8(1) if mx is None else u8(0) + small(mx))
        out += ids(anchors) + ids(include) + ids(exclude)
        out += u8(1) + u8(int(p * 10) - 1) + (u8(1) if scale == 1.0 else u8(0) + flt(scale))
        return out

    def scores(rows, max_blocks, nv, values, ties=False):
        out = u8(rows) + u8(1) + u8(max_blocks) + u8(1 if ties else 0)
        for v in values:
            out += u8(v % 4) if ties else flt(v)
        for n in nv:
            out += u8(1) + rng(n)
        return out + u8(0) + u8(1)  # slack 0, with report
    vals = [float(x % 7) - 3 for x in range(2 * 12)]
    vals[3] = float("nan")
    vals[5] = float("inf")
    vals[8] = -0.0
    for kind in range(9):
        pol = policy(kind, kind % 3, 3, 1, 0.5, 1, 6, [0, 5], [2], [1], 0.8, 1.0)
        write("selector", "kind_%d" % kind, pol + scores(2, 12, [12, 7], vals))
    pol = policy(4, 0, 2, 2, 1.0, 0, None, [0], [], [], 0.9, 1.0)
    write("selector", "ties", pol + scores(3, 10, [10, 10, 0], list(range(30)), ties=True))


def planner():
    def layer(kind, count, w, b, fmt, summ, ratio, window, efmt, idx_dim, idx_fmt, csb):
        return (u8(kind) + u8(1) + u8(count - 1) + small(w) + small(b) + u8(fmt) + u8(summ) +
                small(ratio) + small(window) + u8(efmt) + (u8(1) if idx_dim == 128 else
                                                          u8(0) + small(idx_dim)) +
                u8(idx_fmt) + small(csb))
    def model(hkv, dpick, dtype, layers, context, batch):
        out = small(hkv) + u8(1) + u8(dpick) + u8(dtype) + u8(1) + u8(len(layers))
        for l in layers:
            out += l
        out += u8(1) + small(context) + small(batch)
        return out
    dense = layer(0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
    bsel = layer(1, 2, 32, 16, 3, 7, 0, 0, 0, 0, 0, 0)
    swin = layer(2, 1, 0, 0, 0, 1, 0, 64, 0, 0, 0, 4)
    csa = layer(3, 3, 0, 0, 0, 1, 4, 128, 0, 128, 4, 4)
    hca = layer(4, 2, 0, 0, 0, 1, 128, 128, 1, 0, 4, 4)
    write("planner", "llama_like", model(8, 1, 1, [dense, bsel], 200, 2))
    write("planner", "dsv4_like", model(1, 3, 1, [swin, csa, hca], 250, 1))
    write("planner", "mixed", model(2, 0, 0, [dense, bsel, swin, csa, hca], 100, 3))


def gguf():
    def s(x):
        x = x.encode()
        return u64(len(x)) + x

    def kv(key, vtype, payload):
        return s(key) + u32(vtype) + payload

    def arr(etype, items):
        return u32(etype) + u64(len(items)) + b"".join(items)

    tokens = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["ab", "abc", "<|im_end|>"]
    meta = [
        kv("general.architecture", 8, s("llama")),
        kv("general.alignment", 4, u32(32)),
        kv("llama.context_length", 4, u32(128)),
        kv("llama.rope.freq_base", 6, f32(10000.0)),
        kv("some.bool", 7, u8(1)),
        kv("some.i64", 11, u64(-5)),
        kv("some.f64", 12, struct.pack("<d", 0.5)),
        kv("some.nested", 9, arr(9, [arr(5, [u32(1), u32(2)]), arr(5, [])])),
        kv("tokenizer.ggml.model", 8, s("gpt2")),
        kv("tokenizer.ggml.tokens", 9, arr(8, [s(t) for t in tokens])),
        kv("tokenizer.ggml.token_type", 9, arr(5, [u32(3 if t.startswith("<") else 1)
                                                    for t in tokens])),
        kv("tokenizer.ggml.merges", 9, arr(8, [s("a b"), s("ab c")])),
        kv("tokenizer.ggml.eos_token_id", 4, u32(len(tokens) - 1)),
    ]
    # Tensors: f32 [4], f16 [8], bf16 [2, 4], q8_0 [32, 2], q4_0 [32], q4_1 [64].
    tensors = [("t.f32", [4], 0, 16), ("t.f16", [8], 1, 16), ("t.bf16", [4, 2], 30, 16),
               ("t.q8_0", [32, 2], 8, 68), ("t.q4_0", [32], 2, 18), ("t.q4_1", [64], 3, 40)]
    infos = b""
    data = b""
    for name, dims, ttype, nbytes in tensors:
        off = len(data)
        infos += s(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ttype) + u64(off)
        blob = bytes((i * 37 + 11) & 0xFF for i in range(nbytes))
        if ttype in (2, 3, 8):  # keep the f16 scales finite
            blob = b"\x00\x3c" + blob[2:]
        data += blob + b"\x00" * ((-len(blob)) % 32)
    head = b"GGUF" + u32(3) + u64(len(tensors)) + u64(len(meta)) + b"".join(meta) + infos
    head += b"\x00" * ((-len(head)) % 32)
    write("gguf", "small_v3", head + data)
    write("gguf", "header_only", b"GGUF" + u32(2) + u64(0) + u64(0))
    write("gguf", "metadata_only", b"GGUF" + u32(3) + u64(0) + u64(len(meta)) +
          b"".join(meta))


def dsv4():
    # fuzz_dsv4: a mode byte (0 configs, 1 entry codec, 2 store, 3 compressor), then the fields
    # in the order fuzz_dsv4.cpp reads them.
    def flag(b):
        return u8(1 if b else 0)

    def pick(i):  # Input::pick: one byte
        return u8(i)

    def slots(v):  # read_slots: a count byte, then Input::range(-1, max_slots) each
        return u8(len(v)) + b"".join(rng(x, -1) for x in v)

    # 0: store config (format, dim pick, slots, entries, page pick, num_pages 0, ring), the
    # factories (ratio 4, context 2^20, window 128), compressor, indexer, attention fields.
    def configs(fmt, dim_index, entries, ring):
        d = u8(0) + u8(fmt) + flag(1) + pick(dim_index) + small(2) + raw_int(entries)
        d += flag(1) + pick(0) + flag(1) + flag(ring)
        d += flag(1) + flag(1) + flag(1) + small(128)
        d += small(8) + small(2) + flag(1) + flag(1) + small(64) + flag(0)
        d += small(64) + small(4) + small(1) + small(1) + flag(1)
        d += small(64) + flag(1) + flag(0) + small(1) + small(1) + raw_int(512)
        return d

    write("dsv4", "config_bf16_csa", configs(0, 0, 262144, 0))
    write("dsv4", "config_model1_ring", configs(1, 0, 128, 1))
    write("dsv4", "config_mxfp4_keys", configs(2, 1, 262144, 0))
    write("dsv4", "config_fp8_keys", configs(3, 2, 8192, 0))

    # 1: entry codec: format, (dim), page 16, offset, scale exponent, values.
    def codec(fmt, dim_byte, values):
        d = u8(1) + u8(fmt) + dim_byte + u8(0) + u8(3) + u8(32)
        return d + b"".join(u8(100) + flt(x) for x in values)

    ramp = [((i * 37) % 101 - 50) / 8.0 for i in range(512)]
    write("dsv4", "codec_model1", codec(1, b"", ramp))
    write("dsv4", "codec_mxfp4_128", codec(2, flag(1), ramp[:128]))
    write("dsv4", "codec_fp8_64", codec(3, flag(0), ramp[:64]))
    write("dsv4", "codec_bf16_outliers", codec(0, u8(3), [x * 1e30 if i % 9 == 0 else x
                                                         for i, x in enumerate(ramp[:128])]))

    # 2: store: format, (dim), (ring), slots-1, entries-1, page/16-1, num_pages 0, then ops:
    # append (op 0: slots, T, width byte, bf16 flag, values), reserve (2), reset (3).
    def append(sl, t, values_per_entry):
        d = u8(0) + slots(sl) + rng(t, -1) + u8(200) + flag(0)
        return d + b"".join(u8(100) + u8(v & 0xFF) for v in range(len(sl) * t * values_per_entry))

    store = u8(2) + u8(3) + flag(1) + u8(2) + u8(70) + u8(0) + flag(1)
    store += append([0, 2], 3, 128) + append([1], 20, 128) + u8(3) + slots([2]) + append([2], 1, 128)
    write("dsv4", "store_fp8_three_slots", store)
    ring = u8(2) + u8(0) + u8(1) + flag(1) + u8(1) + u8(47) + u8(0) + flag(1)
    ring += append([0, 1], 30, 64) + append([1], 25, 64) + u8(2) + slots([0, 1]) + rng(20, -1) + rng(30, -1)
    write("dsv4", "store_bf16_ring", ring)

    # 3: compressor: ratio flag, head_dim, slots-1, context/ratio-1, max_tokens-1, batch, rms,
    # rope, rope_dim/2-1, (hadamard), (format flags), store flag, seed, then steps (slots, op
    # byte, T, width byte).
    def step(sl, t):
        return slots(sl) + u8(1) + rng(t) + u8(200)

    comp4 = u8(3) + flag(1) + pick(1) + u8(1) + u8(11) + u8(63) + u8(1) + flag(1) + flag(1)
    comp4 += u8(31) + flag(1) + flag(1) + flag(1) + flag(1) + u32(7)
    comp4 += step([0, 1], 9) + step([1], 1) + step([0], 30) + step([1, 0], 2)
    write("dsv4", "compressor_r4_indexer_mxfp4", comp4)
    comp128 = u8(3) + flag(0) + flag(1) + u8(0) + u8(3) + u8(63) + u8(0) + flag(1) + flag(0)
    comp128 += u8(31) + flag(0) + flag(0) + flag(1) + u32(9)
    comp128 += step([0], 60) + step([0], 70) + step([0], 3) + step([0], 64)
    write("dsv4", "compressor_r128", comp128)


def block_index():
    # fuzz_block_index.cpp: the store (kv heads - 1, block flag (1: 8), window / block - 1, old
    # format pick (0 f16, 1 q8, 2 fp16k_q4v), min/max flag, index-copy flag, mxfp4 flag), two
    # sequences (length, specials count), then the index (group - 1, score byte, sum flag,
    # shared flag, old-blocks flag, max T - 1, store-pitch flag, small-candidates flag and byte,
    # candidate score byte, auto-kernel flag, T - 1, two-slots flag, pitch flag) and the queries.
    def seed(old, minmax, score, shared, keys_old, candidates, first, t):
        store = u8(1) + u8(1) + u8(1) + u8(old) + u8(minmax) + u8(1) + u8(1)
        store += rng(150) + u8(0) + rng(90) + u8(0)
        index = u8(1) + u8(score) + u8(1) + u8(shared) + u8(keys_old) + u8(t - 1) + u8(1)
        index += u8(1) + u8(candidates) + u8(first) + u8(1) + u8(t - 1) + u8(1) + u8(0)
        queries = b"".join(u16(0x3000 + (i * 37) % 0x1000 | (0x8000 if i % 3 == 0 else 0))
                           for i in range(2 * t * 4 * 64))
        return store + index + queries

    write("block_index", "two_stage_mean_k", seed(2, 1, 3, 0, 0, 4, 0, 1))
    write("block_index", "two_stage_quest_shared", seed(2, 1, 3, 1, 0, 3, 1, 2))
    write("block_index", "two_stage_old_blocks_q8", seed(1, 0, 3, 0, 1, 6, 0, 1))
    write("block_index", "one_stage_token_max", seed(0, 1, 2, 0, 0, 0, 0, 3))
    write("block_index", "quest", seed(2, 1, 1, 0, 0, 0, 0, 1))


if __name__ == "__main__":
    formats()
    store_config()
    selector()
    planner()
    gguf()
    dsv4()
    block_index()
