"""DeepSeek-V4 compressed attention (kvc/dsv4/): entry stores over kvc's or the engine's pages,
the compressor, the lightning indexer and its top-k, and CSA / HCA sparse attention.

The same objects and checks as the C++ library (bad arguments raise kvc.Error before anything
runs, with nothing changed). Outputs are allocated like the inputs (numpy in, numpy out; torch
in, torch out on the same device) unless given; work on CUDA tensors is ordered on torch's
current stream. numpy has no bfloat16: pass bf16 inputs from numpy as their bit patterns in a
uint16 array (kvc.to_bf16_bits).

A decode step of one CSA layer, all on one device::

    keys = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.mxfp4, 128, 4,
                                                            max_context, slots), device)
    scores, num_valid = indexer.score(keys, slots, lengths, q_index, weights)
    ids, counts = dsv4.select_topk(selector, scores, num_valid, 512)
    out = attention.forward(ring, entries, slots, lengths, q, indices=ids, sink=sink)
"""

import numpy as np

from . import _kvc
from ._arrays import array_like, device_name, empty_like, stream_of

_d = _kvc.dsv4

EntryFormat = _d.EntryFormat
EntryStoreConfig = _d.EntryStoreConfig
EntryStoreFootprint = _d.EntryStoreFootprint
PageLayout = _d.PageLayout
CompressorConfig = _d.CompressorConfig
IndexerConfig = _d.IndexerConfig
SparseAttentionConfig = _d.SparseAttentionConfig
compute_footprint = _d.compute_footprint
MAX_CONTEXT = _d.MAX_CONTEXT
MAX_ENTRIES_PER_SLOT = _d.MAX_ENTRIES_PER_SLOT


def _slots(slots):
    return [int(s) for s in slots]


class _Wrapped:
    """The C++ object in `impl`; every method not defined here (count, free_pages, reset,
    reserve, footprint, length, state_bytes, ...) is the C++ one, unchanged."""

    def __getattr__(self, name):
        if name == "impl":  # not yet set: __init__ failed
            raise AttributeError(name)
        return getattr(self.impl, name)


class EntryStore(_Wrapped):
    """A paged store of DeepSeek-V4 entries of one layer kind (kvc/dsv4/entry_store.h):
    compressed main entries, indexer keys, or the window ring."""

    def __init__(self, config, device="cpu"):
        self.impl = _d.EntryStore(config, device_name(device))

    @classmethod
    def on_pages(cls, config, device, pool, block_table):
        """A store over engine-owned memory: pool, a 1-D uint8 array (its whole
        config.page_bytes() pages are the pool), and block_table [max_slots, pitch] int32 that
        the engine fills with page ids before kvc writes a row. The store keeps references."""
        store = cls.__new__(cls)
        store.impl = _d.EntryStore.on_pages(config, device_name(device), pool, block_table)
        store._engine_memory = (pool, block_table)
        return store

    def append(self, slots, x):
        """Appends x [len(slots), T, dim] (f32, or bf16) to the slots, encoded in the store's
        format (a ring keeps the last W tokens)."""
        self.impl.set_stream(stream_of(x))
        self.impl.append(_slots(slots), x)

    def read_entry(self, slot, e):
        """Entry (ring: token) e of `slot`, decoded: a float32 numpy array of dim values."""
        return np.asarray(self.impl.read_entry(int(slot), int(e)), dtype=np.float32)

    def physical_entries(self, slots, T, ids, out=None):
        """The pool rows (page id x page_entries + row in its page; -1 for none) of a selection
        ids [len(slots) * T, k] int32 over entries, on the store's device: the index rows
        FlashMLA's sparse kernels take with kvc's pages. Returns out, int32 of ids' shape."""
        if out is None:
            out = empty_like(ids, ids.shape, "i32")
        self.impl.set_stream(stream_of(ids))
        self.impl.physical_entries(array_like(ids, _slots(slots), "i32"), int(T), ids, out)
        return out


class Compressor(_Wrapped):
    """DeepSeek-V4's gated pooling of `ratio` tokens into one entry, with an incremental state
    per slot; token by token, a prefill and chunked prefill give the same bits
    (kvc/dsv4/compressor.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _d.Compressor(config, device_name(device))

    def append(self, slots, kv, score, ape, *, norm_weight=None, rope_cos=None, rope_sin=None,
               store=None, out=None, return_entries=False):
        """Appends T tokens to each slot (kv, score [len(slots), T, width] f32; ape [ratio, width]
        f32) and produces every entry they complete: into `store` (an EntryStore), and into `out`
        [len(slots), T // ratio + 1, head_dim] f32 (allocated with return_entries) after the
        epilogue. Returns out, or None."""
        if out is None and return_entries:
            out = empty_like(kv, (kv.shape[0], kv.shape[1] // self.config.ratio + 1,
                                  self.config.head_dim), "f32")
        store_impl = getattr(store, "impl", store)
        self.impl.set_stream(stream_of(kv))
        self.impl.append(_slots(slots), kv, score, ape, norm_weight, rope_cos, rope_sin,
                         store_impl, out)
        return out

    def state(self, slot):
        """The slot's state (kv, score + ape), each [state_rows, width] float32 numpy:
        DeepSeek's kv_state / score_state layout."""
        kv, score = self.impl.state(int(slot))
        shape = (self.config.state_rows(), self.config.width())
        return (np.asarray(kv, dtype=np.float32).reshape(shape),
                np.asarray(score, dtype=np.float32).reshape(shape))


class Indexer(_Wrapped):
    """The lightning indexer I[t, j] = sum_h w_h ReLU(q_h . k_j) over mxfp4 or fp8 keys
    (kvc/dsv4/indexer.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _d.Indexer(config, device_name(device))

    def score(self, keys, slots, lengths, q, weights, *, rope_cos=None, rope_sin=None,
              scores=None, num_valid=None):
        """Scores of every visible entry of `keys` for q [batch, T, H, head_dim] bf16 with
        weights [batch, T, H] f32; lengths[b] counts sequence b's tokens, its T queries
        included. Returns (scores [batch * T, max_entries] f32, num_valid [batch * T] i32);
        scores past num_valid[row] are not written."""
        keys_impl = getattr(keys, "impl", keys)
        rows = int(q.shape[0]) * int(q.shape[1]) if len(q.shape) > 1 else 0
        if scores is None:
            scores = empty_like(q, (rows, keys_impl.config.max_entries), "f32")
        if num_valid is None:
            num_valid = empty_like(q, (rows,), "i32")
        self.impl.set_stream(stream_of(q))
        self.impl.score(keys_impl, _slots(slots), [int(n) for n in lengths], q, weights, scores,
                        num_valid, rope_cos, rope_sin)
        return scores, num_valid


def select_topk(selector, scores, num_valid, k, sorted=True, ids=None, counts=None):
    """The top-k entries of each row of indexer scores with a kvc.Selector on their device: ids
    [rows, k] int32 (descending score, or ascending id when not sorted; ties to the lower id,
    NaN last; -1 past the visible entries) and counts [rows] int32."""
    rows = scores.shape[0]
    if ids is None:
        ids = empty_like(scores, (rows, int(k)), "i32")
    if counts is None:
        counts = empty_like(scores, (rows,), "i32")
    impl = getattr(selector, "impl", selector)
    impl.set_stream(stream_of(scores))
    _d.select_topk(impl, scores, num_valid, int(k), bool(sorted), ids, counts)
    return ids, counts


class SparseAttention(_Wrapped):
    """CSA / HCA attention of H query heads over one latent per row, from the window ring and
    the entry store (kvc/dsv4/sparse_attention.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _d.SparseAttention(config, device_name(device))

    def forward(self, ring, entries, slots, lengths, q, *, indices=None, window_chunk=None,
                sink=None, out=None, lse=None, return_lse=False, out_dtype="f32"):
        """Attention of q [batch, T, H, d] bf16: CSA reads the entries of indices
        [batch * T, k] int32 (-1 = skip), HCA every visible one; window_chunk [batch, C, d] bf16
        holds a prefill chunk's rows not yet in the ring; sink [H] f32 per-head sink logits.
        Returns out [batch, T, H, d] (out_dtype 'f32' or 'bf16'), or (out, lse [batch, T, H]
        f32) with return_lse or an lse given."""
        if out is None:
            out = empty_like(q, q.shape, out_dtype)
        if lse is None and return_lse:
            lse = empty_like(q, q.shape[:3], "f32")
        self.impl.set_stream(stream_of(q))
        self.impl.forward(getattr(ring, "impl", ring), getattr(entries, "impl", entries),
                          _slots(slots), [int(n) for n in lengths], q, out, lse, window_chunk,
                          indices, sink)
        return (out, lse) if lse is not None else out


__all__ = [
    "Compressor",
    "CompressorConfig",
    "EntryFormat",
    "EntryStore",
    "EntryStoreConfig",
    "EntryStoreFootprint",
    "Indexer",
    "IndexerConfig",
    "MAX_CONTEXT",
    "MAX_ENTRIES_PER_SLOT",
    "PageLayout",
    "SparseAttention",
    "SparseAttentionConfig",
    "compute_footprint",
    "select_topk",
]
