// Split-K decode attention on tensor cores with K / V staged through shared memory: the staged
// variant of mma.cuh (KernelPath::kTensorCoresStaged, kTensorCoresStagedDeep).
//
// The CTA (sequence b, query token t, kv head h, tile of 8 query heads, chunk of the row's
// virtual list), its 4 warps, their warp groups (d > 128: the head dims split over 2 or 4
// warps) and the math of one 16-token tile (mma_scores / mma_values on registers in mma.cuh's
// lane layout) are those of mma.cuh. What differs is how the tiles reach the registers: through
// a ring of p.stages shared-memory stages filled by cp.async. A stage holds one 16-row tile per
// warp group (64 rows up to d = 128, 32 at d = 256, 16 at d = 512: 32 KB of 16-bit K and V at
// d >= 128), all 128 threads copy it 16 bytes at a time (zero-filled where a row is not
// allocated, so such rows read as 0 as mma.cuh's registers do), and while the warps compute
// stage i the copies of stages i + 1 .. i + p.stages - 1 are in flight: about (p.stages - 1) x
// 32 KB per CTA instead of one tile per warp. Multistage in the CUTLASS way: one
// cp.async.wait_group and one __syncthreads per stage, which also frees the slot the stage
// after refills. Old rows are copied in their own format (q8 / int4 codes as bytes, with their
// fp32 scales) and dequantised in registers after the shared-memory load, exactly as mma.cuh
// does after its global load; a staged row is 2d bytes wide whatever its format, and the 16-byte
// chunks of a row are XOR-swizzled (stage_plan.h) so that the lane pattern reads without bank
// conflicts. Each stage also holds one "attended" byte per row (causal mask, lengths,
// selections), written by the producer with ordinary stores once the length is known.
//
// Which tiles a chunk stages (stage_plan.h, next_stage_tile): every ring tile (its rows are
// always allocated; the mask decides), and of the old part and the plain cache only the tiles
// that can hold an attended row. Producer and consumers walk the same sequence (each thread
// walks it twice: the stage it issues and the stage it computes).
//
// Order of a CTA: the slot, then the copies of the first stages that hold only ring rows (they
// need no length: one round trip earlier), the selected ids and their pool ids for every index
// the chunk could read (no length or count needed either), the query, the length (ids past the
// closed blocks then become skipped ones), the attended bytes of the early stages, the rest of
// the prologue, the main loop; then the merge of the warp groups (overlaying the stages) and
// finish_cta, as in mma.cuh (final rows, a cluster merge, or partial states for combine.cuh).
//
// Dynamic shared memory: [pool ids of the selected blocks][their raw ids][SliceSum buffers]
// [stages]
// (staged_smem_bytes).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attention/mma.cuh"
#include "attention/stage_plan.h"

namespace kvc {
namespace kernels {
namespace attention_detail {

/// Fewest and most shared-memory stages of the staged kernel (DecodeParams::stages).
constexpr int kMinStages = 2;
constexpr int kMaxStages = 8;

/// Byte layout of one stage and of the header before the stages, for head_dim D.
template <int D>
struct StageLayout {
  static constexpr int kTiles = MmaSplit<D>::kGroups;  // one 16-row tile per warp group
  static constexpr int kRows = kTiles * kMmaTile;
  static constexpr int kRowBytes = 2 * D;                // a staged K or V row, whatever its format
  static constexpr int kK = 0;                           // [kRows][kRowBytes] K rows
  static constexpr int kV = kRows * kRowBytes;           // [kRows][kRowBytes] V rows
  static constexpr int kKScale = 2 * kRows * kRowBytes;  // [kRows] f32 q8 K scales
  static constexpr int kVScale = kKScale + 4 * kRows;    // [kRows] f32 q8 / int4 V scales
  static constexpr int kFlags = kVScale + 4 * kRows;     // [kRows] bytes: row attended
  static constexpr int kBytes = (kFlags + kRows + 127) / 128 * 128;
  static constexpr int kListBytes = kMaxList * 4;  // pool ids, then the raw ids (two arrays)
  static constexpr int kSumBytes = MmaSplit<D>::kSplit > 1 ? 2 * kWarps * 32 * 16 : 0;
  static constexpr int kHeader = (2 * kListBytes + kSumBytes + 127) / 128 * 128;
  using Merge = MergeSmem<D, kMmaCols, MmaSplit<D>::kGroups>;
  static_assert(sizeof(Merge) <= static_cast<std::size_t>(kMinStages) * kBytes,
                "the merge overlays the stages");
};

/// Dynamic shared memory of the staged kernel for (head_dim, stages), 0 for another head_dim.
inline std::size_t staged_smem_bytes(int head_dim, int stages) {
  switch (head_dim) {
    case 64:
      return StageLayout<64>::kHeader + static_cast<std::size_t>(stages) * StageLayout<64>::kBytes;
    case 128:
      return StageLayout<128>::kHeader +
             static_cast<std::size_t>(stages) * StageLayout<128>::kBytes;
    case 256:
      return StageLayout<256>::kHeader +
             static_cast<std::size_t>(stages) * StageLayout<256>::kBytes;
    case 512:
      return StageLayout<512>::kHeader +
             static_cast<std::size_t>(stages) * StageLayout<512>::kBytes;
    default:
      return 0;
  }
}

/// Rows of one stage for a runtime head_dim (StageLayout<d>::kRows).
constexpr int stage_rows(int head_dim) { return kMmaTile * mma_groups(head_dim); }

// --- cp.async -----------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// Asynchronous copy of the 16 bytes at src into shared memory at dst; with `load` false
/// nothing is read and dst is zero-filled.
__device__ __forceinline__ void stage_copy16(void* dst, const void* src, bool load) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(load ? 16 : 0)
               : "memory");
}

/// The same for 4 bytes (one scale).
__device__ __forceinline__ void stage_copy4(void* dst, const void* src, bool load) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(load ? 4 : 0)
               : "memory");
}

/// Closes this thread's copies issued since the last commit into one group.
__device__ __forceinline__ void stage_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most `pending` of this thread's committed groups are still in flight.
__device__ __forceinline__ void stage_wait(int pending) {
  switch (pending) {
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      break;
    case 3:
      asm volatile("cp.async.wait_group 3;\n" ::: "memory");
      break;
    case 4:
      asm volatile("cp.async.wait_group 4;\n" ::: "memory");
      break;
    case 5:
      asm volatile("cp.async.wait_group 5;\n" ::: "memory");
      break;
    case 6:
      asm volatile("cp.async.wait_group 6;\n" ::: "memory");
      break;
    default:  // 0, and anything else: everything (always correct)
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      break;
  }
}

/// Loads the N-byte run (4, 8 or 16 bytes, aligned) of shared memory at p into w[0 .. N / 4).
template <int N>
__device__ __forceinline__ void shared_run(const std::uint8_t* p, std::uint32_t* w) {
  if constexpr (N == 16) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    w[0] = x.x;
    w[1] = x.y;
    w[2] = x.z;
    w[3] = x.w;
  } else if constexpr (N == 8) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    w[0] = x.x;
    w[1] = x.y;
  } else {
    static_assert(N == 4, "runs are 4, 8 or 16 bytes");
    w[0] = *reinterpret_cast<const std::uint32_t*>(p);
  }
}

// --- the producer -------------------------------------------------------------------------------

/// Byte offset in a stage's K (`is_v` false) or V rows of byte `byte` of staged row `row`, for
/// rows of `row_bytes` bytes in format F (stage_chunk's swizzle).
template <int D, OldKind F>
__device__ __forceinline__ int stage_offset(bool is_v, int row, int byte) {
  using Rb = MmaRowBytes<D, F>;
  const int chunks = (is_v ? Rb::kV : Rb::kK) / 16;
  return row * StageLayout<D>::kRowBytes +
         stage_chunk(is_v, !is_v && F == OldKind::kQ8, chunks, row, byte >> 4) * 16 + (byte & 15);
}

/// Issues the copies of one 16-row tile in row format F (K, V and their scales) into rows
/// [row0, row0 + 16) of stage `st`; `row(i)` is row i of the tile. Every thread calls it.
template <int D, OldKind F, class RowFn>
__device__ __forceinline__ void stage_tile_copy(const DecodeParams& p, std::uint8_t* st, int row0,
                                                RowFn&& row, const void* dummy) {
  using L = StageLayout<D>;
  using Rb = MmaRowBytes<D, F>;
  constexpr int kKC = Rb::kK / 16, kVC = Rb::kV / 16;
  for (int x = threadIdx.x; x < kMmaTile * kKC; x += kThreads) {
    const int i = x / kKC, ch = x % kKC;
    const MmaRow a = row(i);
    stage_copy16(st + L::kK + stage_offset<D, F>(false, row0 + i, ch * 16),
                 a.load ? static_cast<const void*>(a.k + ch * 16) : dummy, a.load);
  }
  for (int x = threadIdx.x; x < kMmaTile * kVC; x += kThreads) {
    const int i = x / kVC, ch = x % kVC;
    const MmaRow a = row(i);
    stage_copy16(st + L::kV + stage_offset<D, F>(true, row0 + i, ch * 16),
                 a.load ? static_cast<const void*>(a.v + ch * 16) : dummy, a.load);
  }
  if constexpr (F == OldKind::kQ8 || F == OldKind::kQ4v) {
    const int x = threadIdx.x;
    const bool is_v = x >= kMmaTile;
    if (x < 2 * kMmaTile && (is_v || F == OldKind::kQ8)) {
      const int i = x % kMmaTile;
      const MmaRow a = row(i);
      const float* src = (is_v ? p.s.old_v_scale : p.s.old_k_scale) + a.r;
      stage_copy4(st + (is_v ? L::kVScale : L::kKScale) + 4 * (row0 + i),
                  a.load ? static_cast<const void*>(src) : dummy, a.load);
    }
  }
}

/// Row v of the virtual list as a lane of the producer sees it: plain-cache, ring or old row.
template <int D, OldKind F>
__device__ __forceinline__ MmaRow stage_row(const DecodeParams& p, const MmaCtx& c, const int* list,
                                            int v) {
  if (p.plain) return plain_row<D>(p, c, v);
  if (v < c.W16) return ring_row<D>(p, c, v);
  return list_old_row<D, F>(p, c, list, v);
}

/// Issues the copies of the tiles t[] (starts in the virtual list; >= c1: none) of one stage.
template <int D, OldKind F, int kTiles>
__device__ __forceinline__ void stage_issue(const DecodeParams& p, const MmaCtx& c, const int* list,
                                            std::uint8_t* st, const int (&t)[kTiles], int c1,
                                            const void* dummy) {
#pragma unroll
  for (int k = 0; k < kTiles; ++k) {
    const int v0 = t[k];
    if (v0 >= c1) continue;
    if (p.plain) {
      stage_tile_copy<D, OldKind::k16>(
          p, st, k * kMmaTile, [&](int i) { return plain_row<D>(p, c, v0 + i); }, dummy);
    } else if (v0 < c.W16) {
      stage_tile_copy<D, OldKind::k16>(
          p, st, k * kMmaTile, [&](int i) { return ring_row<D>(p, c, v0 + i); }, dummy);
    } else {
      stage_tile_copy<D, F>(
          p, st, k * kMmaTile, [&](int i) { return list_old_row<D, F>(p, c, list, v0 + i); },
          dummy);
    }
  }
}

/// Writes the attended byte of every row of the stage's tiles t[] (needs the length).
template <int D, OldKind F, int kTiles>
__device__ __forceinline__ void stage_flags(const DecodeParams& p, const MmaCtx& c, const int* list,
                                            std::uint8_t* st, const int (&t)[kTiles], int c1) {
  const int i = threadIdx.x;
  if (i >= kMmaTile) return;
#pragma unroll
  for (int k = 0; k < kTiles; ++k) {
    const bool ok = t[k] < c1 && stage_row<D, F>(p, c, list, t[k] + i).ok;
    st[StageLayout<D>::kFlags + k * kMmaTile + i] = ok ? 1 : 0;
  }
}

/// The next stage's tiles of the walk from `cursor` (advanced past them).
template <int kTiles>
__device__ __forceinline__ void walk_stage(const StageWalk& w, int& cursor, int (&t)[kTiles]) {
#pragma unroll
  for (int k = 0; k < kTiles; ++k) {
    t[k] = next_stage_tile(w, cursor);
    cursor = t[k] < w.end ? t[k] + kMmaTile : w.end;
  }
}

// --- the consumer -------------------------------------------------------------------------------

/// A lane's registers and mask of the staged tile at rows [row0, row0 + 16) of stage `st` in
/// row format F, for the warp's slice of S head dims (k_off / v_off bytes into a row): the
/// same layout as mma_load of mma.cuh.
template <int D, int S, OldKind F>
__device__ __forceinline__ void stage_load(const std::uint8_t* st, int row0, int k_off, int v_off,
                                           TileData<S, F>& td, TileMask& tm) {
  using L = StageLayout<D>;
  using Sh = MmaShape<S, F>;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const float* ksc = reinterpret_cast<const float*>(st + L::kKScale);
  const float* vsc = reinterpret_cast<const float*>(st + L::kVScale);
  const std::uint8_t* flags = st + L::kFlags;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
#pragma unroll
    for (int j = 0; j < Sh::kKC; ++j) {
      const int byte = k_off + j * (Sh::kKRunBytes * 4) + c * Sh::kKRunBytes;
      shared_run<Sh::kKRunBytes>(st + L::kK + stage_offset<D, F>(false, row, byte),
                                 &td.kr[r][j * (Sh::kKRunBytes / 4)]);
    }
    td.ksc[r] = F == OldKind::kQ8 ? ksc[row] : 1.0f;
    td.vsc[r] = F == OldKind::kQ8 || F == OldKind::kQ4v ? vsc[row] : 1.0f;
    tm.kok[r] = flags[row] != 0;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = row0 + 2 * c + (r & 1) + 8 * (r >> 1);
#pragma unroll
    for (int h = 0; h < Sh::kVC; ++h) {
      const int byte = v_off + h * (Sh::kVRunBytes * 8) + g * Sh::kVRunBytes;
      shared_run<Sh::kVRunBytes>(st + L::kV + stage_offset<D, F>(true, row, byte),
                                 &td.vr[r][h * (Sh::kVRunBytes / 4)]);
    }
    tm.vok[r] = flags[row] != 0;
  }
}

// --- the selected blocks' pool ids
// ----------------------------------------------------------------

/// Before the length and the count are known: the pool ids of every selected block the chunk
/// could read if the count were max_selected (ids [0, max_selected) of the row and the slot's
/// block-table row are always readable): list[i - lo] = table[id] for 0 <= id <
/// max_blocks_per_slot, else -1, and raw[i - lo] = id. Sets c.list_lo. The loads overlap the
/// length's instead of waiting for it (the ids, then the table: two round trips less).
__device__ __forceinline__ void selected_ids_early(const DecodeParams& p, MmaCtx& c, int* list,
                                                   int* raw, int c0, int c1) {
  int lo = 0, hi = -1;
  if (!selected_range(p, c, c0, c1, p.sel.max_selected, lo, hi)) return;
  c.list_lo = lo;
  for (int i = lo + static_cast<int>(threadIdx.x); i <= hi; i += kThreads) {
    const int id = c.sel_ids[i];
    raw[i - lo] = id;
    list[i - lo] = id >= 0 && id < p.s.max_blocks_per_slot ? c.table[id] : -1;
  }
}

/// Once the length is known: the staged ids at or past the row's closed blocks become -1
/// (skipped), as stage_selected_ids stages them; each thread fixes the entries it wrote. Ends
/// with a barrier where stage_selected_ids has one (uniform).
__device__ __forceinline__ void selected_ids_checked(const DecodeParams& p, const MmaCtx& c,
                                                     int* list, const int* raw, int c0, int c1) {
  if (p.plain || p.mode != static_cast<int>(AttentionMode::kBlockSelectExact)) return;
  if (c1 <= c.W16 + c.B16) return;
  int lo = 0, hi = -1;
  if (selected_range(p, c, c0, c1, p.sel.max_selected, lo, hi)) {
    for (int i = lo + static_cast<int>(threadIdx.x); i <= hi; i += kThreads) {
      if (raw[i - lo] >= c.closed) list[i - lo] = -1;
    }
  }
  __syncthreads();
}

// --- the kernel ---------------------------------------------------------------------------------

template <int D, OldKind F, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1)
    staged_decode_kernel(const __grid_constant__ DecodeParams p) {
  using Sp = MmaSplit<D>;
  constexpr int S = Sp::kSlice;
  using L = StageLayout<D>;
  constexpr int kTiles = L::kTiles;
  extern __shared__ __align__(128) std::uint8_t smem[];
  int* list = reinterpret_cast<int*>(smem);            // pool ids of the selected blocks
  int* raw = reinterpret_cast<int*>(smem) + kMaxList;  // their ids as selected
  std::uint8_t* stages = smem + L::kHeader;
  MmaCtx c;
  const CtaCoords cta = mma_cta_begin<D>(p, c);
  const int chunk = cta.chunk, c0 = cta.c0, c1 = cta.c1;
  const MmaWarp<D, F> wp;
  const int group = wp.group, slice = wp.slice, dim0 = wp.dim0;
  const int off16 = wp.off16, k_off = wp.k_off, v_off = wp.v_off;
  const int col0 = cta.tile * kMmaCols;
  SliceSum<Sp::kSplit> sum{reinterpret_cast<float4*>(smem + 2 * L::kListBytes), group, slice, 0};
  const int ns = p.stages;
  // The source of zero-filled copies (nothing is read there): an aligned row of the cache.
  const void* dummy = p.plain                 ? static_cast<const void*>(c.pk)
                      : p.s.ring_k != nullptr ? static_cast<const void*>(c.ring_k)
                                              : static_cast<const void*>(p.s.old_k);

  StageWalk w;
  w.plain = p.plain;
  w.owns_ring = p.plain || store::owns_ring(p.s);
  w.mode = p.mode;
  w.W16 = c.W16;
  w.B16 = c.B16;
  w.end = c1;
  // Stages holding only ring rows (or nothing) are copied before the length is known: the walk
  // does not skip ring tiles, so it needs no length there.
  int issue_v = c0;  // the producer's walk
  int issued = 0;    // stages committed so far (stage s sits in slot s % ns)
  if (!p.plain && w.owns_ring) {
    while (issued < ns - 1 && issue_v < c1 && (issue_v + L::kRows <= c.W16 || c1 <= c.W16)) {
      int t[kTiles];
      walk_stage(w, issue_v, t);
      stage_issue<D, F>(p, c, list, stages + issued * L::kBytes, t, c1, dummy);
      stage_commit();
      ++issued;
    }
  }
  const int early = issued;
  selected_ids_early(p, c, list, raw, c0, c1);

  std::uint32_t q[S / 8];
  mma_load_query<D, S>(p, c, col0, off16, q);

  init_row_range(p, c);  // the first wait for the length
  selected_ids_checked(p, c, list, raw, c0, c1);
  w.O = c.O;
  w.wb = c.wb;
  w.open_tokens = c.open_tokens;
  w.selected_rows = c.sel_count * p.s.block_size;
  w.begin = c.begin;
  w.pos = c.pos;
  {
    int v = c0;
    for (int s = 0; s < early; ++s) {
      int t[kTiles];
      walk_stage(w, v, t);
      stage_flags<D, F>(p, c, list, stages + s * L::kBytes, t, c1);
    }
  }
  for (; issued < ns - 1; ++issued) {
    int t[kTiles];
    walk_stage(w, issue_v, t);
    std::uint8_t* st = stages + issued * L::kBytes;
    stage_issue<D, F>(p, c, list, st, t, c1, dummy);
    stage_flags<D, F>(p, c, list, st, t, c1);
    stage_commit();
  }

  MmaState<S> ms;
  mma_state_init(ms);
  int use_v = c0;  // the consumers' walk
  for (int it = 0;; ++it) {
    stage_wait(ns - 2);  // stage it has landed (this thread's copies) ...
    __syncthreads();     // ... and everyone's; slot (it - 1) % ns is no longer read
    int t[kTiles];
    walk_stage(w, use_v, t);
    if (t[0] >= c1) break;  // uniform: nothing is left (later stages are empty too)
    {
      int tn[kTiles];
      walk_stage(w, issue_v, tn);
      std::uint8_t* st = stages + ((it + ns - 1) % ns) * L::kBytes;
      stage_issue<D, F>(p, c, list, st, tn, c1, dummy);
      stage_flags<D, F>(p, c, list, st, tn, c1);
      stage_commit();
    }
    int v0 = t[0];
#pragma unroll
    for (int k = 1; k < kTiles; ++k) v0 = group == k ? t[k] : v0;
    if (v0 < c1) {
      const std::uint8_t* st = stages + (it % ns) * L::kBytes;
      TileMask tm;
      if (p.plain || v0 < c.W16) {
        TileData<S, OldKind::k16> td;
        stage_load<D, S, OldKind::k16>(st, group * kMmaTile, off16, off16, td, tm);
        mma_compute<S, OldKind::k16, kBf16>(td, tm, q, p.scale_log2, ms, sum);
      } else {
        TileData<S, F> td;
        stage_load<D, S, F>(st, group * kMmaTile, k_off, v_off, td, tm);
        mma_compute<S, F, kBf16>(td, tm, q, p.scale_log2, ms, sum);
      }
    }
  }
  stage_wait(0);  // nothing is in flight (the stages past the end are empty); to be exact

  auto& mg = *reinterpret_cast<typename L::Merge*>(stages);
  mma_store_group_state<D, S>(ms, mg, group, slice, dim0);  // synchronises around its writes
  finish_cta<D, kMmaCols, Sp::kGroups>(p, mg, c.bt, c.h, col0, chunk);
}

/// The staged tensor-core kernel for (D, F, kBf16) as a function pointer (instantiates it).
template <int D, OldKind F, bool kBf16>
const void* staged_kernel_ptr() {
  return reinterpret_cast<const void*>(&staged_decode_kernel<D, F, kBf16>);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc
