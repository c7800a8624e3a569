/*! \file kvc/kernels/dsv4_kernels.h
 *  \brief Kernel layer of the DeepSeek-V4 objects: stream-ordered launches over memory the
 *  caller owns (EntryStoreView, compressor state, queries, scores), bit-identical to the CPU
 *  reference where the reference defines bits (entries, states, indexer scores), never
 *  allocating, never synchronising, graph-capturable (lengths and counts are read on the device;
 *  launch shapes depend only on the arguments' maxima). Each returns the launch's cudaError_t, or
 *  cudaErrorInvalidValue before launching for arguments the objects would reject.
 *
 *  The launches do not validate device data (that would need a synchronisation): the objects
 *  (EntryStore, Compressor, Indexer, SparseAttention) check slots, lengths and capacity on their
 *  host mirrors first. An engine calling these directly keeps those invariants itself; device
 *  reads of an out-of-range page id or index id are skipped, never dereferenced.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/core/types.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/dsv4/sparse_attention.h"
#include "kvc/select/selection.h"

namespace kvc {
namespace kernels {

// --- entry stores -------------------------------------------------------------------------------

/// Advances the counts of `n` distinct slots to `d_targets` and, for a kvc-owned store
/// (s.free_pages != null), pops the pages their new rows need from the free stack in the host
/// mirror's order (slots in order, page columns ascending). One thread; tiny.
/// @param[in] s          the store (device pointers)
/// @param[in] d_slots    [n] slots
/// @param[in] d_targets  [n] new counts (>= the current ones)
/// @param[in] n          slots
/// @param[in] stream     stream the work is ordered on
cudaError_t dsv4_store_reserve(const dsv4::EntryStoreView& s, const std::int32_t* d_slots,
                               const std::int32_t* d_targets, int n, cudaStream_t stream);

/// Empties `n` slots: counts 0 and, kvc-owned, their pages pushed back (columns ascending).
/// @param[in] s        the store (device pointers)
/// @param[in] d_slots  [n] slots
/// @param[in] n        slots
/// @param[in] stream   stream the work is ordered on
cudaError_t dsv4_store_reset(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int n,
                             cudaStream_t stream);

/// Encodes x[i, t] (f32 or bf16, [n, T, dim]) as row counts[slot_i] - T + t of each slot (the
/// rows a dsv4_store_reserve to counts just added; ring rows modulo W, the last W of a longer
/// chunk remaining). A row whose page id is not in [0, num_pages) is skipped.
/// @param[in] s        the store (device pointers)
/// @param[in] d_slots  [n] slots
/// @param[in] n        slots
/// @param[in] T        rows per slot
/// @param[in] d_x      [n, T, dim] values
/// @param[in] x_bf16   true: x is bf16 bits; false: f32
/// @param[in] stream   stream the work is ordered on
cudaError_t dsv4_store_write(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int n,
                             int T, const void* d_x, bool x_bf16, cudaStream_t stream);

/// d_out[r, i] = dsv4::physical_entry(s, d_slots[r / T], in.ids[r, i]) for every row
/// r < in.rows and i < in.max_selected: a selection over entries as pool rows (page id x
/// page_entries + offset), the indices FlashMLA's sparse kernels take into kvc's pages; -1 for
/// -1, an entry the slot does not hold, an unmapped page or a slot out of range. The same
/// values as dsv4::physical_entries on the host. Graph-capturable; allocates nothing.
/// cudaErrorInvalidValue, before any launch, for T < 1, in.rows not a multiple of T,
/// out_pitch < in.max_selected, a null pointer or a pool of more than 2^31 - 1 rows.
/// @param[in]  s          the store (device pointers)
/// @param[in]  d_slots    [in.rows / T] the slot of each sequence
/// @param[in]  T          rows per sequence
/// @param[in]  in         the selection (device ids)
/// @param[out] d_out      [in.rows, out_pitch] pool rows
/// @param[in]  out_pitch  row pitch of d_out, >= in.max_selected
/// @param[in]  stream     stream the work is ordered on
cudaError_t dsv4_physical_entries(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int T,
                                  const SelectionView& in, std::int32_t* d_out, int out_pitch,
                                  cudaStream_t stream);

// --- the Walsh–Hadamard transform ---------------------------------------------------------------

/// y[r] = hadamard_inplace(x[r]) (kvc/dsv4/math.h) for `rows` rows of `d` (64 or 128) elements,
/// x f32 or bf16, y f32 (the scaled transform) or bf16 (rounded); bit-identical to the CPU.
/// @param[in]  d_x      [rows, d] input
/// @param[in]  x_dtype  kF32 or kBF16
/// @param[out] d_y      [rows, d] output (may equal d_x)
/// @param[in]  y_dtype  kF32 or kBF16
/// @param[in]  rows     rows, >= 0
/// @param[in]  d        64 or 128
/// @param[in]  stream   stream the work is ordered on
cudaError_t dsv4_hadamard(const void* d_x, DType x_dtype, void* d_y, DType y_dtype,
                          std::int64_t rows, int d, cudaStream_t stream);

// --- the compressor -----------------------------------------------------------------------------

/// A compressor's state in device memory (kvc/dsv4/compressor.h gives the layout).
struct Dsv4CompressorState {
  float* kv = nullptr;              ///< [max_slots, state_rows, width]
  float* score = nullptr;           ///< [max_slots, state_rows, width] (score + ape; -inf empty)
  std::int32_t* lengths = nullptr;  ///< [max_slots] tokens per slot
};

/// Inputs of one dsv4_compress launch (device pointers).
struct Dsv4CompressArgs {
  const std::int32_t* slots = nullptr;  ///< [n] distinct slots
  int n = 0;                            ///< slots
  int T = 0;                            ///< tokens per slot
  const float* kv = nullptr;            ///< [n, T, width]
  const float* score = nullptr;         ///< [n, T, width]
  const float* ape = nullptr;           ///< [ratio, width]
  const float* norm_weight = nullptr;   ///< [head_dim] (rms_norm)
  const float* rope_cos = nullptr;      ///< [positions, rope_dim / 2] (rope)
  const float* rope_sin = nullptr;      ///< [positions, rope_dim / 2] (rope)
  float* out = nullptr;                 ///< [n, out_pitch, head_dim] entry values, or null
  int out_pitch = 0;                    ///< rows of out per slot, >= T / ratio + 1
};

/// Appends T tokens to each slot: computes every entry they complete (pooling, epilogue) into
/// `store` rows (when not null; its pages must already exist: dsv4_store_reserve) and `out`, then
/// updates the state and lengths. Two kernels; the entries of one launch read the state before
/// the update.
/// @param[in] c       the compressor's configuration (validated)
/// @param[in] st      its state
/// @param[in] a       the tokens
/// @param[in] store   the entry store, or null
/// @param[in] stream  stream the work is ordered on
cudaError_t dsv4_compress(const dsv4::CompressorConfig& c, const Dsv4CompressorState& st,
                          const Dsv4CompressArgs& a, const dsv4::EntryStoreView* store,
                          cudaStream_t stream);

// --- the indexer --------------------------------------------------------------------------------

/// Inputs of one dsv4_index_score launch (device pointers).
struct Dsv4IndexArgs {
  const std::int32_t* slots = nullptr;    ///< [batch]
  const std::int32_t* lengths = nullptr;  ///< [batch] L_b (queries at L_b - T + t)
  int batch = 0;                          ///< sequences
  int T = 0;                              ///< query tokens per sequence
  const std::uint16_t* q = nullptr;       ///< [batch, T, H, dim] bf16
  const float* weights = nullptr;         ///< [batch, T, H]
  const float* rope_cos = nullptr;        ///< [positions, rope_dim / 2] (query_rope)
  const float* rope_sin = nullptr;        ///< [positions, rope_dim / 2] (query_rope)
  ScoresView out;                         ///< rows batch * T, max_blocks >= keys' max_entries
  /// mxfp4 score kernel: 0 automatic (one or two query tokens 10 for 64 heads of dim 128 on pages
  /// of 64 entries, else 8; from three 11 where it runs, else 8 below 8 tokens and 7 from 8; 2
  /// when a page does not fit), 1 key pages staged in shared memory by TMA bulk copies (pages of
  /// at most 4352 bytes), 2 keys prefetched in registers, 3 lean staged (1's staging, less work
  /// per key octet), 4 lean staged scoring two pages at a time, 5 lean staged with each key
  /// unpacked once for all query tokens of a pass, 6 page streams (each warp, or the warps of a
  /// pass's tokens together, stream whole pages through a private pipeline), 7 page streams with
  /// each page unpacked once for the pass's tokens (6 when a pass has one token), 8 page streams
  /// with the octet loop unrolled for pages of 64 entries (3 to 8 and 10: pages of at most 4352
  /// bytes), 9 warpgroup tensor cores (wgmma; 64 heads of dim 128, pages of 8 to 64 entries
  /// dividing 64; a build with sm_90a and no plain sm_90 code, on a compute capability 9.0
  /// device), 10 page streams scoring the octets of 64-entry pages two at a time, the query's
  /// fragments loaded per k step (64 heads of dim 128; pages of other sizes one octet at a time),
  /// 11 variant 9 with two tokens' wgmma groups in flight (token t + 1's during token t's head
  /// sum; where 9 runs). The same bits either way; a tuning knob for benchmarks. Other values, 9
  /// and 11 where they cannot run and 10 for other head shapes: cudaErrorInvalidValue.
  int variant = 0;
};

/// Scores every visible key for every query token (kvc/dsv4/indexer.h; bit-identical to the CPU
/// reference) in two kernels per launch: the queries' preparation (a CTA of head_dim threads per
/// query row and head: RoPE, Hadamard, quantisation, the folded fragments; into the workspace),
/// then the scores (programmatic dependent launch lets them start while the preparation ends):
/// mxfp4 keys on integer tensor cores (mma m16n8k32 s8 x u8) with the e2m1 codes unpacked in
/// registers (kernels/formats/mxfp4_unpack.cuh) and the folded evaluation of kvc/dsv4/index_math.h,
/// falling back to the reference form for a query token or an octet of keys outside its bounds; fp8
/// keys on CUDA cores. Writes num_valid for every row. Up to 4 query tokens of a sequence share a
/// CTA pass; long prefills go in launches of at most 4096 query rows. With d_temp == null it only
/// sets temp_bytes (dsv4_index_workspace_bound(c) covers every call within c's maxima).
/// @param[in] d_temp          workspace (device, 16-byte aligned), or null to query its size
/// @param[in,out] temp_bytes  in: the workspace size; out (query): the size needed
/// @param[in] keys    the indexer keys (kMxfp4 or kFp8Scaled)
/// @param[in] c       the indexer's configuration (validated)
/// @param[in] a       queries, weights, tables and the scores written
/// @param[in] stream  stream the work is ordered on
cudaError_t dsv4_index_score(void* d_temp, std::size_t& temp_bytes,
                             const dsv4::EntryStoreView& keys, const dsv4::IndexerConfig& c,
                             const Dsv4IndexArgs& a, cudaStream_t stream);

/// Workspace bytes that cover every dsv4_index_score call with at most c.max_batch sequences of
/// c.max_query_tokens query tokens.
/// @param[in] c  the indexer's configuration (validated)
std::size_t dsv4_index_workspace_bound(const dsv4::IndexerConfig& c);

// --- sparse attention ---------------------------------------------------------------------------

/// Inputs of one dsv4_sparse_attention launch (device pointers).
struct Dsv4AttentionArgs {
  const std::int32_t* slots = nullptr;    ///< [batch]
  const std::int32_t* lengths = nullptr;  ///< [batch] L_b = ring count + chunk_rows
  int batch = 0;                          ///< sequences
  int T = 0;                              ///< query tokens per sequence
  const std::uint16_t* q = nullptr;       ///< [batch, T, H, d] bf16
  const std::uint16_t* chunk = nullptr;   ///< [batch, chunk_rows, d] bf16, or null
  int chunk_rows = 0;                     ///< C
  const std::int32_t* indices = nullptr;  ///< [batch * T, indices_pitch] (CSA), -1 = skip
  int indices_pitch = 0;                  ///< K
  const float* sink = nullptr;            ///< [H] or null
  void* out = nullptr;                    ///< [batch, T, H, d] bf16 or f32
  bool out_bf16 = true;                   ///< out's dtype
  float* lse = nullptr;                   ///< [batch, T, H] or null
};

/// Sparse attention (kvc/dsv4/sparse_attention.h) on bf16 tensor cores (mma m16n8k16, fp32
/// accumulation, P split into two bf16 halves), split over chunks of 64 attended rows with an
/// LSE merge. With d_temp == null it only sets temp_bytes (the workspace of a call with these
/// batch, T and the config's maxima) and launches nothing. head_dim 128 or 512.
/// @param[in] d_temp          workspace (device, 256-byte aligned), or null to query its size
/// @param[in,out] temp_bytes  in: the workspace size; out (query): the size needed
/// @param[in] ring     the window ring
/// @param[in] entries  the compressed entries
/// @param[in] c        the attention's configuration (validated)
/// @param[in] a        queries, chunk, indices, sink and the outputs
/// @param[in] stream   stream the work is ordered on
cudaError_t dsv4_sparse_attention(void* d_temp, std::size_t& temp_bytes,
                                  const dsv4::EntryStoreView& ring,
                                  const dsv4::EntryStoreView& entries,
                                  const dsv4::SparseAttentionConfig& c, const Dsv4AttentionArgs& a,
                                  cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc
