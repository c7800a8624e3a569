// Internal: the token-level block scores (kTokenMax, kTokenMass) with the tensor-core kernel
// variant pinned, for the GPU tests (every variant against the CPU reference) and the benchmark
// (old and new kernels measured in one run). Not installed; kernels::block_scores (and so
// BlockIndex) uses kAuto.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvc/core/macros.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

/// Which chunk kernel scores the closed blocks where the tensor-core token scorer serves the call
/// (detail::uses_fast_kernel: mxfp4 index copy, f16 queries, head_dim 64 / 128, G <= 8). Every
/// other call (the general kernel, other scores) runs the same kernels whatever the variant.
enum class TokenKernels {
  /// The library's choice: kAutoTokenKernels (kStreamRows) where the streaming kernels serve the
  /// block size, else kBlockPerWarp.
  kAuto,
  /// token_stream_kernel (kernels/index/token_fast.cuh): 2, 4 or 8 blocks per warp (8 warps per
  /// chunk CTA) chosen from the call's shape (stream_blocks_per_warp), loads one slab ahead, a
  /// NaN-free path for blocks whose scales cannot overflow, per-warp running normalisers merged
  /// in shared memory, the ring over kStreamRingParts CTAs. Serves blocks of 16, 32 and 64
  /// tokens; other block sizes return cudaErrorNotSupported.
  kStream,
  /// kStream with 8 blocks per warp (64 per chunk CTA) whatever the shape.
  kStream8,
  /// kStream with 4 blocks per warp (32 per chunk CTA).
  kStream4,
  /// kStream with 2 blocks per warp (16 per chunk CTA).
  kStream2,
  /// kStream whose ring CTAs (kStreamTcRingParts per row) score the f16 ring rows on tensor
  /// cores (exact_part_tc: 16 rows per warp and mma.sync; the per-token CUDA-core code only for
  /// the open block's rows, a bf16 ring, non-finite keys or queries), and whose finish kernel is
  /// a programmatic dependent launch (its launch overlaps the chunk kernel's tail).
  kStreamTc,
  /// kStreamTc with the lean chunk loop: the softmax scale folded into each group's power of two
  /// (one IMAD builds scale * 2^(e - 113), no multiply per logit; stream_lean_safe_add) and one
  /// byte test per slab over the OR of its scale words (conservative: a slab it fails takes the
  /// exact path).
  kStreamLean,
  /// kStreamLean's math and ring CTAs with each warp's slabs copied as whole pool rows (16 bytes
  /// per cp.async, coalesced) into a padded ring of kRowsStages shared-memory stages two slabs
  /// ahead, read back with ldmatrix in the fragment order (kLoopRows): no registers hold loads in
  /// flight, and three chunk CTAs fit an SM (__launch_bounds__ 3). Blocks per warp (8, 4 or 2)
  /// from the call's shape and the CTAs resident on the device (rows_blocks_per_warp).
  kStreamRows,
  /// kStreamRows with 4 blocks per warp whatever the shape.
  kStreamRows4,
  /// kStreamRows with 8 blocks per warp whatever the shape.
  kStreamRows8,
  /// token_fast_kernel: a warp per (block, kv head), 16 blocks per chunk CTA, one ring CTA (the
  /// kernel before issue 12's token-mass rewrite, kept for comparison).
  kBlockPerWarp,
};

/// What kAuto means today: the streaming kernel with whole-row staging, the fastest variant at
/// B8 of the H200 run of docs/perf-data/2026-12-04-session15/second (h32x8x128 N128K token_mass
/// B8 263 us against kStreamLean's 284, token_max 218 against 228; SmolLM2's shape B1 / B8 19.9 /
/// 78.2 against 22.9 / 87.0; h32x8x128 B1 51.3 against 49.3, the one row where kStreamLean leads),
/// bit-identical to it in its arithmetic (every token-score test against the CPU). Before
/// 2026-12-04: kStreamLean (docs/perf-data/2026-12-01-session6).
constexpr TokenKernels kAutoTokenKernels = TokenKernels::kStreamRows;

/// True for the variants with the kLoopRows chunk loop (kStreamRows, kStreamRows4, kStreamRows8).
inline bool uses_rows(TokenKernels v) {
  return v == TokenKernels::kStreamRows || v == TokenKernels::kStreamRows4 ||
         v == TokenKernels::kStreamRows8;
}

/// True for the variants whose ring CTAs run on tensor cores and whose finish kernel is a
/// programmatic dependent launch (kStreamTc, kStreamLean, the kStreamRows variants).
inline bool uses_ring_tc(TokenKernels v) {
  return v == TokenKernels::kStreamTc || v == TokenKernels::kStreamLean || uses_rows(v);
}

/// True for the streaming variants (kStream, kStream8, kStream4, kStream2, and those whose ring
/// CTAs run on tensor cores).
inline bool is_stream(TokenKernels v) {
  return v == TokenKernels::kStream || v == TokenKernels::kStream8 || v == TokenKernels::kStream4 ||
         v == TokenKernels::kStream2 || uses_ring_tc(v);
}

/// True when the streaming kernel serves blocks of `block_size` tokens.
inline bool stream_serves_block_size(int block_size) {
  return block_size == 16 || block_size == 32 || block_size == 64;
}

/// The largest mxfp4 scale byte e for which every logit of a block is finite and far from
/// overflow, as the splat 255 - e over the four bytes of a word (0: no block is safe), for head_dim
/// `d` and softmax `scale`. Proof: with finite f16 queries |q| <= 65504 and e2m1 keys
/// |k| <= 6 * 2^(e - 127), every product, every partial sum of the mma's f32 accumulation, each
/// group's scaled sum and the FFMA chain over the groups is at most Σ_e |q_e k_e| <=
/// d * 65504 * 6 * 2^(e - 127) in magnitude, times a rounding factor (1 + 2^-24)^(2d) < 2; e is
/// the largest with d * 65504 * 6 * 2^(e - 127) * max(scale, 1) < 2^125, so |logit| < 2^126.
/// Then the block max m times log2 of Euler's number (< 2^126.6) is finite, every ex2 argument
/// (x - m) in base 2 is finite or -inf (ex2 gives 0), Σ exp >= 1, and no NaN or inf arises. At d
/// 128 and scale <= 1: e <= 226 (d 64: 227). The bound is also below 240, where ue8m0_times_16384
/// is exact.
inline std::uint32_t stream_safe_add(int d, float scale) {
  const double s = scale > 1.0f ? static_cast<double>(scale) : 1.0;
  int e = 240;
  while (e >= 128 && d * 65504.0 * 6.0 * std::ldexp(1.0, e - 127) * s >= std::ldexp(1.0, 125)) {
    --e;
  }
  // Bytes below 128 always pass the byte test of scale_bytes_unsafe, so a bound below 128 turns the
  // fast path off instead.
  return e >= 128 ? static_cast<std::uint32_t>(255 - e) * 0x01010101u : 0u;
}

/// The softmax scale times 2^-113 as float bits (kStreamLean folds it into each group's power of
/// two: adding e << 23 to these bits gives scale * 2^(e - 113) exactly while the exponent field
/// stays in 1..254), or 0 when that is not a normal float (zero, subnormal, infinite or NaN
/// scales; the lean fast path is then off).
inline std::uint32_t stream_scale_bits(float scale) {
  const float v = std::ldexp(scale, -113);
  if (!std::isnormal(v)) return 0u;
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

/// kStreamLean's fast-path bound, as stream_safe_add's splat: the smaller of stream_safe_add's
/// byte and the largest byte e for which stream_scale_bits(scale) + (e << 23) keeps the exponent
/// field at most 254 (so scale * 2^(e - 113) is a finite normal float); 0 (fast path off) when
/// either is off or the bound would fall below 128.
inline std::uint32_t stream_lean_safe_add(int d, float scale) {
  const std::uint32_t add = stream_safe_add(d, scale);
  const std::uint32_t bits = stream_scale_bits(scale);
  if (add == 0u || bits == 0u) return 0u;
  const int e_safe = 255 - static_cast<int>(add & 0xffu);
  const int e_exp = 254 - static_cast<int>((bits >> 23) & 0xffu);
  const int e = e_safe < e_exp ? e_safe : e_exp;
  return e >= 128 ? static_cast<std::uint32_t>(255 - e) * 0x01010101u : 0u;
}

/// Nonzero when one of the four scale bytes of `w` exceeds the bound of stream_safe_add
/// (`safe_add`, not 0; the bound is at least 128): a byte b >= 128 fails when
/// (b & 0x7f) + (255 - bound) carries into bit 7 (no carry crosses bytes: 127 + 127 < 256).
KVC_HD std::uint32_t scale_bytes_unsafe(std::uint32_t w, std::uint32_t safe_add) {
  return w & ((w & 0x7f7f7f7fu) + safe_add) & 0x80808080u;
}

/// kernels::block_scores (with its kTokenMass workspace) with the chunk kernel variant `which`.
/// A streaming variant on a call the tensor-core scorer serves but with a block size it does not
/// returns cudaErrorNotSupported before anything runs.
cudaError_t block_scores_with(TokenKernels which, const StoreView& s, const BlockIndexConfig& c,
                              const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                              const ScoresView& out, void* d_workspace, std::size_t workspace_bytes,
                              cudaStream_t stream);

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc
