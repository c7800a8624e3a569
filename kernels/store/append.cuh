// The KvStore's count-1 append kernels, each ONE launch that plans for itself (append_kernel,
// append_once_kernel, append_lean_kernel), and planned_append_kernel, the same row work for an
// update whose plan ran before (the LayeredCache). The shared row encoding and summaries are in
// store/update.cuh.
#pragma once

#include "store/update.cuh"

namespace kvc {
namespace kernels {
namespace store_detail {

/// Rows of a block's summary whose loads append_once_kernel, append_lean_kernel and
/// planned_append_kernel keep in flight at a time.
constexpr int kSummaryAhead = 8;

// The whole count-1 append in one launch (entries <= kFusedMaxEntries, s.update_counter
// set): warp w serves (entry w / Hkv, head w % Hkv). It reads the slot's length L, writes the new
// token into ring row L % W — after reading that row, whose token L - W is the one leaving the
// ring, when L >= W (each lane reads its share before it overwrites the same addresses) — and
// encodes the leaving token into its old row; a block that starts takes free_blocks[top - 1 -
// rank], rank = pops of the entries before this one, and head 0 records it in the block table; a
// block that closes is summarised by the warp. publish_update advances lengths and the free
// count once every CTA is done, so the launch replays in a graph.
template <int E>
__global__ void __launch_bounds__(32 * kFastWarps)
    append_kernel(StoreView s, const std::int32_t* slots, int entries, const std::uint16_t* k,
                  const std::uint16_t* v) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int w = static_cast<int>(blockIdx.x) * (static_cast<int>(blockDim.x) / 32) +
                static_cast<int>(threadIdx.x) / 32;
  const int H = s.num_kv_heads, W = s.recent_window, B = s.block_size, d = s.head_dim;
  const int top = *s.free_count;
  if (w < entries * H) {
    const int e = w / H, h = w % H;
    const int slot = slots[e];
    const int L = s.lengths[slot];
    const int q = L - W;  // the token leaving the ring, when >= 0
    const bool quantise = q >= 0 && store::owns_block(s, q / B);
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * d;
    const LaneRow<E> kn = load_lane<E>(k + in, lane), vn = load_lane<E>(v + in, lane);
    const std::size_t r = store::ring_row_index(s, slot, h, L % W) * d;
    auto* rk = static_cast<std::uint16_t*>(s.ring_k) + r;
    auto* rv = static_cast<std::uint16_t*>(s.ring_v) + r;
    LaneRow<E> ko, vo;
    if (quantise) {
      ko = load_lane<E>(rk, lane);
      vo = load_lane<E>(rv, lane);
    }
    store_lane<E>(rk, lane, kn);
    store_lane<E>(rv, lane, vn);
    if (quantise) {
      std::int32_t* entry =
          s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + q / B;
      int pb;
      if (q % B == 0) {  // the block starts
        pb = s.free_blocks[top - 1 - pops_before(s, slots, e, 1, lane)];
        if (h == 0 && lane == 0) *entry = pb;
      } else {
        pb = *entry;
      }
      encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, q % B), ko, vo, lane);
      if ((q + 1) % B == 0) {  // the block closes: its last row is this warp's
        __syncwarp();
        for (int i0 = 4 * lane; i0 < d; i0 += 4 * 32) summarise4<1>(s, pb, h, i0);
      }
    }
    if (h == 0 && lane == 0) s.update_scratch[e] = L;
  }
  publish_update(s, slots, entries, 1, top);
}

// --- count-1 append in one round of reads (StoreKernels::kOneRound, kOneRoundWide) and the
// count-1 write of an update planned before (the LayeredCache) ---------------------------------
//
// append_kernel's critical path is a chain of dependent loads followed by a publication that
// waits for every CTA's rows: slot -> length -> (the pops of the entries before: their slots ->
// their lengths) -> free page -> rows -> fence -> done-counter -> (last CTA) slots -> lengths ->
// stores. append_once_kernel shortens it to two rounds of independent loads and one of
// dependent ones:
// 1. every CTA reads what the whole update needs — all entries' slots, then all their lengths
//    (each round's loads in flight together), the free count — into shared memory, with one bit
//    per entry that pops a block (AppendEntries); the new token's K/V loads are in flight
//    meanwhile;
// 2. each warp then issues its row's loads together: the ring row of the leaving token, and its
//    page (the table's, or free_blocks[top - 1 - rank] for a block that starts, the rank a
//    popcount of the bits of the entries before: the host mirror's order of pops);
// 3. a CTA counts itself on the done-counter as soon as it has READ (publish_after_reads), not
//    once its rows are written: the last CTA to count publishes every length and the free
//    count from its shared memory (stores only) and sets the counter back to 0, while the rows
//    are still being written. After its first round no CTA of the launch reads a length or the
//    free count, so the early publication is safe; the next launch, or the next kernel of a
//    graph, sees every write of this one.
// planned_append_kernel is the same row work for an update whose plan ran before (each entry's
// slot given, its old length in update_scratch, its pages in the table): one launch per write,
// with the LayeredCache's spill of the leaving token fused in.

/// Programmatic dependent launch (StoreKernels::kOneRoundPdl, sm_90): a kernel launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled while the kernel before it
/// on the stream still runs. griddepcontrol.wait blocks until that kernel has completed and its
/// writes are visible, so it comes before the kernel's first global access; launch_dependents
/// first lets the next such kernel be scheduled now (it waits the same way before it touches
/// memory), so its launch overlaps this kernel instead of following its last CTA.
template <bool kProgrammatic>
__device__ __forceinline__ void wait_for_previous_kernel() {
  if constexpr (kProgrammatic) {
    pdl_launch_dependents();
    pdl_wait();
  }
}

/// Every entry of a count-1 update as a CTA of append_once_kernel read it (shared memory).
struct AppendEntries {
  std::int32_t slot[kFusedMaxEntries];        ///< slots[e]
  std::int32_t length[kFusedMaxEntries];      ///< lengths[slot[e]] before the update
  std::uint32_t pops[kFusedMaxEntries / 32];  ///< bit e % 32 of word e / 32: entry e pops a block
  int top;                                    ///< free_count before the update
  /// Entry x's length before the update.
  __device__ __forceinline__ int entry_length(int x) const { return length[x]; }
};

/// Round 1 of append_once_kernel (every thread of the CTA, kThreads of them): reads the slots of
/// entries [0, entries), then their lengths, and the free count into `sh`.
template <int kThreads>
__device__ __forceinline__ void read_entries(const StoreView& s, const StoreDividers& dv,
                                             const std::int32_t* slots, int entries,
                                             AppendEntries& sh) {
  constexpr int kItems = (kFusedMaxEntries + kThreads - 1) / kThreads;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  int slot[kItems], length[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    slot[i] = x < entries ? slots[x] : 0;
  }
  if (t == 0) sh.top = *s.free_count;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    length[i] = x < entries ? s.lengths[slot[i]] : 0;
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (i * kThreads >= entries) break;  // the same for the whole CTA
    const int x = i * kThreads + t;
    const bool pops = x < entries && update_pops(s, dv, length[i], 1) != 0;
    const std::uint32_t bits = __ballot_sync(kFullMask, pops);
    if (x < entries) {
      sh.slot[x] = slot[i];
      sh.length[x] = length[i];
      if (lane == 0) sh.pops[x / 32] = bits;
    }
  }
  __syncthreads();
}

/// Entries before `e` (0..kFusedMaxEntries) that pop a block: the set bits of sh.pops below bit
/// e (sh: AppendEntries or LeanEntries). Every lane calls it with the same e.
template <class Entries>
__device__ __forceinline__ int pops_below(const Entries& sh, int e, int lane) {
  const int word = e / 32;
  int n = 0;
  if (lane < word) {
    n = __popc(sh.pops[lane]);
  } else if (lane == word && e % 32 != 0) {
    n = __popc(sh.pops[lane] & ((1u << (e % 32)) - 1u));
  }
  return row_sum(n);
}

/// Step 3 of append_once_kernel (and append_lean_kernel), by one warp of every CTA once the CTA
/// has read (read_entries, read_lean_entries): counts the CTA on s.update_counter; the last CTA
/// to count advances every entry's length by 1, lowers the free count by the entries' pops and
/// sets the counter back to 0.
template <class Entries>
__device__ __forceinline__ void publish_after_reads(const StoreView& s, const Entries& sh,
                                                    int entries, int lane) {
  int ticket = 0;
  if (lane == 0) {
    __threadfence();  // the CTA's reads (before __syncthreads) come before its count
    ticket = atomicAdd(s.update_counter, 1);
  }
  ticket = __shfl_sync(kFullMask, ticket, 0);
  if (ticket != static_cast<int>(gridDim.x) - 1) return;
  __threadfence();  // every other CTA's reads come before these writes
  for (int x = lane; x < entries; x += 32) s.lengths[sh.slot[x]] = sh.entry_length(x) + 1;
  const int pops = pops_below(sh, entries, lane);
  if (lane == 0) {
    *s.free_count = sh.top - pops;
    *s.update_counter = 0;
  }
}

/// One lane's share of the open block's running mean-K sum (StoreView::open_sum_k) in a count-1
/// append: the E elements [E lane, E lane + E) of (slot, head)'s sum and the position it awaits
/// (open_sum_next). Loaded beside the ring row (its address needs the slot, not the length), so
/// it adds no round of loads; the append folds its row in (fold) and either keeps the sum for
/// the next row or, at the block's last row, writes the mean K itself (store::summarise_element's
/// arithmetic: the same fadd_rn from 0 in row order over the same decoded values, then fdiv_rn
/// and store_summary), so the closing append reads nothing back.
template <int E>
struct OpenSum {
  float sum[E];
  int next = -1;  // open_sum_next's value; -1 where not loaded

  /// The lane's share of (slot, h)'s sum and its position (issued only; not waited for here).
  __device__ __forceinline__ void load(const StoreView& s, int slot, int h, int lane) {
    const std::size_t i = store::slot_head_index(s, slot, h);
    next = s.open_sum_next[i];
    std::uint32_t w[E];
    load_packed<4 * E>(
        reinterpret_cast<const std::uint8_t*>(s.open_sum_k + i * s.head_dim + E * lane), w);
#pragma unroll
    for (int e = 0; e < E; ++e) sum[e] = bits_float(w[e]);
  }

  /// Folds in row q (row qr of its block) as encode_row stored it (`kept`, the lane's share; f
  /// the store's OldRowLayout). Returns false, and folds nothing, when the sum does not cover
  /// the block's rows before this one (qr > 0 and next != q).
  template <class Layout>
  __device__ __forceinline__ bool fold(const Layout& f, const EncodedLane<E>& kept, int q, int qr) {
    if (qr != 0 && next != q) return false;
    constexpr int N = E % 4 == 0 ? 4 : 2;
#pragma unroll
    for (int g = 0; g < E / N; ++g) {
      float x[N];
      decode_old<N>(f, false, kept.template piece<N, Layout>(f, false, g), x);
#pragma unroll
      for (int n = 0; n < N; ++n) {
        float& a = sum[N * g + n];
        a = fadd_rn(qr == 0 ? 0.0f : a, x[n]);  // the first row from 0, as the summary's sums
      }
    }
    return true;
  }

  /// The sum and its position q + 1 kept for the block's next row (valid), or the position -1.
  __device__ __forceinline__ void keep(const StoreView& s, int slot, int h, int lane, int q,
                                       bool valid) const {
    const std::size_t i = store::slot_head_index(s, slot, h);
    if (valid) {
      std::uint32_t w[E];
#pragma unroll
      for (int e = 0; e < E; ++e) w[e] = float_bits(sum[e]);
      store_packed<4 * E>(reinterpret_cast<std::uint8_t*>(s.open_sum_k + i * s.head_dim + E * lane),
                          w);
    }
    if (lane == 0) s.open_sum_next[i] = valid ? q + 1 : -1;
  }

  /// The closed block's mean K (pool block pb, head h), the lane's E elements.
  __device__ __forceinline__ void close(const StoreView& s, int pb, int h, int lane) const {
    const float b = static_cast<float>(s.block_size);
    const std::size_t o = store::block_head_index(s, pb, h) * s.head_dim + E * lane;
#pragma unroll
    for (int e = 0; e < E; ++e) store::store_summary(s, s.mean_k, o + e, fdiv_rn(sum[e], b));
  }
};

/// The count-1 append of head h of `slot`, length L before the update, from the warp that owns
/// the row (every lane; kn, vn: the lane's share of the new token). The new token goes to ring
/// row L % W once that row's token L - W — the one leaving the ring, when L >= W — has been read
/// (each lane reads its share before it overwrites the same addresses). The leaving token is
/// encoded into its old row when the store owns its block, on page `fresh` when the block starts
/// and the caller popped one (the head-0 warp records it in the table), else on the table's; it
/// is also copied to the 16-bit rows spill_k / spill_v when they are not null. Where the store
/// keeps running sums (s.open_sum_k) the row is folded into its block's (OpenSum), and the row
/// that closes a block over a sum that covers it writes the mean K itself. Returns the pool
/// block when this row closes it and its summaries still need the block's rows (the caller
/// summarises it, summarise_closed or summarise_closing, once the warp's stores are visible),
/// else -1. Layout: the store's row layout type (OldRowLayout, or Fp16kQ4vMxfp4Layout where it
/// serves the store). dv: the store's divisors.
template <int E, class Layout = OldRowLayout>
__device__ __forceinline__ int append_row(const StoreView& s, const StoreDividers& dv, int slot,
                                          int L, int h, int lane, int fresh, const LaneRow<E>& kn,
                                          const LaneRow<E>& vn, std::uint16_t* spill_k,
                                          std::uint16_t* spill_v) {
  const int W = s.recent_window, B = s.block_size, d = s.head_dim;
  const int q = L - W;
  const int qb = q >= 0 ? dv.block(q) : 0, qr = q - qb * B;  // q's block and row in it
  const bool quantise = q >= 0 && owns_block(s, dv, qb);
  const bool spill = q >= 0 && spill_k != nullptr;
  const bool sums = quantise && s.open_sum_k != nullptr;
  const std::size_t r = store::ring_row_index(s, slot, h, L - dv.window(L) * W) * d;
  auto* rk = static_cast<std::uint16_t*>(s.ring_k) + r;
  auto* rv = static_cast<std::uint16_t*>(s.ring_v) + r;
  LaneRow<E> ko, vo;
  if (quantise || spill) {
    ko = load_lane<E>(rk, lane);
    vo = load_lane<E>(rv, lane);
  }
  OpenSum<E> open;
  if (sums && qr != 0) open.load(s, slot, h, lane);
  std::int32_t* entry = s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + qb;
  int pb = 0;
  if (quantise) pb = fresh >= 0 ? fresh : *entry;
  store_lane<E>(rk, lane, kn);
  store_lane<E>(rv, lane, vn);
  if (spill) {
    store_lane<E>(spill_k, lane, ko);
    store_lane<E>(spill_v, lane, vo);
  }
  if (!quantise) return -1;
  if (fresh >= 0 && h == 0 && lane == 0) *entry = pb;
  const Layout f{OldRowLayout::of(s)};
  EncodedLane<E> kept;
  encode_row<E>(s, f, store::old_row_index(s, pb, h, qr), ko, vo, lane, RowStage{}, &kept);
  const bool closes = qr == B - 1;  // the block closes: its last row is this warp's
  if (!sums) return closes ? pb : -1;
  const bool folded = open.fold(f, kept, q, qr);
  if (!closes) {
    open.keep(s, slot, h, lane, q, folded);
    return -1;
  }
  if (!folded) return pb;
  open.close(s, pb, h, lane);
  return -1;
}

/// The summaries of (pool block pb, head h) by the warp that closed it (append_row), every lane,
/// kSummaryAhead rows' loads in flight at a time.
template <class Layout = OldRowLayout>
__device__ __forceinline__ void summarise_closed(const StoreView& s, int pb, int h, int lane) {
  __syncwarp();  // the closing row's stores, every lane's, before any lane reads them back
  for (int i0 = 4 * lane; i0 < s.head_dim; i0 += 4 * 32) {
    summarise4<kSummaryAhead, Layout>(s, pb, h, i0);
  }
}

/// Entry e's row of head h in a self-planned count-1 append once round 1 is in `sh`
/// (AppendEntries or LeanEntries): the page its leaving token starts, popped in the entries'
/// order, then append_row, and the entry's length before the update into s.update_scratch.
/// Returns append_row's closed pool block, or -1.
template <int E, class Entries, class Layout = OldRowLayout>
__device__ __forceinline__ int append_entry_row(const StoreView& s, const StoreDividers& dv,
                                                const Entries& sh, int e, int h, int lane,
                                                const LaneRow<E>& kn, const LaneRow<E>& vn) {
  const int slot = sh.slot[e], L = sh.entry_length(e);
  const int q = L - s.recent_window;
  int fresh = -1;
  if (q >= 0) {
    const int qb = dv.block(q);
    if (q == qb * s.block_size && owns_block(s, dv, qb)) {  // a block this store owns starts
      fresh = s.free_blocks[sh.top - 1 - pops_below(sh, e, lane)];
    }
  }
  if (h == 0 && lane == 0) s.update_scratch[e] = L;
  return append_row<E, Layout>(s, dv, slot, L, h, lane, fresh, kn, vn, nullptr, nullptr);
}

// The whole count-1 append in one launch, one round of reads (see above): entries <=
// kFusedMaxEntries, s.update_counter set; kWarps warps per CTA, warp w of the grid serves
// (entry w / Hkv, head w % Hkv). Bit-identical to append_kernel and the CPU reference.
// kProgrammatic: launched as a programmatic dependent (wait_for_previous_kernel).
template <int E, int kWarps, bool kProgrammatic>
__global__ void __launch_bounds__(32 * kWarps)
    append_once_kernel(StoreView s, StoreDividers dv, const std::int32_t* slots, int entries,
                       const std::uint16_t* k, const std::uint16_t* v) {
  __shared__ AppendEntries sh;
  wait_for_previous_kernel<kProgrammatic>();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int w = static_cast<int>(blockIdx.x) * kWarps + warp;
  const int H = s.num_kv_heads;
  const bool row = w < entries * H;
  const int e = dv.heads(w), h = w - e * H;
  LaneRow<E> kn, vn;
  if (row) {  // the new token: independent of everything read below, in flight meanwhile
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * s.head_dim;
    kn = load_lane<E>(k + in, lane);
    vn = load_lane<E>(v + in, lane);
  }
  read_entries<32 * kWarps>(s, dv, slots, entries, sh);
  if (warp == kWarps - 1) publish_after_reads(s, sh, entries, lane);
  if (row) {
    const int closed = append_entry_row<E>(s, dv, sh, e, h, lane, kn, vn);
    if (closed >= 0) summarise_closed(s, closed, h, lane);
  }
}

// --- count-1 append with a two-load chain (StoreKernels::kLean, kLeanPdl) ------------------
//
// append_once_kernel's rows wait on three dependent rounds of global loads (slots -> their
// lengths -> page and leaving ring row), and in every CTA but a lone one the publishing warp
// also serves a row, so that row waits for the fence and the done-counter's atomic as well
// (B1 3.5 us, B8 and B64 a microsecond and two more on the H200). append_lean_kernel:
// 1. round 1 reads the entries' slots, the lengths of EVERY slot (s.max_slots <=
//    kLeanMaxSlots) and the free count, all independent of each other: a row's length is then a
//    shared-memory lookup, and its page and leaving ring row are the second and last round;
// 2. a warp of its own (the CTA's last, serving no row) counts the CTA on the done-counter and,
//    in the last CTA, publishes lengths and the free count (publish_after_reads), off the rows'
//    path;
// 3. the rows are append_row as in append_once_kernel (same pops, ranks and payloads);
// 4. a row that closes a block over the store's running sum (OpenSum) writes its mean K itself;
//    without running sums, a block a row closes is summarised by all the CTA's warps after a
//    CTA barrier (summarise_closing), not by the closing warp alone.

/// Row warps per CTA of append_lean_kernel, plus its publishing warp: 512 threads, so that the
/// kernel has append_once_kernel's register budget (128; with 17 warps ptxas spilled).
constexpr int kLeanRowWarps = 15;

/// Every entry's slot and every slot's length as a CTA of append_lean_kernel read them (shared
/// memory).
struct LeanEntries {
  std::int32_t slot[kFusedMaxEntries];        ///< slots[e]
  std::int32_t length[kLeanMaxSlots];         ///< lengths[x] of every slot x < max_slots
  std::uint32_t pops[kFusedMaxEntries / 32];  ///< bit e % 32 of word e / 32: entry e pops a block
  int top;                                    ///< free_count before the update
  int closed_count;                           ///< pairs in `closed`
  int2 closed[kLeanRowWarps];                 ///< (pool block, head) pairs the row warps closed
  /// Entry x's length before the update.
  __device__ __forceinline__ int entry_length(int x) const { return length[slot[x]]; }
};

/// Round 1 of append_lean_kernel (every thread of the CTA, kThreads of them): the slots of
/// entries [0, entries), the lengths of slots [0, s.max_slots) and the free count, one round of
/// independent loads; then each entry's pop bit.
template <int kThreads>
__device__ __forceinline__ void read_lean_entries(const StoreView& s, const StoreDividers& dv,
                                                  const std::int32_t* slots, int entries,
                                                  LeanEntries& sh) {
  constexpr int kItems = (kFusedMaxEntries + kThreads - 1) / kThreads;
  constexpr int kSlotItems = (kLeanMaxSlots + kThreads - 1) / kThreads;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  int slot[kItems], length[kSlotItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    slot[i] = x < entries ? slots[x] : 0;
  }
#pragma unroll
  for (int i = 0; i < kSlotItems; ++i) {
    const int x = i * kThreads + t;
    length[i] = x < s.max_slots ? s.lengths[x] : 0;
  }
  if (t == 0) {
    sh.top = *s.free_count;
    sh.closed_count = 0;
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    if (x < entries) sh.slot[x] = slot[i];
  }
#pragma unroll
  for (int i = 0; i < kSlotItems; ++i) {
    const int x = i * kThreads + t;
    if (x < s.max_slots) sh.length[x] = length[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (i * kThreads >= entries) break;  // the same for the whole CTA
    const int x = i * kThreads + t;
    const bool pops = x < entries && update_pops(s, dv, sh.entry_length(x), 1) != 0;
    const std::uint32_t bits = __ballot_sync(kFullMask, pops);
    if (x < entries && lane == 0) sh.pops[x / 32] = bits;
  }
  __syncthreads();
}

/// Rows of a closed block whose loads summarise_closing keeps in flight where the store keeps
/// mean K alone, 4 bytes a row a lane: a whole block of 32 with the default format's layout,
/// whose rows are immediate offsets from one address (PoolRowsOf with compile-time sizes); half
/// of it with OldRowLayout (at 32 the lean kernel spills: each row takes its own 64-bit address,
/// and the kernel has 128 registers). With the tasks shared (level alone) and the rows in one or
/// two rounds instead of four, the staggered B64 append took 5.34 us against 6.23 (H100,
/// fifty-first session): the closing step's extra was its rounds of loads.
template <class Layout>
constexpr int closing_ahead_mean_k() {
  return std::is_same<Layout, Fp16kQ4vMxfp4Layout>::value ? 32 : 16;
}

/// The pool rows summarise_closing reads: with the default format's layout at compile-time row
/// sizes (K in the 16-bit dtype, 2 d bytes; V in int4, d / 2 bytes; d = 32 E).
template <int E, class Layout>
using ClosingRows = typename std::conditional<std::is_same<Layout, Fp16kQ4vMxfp4Layout>::value,
                                              PoolRowsOf<64 * E, 16 * E>, PoolRows>::type;

/// The summaries of the (pool block, head) pairs a CTA of append_lean_kernel closed (sh.closed),
/// shared by its kWarps warps once every row is written: task t is elements [64 p, 64 p + 64)
/// (p = t % (d / 64)) of pair t / (d / 64), two a lane, taken by warp t % kWarps. Each element's
/// sums run over the rows in order, as summarise_closed's (the same summaries). A pair's warp
/// alone took about 1,170 instructions more than a row (H100, fiftieth session) while the CTA's
/// other warps had finished; shared, the step measured level, and with closing_ahead_mean_k's
/// rows in flight 0.86x (fifty-first session). With `own` (pool block, head; x < 0: none) the
/// calling warp takes only that pair's tasks, after its own rows are visible to it and no CTA
/// barrier (a store with running sums, where a read-back is rare): one call site, so the kernel
/// carries the loop's code once.
template <int E, int kWarps, class Layout>
__device__ __forceinline__ void summarise_closing(const StoreView& s, const LeanEntries& sh,
                                                  int warp, int lane, bool alone, int2 own) {
  constexpr int kParts = E / 2;  // d = 32 E: 64 elements a task
  if (alone) __syncwarp();       // the closing row's stores, every lane's, before the read-back
  const int tasks = alone ? (own.x >= 0 ? kParts : 0) : sh.closed_count * kParts;
  const int first = alone ? 0 : warp, stride = alone ? 1 : kWarps;
  for (int t = first; t < tasks; t += stride) {
    const int2 c = alone ? own : sh.closed[t / kParts];
    const Layout f{OldRowLayout::of(s)};
    using Rows = ClosingRows<E, Layout>;
    summarise_rows<kSummaryAhead, Rows, Layout, 2, closing_ahead_mean_k<Layout>()>(
        s, Rows(s, f, c.x, c.y), c.x, c.y, 64 * (t % kParts) + 2 * lane);
  }
}

// The whole count-1 append in one launch with a two-load chain (see above): entries <=
// kFusedMaxEntries, s.max_slots <= kLeanMaxSlots, s.update_counter set; kLeanRowWarps row warps
// per CTA (warp w of the grid's row warps serves (entry w / Hkv, head w % Hkv)) and one
// publishing warp. Bit-identical to append_once_kernel and the CPU reference. kProgrammatic:
// launched as a programmatic dependent (wait_for_previous_kernel). Layout: as append_row.
template <int E, bool kProgrammatic, class Layout = OldRowLayout>
__global__ void __launch_bounds__(32 * (kLeanRowWarps + 1), 1)
    append_lean_kernel(StoreView s, StoreDividers dv, const std::int32_t* slots, int entries,
                       const std::uint16_t* k, const std::uint16_t* v) {
  __shared__ LeanEntries sh;
  wait_for_previous_kernel<kProgrammatic>();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int w = static_cast<int>(blockIdx.x) * kLeanRowWarps + warp;
  const int H = s.num_kv_heads;
  const bool row = warp < kLeanRowWarps && w < entries * H;
  const int e = dv.heads(w), h = w - e * H;
  LaneRow<E> kn, vn;
  if (row) {  // the new token: independent of everything read below, in flight meanwhile
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * s.head_dim;
    kn = load_lane<E>(k + in, lane);
    vn = load_lane<E>(v + in, lane);
  }
  read_lean_entries<32 * (kLeanRowWarps + 1)>(s, dv, slots, entries, sh);
  if (warp == kLeanRowWarps) {
    publish_after_reads(s, sh, entries, lane);
  }
  // With running sums a block is read back only where its sum did not cover it (the first a
  // sequence closes after a chunk): rare, so its warp reads it back alone and the CTA takes no
  // barrier. Without, the CTA's warps share the closed blocks after one.
  const bool alone = s.open_sum_k != nullptr;  // the same for the whole CTA
  int closed = -1;
  if (row) {
    closed = append_entry_row<E, LeanEntries, Layout>(s, dv, sh, e, h, lane, kn, vn);
    if (closed >= 0 && !alone && lane == 0) {
      sh.closed[atomicAdd(&sh.closed_count, 1)] = make_int2(closed, h);
    }
  }
  if (!alone) __syncthreads();  // every row of the CTA written and visible, every pair listed
  summarise_closing<E, kLeanRowWarps + 1, Layout>(s, sh, warp, lane, alone, make_int2(closed, h));
}

// The count-1 write of an update planned before (store_write / the LayeredCache's plan): entry
// e is slot slots[e] with its length before the update in update_scratch[e] and its pages in the
// block table. Grid (ceil(entries * Hkv / kFastWarps), 1, layers), warp w serves (entry w / Hkv,
// head w % Hkv) of layer z = at_layer(s0, ls, z) with its input at k + z * ls.kv; with
// spill.rows > 0 the leaving token is also kept in spill row (slot, head, (L - W) % rows) of
// layer z (spill.k / spill.v moved by z * spill.layer_stride bytes). kProgrammatic: launched
// as a programmatic dependent (wait_for_previous_kernel).
template <int E, bool kProgrammatic>
__global__ void __launch_bounds__(32 * kFastWarps)
    planned_append_kernel(StoreView s0, StoreDividers dv, LayerStrides ls,
                          const std::int32_t* slots, int entries, const std::uint16_t* k,
                          const std::uint16_t* v, SpillRows spill) {
  wait_for_previous_kernel<kProgrammatic>();
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int w = static_cast<int>(blockIdx.x) * kFastWarps + static_cast<int>(threadIdx.x) / 32;
  const int H = s.num_kv_heads, d = s.head_dim;
  if (w >= entries * H) return;
  const int e = dv.heads(w), h = w - e * H;
  const std::size_t in = ls.kv * blockIdx.z + (static_cast<std::size_t>(e) * H + h) * d;
  const LaneRow<E> kn = load_lane<E>(k + in, lane), vn = load_lane<E>(v + in, lane);
  const int slot = slots[e], L = s.update_scratch[e];
  std::uint16_t *sk = nullptr, *sv = nullptr;
  if (spill.rows > 0 && L >= s.recent_window) {
    const std::ptrdiff_t layer = spill.layer_stride * static_cast<std::ptrdiff_t>(blockIdx.z);
    const std::size_t at = ((static_cast<std::size_t>(slot) * H + h) * spill.rows +
                            (L - s.recent_window) % spill.rows) *
                           d;
    sk = shift_bytes(static_cast<std::uint16_t*>(spill.k), layer) + at;
    sv = shift_bytes(static_cast<std::uint16_t*>(spill.v), layer) + at;
  }
  const int closed = append_row<E>(s, dv, slot, L, h, lane, -1, kn, vn, sk, sv);
  if (closed >= 0) summarise_closed(s, closed, h, lane);
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc
