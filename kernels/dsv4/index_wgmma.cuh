// The DeepSeek-V4 lightning indexer's mxfp4 score on Hopper's warpgroup tensor cores (variant 9:
// 64 heads, dim 128, sm_90a); kernels/dsv4/index.cuh holds the arithmetic and variants 1-5,
// index_stream.cuh variants 6-8.
//
// The roles of the integer mma swap: a warpgroup multiplies 64 keys (M, the A operand, unpacked
// in registers) by the token's 64 heads (N, the B operand, the prepared int8 query in shared
// memory), 4 wgmma m64n64k32 over the 128 dimensions. Variant 8 holds the query in registers as
// the A operand of 16 mma.sync per octet (64 registers a lane); here the query lives once in
// shared memory, a warp issues 4 wgmma per 64 keys for its 16, each unpacked key serves every
// token of a pass, and the accumulators arrive in the layout the head sum wants: thread (warp w,
// lane g, t) holds keys 16 w + g and 16 w + g + 8 and, of each 8-head tile j, heads 8 j + 2 t and 8
// j + 2 t + 1 — so it holds the whole chains of heads 2 t (mod 8) and 2 t + 1 (mod 8) of both keys,
// in ascending order.
//
// Same bits as variant 8 and the CPU (index_math.h): the k positions of a key's A fragment are
// lane (g, t)'s contiguous quarter [32 t, 32 t + 32) as lean_key / lean_unpack build them, and the
// query's B operand is variant 8's A fragments scattered into wgmma's K-major core matrices, so
// both sides see the same k permutation and the integer dot is the same; relu and the folded
// weight are variant 8's (relu_from_zero_start, fma chains over heads c, c + 8, ..., c + 56 for
// chain c); the butterfly ((c0 + c4) + (c2 + c6)) + ((c1 + c5) + (c3 + c7)) is variant 8's tree,
// here by lane xor 2, then xor 1 twice; the key scale is the same power of two.
//
// Pipeline: each warpgroup streams units of 64 entries (64 / page_entries pages, page_entries
// dividing 64) through wg_stages(tp) TMA stages of its own; after the unit's keys are in registers
// a warpgroup barrier (bar.red.and) both frees the stage for the refill and votes whether every key
// folds; a unit that does not (or one with a missing page) takes the reference form per octet
// (score_octet_reference), a warp its two octets. Up to kWgMaxTokens query tokens per pass reuse
// the unpacked A registers.
//
// Measured on the H200 (docs/dsv4.md): faster than variant 8 from three query tokens on (B8 T4
// 157 against 191 us) and than variant 7 for prefill (T 64: 264 against 356 us), slower at one
// token (B1: 15.7 against variant 8's 13.2 us): the exact fp32 head sum, the unpacking and the
// scale records cost the same in both, and one token's unit is a lockstep chain across the
// warpgroup.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dsv4/index.cuh"
#include "dsv4/index_stream.cuh"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

/// Warpgroups (key streams) per CTA of the wgmma kernel; kIndexThreads / 128.
constexpr int kWgGroups = kIndexThreads / 128;
/// Query tokens per pass of the wgmma kernel, at most (1, 2, 4 or 8).
constexpr int kWgMaxTokens = 8;
/// TMA stages (units of 64 entries) per warpgroup, at most.
constexpr int kWgMaxStages = 4;
/// Entries per unit: the M of one wgmma.
constexpr int kWgUnit = 64;
/// Bytes of one token's B operand: 64 heads x 128 int8, K-major core matrices.
constexpr int kWgQueryBytes = 64 * 128;

/// Stages per warpgroup for passes of `tp` tokens: 4, or 2 for 8 tokens (a unit then takes eight
/// tokens' work, and two CTAs still fit an SM).
__host__ __device__ constexpr int wg_stages(int tp) { return tp > 4 ? 2 : kWgMaxStages; }

/// The wgmma kernel's dynamic shared memory for passes of tp tokens: [kWgGroups][stages] staged
/// units, the pass's query B operands [tp][4 k-steps][8 head groups][2 k cores][8 rows][16 B],
/// their (K, weight) pairs [tp][8 tiles][4 t] int4 {K 2t, w 2t, K 2t+1, w 2t+1}, each warp's
/// reference-form scratch.
struct WgSmem {
  int query, kw, scratch, bytes;
  __host__ __device__ constexpr explicit WgSmem(int tp)
      : query(kWgGroups * wg_stages(tp) * kMaxStagedPageBytes),
        kw(query + tp * kWgQueryBytes),
        scratch(kw + tp * 32 * 16),
        bytes(scratch + kIndexWarps * octet_scratch_bytes<4, 128>()) {}
};
static_assert(kMaxStagedPageBytes % 128 == 0, "the query operands start 128-byte aligned");
static_assert(kWgMaxTokens == kStreamPrefillTokens, "the launcher's passes of 8 tokens fit");

/// The shared-memory matrix descriptor of a K-major, unswizzled operand (core matrices of 8 rows
/// x 16 bytes, 128 contiguous bytes each): start address `addr` (a shared-window address), LBO =
/// `k_stride` bytes between the two core matrices of a 32-byte k step, SBO = `n_stride` bytes
/// between groups of 8 rows.
__device__ __forceinline__ std::uint64_t wgmma_desc(std::uint32_t addr, int k_stride,
                                                    int n_stride) {
  return ((addr & 0x3FFFFu) >> 4) | (static_cast<std::uint64_t>(k_stride >> 4) << 16) |
         (static_cast<std::uint64_t>(n_stride >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
/// Waits until at most one committed wgmma group is still in flight (the newest).
__device__ __forceinline__ void wgmma_wait_one() {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}
/// Generic-proxy shared-memory writes made visible to the async proxy (wgmma's operand reads).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// Pins the accumulators in place around the asynchronous mma: the compiler may not move their
/// reads or writes across this point (CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void fence_accumulators(int (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

/// d (+)= a (64 x 32 u8, registers) * b (32 x 64 s8, descriptor); accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n64k32_u8s8(int (&d)[32], const std::uint32_t (&a)[4],
                                                     std::uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, "
      "p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
        "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

/// bar.red.and over the 128 threads of warpgroup `wg` (named barrier 1 + wg): true when `pred`
/// holds on all of them; also a barrier.
__device__ __forceinline__ bool warpgroup_all(int wg, bool pred) {
  std::uint32_t out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.and.pred p, %2, 128, q;\nselp.u32 %0, "
      "1, 0, p;\n}"
      : "=r"(out)
      : "r"(static_cast<std::uint32_t>(pred)), "r"(1 + wg)
      : "memory");
  return out != 0;
}

/// The reference form of a warp's two octets of a unit (o: its lanes' keys r0, o + 1: r1) for
/// one token, from the lanes' packed quarters w0 / w1 and scale bytes sb0 / sb1; out of line (and
/// by value), so that the folded path's registers do not carry it.
__device__ __noinline__ void wgmma_reference_octets(uint4 w0, int sb0, uint4 w1, int sb1, bool v0,
                                                    bool v1, const unsigned char* ws,
                                                    unsigned char* wsm, int o, int vis,
                                                    float* out_row) {
  const Mxfp4Row L(64, 128);
  const std::uint32_t k0[4] = {w0.x, w0.y, w0.z, w0.w}, k1[4] = {w1.x, w1.y, w1.z, w1.w};
  // An octet lies on one page: all its in-bound lanes agree on v (masked lanes say true).
  if (__all_sync(0xffffffffu, v0) && o * 8 < vis) {
    score_octet_reference<4, 128>(k0, sb0, ws, L, wsm, o, vis, out_row);
  }
  if (__all_sync(0xffffffffu, v1) && (o + 1) * 8 < vis) {
    score_octet_reference<4, 128>(k1, sb1, ws, L, wsm, o + 1, vis, out_row);
  }
}

/// Where thread (warp wq, lane g, t) finds its key r (16 wq + g or that + 8) of a unit: the page
/// of the unit and the key's (octet, row) within that page.
struct WgKeyPos {
  int page, stage_offset, ol, g;
  __device__ WgKeyPos(int r, int pe, int page_bytes)
      : page(r / pe), stage_offset((r / pe) * page_bytes), ol((r % pe) / 8), g(r % 8) {}
};

/// Scoring, mxfp4 keys, 64 heads, dim 128, on warpgroup tensor cores (variant 9, see above): grid
/// (CTAs, batch, passes), p.tp tokens per pass; page_entries divides 64 and a unit of pages fits
/// kMaxStagedPageBytes.
///
/// kTokenPairs (variant 11): where a unit folds and every token of a pass of 4 or 8 folds, the
/// tokens' wgmma groups go into two accumulator sets in turn, token tt + 1's group in flight while
/// token tt's head sum runs (variant 9 waits for each token's group before its head sum); the head
/// sum, and so the bits, are variant 9's. A token whose unit lies past its bound is computed and
/// not stored (every key of it fails j < vis).
///
/// The pair loop's two details (each measured; the bits are variant 9's either way):
/// - each wgmma's query descriptor is one base descriptor plus a compile-time offset added to its
///   low word (the address field: a shared-window address over 16, below 2^14, so the add carries
///   into nothing), not formed from the address per token and k step (about 24 uniform-datapath
///   instructions a token);
/// - the two tokens of a pair run their head chains one after the other and then their
///   butterflies together, so that the second token's shuffles wait in the first's shadow.
/// Together they took B1 T64 from 238.7 to 229.9 us and T256 from 927.8 to 893.0 us on an H200
/// (scripts/index-prefill-probe.cu, 2026-12-07).
template <bool kTokenPairs>
__global__ void __launch_bounds__(kIndexThreads, 2) mxfp4_score_wgmma_kernel(const IndexParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int H = 64, D = 128, KS = D / 32;
  extern __shared__ __align__(128) unsigned char dsmem[];
  __shared__ __align__(8) std::uint64_t bar[kWgGroups * kWgMaxStages];
  __shared__ int
      stage_pages[kWgGroups * kWgMaxStages];  // bit q: page q of the staged unit is there
  __shared__ int tok_vis[kWgMaxTokens], tok_ok[kWgMaxTokens];
  __shared__ float* tok_out[kWgMaxTokens];
  __shared__ const unsigned char* tok_ws[kWgMaxTokens];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4, wq = warp % 4, t = lane % 4;
  const int b = blockIdx.y, pass = blockIdx.z, tp = p.tp;
  const int S = wg_stages(tp);
  const WgSmem layout(tp);
  auto stage = reinterpret_cast<unsigned char(*)[kMaxStagedPageBytes]>(dsmem);
  unsigned char* qb = dsmem + layout.query;
  const int4* kw = reinterpret_cast<const int4*>(dsmem + layout.kw);  // [tp][32]
  auto wsm_all =
      reinterpret_cast<unsigned char(*)[octet_scratch_bytes<4, D>()]>(dsmem + layout.scratch);
  const int last = min(p.tc - 1, pass * tp + tp - 1);
  const ScoreRow srl = score_row(p, b, last);
  const int pe = p.keys.layout.page_entries,
            page_bytes = static_cast<int>(p.keys.layout.page_bytes);
  const int ppu = kWgUnit / pe;  // pages per unit
  const int units = (srl.vis + kWgUnit - 1) / kWgUnit;
  const int gs = static_cast<int>(blockIdx.x) * kWgGroups + wg, GS = gridDim.x * kWgGroups;
  const int my_units = units > gs ? (units - gs + GS - 1) / GS : 0;
  const int s0 = wg * S;  // this warpgroup's first stage
  const std::int32_t* table =
      p.keys.block_table + static_cast<std::size_t>(srl.slot) * p.keys.block_table_pitch;
  const bool producer = tid % 128 == 0;
  // A table entry's page: its pool address, or null when the entry is out of range (missing).
  auto page_address = [&](std::int32_t id) -> const std::uint8_t* {
    return id >= 0 && id < p.keys.num_pages
               ? p.keys.pool + static_cast<std::size_t>(id) * p.keys.layout.page_bytes
               : nullptr;
  };
  // Page q of unit u: its pool address, or null when it is past the pass's bound (not looked up)
  // or missing.
  auto unit_page = [&](int u, int q) -> const std::uint8_t* {
    if (u * kWgUnit + q * pe >= srl.vis) return nullptr;
    return page_address(table[u * ppu + q]);
  };
  // Unit i of the stream into stage st: one bulk copy per page, and which pages are there (the
  // mbarrier's arrival releases that word to the threads that wait on it).
  auto issue_unit = [&](int i, int st) {
    const int u = gs + i * GS;
    int bytes = 0, mask = 0;
    for (int q = 0; q < ppu; ++q) {
      if (unit_page(u, q) != nullptr) {
        bytes += page_bytes;
        mask |= 1 << q;
      }
    }
    stage_pages[s0 + st] = mask;
    std::uint64_t* br = &bar[s0 + st];
    mbar_arrive_expect_tx(br, bytes);
    for (int q = 0; q < ppu; ++q) {
      const std::uint8_t* src = unit_page(u, q);
      if (src != nullptr) bulk_copy_to_shared(stage[s0 + st] + q * page_bytes, src, page_bytes, br);
    }
  };
  // kTokenPairs: the warpgroup's first warp looks up unit i's page ids one unit ahead (lane q:
  // page q's table entry, -1 past the pass's bound), so that refilling a stage waits on no table
  // load (variant 9's producer thread loads them when it refills, and its warpgroup waits at the
  // next wgmma for that round trip).
  auto look_up_unit = [&](int i) -> std::int32_t {
    const int u = gs + i * GS;
    if (i >= my_units || lane >= ppu || u * kWgUnit + lane * pe >= srl.vis) return -1;
    return table[u * ppu + lane];
  };
  // Unit i into stage st from the ids look_up_unit(i) gave: the same copies and page mask as
  // issue_unit; every lane of the first warp calls it, lane 0 issues.
  auto issue_looked_up = [&](int st, std::int32_t ids) {
    int bytes = 0, mask = 0;
    for (int q = 0; q < ppu; ++q) {
      if (page_address(__shfl_sync(0xffffffffu, ids, q)) != nullptr) {
        bytes += page_bytes;
        mask |= 1 << q;
      }
    }
    std::uint64_t* br = &bar[s0 + st];
    if (lane == 0) {
      stage_pages[s0 + st] = mask;
      mbar_arrive_expect_tx(br, bytes);
    }
    for (int q = 0; q < ppu; ++q) {
      const std::uint8_t* src = page_address(__shfl_sync(0xffffffffu, ids, q));
      if (lane == 0 && src != nullptr) {
        bulk_copy_to_shared(stage[s0 + st] + q * page_bytes, src, page_bytes, br);
      }
    }
  };
  if (tid == 0) {
    for (int s = 0; s < kWgGroups * S; ++s) mbar_init(&bar[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (producer) {
    for (int s = 0; s < S && s < my_units; ++s) issue_unit(s, s);
  }
  std::int32_t ahead = kTokenPairs && wq == 0 ? look_up_unit(S) : -1;  // unit S's page ids
  // The pass's tokens: bound, output row, prepared query (the last token's for an inactive one).
  if (tid < tp) {
    const int tl = min(pass * tp + tid, last);
    const ScoreRow r = score_row(p, b, tl);
    const bool active = pass * tp + tid < p.tc;
    tok_vis[tid] = active ? r.vis : 0;
    tok_out[tid] = p.scores + r.row * static_cast<std::size_t>(p.pitch);
    tok_ws[tid] = p.ws + (static_cast<std::size_t>(b) * p.tc + tl) * p.ws_row;
    if (active && blockIdx.x == 0) p.num_valid[r.row] = r.vis;
  }
  pdl_wait();
  __syncthreads();
  // The pass's queries: variant 8's A fragments [4 tiles][4 k-steps][32 lanes][4 u32] scattered
  // into the B operand; (K, weight) pairs; fold flags.
  const Mxfp4Row L(H, D);
  for (int tt = 0; tt < tp; ++tt) {
    const unsigned char* ws = tok_ws[tt];
    const uint4* frag = reinterpret_cast<const uint4*>(ws + L.frag);
    for (int idx = tid; idx < 4 * KS * 32; idx += kIndexThreads) {
      const uint4 f = frag[idx];
      const int fl = idx % 32, s = (idx / 32) % KS, mt = idx / (32 * KS);
      unsigned char* dst = qb + tt * kWgQueryBytes + s * (H * 32) + (fl / 4) * 16 + (fl % 4) * 4;
      // Register r of the fragment: head 16 mt + fl / 4 + 8 (r & 1), k core r >> 1.
      *reinterpret_cast<std::uint32_t*>(dst + (2 * mt) * 256) = f.x;
      *reinterpret_cast<std::uint32_t*>(dst + (2 * mt + 1) * 256) = f.y;
      *reinterpret_cast<std::uint32_t*>(dst + (2 * mt) * 256 + 128) = f.z;
      *reinterpret_cast<std::uint32_t*>(dst + (2 * mt + 1) * 256 + 128) = f.w;
    }
    if (tid < 32) {
      const int* cinit = reinterpret_cast<const int*>(ws + L.cinit);
      const float* wfold = reinterpret_cast<const float*>(ws + L.wfold);
      const int h = 8 * (tid / 4) + 2 * (tid % 4);
      reinterpret_cast<int4*>(dsmem + layout.kw)[tt * 32 + tid] =
          make_int4(cinit[h], __float_as_int(wfold[h]), cinit[h + 1], __float_as_int(wfold[h + 1]));
      const bool all = __all_sync(0xffffffffu, ws[L.ok + lane] != 0 && ws[L.ok + lane + 32] != 0);
      if (lane == 0) tok_ok[tt] = all ? 1 : 0;
    }
  }
  fence_proxy_async_shared();
  __syncthreads();
  bool pass_folds = true;  // every token of the pass folds (the pipelined form's condition)
  for (int tt = 0; tt < tp; ++tt) pass_folds = pass_folds && tok_ok[tt] != 0;
  const std::uint32_t qb_s = smem_addr(qb);
  // The query operand's base descriptor, split in its words (the pair loop's).
  const std::uint64_t q_desc = wgmma_desc(qb_s, 128, 256);
  const std::uint32_t q_desc_lo = static_cast<std::uint32_t>(q_desc),
                      q_desc_hi = static_cast<std::uint32_t>(q_desc >> 32);
  // This thread's keys of a unit: rows r0 = 16 wq + g and r1 = r0 + 8.
  const int r0 = 16 * wq + lane / 4, r1 = r0 + 8;
  const WgKeyPos k0p(r0, pe, page_bytes), k1p(r1, pe, page_bytes);
  int st = 0;
  std::uint32_t phase = 0;
  for (int i = 0; i < my_units; ++i) {
    const int u = gs + i * GS, base = u * kWgUnit;
    mbar_wait(&bar[s0 + st], phase);
    const unsigned char* su = stage[s0 + st];
    // A key past the pass's bound is masked (zero codes, folds); one on a missing page is never
    // stored.
    const bool in0 = base + r0 < srl.vis, in1 = base + r1 < srl.vis;
    const int there = stage_pages[s0 + st];
    const bool v0 = !in0 || ((there >> k0p.page) & 1) != 0;
    const bool v1 = !in1 || ((there >> k1p.page) & 1) != 0;
    const LeanKey<KS> k0 = lean_key<D>(su + k0p.stage_offset, pe, k0p.ol, in0 && v0, k0p.g, t);
    const LeanKey<KS> k1 = lean_key<D>(su + k1p.stage_offset, pe, k1p.ol, in1 && v1, k1p.g, t);
    // Every key of the unit read: the stage is free; and whether the whole unit folds.
    const bool folds = warpgroup_all(wg, k0.fold && k1.fold && v0 && v1);
    if constexpr (kTokenPairs) {
      if (wq == 0) {
        if (i + S < my_units) issue_looked_up(st, ahead);
        ahead = look_up_unit(i + S + 1);
      }
    } else {
      if (producer && i + S < my_units) issue_unit(i + S, st);
    }
    if (++st == S) {
      st = 0;
      phase ^= 1u;
    }
    std::uint32_t a[KS][4];
    if (folds) {
      std::uint32_t bl0[KS], bh0[KS], bl1[KS], bh1[KS];
      lean_unpack<KS>(k0, bl0, bh0);
      lean_unpack<KS>(k1, bl1, bh1);
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        a[s][0] = bl0[s];
        a[s][1] = bl1[s];
        a[s][2] = bh0[s];
        a[s][3] = bh1[s];
      }
    }
    // Token tt's group: 4 wgmma over the unit's A registers into acc, committed.
    auto issue_token = [&](int(&acc)[32], int tt) {
      fence_accumulators(acc);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        wgmma_m64n64k32_u8s8(acc, a[s],
                             wgmma_desc(qb_s + tt * kWgQueryBytes + s * (H * 32), 128, 256), s);
      }
      wgmma_commit();
    };
    // Token TT's group (a compile-time token of the pair loop) from the base descriptor.
    auto issue_token_at = [&](int(&acc)[32], auto token) {
      constexpr int TT = decltype(token)::value;
      fence_accumulators(acc);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const std::uint32_t lo =
            q_desc_lo + static_cast<std::uint32_t>((TT * kWgQueryBytes + s * (H * 32)) >> 4);
        wgmma_m64n64k32_u8s8(acc, a[s], (static_cast<std::uint64_t>(q_desc_hi) << 32) | lo, s);
      }
      wgmma_commit();
    };
    // Token tt's head chains over its completed accumulators: e0 / o0 heads 2t / 2t + 1 (mod 8)
    // of key r0, e1 / o1 of key r1.
    auto token_chains = [&](const int(&acc)[32], int tt) {
      float4 c4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // e0, o0, e1, o1
#pragma unroll
      for (int j = 0; j < H / 8; ++j) {
        const int4 c = kw[tt * 32 + j * 4 + t];  // K 2t, w 2t, K 2t+1, w 2t+1
        c4.x = __fmaf_rn(relu_from_zero_start(acc[4 * j + 0], c.x), __int_as_float(c.y), c4.x);
        c4.y = __fmaf_rn(relu_from_zero_start(acc[4 * j + 1], c.z), __int_as_float(c.w), c4.y);
        c4.z = __fmaf_rn(relu_from_zero_start(acc[4 * j + 2], c.x), __int_as_float(c.y), c4.z);
        c4.w = __fmaf_rn(relu_from_zero_start(acc[4 * j + 3], c.z), __int_as_float(c.w), c4.w);
      }
      return c4;
    };
    // Token tt's head sum from its chains, stored below its bound: c_(2t) + c_(2t^4) by lane
    // xor 2 (t < 2 keeps key r0, t >= 2 key r1), then the pairs (c0 + c4) + (c2 + c6) and
    // (c1 + c5) + (c3 + c7) by xor 1 (even t keeps the even chains), then their sum by xor 1.
    auto token_tree = [&](const float4 c4, int tt) {
      const float e0 = c4.x, o0 = c4.y, e1 = c4.z, o1 = c4.w;
      const bool low = t < 2;
      const float se = __shfl_xor_sync(0xffffffffu, low ? e1 : e0, 2);
      const float so = __shfl_xor_sync(0xffffffffu, low ? o1 : o0, 2);
      const float ae = __fadd_rn(low ? e0 : e1, se), ao = __fadd_rn(low ? o0 : o1, so);
      const bool even = (t & 1) == 0;
      float v = __fadd_rn(even ? ae : ao, __shfl_xor_sync(0xffffffffu, even ? ao : ae, 1));
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
      if (even) {
        const int vis = tok_vis[tt];
        const int j = base + (low ? r0 : r1);
        const int kmin = low ? k0.kmin : k1.kmin;
        // The key scale 2^(kmin - 127): kmin is in [kFoldByteLo, kFoldByteHi], a normal float.
        if (j < vis) tok_out[tt][j] = fmul_rn(v, __int_as_float(kmin << 23));
      }
    };
    // Token tt's head sum over its completed accumulators, stored below its bound.
    auto finish_token = [&](const int(&acc)[32], int tt) { token_tree(token_chains(acc, tt), tt); };
    if constexpr (kTokenPairs) {
      // Straight-line per pass size, so that every group's issue and wait lie on one path (a
      // wait on a divergent path makes ptxas serialize every wgmma of the kernel).
      auto in_pairs = [&](auto tokens) {
        constexpr int TP = decltype(tokens)::value;
        int acc_a[32], acc_b[32];
        issue_token_at(acc_a, std::integral_constant<int, 0>{});
        // The pair (TT, TT + 1): TT + 1's group issued before TT's head sum, TT + 2's before
        // TT + 1's.
        auto pair = [&](auto token) {
          constexpr int TT = decltype(token)::value;
          issue_token_at(acc_b, std::integral_constant<int, TT + 1>{});
          wgmma_wait_one();
          fence_accumulators(acc_a);
          const float4 ca = token_chains(acc_a, TT);
          if constexpr (TT + 2 < TP) {
            issue_token_at(acc_a, std::integral_constant<int, TT + 2>{});
            wgmma_wait_one();
          } else {
            wgmma_wait_all();
          }
          fence_accumulators(acc_b);
          const float4 cb = token_chains(acc_b, TT + 1);
          token_tree(ca, TT);
          token_tree(cb, TT + 1);
        };
        pair(std::integral_constant<int, 0>{});
        pair(std::integral_constant<int, 2>{});
        if constexpr (TP == 8) {
          pair(std::integral_constant<int, 4>{});
          pair(std::integral_constant<int, 6>{});
        }
      };
      if (folds && pass_folds && (tp == 8 || tp == 4)) {
        if (tp == 8) {
          in_pairs(std::integral_constant<int, 8>{});
        } else {
          in_pairs(std::integral_constant<int, 4>{});
        }
        continue;
      }
    }
    for (int tt = 0; tt < tp; ++tt) {
      const int vis = tok_vis[tt];
      if (base >= vis) continue;  // uniform over the warpgroup (0 for an inactive token)
      if (folds && tok_ok[tt] != 0) {
        int acc[32];
        issue_token(acc, tt);
        wgmma_wait_all();
        fence_accumulators(acc);
        finish_token(acc, tt);
      } else {
        wgmma_reference_octets(make_uint4(k0.word[0], k0.word[1], k0.word[2], k0.word[3]), k0.sb,
                               make_uint4(k1.word[0], k1.word[1], k1.word[2], k1.word[3]), k1.sb,
                               v0, v1, tok_ws[tt], wsm_all[warp], u * (kWgUnit / 8) + 2 * wq, vis,
                               tok_out[tt]);
      }
    }
  }
#endif
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc
