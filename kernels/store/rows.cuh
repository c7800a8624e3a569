// The KvStore's count > 1 update kernels (a prefill chunk, or several tokens per sequence):
// block_rows_kernel (the library's choice), rows_kernel (a warp per row, optionally staged
// through shared memory) and ring_copy_kernel, which writes the new ring rows after either. The
// shared row encoding and summaries are in store/update.cuh.
#pragma once

#include "store/update.cuh"

namespace kvc {
namespace kernels {
namespace store_detail {

/// Warps per CTA of the staged rows kernel (rows_kernel<E, true>, StoreKernels::kLean).
constexpr int kStagedWarps = 8;
/// Rows whose loads a warp of the staged rows kernel issues together (lane elements E).
template <int E>
constexpr int staged_batch() {
  return E <= 8 ? 4 : 2;
}
/// Rows of a staged block's summary whose shared-memory loads are in flight at a time (a few:
/// shared memory answers fast, and registers bound the CTAs per SM).
constexpr int kStagedAhead = 4;

/// Old block c (0 .. touched - 1) of the blocks a chunk update of `count` tokens to a slot of
/// length L touches: block b, the old tokens [p_begin, p_end) the update adds to it, and whether
/// the update closes it; `writes` is false where it adds none or another shard owns the block.
struct ChunkBlock {
  int b, p_begin, p_end;
  bool closes, writes;

  __device__ __forceinline__ ChunkBlock(const StoreView& s, int L, int count, int c) {
    const int B = s.block_size;
    const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
    b = o0 / B + c;
    p_begin = o0 > b * B ? o0 : b * B;
    p_end = o1 < b * B + B ? o1 : b * B + B;
    closes = b < o1 / B;
    writes = p_begin < p_end && store::owns_block(s, b);
  }

  /// Its pool block for entry e (slot `slot`): with `plan` a block that starts with this update
  /// takes free_blocks[top - 1 - rank] (rank: the pops of the entries before, then the block's
  /// place among the entry's new owned blocks; the host mirror's order), recorded in the block
  /// table where `record`; else the block table's. Every lane of the unit's G lanes calls it
  /// (pops_before; `lane` its place among them).
  template <int G = 32>
  __device__ __forceinline__ int pool_block(const StoreView& s, const std::int32_t* slots, int e,
                                            int slot, int L, int count, bool plan, int top,
                                            int lane, bool record) const {
    std::int32_t* entry =
        s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b;
    const int begin = (old_tokens(s, L) + s.block_size - 1) / s.block_size;  // opened earlier
    if (!plan || b < begin) return *entry;
    const int rank = pops_before<G>(s, slots, e, count, lane) +
                     store::owned_count(b, s.num_shards, s.shard_index) -
                     store::owned_count(begin, s.num_shards, s.shard_index);
    const int pb = s.free_blocks[top - 1 - rank];
    if (record) *entry = pb;
    return pb;
  }
};

// Quantises the tokens that leave the ring and summarises the blocks that close: a CTA per
// (entry, block touched, head), grid (entries * touched_blocks(count, B) * Hkv, 1, layers), the
// head fastest. Layer z is at_layer(s0, ls, z) with its input at k + z * ls.kv. plan = false
// (store_write, the LayeredCache): the plan ran before; each entry's length before the update is
// in update_scratch and its pages in the block table. plan = true (store_update of one layer,
// s.update_counter set): the kernel is its own plan. It reads the lengths, a CTA whose block
// starts takes free_blocks[top - 1 - rank] (rank: the pops of the entries before, then the
// block's place among the entry's new owned blocks; the host mirror's order) and records it
// (head 0), the CTAs of (entry, 0, head 0) record the old length in update_scratch for
// ring_copy_kernel, and the last CTA publishes lengths and the free count.
// kStaged = false (kRows): warp w encodes the block's new rows w, w + warps, ... (the next row's
// loads in flight while it encodes one), then, when the block closes, the CTA's threads
// summarise it from the pool (four elements a thread, one row at a time).
// kStaged = true (kLean): kStagedWarps warps, each issuing the loads of staged_batch<E>() of its
// rows at once (for B = 32 the CTA has the whole block in flight); with `staged` (dynamic shared
// memory of stage_bytes(s)) every encoded row's stored bytes are also staged in shared memory,
// and a block that closes is summarised from there (its rows of earlier updates from the pool);
// without, from the pool; kStagedAhead rows in flight either way.
template <int E, bool kStaged>
__global__ void __launch_bounds__(kStaged ? 32 * kStagedWarps : 32 * kFastWarps,
                                  kStaged ? (E <= 4 ? 3 : (E == 8 ? 2 : 1))
                                          : (E <= 4 ? 8 : (E == 8 ? 6 : 4)))
    rows_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries, int count,
                int touched, const std::uint16_t* k, const std::uint16_t* v, bool plan,
                bool staged) {
  extern __shared__ __align__(16) std::uint8_t stage[];
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  // Heads vary fastest, so CTAs resident at once read whole token rows of the input.
  const int h = static_cast<int>(blockIdx.x % s.num_kv_heads);
  const int e = static_cast<int>(blockIdx.x / s.num_kv_heads) / touched;
  const int c = static_cast<int>(blockIdx.x / s.num_kv_heads) % touched;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int slot = slots[e];
  const int top = plan ? *s.free_count : 0;
  const int L = plan ? s.lengths[slot] : s.update_scratch[e];
  const int B = s.block_size, W = s.recent_window, d = s.head_dim;
  const ChunkBlock blk(s, L, count, c);
  const int b = blk.b, p_begin = blk.p_begin, p_end = blk.p_end;
  if (blk.writes) {
    const int pb =
        blk.pool_block(s, slots, e, slot, L, count, plan, top, lane, h == 0 && threadIdx.x == 0);
    const int warps = static_cast<int>(blockDim.x) / 32;
    const auto* ring_k = static_cast<const std::uint16_t*>(s.ring_k);
    const auto* ring_v = static_cast<const std::uint16_t*>(s.ring_v);
    auto source = [&](int p, const std::uint16_t* ring, const std::uint16_t* in) {
      if (p < L) return ring + store::ring_row_index(s, slot, h, p % W) * d;
      return in + ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
    };
    const bool closes = blk.closes;
    if constexpr (!kStaged) {
      int p = p_begin + static_cast<int>(threadIdx.x) / 32;
      LaneRow<E> kr, vr;
      if (p < p_end) {
        kr = load_lane<E>(source(p, ring_k, k), lane);
        vr = load_lane<E>(source(p, ring_v, v), lane);
      }
      for (; p < p_end; p += warps) {
        const int next = p + warps;
        LaneRow<E> kn = kr, vn = vr;
        if (next < p_end) {
          kn = load_lane<E>(source(next, ring_k, k), lane);
          vn = load_lane<E>(source(next, ring_v, v), lane);
        }
        encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, p % B), kr, vr, lane);
        kr = kn;
        vr = vn;
      }
      if (closes) {  // the block closes: its rows are complete once every warp is done
        __syncthreads();
        for (int i0 = 4 * static_cast<int>(threadIdx.x); i0 < d;
             i0 += 4 * static_cast<int>(blockDim.x)) {
          summarise4<1>(s, pb, h, i0);
        }
      }
    } else {
      // The stage: K rows [B, kb], V rows [B, vb] (mean V only), K scales [B], V scales [B].
      const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
      const bool use_stage = staged && closes;
      const int kb = static_cast<int>(store::k_row_bytes(s));
      const int vb = mean_v ? static_cast<int>(store::v_row_bytes(s)) : 0;
      std::uint8_t* stage_v = stage + static_cast<std::size_t>(B) * kb;
      float* stage_ks = reinterpret_cast<float*>(stage_v + static_cast<std::size_t>(B) * vb);
      float* stage_vs = stage_ks + B;
      constexpr int kBatch = staged_batch<E>();
      for (int p0 = p_begin + static_cast<int>(threadIdx.x) / 32; p0 < p_end;
           p0 += warps * kBatch) {
        LaneRow<E> kr[kBatch], vr[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int p = p0 + j * warps;
          if (p < p_end) {
            kr[j] = load_lane<E>(source(p, ring_k, k), lane);
            vr[j] = load_lane<E>(source(p, ring_v, v), lane);
          }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int p = p0 + j * warps;
          if (p >= p_end) break;
          const int t = p % B;
          RowStage at;
          if (use_stage) {
            at.k = stage + static_cast<std::size_t>(t) * kb;
            at.v = mean_v ? stage_v + static_cast<std::size_t>(t) * vb : nullptr;
            at.k_scale = stage_ks + t;
            at.v_scale = stage_vs + t;
          }
          encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, t), kr[j], vr[j],
                        lane, at);
        }
      }
      if (closes) {  // the block closes: its rows are complete once every warp is done
        __syncthreads();
        const StagedRows rows{PoolRows(s, OldRowLayout::of(s), pb, h),
                              stage,
                              mean_v ? stage_v : nullptr,
                              stage_ks,
                              stage_vs,
                              kb,
                              vb,
                              p_begin - b * B};
        for (int i0 = 4 * static_cast<int>(threadIdx.x); i0 < d;
             i0 += 4 * static_cast<int>(blockDim.x)) {
          if (use_stage) {
            summarise_rows<kStagedAhead>(s, rows, pb, h, i0);
          } else {
            summarise4<kStagedAhead>(s, pb, h, i0);
          }
        }
      }
    }
  }
  if (plan) {
    if (c == 0 && h == 0 && threadIdx.x == 0) s.update_scratch[e] = L;
    publish_update(s, slots, entries, count, top);
  }
}

/// Warps per CTA of block_rows_kernel.
constexpr int kBlockRowsWarps = 4;

/// Lanes of a block_rows_kernel unit for rows of d elements: d / 8 up to a warp, so that a lane
/// holds 8 elements (d = 64: 8 lanes, four units a warp; 128: 16 lanes, two units; 256 and 512:
/// the warp). A row's fixed work (its scales, reductions, addresses and stores) is then one
/// instruction for all the warp's units: at d 128 the default format's 16K-token ingest took
/// 70.2 us against 104 with a warp a unit (H100, forty-ninth session). OldRowLayout's units of
/// 16 lanes measured slower there without a register bound (143 registers, 3 CTAs an SM: fp16k_q4v
/// without the index copy 78.4 against 70.1 us, f16 76.6 against 63.8); units of fewer than 32
/// lanes are compiled for 4 CTAs an SM (128 registers; OldRowLayout spills 8 bytes), and so
/// OldRowLayout's gained too (q8 66.9 against 83.5 us, q8 with the index copy 85.0 against 125,
/// H100, fiftieth session).
constexpr int block_rows_lanes(int head_dim) { return head_dim / 8 < 32 ? head_dim / 8 : 32; }

/// Rows whose K and V loads a warp of block_rows_kernel issues together, and keeps in flight
/// while it encodes the rows before them (lane elements E, 2 <= E <= 16): 32 bytes of K and 32
/// of V per lane.
template <int E>
constexpr int block_rows_batch() {
  return 8 / E > 0 ? 8 / E : 1;
}

/// Rows p = p0, p0 + 1, ... of one (entry, head) in turn, where block_rows_kernel reads them: the
/// ring (p < L, ring row p % W) or the update's input (token p - L). The offsets step from row to
/// row: no modulo and no 64-bit multiply a row.
struct BlockRowSource {
  const std::uint16_t* ring_k;
  const std::uint16_t* ring_v;
  const std::uint16_t* in_k;
  const std::uint16_t* in_v;
  std::size_t ring_head;  ///< ring row 0 of (slot, head), in elements
  long long in_off;       ///< the input row of p, in elements (negative while p < L)
  long long in_step;      ///< H * d
  int p, L, W, d, ring_row;

  __device__ __forceinline__ BlockRowSource(const StoreView& s, int slot, int h, int e, int count,
                                            int L_, int p0, const std::uint16_t* k,
                                            const std::uint16_t* v)
      : ring_k(static_cast<const std::uint16_t*>(s.ring_k)),
        ring_v(static_cast<const std::uint16_t*>(s.ring_v)),
        in_k(k),
        in_v(v),
        ring_head(store::ring_row_index(s, slot, h, 0) * s.head_dim),
        in_off(((static_cast<long long>(e) * count + (p0 - L_)) * s.num_kv_heads + h) * s.head_dim),
        in_step(static_cast<long long>(s.num_kv_heads) * s.head_dim),
        p(p0),
        L(L_),
        W(s.recent_window),
        d(s.head_dim),
        ring_row(p0 % s.recent_window) {}

  /// Row p's K and V; then p + 1.
  __device__ __forceinline__ void next(const std::uint16_t*& kp, const std::uint16_t*& vp) {
    if (p < L) {
      const std::size_t o = ring_head + static_cast<std::size_t>(ring_row) * d;
      kp = ring_k + o;
      vp = ring_v + o;
      ring_row = ring_row + 1 == W ? 0 : ring_row + 1;
    } else {
      kp = in_k + in_off;
      vp = in_v + in_off;
    }
    in_off += in_step;
    ++p;
  }
};

// Quantises the tokens that leave the ring and summarises the blocks that close, G consecutive
// lanes per (entry, block touched, head) (block_rows_lanes: the warp, or a half or a quarter of
// it, each a unit of its own): unit u = (blockIdx.x * kBlockRowsWarps + warp) * (32 / G) + lane
// / G of entries * touched * Hkv, the head fastest; layer z is at_layer(s0, ls, z) with its input
// at k + z * ls.kv. A unit's lanes encode its block's new rows in row order (E = d / G elements a
// lane), block_rows_batch<E>() rows' loads in flight ahead of the ones they encode, and when the
// block closes sum its summary from the rows they encoded (kept in registers: EncodedLane) after
// the block's earlier rows (written by earlier updates) from the pool: the row-order sums of
// store::summarise_element without reading the new rows back. The units of a warp share no data:
// their shuffles stay within their own lanes, so units that branch apart stay correct. plan as
// in rows_kernel (false: the plan ran before, lengths in update_scratch; true: the kernel pops
// its own blocks and its last CTA publishes). Layout: OldRowLayout (any format, its cases tested
// at run time) or Fp16kQ4vMxfp4Layout (the default format's, fixed at compile time).
// Bit-identical to rows_kernel and the CPU reference.
template <int E, int G, class Layout>
__global__ void __launch_bounds__(32 * kBlockRowsWarps, G < 32 ? 4 : 1)
    block_rows_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries,
                      int count, int touched, const std::uint16_t* k, const std::uint16_t* v,
                      bool plan) {
  static_assert(G == 8 || G == 16 || G == 32, "a unit is a quarter, a half or all of a warp");
  constexpr int N = E >= 4 ? 4 : 2;  // elements of a summary piece
  constexpr int P = E / N;           // pieces per lane
  constexpr int R = block_rows_batch<E>();
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int lane = static_cast<int>(threadIdx.x) % G;  // this lane's place in its unit
  const int H = s.num_kv_heads;
  const long long u =
      (static_cast<long long>(blockIdx.x) * kBlockRowsWarps + threadIdx.x / 32) * (32 / G) +
      static_cast<int>(threadIdx.x) % 32 / G;
  const int top = plan ? *s.free_count : 0;
  if (u < static_cast<long long>(entries) * touched * H) {
    const int h = static_cast<int>(u % H);
    const int e = static_cast<int>(u / H / touched), c = static_cast<int>(u / H % touched);
    const int slot = slots[e];
    const int L = plan ? s.lengths[slot] : s.update_scratch[e];
    const int B = s.block_size;
    const ChunkBlock blk(s, L, count, c);
    const int b = blk.b, p_begin = blk.p_begin, p_end = blk.p_end;
    if (blk.writes) {
      const int pb = blk.template pool_block<G>(s, slots, e, slot, L, count, plan, top, lane,
                                                h == 0 && lane == 0);
      const bool closes = blk.closes;
      const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
      const Layout layout{OldRowLayout::of(s)};
      const std::size_t row0 = store::old_row_index(s, pb, h, 0);
      SummarySums<N> sums[P];
      if (closes) {  // the rows of earlier updates, from the pool, first
        const PoolRows pool(s, layout, pb, h);
#pragma unroll 1
        for (int t = 0; t < p_begin - b * B; ++t) {
          const StoredRow r = pool(t);
#pragma unroll
          for (int g = 0; g < P; ++g) {
            const int i0 = E * lane + N * g;
            const StoredPiece kp = load_old<N>(layout, false, r, i0);
            const StoredPiece vp = mean_v ? load_old<N>(layout, true, r, i0) : StoredPiece{};
            sums[g].add(s, layout, t, kp, vp);
          }
        }
      }
      BlockRowSource source(s, slot, h, e, count, L, p_begin, k, v);  // rows in order
      LaneRow<E> kr[R], vr[R];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (p_begin + j < p_end) {
          const std::uint16_t *kp, *vp;
          source.next(kp, vp);
          kr[j] = load_lane<E>(kp, lane);
          vr[j] = load_lane<E>(vp, lane);
        }
      }
      for (int p0 = p_begin; p0 < p_end; p0 += R) {
        LaneRow<E> kn[R], vn[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          kn[j] = kr[j];
          vn[j] = vr[j];
          if (p0 + R + j < p_end) {
            const std::uint16_t *kp, *vp;
            source.next(kp, vp);
            kn[j] = load_lane<E>(kp, lane);
            vn[j] = load_lane<E>(vp, lane);
          }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const int p = p0 + j;
          if (p >= p_end) break;
          const int t = p - b * B;
          EncodedLane<E> kept;
          encode_row<E, Layout, G>(s, layout, row0 + t, kr[j], vr[j], lane, RowStage{}, &kept);
          if (closes) {
#pragma unroll
            for (int g = 0; g < P; ++g) {
              sums[g].add(s, layout, t, kept.template piece<N>(layout, false, g),
                          kept.template piece<N>(layout, true, g));
            }
          }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          kr[j] = kn[j];
          vr[j] = vn[j];
        }
      }
      if (closes) {
#pragma unroll
        for (int g = 0; g < P; ++g) sums[g].store(s, pb, h, E * lane + N * g);
      }
    }
    if (plan && c == 0 && h == 0 && lane == 0) s.update_scratch[e] = L;
  }
  if (plan) publish_update(s, slots, entries, count, top);
}

