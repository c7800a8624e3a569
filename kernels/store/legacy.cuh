// The KvStore's legacy update kernels (plan_kernel, quantise_kernel, summarise_kernel,
// ring_kernel: a CTA per row with block reductions through shared memory, four launches per
// update) and reset_kernel. plan_kernel also plans the fast row kernels' updates where they do
// not plan for themselves (src/cuda/store_kernels.cu).
#pragma once

#include <cub/block/block_scan.cuh>

#include "store/update.cuh"

namespace kvc {
namespace kernels {
namespace store_detail {

constexpr int kPlanThreads = 1024;
constexpr int kRowThreads = 128;

// One CTA. Records each entry's length in update_scratch, pops pool blocks for the blocks that
// start and the store owns (entry order, then block order — the order of the host mirror's
// pops), advances lengths.
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(StoreView s, const std::int32_t* slots, int entries, int count) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int consumed;
  const int top = *s.free_count;
  if (threadIdx.x == 0) consumed = 0;
  __syncthreads();
  const int B = s.block_size, N = s.num_shards, me = s.shard_index;
  for (int base = 0; base < entries; base += kPlanThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int slot = 0, L = 0, first = 0, need = 0;
    if (e < entries) {
      slot = slots[e];
      L = s.lengths[slot];
      const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
      const int begin = (o0 + B - 1) / B, end = (o1 + B - 1) / B;
      // Owned blocks in [begin, end): first, first + N, ... (every block when unsharded).
      need = store::owned_count(end, N, me) - store::owned_count(begin, N, me);
      first = begin + ((me - begin % N) % N + N) % N;
    }
    int rank = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(need, rank, total);
    rank += consumed;
    for (int k = 0; k < need; ++k) {
      s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + first + k * N] =
          s.free_blocks[top - 1 - (rank + k)];
    }
    if (e < entries) {
      s.update_scratch[e] = L;
      s.lengths[slot] = L + count;
    }
    __syncthreads();
    if (threadIdx.x == 0) consumed += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *s.free_count = top - consumed;
}

// max |x| and "any non-finite" over the CTA; every thread gets the result.
__device__ __forceinline__ float block_abs_max(float local, bool nonfinite, float* red) {
  const unsigned full = 0xffffffffu;
  int bad = nonfinite ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(full, local, o);
    local = other > local ? other : local;
    bad |= __shfl_xor_sync(full, bad, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    red[warp] = local;
    red[32 + warp] = bad ? 1.0f : 0.0f;
  }
  __syncthreads();
  float m = 0.0f;
  bool any_bad = false;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) {
    m = red[w] > m ? red[w] : m;
    any_bad = any_bad || red[32 + w] != 0.0f;
  }
  return any_bad ? formats::quiet_nan() : m;
}

// Max |x| over this thread's strided share of a 16-bit vector, and whether any is non-finite.
__device__ __forceinline__ float thread_abs_max(const std::uint16_t* x, int d, bool bf, bool& bad) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = bits16_to_float(x[i], bf);
    if (is_nonfinite(v)) bad = true;
    const float a = v < 0.0f ? -v : v;
    m = a > m ? a : m;
  }
  return m;
}

// Encodes old row `row`'s K (`ks`, 16-bit) into the index copy (kSummaryIndexKeys) with the
// element-level pieces of formats.h's mxfp4 / fp8_e4m3 codec (mxfp4 codes in index-copy words),
// bit-identical to store::encode_index_row. mxfp4: blockDim.x and d are multiples of 32, so each
// warp holds whole 32-element groups (lane l: element 32g + l) and reduces the group's amax with
// shuffles.
__device__ __forceinline__ void encode_index_row(const StoreView& s, std::size_t row,
                                                 const std::uint16_t* ks, bool bf, float* red) {
  const unsigned full = 0xffffffffu;
  const int d = s.head_dim;
  std::uint8_t* p = s.index_k + row * store::index_payload_bytes(s);
  std::uint8_t* sc = s.index_k_scale + row * store::index_scale_bytes(s);
  if (s.index_format == Format::kMxfp4) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const float x = bits16_to_float(ks[i], bf);
      int bad = is_nonfinite(x) ? 1 : 0;
      float a = bad ? 0.0f : fabsf(x);
      for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(full, a, o);
        a = other > a ? other : a;
        bad |= __shfl_xor_sync(full, bad, o);
      }
      const float amax = bad ? formats::quiet_nan() : a;  // abs_max of the group
      const std::uint8_t byte = formats::mxfp4_scale_byte(amax);
      const unsigned code = (byte == 0xffu || amax == 0.0f) ? 0u : formats::mxfp4_code(x, byte);
      // The index-copy word of elements 8w .. 8w + 7: each lane's code placed, OR-ed over the 8
      // lanes (consecutive i).
      std::uint32_t word = formats::mxfp4_index_place(code, i % 8);
      word |= __shfl_xor_sync(full, word, 1);
      word |= __shfl_xor_sync(full, word, 2);
      word |= __shfl_xor_sync(full, word, 4);
      if ((i % 8) == 0) *reinterpret_cast<std::uint32_t*>(p + i / 2) = word;
      if ((i % formats::kMxfp4Group) == 0) sc[i / formats::kMxfp4Group] = byte;
    }
  } else {
    bool bad = false;
    const float local = thread_abs_max(ks, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    const float scale = zero ? amax : formats::fp8_e4m3_scale(amax);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      p[i] = zero ? 0 : formats::float_to_e4m3(fdiv_rn(bits16_to_float(ks[i], bf), scale));
    }
    if (threadIdx.x == 0) *reinterpret_cast<float*>(sc) = scale;
  }
}

// Encodes one token of one head into its old row: grid (entries * count, Hkv, layers); layer z
// is the view at_layer(s0, ls, z) with its input at k + z * ls.kv.
__global__ void __launch_bounds__(kRowThreads)
    quantise_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count,
                    const std::uint16_t* k, const std::uint16_t* v) {
  __shared__ float red[64];
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int e = blockIdx.x / count, j = blockIdx.x % count, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int p = old_tokens(s, L) + j;
  if (p >= old_tokens(s, L + count)) return;
  if (!store::owns_block(s, p / s.block_size)) return;  // another shard's block
  const int d = s.head_dim, W = s.recent_window, B = s.block_size;
  const bool bf = store::is_bf16(s);
  const std::uint16_t *ks, *vs;
  if (p < L) {
    const std::size_t r = store::ring_row_index(s, slot, h, p % W) * d;
    ks = static_cast<const std::uint16_t*>(s.ring_k) + r;
    vs = static_cast<const std::uint16_t*>(s.ring_v) + r;
  } else {
    const std::size_t r =
        ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
    ks = k + r;
    vs = v + r;
  }
  const int pb = s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + p / B];
  const std::size_t row = store::old_row_index(s, pb, h, p % B);
  std::uint8_t* kp = s.old_k + row * store::k_row_bytes(s);
  std::uint8_t* vp = s.old_v + row * store::v_row_bytes(s);
  if (s.summaries & kSummaryIndexKeys) encode_index_row(s, row, ks, bf, red);
  // K
  if (s.old_format == Format::kQ8) {
    bool bad = false;
    const float local = thread_abs_max(ks, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    const float scale = zero ? amax : formats::q8_scale(amax);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      reinterpret_cast<std::int8_t*>(kp)[i] =
          zero ? 0 : formats::q8_code(bits16_to_float(ks[i], bf), scale);
    }
    if (threadIdx.x == 0) s.old_k_scale[row] = scale;
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      reinterpret_cast<std::uint16_t*>(kp)[i] = ks[i];
  }
  // V
  if (s.old_format == Format::kQ8 || s.old_format == Format::kFp16kQ4v) {
    bool bad = false;
    const float local = thread_abs_max(vs, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    if (s.old_format == Format::kQ8) {
      const float scale = zero ? amax : formats::q8_scale(amax);
      for (int i = threadIdx.x; i < d; i += blockDim.x) {
        reinterpret_cast<std::int8_t*>(vp)[i] =
            zero ? 0 : formats::q8_code(bits16_to_float(vs[i], bf), scale);
      }
      if (threadIdx.x == 0) s.old_v_scale[row] = scale;
    } else {
      const float scale = zero ? amax : formats::q4_scale(amax);
      for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
        const unsigned lo = zero ? 0u : formats::q4_nibble(bits16_to_float(vs[2 * i], bf), scale);
        const unsigned hi =
            zero ? 0u : formats::q4_nibble(bits16_to_float(vs[2 * i + 1], bf), scale);
        vp[i] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
      if (threadIdx.x == 0) s.old_v_scale[row] = scale;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      reinterpret_cast<std::uint16_t*>(vp)[i] = vs[i];
  }
}

// Summaries of the blocks that close: grid (entries * max_closing, Hkv, layers); thread per
// element.
__global__ void __launch_bounds__(kRowThreads)
    summarise_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count,
                     int max_closing) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  const int e = blockIdx.x / max_closing, c = blockIdx.x % max_closing, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int b = old_tokens(s, L) / s.block_size + c;
  if (b >= old_tokens(s, L + count) / s.block_size) return;
  if (!store::owns_block(s, b)) return;  // another shard's block
  const int pb = s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b];
  for (int i = threadIdx.x; i < s.head_dim; i += blockDim.x) store::summarise_element(s, pb, h, i);
}

// New ring rows: grid (entries * min(count, W), Hkv, layers); 16-byte copies.
__global__ void __launch_bounds__(kRowThreads)
    ring_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count, int ring_rows,
                const std::uint16_t* k, const std::uint16_t* v) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int e = blockIdx.x / ring_rows, j = blockIdx.x % ring_rows, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int begin = L > L + count - s.recent_window ? L : L + count - s.recent_window;
  const int p = begin + j;
  if (p >= L + count) return;
  const int d = s.head_dim;
  const std::size_t dst = store::ring_row_index(s, slot, h, p % s.recent_window) * d;
  const std::size_t src =
      ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
  const uint4* sk = reinterpret_cast<const uint4*>(k + src);
  const uint4* sv = reinterpret_cast<const uint4*>(v + src);
  uint4* dk = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_k) + dst);
  uint4* dv = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_v) + dst);
  for (int i = threadIdx.x; i < d / 8; i += blockDim.x) {
    dk[i] = sk[i];
    dv[i] = sv[i];
  }
}

// One thread: pushes each slot's blocks back in logical order and zeroes its length and its open
// blocks' running sums' positions (StoreView::open_sum_next: no sum, as the length falls).
__global__ void reset_kernel(StoreView s, const std::int32_t* slots, int n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int top = *s.free_count;
  for (int i = 0; i < n; ++i) {
    const int slot = slots[i];
    const int blocks = (old_tokens(s, s.lengths[slot]) + s.block_size - 1) / s.block_size;
    std::int32_t* row = s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
    for (int b = 0; b < blocks; ++b) {
      if (!store::owns_block(s, b)) continue;
      s.free_blocks[top++] = row[b];
      row[b] = -1;
    }
    s.lengths[slot] = 0;
    if (s.open_sum_next != nullptr) {
      for (int h = 0; h < s.num_kv_heads; ++h)
        s.open_sum_next[store::slot_head_index(s, slot, h)] = 0;
    }
  }
  *s.free_count = top;
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc
