"""KvStore through the Python package (CPU, numpy): ingest and append, the stored bytes, and the
same argument checks as C++ (kvc.Error naming the argument, store unchanged)."""

import numpy as np
import pytest

import kvc
from conftest import randn, store_config


def stored_keys(state, cfg):
    """K of every token of a slot in position order [L, Hkv, d] from a snapshot (f16 format)."""
    H, d, W, B = cfg.num_kv_heads, cfg.head_dim, cfg.recent_window, cfg.block_size
    L = state.length
    old = max(0, L - W)
    ring = np.frombuffer(state.ring_k, np.float16).reshape(H, L - old, d).transpose(1, 0, 2)
    blocks = (old + B - 1) // B
    olds = np.zeros((old, H, d), np.float16)
    raw = np.frombuffer(state.old_k, np.float16)
    at = 0
    for b in range(blocks):
        rows = min(B, old - b * B)
        chunk = raw[at:at + H * rows * d].reshape(H, rows, d)
        olds[b * B:b * B + rows] = chunk.transpose(1, 0, 2)
        at += H * rows * d
    return np.concatenate([olds, ring])


@pytest.mark.parametrize("fmt", ["f16", "q8", "fp16k_q4v"])
def test_ingest_equals_appends(rng, fmt):
    cfg = store_config(old_format=fmt)
    a, b = kvc.KvStore(cfg), kvc.KvStore(cfg)
    sa, sb = a.open_slot(), b.open_slot()
    T = 77
    k = randn(rng, (T, 2, 64))
    v = randn(rng, (T, 2, 64))
    a.ingest(sa, k, v)
    for t in range(T):
        b.append([sb], k[t:t + 1], v[t:t + 1])
    assert a.length(sa) == b.length(sb) == T
    assert a.num_closed_blocks(sa) == (T - 24) // 8
    assert a.snapshot() == b.snapshot()


def test_stored_bytes_are_the_input(rng):
    cfg = store_config()
    s = kvc.KvStore(cfg)
    slot = s.open_slot()
    k = randn(rng, (61, 2, 64))
    s.ingest(slot, k, randn(rng, (61, 2, 64)))
    np.testing.assert_array_equal(stored_keys(s.snapshot()[slot], cfg), k)


def test_batched_append_and_lifecycle(rng):
    s = kvc.KvStore(store_config())
    slots = [s.open_slot() for _ in range(3)]
    assert slots == [0, 1, 2]
    s.ingest(1, randn(rng, (40, 2, 64)), randn(rng, (40, 2, 64)))
    s.append([2, 0], randn(rng, (2, 2, 64)), randn(rng, (2, 2, 64)))
    assert [s.length(i) for i in slots] == [1, 40, 1]
    used = s.free_pool_blocks()
    s.reset(1)
    assert s.length(1) == 0 and s.free_pool_blocks() > used
    s.free(1)
    assert not s.is_open(1)
    assert s.open_slot() == 1


def test_footprint_matches_compute_footprint(rng):
    cfg = store_config(old_format="q8")
    s = kvc.KvStore(cfg)
    slot = s.open_slot()
    s.ingest(slot, randn(rng, (50, 2, 64)), randn(rng, (50, 2, 64)))
    f = s.footprint()
    g = kvc.compute_footprint(cfg, [50, 0, 0])
    assert (f.total(), f.in_use, f.tokens) == (g.total(), g.in_use, 50)
    assert f.dense_equivalent_bytes == 50 * 2 * 64 * 2 * 2


def test_read_only_arrays_are_accepted(rng):
    s = kvc.KvStore(store_config())
    k = randn(rng, (5, 2, 64))
    k.setflags(write=False)
    s.ingest(s.open_slot(), k, k)
    assert s.length(0) == 5


def expect_error(fn, *words):
    with pytest.raises(kvc.Error) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


def test_bad_input_raises_and_changes_nothing(rng):
    cfg = store_config(max_slots=2, num_pool_blocks=3)
    s = kvc.KvStore(cfg)
    slot = s.open_slot()
    s.ingest(slot, randn(rng, (30, 2, 64)), randn(rng, (30, 2, 64)))
    before = s.snapshot()
    k = randn(rng, (1, 2, 64))
    expect_error(lambda: s.append([slot], k.astype(np.float32), k), "k.dtype = f32", "f16")
    expect_error(lambda: s.append([slot], randn(rng, (1, 3, 64)), k), "k.shape", "[1, 2, 64]")
    expect_error(lambda: s.append([slot, slot], np.concatenate([k, k]), np.concatenate([k, k])),
                 "appears twice")
    expect_error(lambda: s.append([1], k, k), "slots[0] = 1", "not an open slot")
    expect_error(lambda: s.append([7], k, k), "slots[0] = 7", "max_slots = 2")
    expect_error(lambda: s.ingest(slot, randn(rng, (131, 2, 64)), randn(rng, (131, 2, 64))),
                 "exceeds max_context = 160")
    expect_error(lambda: s.ingest(slot, randn(rng, (40, 2, 64)), randn(rng, (40, 2, 64))),
                 "pool exhausted")
    strided = randn(rng, (4, 2, 128))[:, :, ::2]
    expect_error(lambda: s.ingest(slot, strided, strided), "k must be contiguous")
    expect_error(lambda: s.length(5), "slot = 5")
    assert s.snapshot() == before


def test_bad_config_and_device():
    expect_error(lambda: kvc.KvStore(store_config(head_dim=96)), "head_dim = 96")
    expect_error(lambda: kvc.KvStore(store_config(recent_window=0)), "recent_window = 0")
    expect_error(lambda: kvc.KvStore(store_config(), "tpu"), "device = 'tpu'")
    if not kvc.cuda_enabled:
        expect_error(lambda: kvc.KvStore(store_config(), "cuda:0"), "needs kvc built with CUDA")
    else:
        expect_error(lambda: kvc.KvStore(store_config(), "cuda:99"), "cuda:99")
    with pytest.raises(AttributeError):
        kvc.KvStoreConfig(no_such_field=1)
    # kvc.Error is a ValueError: generic handlers catch it.
    assert issubclass(kvc.Error, ValueError)


def test_unsupported_dtypes_are_named():
    s = kvc.KvStore(store_config())
    slot = s.open_slot()
    k = np.zeros((1, 2, 64), np.float64)
    expect_error(lambda: s.append([slot], k, k), "k.dtype", "float16, bfloat16")
    k = np.zeros((1, 2, 64, 1, 1, 1), np.float16)
    expect_error(lambda: s.append([slot], k, k), "k.ndim = 6")