// New ring rows: positions [max(L, L + count - W), L + count) of every entry (L from
// update_scratch), one 16-byte chunk of K and one of V per thread; grid (ceil(entries *
// ring_rows * Hkv * d / 8 / kRingThreads), 1, layers).
__global__ void __launch_bounds__(kRingThreads)
    ring_copy_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries,
                     int count, int ring_rows, const std::uint16_t* k, const std::uint16_t* v) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int d = s.head_dim, H = s.num_kv_heads, chunks = d / 8;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(entries) * ring_rows * H * chunks;
  if (i >= total) return;
  const int chunk = static_cast<int>(i % chunks);
  long long r = i / chunks;
  const int h = static_cast<int>(r % H);
  r /= H;
  const int j = static_cast<int>(r % ring_rows), e = static_cast<int>(r / ring_rows);
  const int L = s.update_scratch[e];
  const int begin = L > L + count - s.recent_window ? L : L + count - s.recent_window;
  const int p = begin + j;
  if (p >= L + count) return;
  const std::size_t dst = store::ring_row_index(s, slots[e], h, p % s.recent_window) * d;
  const std::size_t src = ((static_cast<std::size_t>(e) * count + (p - L)) * H + h) * d;
  reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_k) + dst)[chunk] =
      reinterpret_cast<const uint4*>(k + src)[chunk];
  reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_v) + dst)[chunk] =
      reinterpret_cast<const uint4*>(v + src)[chunk];
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc
