// Kernels of the LayeredCache (kvc/store/layered_cache.h) around the per-layer KvStore update
// kernels (update.cuh and its rows / append headers): a guarded plan (lengths and pages advance
// once for every layer; a bad entry goes to the trash slot and sets an error bit instead of writing
// out of bounds), the spill of aged-out tokens for truncate(), the ring restore of truncate(), and
// page copies for fork(). Every kernel reads lengths and tables on the device, so a step captures
// in a graph.
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "kvc/store/block_codec.h"
#include "kvc/store/layered_cache.h"
#include "store/layer_shift.h"

namespace kvc {
namespace kernels {
namespace layered_detail {

constexpr int kPlanThreads = 1024;
constexpr int kCopyThreads = 256;
constexpr int kRowThreads = 128;

__device__ __forceinline__ int old_tokens(const StoreView& s, int length) {
  return length > s.recent_window ? length - s.recent_window : 0;
}
__device__ __forceinline__ int blocks_in_use(const StoreView& s, int length) {
  return (old_tokens(s, length) + s.block_size - 1) / s.block_size;
}
__device__ __forceinline__ void raise(const LayeredView& v, ErrorBits bit) {
  atomicOr(v.errors, static_cast<std::uint32_t>(bit));
}

// One CTA. Entry e adds counts[e] tokens (or `uniform_count` when counts is null). For each
// entry: checks the slot, the length and the pages (the engine's ids, or
// kvc's free list), then records the old length in update_scratch and the slot in plan_slots and
// advances the length; an entry that fails any check is redirected to the trash slot
// (max_slots, length 0, the trash page in every block) and raises its error bit. kvc-owned
// pages are popped in entry order, then block order (the host mirror's order); entries past
// the end of the free list fail as a suffix, so the pages served stay contiguous.
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(LayeredView v, const std::int32_t* slots, const std::int32_t* counts, int entries,
                int uniform_count) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int consumed;
  const StoreView& s = v.layer0;
  const bool kvc_pages = v.pages == PageOwner::kKvc;
  const int top = kvc_pages ? *s.free_count : 0;
  if (threadIdx.x == 0) consumed = 0;
  __syncthreads();
  for (int base = 0; base < entries; base += kPlanThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int slot = -1, L = 0, need = 0;
    bool ok = e < entries;
    ErrorBits why = ErrorBits::kNone;
    const int count = ok && counts ? counts[e] : uniform_count;
    if (ok && count < 1) {
      ok = false;
      why = ErrorBits::kContext;
    }
    if (ok) {
      slot = slots[e];
      if (slot < 0 || slot >= s.max_slots) {
        ok = false;
        why = ErrorBits::kBadSlot;
      } else {
        L = s.lengths[slot];
        if (L < 0 || static_cast<long long>(L) + count > s.max_context) {
          ok = false;
          why = ErrorBits::kContext;
        }
      }
    }
    const std::int32_t* row =
        s.block_table + static_cast<std::size_t>(ok ? slot : 0) * s.max_blocks_per_slot;
    if (ok && !kvc_pages) {
      // Every block a token of this update lands in needs an engine page in [0, pool).
      const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
      for (int b = o0 / s.block_size; o1 > o0 && b <= (o1 - 1) / s.block_size; ++b) {
        if (row[b] < 0 || row[b] >= s.num_pool_blocks) {
          ok = false;
          why = ErrorBits::kBadPage;
          break;
        }
      }
    }
    if (ok && kvc_pages) need = blocks_in_use(s, L + count) - blocks_in_use(s, L);
    int rank = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(need, rank, total);
    __syncthreads();
    if (ok && kvc_pages && consumed + rank + need > top) {
      ok = false;
      why = ErrorBits::kPoolEmpty;
      need = 0;
    }
    int served_rank = 0, served = 0;
    Scan(scan_storage).ExclusiveSum(need, served_rank, served);
    if (ok) {
      const int first = blocks_in_use(s, L);
      std::int32_t* w = s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
      for (int k = 0; k < need; ++k)
        w[first + k] = s.free_blocks[top - 1 - (consumed + served_rank + k)];
      s.update_scratch[e] = L;
      s.lengths[slot] = L + count;
      v.plan_slots[e] = slot;
      if (v.spill_begin) {  // the last max_rollback aged-out tokens are kept from here on
        const int kept = old_tokens(s, L + count) - v.max_rollback;
        if (kept > v.spill_begin[slot]) v.spill_begin[slot] = kept;
      }
    } else if (e < entries) {
      s.update_scratch[e] = 0;
      v.plan_slots[e] = s.max_slots;  // the trash slot
      raise(v, why);
    }
    __syncthreads();
    if (threadIdx.x == 0) consumed += served;
    __syncthreads();
  }
  if (threadIdx.x == 0 && kvc_pages) *s.free_count = top - consumed;
}

// The layer `layer` view of v (per-layer arrays offset by the strides).
KVC_HD StoreView layer_of(const LayeredView& v, int layer) {
  LayerStrides ls;
  ls.ring = v.ring_stride;
  ls.pool = v.pool_stride;
  return at_layer(v.layer0, ls, layer);
}

// Spill row (slot, head, row) of layer l, K or V.
__device__ __forceinline__ std::uint16_t* spill_row(const LayeredView& v, bool value, int layer,
                                                    int slot, int h, int row) {
  const StoreView& s = v.layer0;
  std::uint8_t* base = static_cast<std::uint8_t*>(value ? v.spill_v : v.spill_k) +
                       static_cast<std::ptrdiff_t>(layer) * v.spill_stride;
  const std::size_t r =
      (static_cast<std::size_t>(slot) * s.num_kv_heads + h) * v.max_rollback + row;
  return reinterpret_cast<std::uint16_t*>(base) + r * s.head_dim;
}

// Copies the 16-bit K/V of the last max_rollback tokens that leave the ring in this update into
// the spill of layers first_layer + z (before the ring is overwritten): grid
// (entries * min(count, R), Hkv, layers); layer z's input at k + z * kv_layer_stride.
__global__ void __launch_bounds__(kRowThreads)
    spill_kernel(LayeredView v, int first_layer, int count, int per_entry, const std::uint16_t* k,
                 const std::uint16_t* val, std::int64_t kv_layer_stride) {
  const int e = blockIdx.x / per_entry, j = blockIdx.x % per_entry, h = blockIdx.y;
  const int layer = first_layer + static_cast<int>(blockIdx.z);
  k += kv_layer_stride * blockIdx.z;
  val += kv_layer_stride * blockIdx.z;
  const StoreView s = layer_of(v, layer);
  const int slot = v.plan_slots[e];
  const int L = s.update_scratch[e];
  const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
  const int R = v.max_rollback;
  const int first = o1 - R > o0 ? o1 - R : o0;
  const int p = first + j;
  if (p >= o1) return;
  const int d = s.head_dim;
  const std::uint16_t *ks, *vs;
  if (p < L) {
    const std::size_t r = store::ring_row_index(s, slot, h, p % s.recent_window) * d;
    ks = static_cast<const std::uint16_t*>(s.ring_k) + r;
    vs = static_cast<const std::uint16_t*>(s.ring_v) + r;
  } else {
    const std::size_t r =
        ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
    ks = k + r;
    vs = val + r;
  }
  std::uint16_t* dk = spill_row(v, false, layer, slot, h, p % R);
  std::uint16_t* dv = spill_row(v, true, layer, slot, h, p % R);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    dk[i] = ks[i];
    dv[i] = vs[i];
  }
}

// truncate(): ring rows of positions [from, to) of `slot` come back from the spill in every
// layer: grid (to - from, Hkv, L).
__global__ void __launch_bounds__(kRowThreads) restore_kernel(LayeredView v, int slot, int from) {
  const int p = from + static_cast<int>(blockIdx.x), h = blockIdx.y, layer = blockIdx.z;
  const StoreView s = layer_of(v, layer);
  const int d = s.head_dim;
  const std::size_t r = store::ring_row_index(s, slot, h, p % s.recent_window) * d;
  const std::uint16_t* sk = spill_row(v, false, layer, slot, h, p % v.max_rollback);
  const std::uint16_t* sv = spill_row(v, true, layer, slot, h, p % v.max_rollback);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    static_cast<std::uint16_t*>(s.ring_k)[r + i] = sk[i];
    static_cast<std::uint16_t*>(s.ring_v)[r + i] = sv[i];
  }
}

// Table edits of truncate (one thread): pushes `n` released pages (in order) on kvc's free list,
// clears the table entries of blocks [b0, b1) of `slot`, and sets its length.
__global__ void truncate_tables_kernel(LayeredView v, int slot, const std::int32_t* released, int n,
                                       int b0, int b1, int length) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const StoreView& s = v.layer0;
  if (v.pages == PageOwner::kKvc) {
    int top = *s.free_count;
    for (int i = 0; i < n; ++i) s.free_blocks[top++] = released[i];
    *s.free_count = top;
    for (int b = b0; b < b1; ++b) {
      s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b] = -1;
    }
  }
  s.lengths[slot] = length;
}

// truncate() on the device, for the graph path: entry by entry (in order, so kvc's free list gets
// its pages back deterministically), slot slots[e] goes back to new_lengths[e] — every layer's
// ring rows of the old positions that come back restored from the spill, kvc-owned pages of the
// blocks no longer in use pushed (descending logical order) and their table entries cleared, the
// length set. An entry whose slot is out of range raises kBadSlot, one whose length is not in
// [0, length] or reaches below the spill window (old(new) < spill_begin) raises kRollback; such
// entries change nothing. One CTA.
__global__ void __launch_bounds__(kCopyThreads)
    truncate_kernel(LayeredView v, const std::int32_t* slots, const std::int32_t* new_lengths,
                    int entries) {
  __shared__ int sh_ok, sh_slot, sh_n, sh_from, sh_to;
  const StoreView& s = v.layer0;
  for (int e = 0; e < entries; ++e) {
    if (threadIdx.x == 0) {
      const int slot = slots[e], n = new_lengths[e];
      int ok = slot >= 0 && slot < s.max_slots;
      if (!ok) {
        raise(v, ErrorBits::kBadSlot);
      } else {
        const int L = s.lengths[slot];
        const int from = old_tokens(s, n), to = old_tokens(s, L);
        const int floor = v.spill_begin ? v.spill_begin[slot] : to;
        ok = n >= 0 && n <= L && (from == to || (v.max_rollback > 0 && from >= floor));
        if (!ok) raise(v, ErrorBits::kRollback);
        sh_from = from;
        sh_to = to;
      }
      sh_ok = ok;
      sh_slot = slot;
      sh_n = n;
    }
    __syncthreads();
    if (sh_ok) {
      const int H = s.num_kv_heads, d = s.head_dim, rows = sh_to - sh_from;
      const long long total = static_cast<long long>(rows) * H * v.num_layers * d;
      for (long long i = threadIdx.x; i < total; i += blockDim.x) {
        const int x = static_cast<int>(i % d);
        long long r = i / d;
        const int h = static_cast<int>(r % H);
        r /= H;
        const int p = sh_from + static_cast<int>(r % rows);
        const int layer = static_cast<int>(r / rows);
        const StoreView sl = layer_of(v, layer);
        const std::size_t at = store::ring_row_index(sl, sh_slot, h, p % s.recent_window) * d + x;
        static_cast<std::uint16_t*>(sl.ring_k)[at] =
            spill_row(v, false, layer, sh_slot, h, p % v.max_rollback)[x];
        static_cast<std::uint16_t*>(sl.ring_v)[at] =
            spill_row(v, true, layer, sh_slot, h, p % v.max_rollback)[x];
      }
    }
    __syncthreads();
    if (sh_ok && threadIdx.x == 0) {
      const int L = s.lengths[sh_slot];
      std::int32_t* row = s.block_table + static_cast<std::size_t>(sh_slot) * s.max_blocks_per_slot;
      if (v.pages == PageOwner::kKvc) {
        int top = *s.free_count;
        for (int b = blocks_in_use(s, L) - 1; b >= blocks_in_use(s, sh_n); --b) {
          s.free_blocks[top++] = row[b];
          row[b] = -1;
        }
        *s.free_count = top;
      }
      s.lengths[sh_slot] = sh_n;
    }
    __syncthreads();
  }
}

// The pool arrays of one layer for page copies (offsets in a layer's pool region).
struct PageArrays {
  void* pool = nullptr;             ///< layer 0's pool region
  std::size_t offset[10] = {};      ///< array offsets
  std::size_t page_bytes[10] = {};  ///< bytes per page of each array
  int count = 0;                    ///< arrays
};

// fork(): for blocks [0, used) of src, copies every pool array of every layer from src's page to
// dst's where the two differ: grid (used, L). Engine pages are checked: an id outside the pool
// raises kBadPage, a shared open block (the last, partial one) kSharedOpenBlock; neither copies.
// The CTA of (block 0, layer 0) also copies the length.
__global__ void __launch_bounds__(kCopyThreads)
    fork_pages_kernel(LayeredView v, int src, int dst, int used, int open_block,
                      PageArrays arrays) {
  const int b = blockIdx.x, layer = blockIdx.y;
  const StoreView& s = v.layer0;
  const int ps = s.block_table[static_cast<std::size_t>(src) * s.max_blocks_per_slot + b];
  const int pd = s.block_table[static_cast<std::size_t>(dst) * s.max_blocks_per_slot + b];
  if (b == 0 && layer == 0 && threadIdx.x == 0) s.lengths[dst] = s.lengths[src];
  if (ps < 0 || ps >= s.num_pool_blocks || pd < 0 || pd >= s.num_pool_blocks) {
    if (threadIdx.x == 0 && layer == 0) raise(v, ErrorBits::kBadPage);
    return;
  }
  if (ps == pd) {
    if (b == open_block && threadIdx.x == 0 && layer == 0) raise(v, ErrorBits::kSharedOpenBlock);
    return;
  }
  std::uint8_t* base =
      static_cast<std::uint8_t*>(arrays.pool) + static_cast<std::ptrdiff_t>(layer) * v.pool_stride;
  for (int a = 0; a < arrays.count; ++a) {
    const std::size_t n = arrays.page_bytes[a];
    const std::uint8_t* from = base + arrays.offset[a] + static_cast<std::size_t>(ps) * n;
    std::uint8_t* to = base + arrays.offset[a] + static_cast<std::size_t>(pd) * n;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
  }
}

}  // namespace layered_detail
}  // namespace kernels
}  // namespace kvc
