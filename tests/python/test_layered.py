"""LayeredCache through the Python package (CPU, numpy): every layer equal to a KvStore, engine
pages written through block_table(), rollback, fork, strided K/V, and the C++ checks."""

import numpy as np
import pytest

import kvc
from conftest import randn, store_config


def layered_config(**kw):
    fields = dict(layer=store_config(), num_layers=3, max_rollback=4)
    fields.update(kw)
    return kvc.LayeredCacheConfig(**fields)


def test_every_layer_equals_a_kv_store(rng):
    cfg = layered_config()
    cache = kvc.LayeredCache(cfg)
    refs = [kvc.KvStore(cfg.layer) for _ in range(3)]
    slots = [cache.open_slot() for _ in range(2)]
    for r in refs:
        r.open_slot(), r.open_slot()
    k, v = randn(rng, (3, 50, 2, 64)), randn(rng, (3, 50, 2, 64))
    cache.ingest(0, k, v)
    for layer, r in enumerate(refs):
        r.ingest(0, k[layer], v[layer])
    for _ in range(12):
        k, v = randn(rng, (3, 2, 2, 64)), randn(rng, (3, 2, 2, 64))
        cache.append(slots, k, v)
        for layer, r in enumerate(refs):
            r.append(slots, k[layer], v[layer])
    for layer, r in enumerate(refs):
        assert cache.layer(layer).snapshot() == r.snapshot()
    assert cache.length(0) == 62 and cache.length(1) == 12
    # The objects take a layer like any store.
    q = randn(rng, (2, 1, 4, 64))
    att = kvc.AttentionBackend(kvc.AttentionConfig(num_q_heads=4, num_kv_heads=2, head_dim=64,
                                                   mode="dense"))
    np.testing.assert_array_equal(att.decode(cache.layer(1), slots, q),
                                  att.decode(refs[1], slots, q))


def test_rollback_and_fork(rng):
    cache = kvc.LayeredCache(layered_config())
    a, b = cache.open_slot(), cache.open_slot()
    cache.ingest(a, randn(rng, (3, 40, 2, 64)), randn(rng, (3, 40, 2, 64)))
    before = [cache.layer(layer).snapshot() for layer in range(3)]
    cache.begin_update([a], 3)  # speculative tokens
    for layer in range(3):
        cache.write(layer, randn(rng, (1, 3, 2, 64)), randn(rng, (1, 3, 2, 64)))
    cache.truncate(a, 40)
    assert [cache.layer(layer).snapshot() for layer in range(3)] == before
    with pytest.raises(kvc.Error, match="rollback floor"):
        cache.truncate(a, 30)
    cache.fork(a, b)
    s = cache.layer(2).snapshot()
    assert s[a] == s[b]


def test_engine_pages_and_strided_rows(rng):
    cfg = layered_config(pages=kvc.PageOwner.engine, max_rollback=0)
    cache = kvc.LayeredCache(cfg)
    table = cache.block_table()
    assert table.shape == (4, cfg.layer.max_blocks_per_slot())
    assert (table[-1] == cfg.layer.pool_blocks()).all() or (table[-1] == -1).all()
    slot = cache.open_slot()
    with pytest.raises(kvc.Error, match="block_table"):
        cache.begin_update([slot], 40)  # no page ids yet
    table[slot, :3] = [17, 3, 9]
    qkv = randn(rng, (5, 8, 64))  # fused rows: 4 q heads, 2 k heads, 2 v heads
    cache.begin_update([slot], 5)
    for layer in range(3):
        cache.write(layer, qkv[None, :, 4:6], qkv[None, :, 6:8])
    assert cache.length(slot) == 5
    assert cache.free_pages() == 0


def test_bad_layered_input(rng):
    cache = kvc.LayeredCache(layered_config())
    slot = cache.open_slot()
    with pytest.raises(kvc.Error, match="no update is pending"):
        cache.write(0, randn(rng, (1, 2, 64)), randn(rng, (1, 2, 64)))
    with pytest.raises(kvc.Error, match="num_layers = 3"):
        cache.ingest(slot, randn(rng, (2, 5, 2, 64)), randn(rng, (2, 5, 2, 64)))
    with pytest.raises(kvc.Error, match="read-only"):
        cache.layer(0).open_slot()
    with pytest.raises(kvc.Error, match="max_rollback = 99"):
        kvc.LayeredCache(layered_config(max_rollback=99))
    assert cache.length(slot) == 0


def test_ragged_update_in_one_call(rng):
    cfg = layered_config()
    cache = kvc.LayeredCache(cfg)
    refs = [kvc.KvStore(cfg.layer) for _ in range(3)]
    for _ in range(3):
        cache.open_slot()
        for r in refs:
            r.open_slot()
    counts = [30, 3, 1]  # a prefill chunk, verify rows, a decode row
    cache.begin_update([0, 2, 1], counts)
    rows = randn(rng, (3, sum(counts), 2, 64))
    for layer in range(3):
        cache.write(layer, rows[layer], rows[layer])
        at = 0
        for slot, n in zip([0, 2, 1], counts):
            refs[layer].ingest(slot, rows[layer, at:at + n], rows[layer, at:at + n])
            at += n
    for layer in range(3):
        assert cache.layer(layer).snapshot() == refs[layer].snapshot()
    with pytest.raises(kvc.Error, match="counts.size"):
        cache.begin_update([0, 1], [1])


def test_engine_owned_memory(rng):
    cfg = layered_config(pages=kvc.PageOwner.engine, max_rollback=0)
    pages = cfg.layer.pool_blocks()

    def aligned(nbytes, dtype):
        raw = np.zeros(nbytes + 256, np.uint8)
        off = (-raw.ctypes.data) % 256
        return raw[off:off + nbytes].view(dtype)

    pool = aligned(cfg.pool_bytes(pages), np.uint8)
    table = aligned(cfg.table_entries() * 4, np.int32)
    table[:] = -1
    cache = kvc.LayeredCache(cfg, pool=pool, block_table=table)
    assert cache.block_table().ctypes.data == table.ctypes.data  # the engine's own table
    slot = cache.open_slot()
    table[slot * cfg.layer.max_blocks_per_slot():][:4] = [5, 1, 7, 2]
    ref = kvc.KvStore(cfg.layer)
    ref.open_slot()
    k = randn(rng, (3, 50, 2, 64))
    cache.ingest(slot, k, k)
    ref.ingest(0, k[1], k[1])
    assert cache.layer(1).snapshot() == ref.snapshot()
    assert pool.any()  # the K/V landed in the engine's pool
    with pytest.raises(kvc.Error, match="pool holds"):
        kvc.LayeredCache(cfg, pool=pool[:100])
