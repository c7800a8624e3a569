"""The kvc objects with Python conveniences: outputs allocated like the inputs, work on CUDA
tensors ordered on torch's current stream. Each class holds the C++ object in `impl`; every
check (shapes, dtypes, devices, slots, lengths, pool space) is the C++ one."""

from . import _kvc
from ._arrays import device_name, empty_like, stream_of


class _SlotObject:
    """What KvStore and LayeredCache share: the C++ object in `impl`; every method not defined
    here (open_slot, reset, free, is_open, length, footprint, snapshot, truncate, fork, ...)
    is the C++ one, unchanged."""

    def __getattr__(self, name):
        if name == "impl":  # not yet set: __init__ failed
            raise AttributeError(name)
        return getattr(self.impl, name)


class KvStore(_SlotObject):
    """One layer's compressed KV cache (kvc/store/kv_store.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _kvc.KvStore(config, device_name(device))

    def append(self, slots, k, v):
        """One token to each of `slots`: k, v [len(slots), Hkv, d] in the store's dtype."""
        self.impl.set_stream(stream_of(k))
        self.impl.append([int(s) for s in slots], k, v)

    def ingest(self, slot, k, v):
        """A chunk of T tokens to one slot: k, v [T, Hkv, d]."""
        self.impl.set_stream(stream_of(k))
        self.impl.ingest(int(slot), k, v)


class BlockIndex:
    """Block scores from a store's summaries (kvc/index/block_index.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _kvc.BlockIndex(config, device_name(device))

    @property
    def config(self):
        return self.impl.config

    def score(self, store, slots, q, scores=None, num_valid=None):
        """Scores of q [batch, T, Hq, d] against every closed block of each slot. Returns
        (scores [rows, max_blocks_per_slot] f32, num_valid [rows] i32), rows =
        config.rows(batch, T); entries past num_valid[row] are unspecified."""
        store_impl = getattr(store, "impl", store)
        slots = [int(s) for s in slots]
        rows = self.config.rows(len(slots), q.shape[1] if len(q.shape) > 1 else 0)
        if scores is None:
            scores = empty_like(q, (rows, store_impl.config.max_blocks_per_slot()), "f32")
        if num_valid is None:
            num_valid = empty_like(q, (rows,), "i32")
        self.impl.set_stream(stream_of(q))
        self.impl.score(store_impl, slots, q, scores, num_valid)
        return scores, num_valid


class Selector:
    """Batched block selection (kvc/select/selector.h)."""

    def __init__(self, device="cpu", limits=None):
        self.impl = _kvc.Selector(device_name(device), limits)

    @property
    def device(self):
        return self.impl.device

    def select(self, scores, num_valid, policy, ids=None, counts=None):
        """The policy's ids per row of scores [rows, max_blocks] with num_valid [rows]. Returns
        (ids [rows, policy.max_output(max_blocks)] i32 padded with -1, counts [rows] i32)."""
        rows, max_blocks = scores.shape
        if ids is None:
            ids = empty_like(scores, (rows, policy.max_output(max_blocks)), "i32")
        if counts is None:
            counts = empty_like(scores, (rows,), "i32")
        self.impl.set_stream(stream_of(scores))
        self.impl.select(scores, num_valid, policy, ids, counts)
        return ids, counts


class AttentionBackend:
    """Decode attention in every mode (kvc/attention/attention.h)."""

    def __init__(self, config, device="cpu"):
        self.impl = _kvc.AttentionBackend(config, device_name(device))

    @property
    def config(self):
        return self.impl.config

    @property
    def device(self):
        return self.impl.device

    def _outputs(self, q, out, lse, return_lse, out_dtype):
        if out is None:
            out = empty_like(q, q.shape, out_dtype or self.config.dtype.name)
        if lse is None and return_lse:
            lse = empty_like(q, q.shape[:3], "f32")
        return out, lse

    def decode(self, store, slots, q, ids=None, counts=None, *, sink=None, out=None, lse=None,
               return_lse=False, shared_across_heads=False, out_dtype=None):
        """Attention of q [batch, T, Hq, d] over the store's slots in config.mode; the select
        modes read the selection (ids, counts) of Selector.select. Returns out [batch, T, Hq, d]
        (config dtype, or out_dtype 'f32'), or (out, lse) with return_lse or an lse given."""
        store_impl = getattr(store, "impl", store)
        out, lse = self._outputs(q, out, lse, return_lse, out_dtype)
        self.impl.set_stream(stream_of(q))
        self.impl.decode(store_impl, [int(s) for s in slots], q, out, lse, ids, counts,
                         shared_across_heads, sink)
        return (out, lse) if lse is not None else out

    def dense_decode(self, q, k, v, lengths, *, window=0, sink=None, out=None, lse=None,
                     return_lse=False, out_dtype=None):
        """Exact attention of q [batch, T, Hq, d] over a plain cache k, v [batch, Hkv, N, d]
        holding lengths[b] tokens; window > 0 keeps the last `window` positions."""
        out, lse = self._outputs(q, out, lse, return_lse, out_dtype)
        self.impl.set_stream(stream_of(q))
        self.impl.dense_decode(q, k, v, [int(n) for n in lengths], out, lse, window, sink)
        return (out, lse) if lse is not None else out


def merge_states(out_a, lse_a, out_b, lse_b, out=None, lse=None):
    """The merge of two partial states over disjoint token sets (kvc/attention/merge.h):
    out_* [n, d] f32, lse_* [n] f32. Returns (out, lse); out may be out_a or out_b."""
    if out is None:
        out = empty_like(out_a, out_a.shape, "f32")
    if lse is None:
        lse = empty_like(lse_a, lse_a.shape, "f32")
    _kvc.merge_states(out_a, lse_a, out_b, lse_b, out, lse, stream_of(out_a))
    return out, lse


def merge_states_inplace(out, lse, out_b, lse_b):
    """Accumulates (out_b, lse_b) into the running state (out, lse); start from lse = -inf,
    out = 0."""
    _kvc.merge_states_inplace(out, lse, out_b, lse_b, stream_of(out))
    return out, lse


class LayeredCache(_SlotObject):
    """Every layer's compressed KV cache in one object (kvc/store/layered_cache.h): one pool,
    one set of lengths and block tables for all layers; begin_update() once per step, write()
    per layer, layer(l) for BlockIndex / AttentionBackend; truncate() and fork()."""

    def __init__(self, config, device="cpu", *, pool=None, block_table=None, ring=None):
        """pool, block_table, ring: engine-owned memory (torch tensors or numpy arrays on the
        cache's device, contiguous, 256-byte aligned) of at least config.pool_bytes(pages),
        config.table_entries() int32 and config.ring_bytes() bytes; kvc allocates what is
        None. The cache keeps references to them."""
        self.impl = _kvc.LayeredCache(config, device_name(device), pool, block_table, ring)
        self._engine_memory = (pool, block_table, ring)

    def begin_update(self, slots, counts=1):
        """Advances the lengths of `slots` by `counts` (one int for all, or one per slot: a
        ragged update of decode rows, verify rows and prefill chunks) and assigns pages, for
        every layer. write() then takes packed rows [sum(counts), Hkv, d]."""
        slots = [int(s) for s in slots]
        if isinstance(counts, int):
            self.impl.begin_update(slots, counts)
        else:
            self.impl.begin_update(slots, [int(c) for c in counts])

    def write(self, layer, k, v):
        """Layer `layer`'s K/V of the update begun: packed rows [sum(counts), Hkv, d] (or
        [len(slots), count, Hkv, d] when every count is the same); strided rows (a fused QKV
        output) are accepted."""
        self.impl.set_stream(stream_of(k))
        self.impl.write(int(layer), k, v)

    def append(self, slots, k, v):
        """One token per slot in every layer: k, v [L, len(slots), Hkv, d]."""
        self.impl.set_stream(stream_of(k))
        self.impl.append([int(s) for s in slots], k, v)

    def ingest(self, slot, k, v):
        """A prefill chunk in every layer: k, v [L, T, Hkv, d]."""
        self.impl.set_stream(stream_of(k))
        self.impl.ingest(int(slot), k, v)

    def layer(self, layer):
        """Layer `layer` as a read-only KvStore (pass it to BlockIndex.score, decode, ...)."""
        return self.impl.layer(int(layer))

    def block_table(self):
        """The block table [max_slots + 1, max_blocks_per_slot] int32 over the cache's own memory
        (a numpy array for a CPU cache, a torch tensor for a CUDA one): with PageOwner.engine the
        engine writes its page ids here; the last row is kvc's."""
        return self.impl.block_table()
