/*! \file kvc/dsv4/indexer.h
 *  \brief Indexer: DeepSeek's lightning-indexer scores of every visible compressed entry for
 *  each query token, I[t, j] = Σ_h w_h · ReLU(q_h · k_j), over mxfp4 (DeepSeek-V4) or fp8
 *  (DeepSeek-V3.2) keys in an EntryStore, and select_topk, the top-k of those scores with kvc's
 *  Selector.
 *
 *  The key k_j is one vector per entry shared by all H index heads (kvc/dsv4/entry_store.h, dim
 *  64 or 128). The query q_h (bf16, [H, dim] per token, as the engine projects it) is prepared
 *  by kvc the way DeepSeek does: optional interleaved RoPE on its last rope_dim dims at the
 *  token's position and optional Walsh–Hadamard rotation, each rounded to bf16, then quantised
 *  like the keys: mxfp4 with DeepSeek's amax floor (kMxfp4 keys) or e4m3 with one power-of-two
 *  fp32 scale per head (kFp8Scaled keys). The weights w_h are the engine's, already carrying
 *  DeepSeek's scale factors (V4: bf16(weights_proj(x) · 128^-1/2 · 64^-1/2); V3.2:
 *  bf16(weights_proj(x) · 64^-1/2) · 128^-1/2).
 *
 *  Exact arithmetic (the CPU reference and the CUDA kernels give the same bits):
 *  - mxfp4: d_hj = fp32(Σ_c P_c 2^(e_q,c + e_k,c - 2)) over the dim/32 groups c, P_c the exact
 *    integer Σ (2 q_code)(2 k_code) of the group and e the ue8m0 exponents (scale byte - 127),
 *    summed in double in group order (exact unless two groups' products differ by > 2^40) and
 *    rounded once; NaN if a scale byte is 0xFF. Then eight fused multiply-add chains
 *    a_g = fma(relu(d_hj), w_h, a_g) over h = g, g + 8, g + 16, ... (g = 0..7, from +0), combined
 *    by a butterfly a_g += a_(g^4); a_g += a_(g^2); a_g += a_(g^1); I = a_0.
 *  - fp8: d_hj = (p0 + p1) + (p2 + p3), p_r the fma chain (from +0) of q8_i k8_i (decoded e4m3)
 *    over the r-th contiguous quarter of the dims in ascending i;
 *    a = fma(relu(d_hj), w_h · qs_h, a) over h ascending; I = a · ks_j (qs, ks the fp32 scales).
 *  relu keeps NaN (a NaN score is never dropped silently; the Selector ranks it last).
 *
 *  Visibility: query t of sequence b sits at position p = L_b - T + t (L_b: tokens of the
 *  sequence, queries included) and sees entries j < min((p + 1) / ratio, count); scores past the
 *  visible ones are not written, num_valid says how many are.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/select/selection.h"

namespace kvc {

class Selector;

namespace dsv4 {

/// Shape and query preparation of an Indexer. Validated by validate().
struct IndexerConfig {
  EntryFormat key_format = EntryFormat::kMxfp4;  ///< keys' format: kMxfp4 or kFp8Scaled
  int num_heads = 64;                            ///< H: index heads, a multiple of 16 in [16, 64]
  int head_dim = 128;                            ///< dim of q and k: 64 or 128
  int ratio = 4;               ///< tokens per entry: 4 (V4), 128, or 1 (V3.2: one key per token)
  int max_batch = 1;           ///< most sequences of one score(), 1..65536
  int max_query_tokens = 4;    ///< most query tokens per sequence of one score(), 1..2^20
  bool query_rope = false;     ///< rotate the last rope_dim dims of q at the token's position
  int rope_dim = 64;           ///< rotated elements, even, in [2, head_dim]
  bool query_hadamard = true;  ///< Walsh–Hadamard rotation of q (DeepSeek rotates q and k)

  /// Throws kvc::Error naming the first field out of range.
  void validate() const;
};

/// Arguments of Indexer::score. Device data lives on the indexer's device.
struct IndexerArgs {
  std::vector<int> slots;             ///< slot of each sequence (host); may repeat
  std::vector<std::int64_t> lengths;  ///< L_b: tokens of each sequence, queries included (host)
  TensorView q;                       ///< [batch, T, H, head_dim] bf16
  TensorView weights;                 ///< [batch, T, H] f32
  TensorView rope_cos;  ///< [positions, rope_dim / 2] f32 (query_rope), row = position
  TensorView rope_sin;  ///< like rope_cos
  /// Scores, rows batch * T (row = b * T + t), max_blocks >= the keys' max_entries; num_valid is
  /// written for every row.
  ScoresView out;
};

/// The lightning indexer of one layer, with a CPU reference and a CUDA implementation behind one
/// interface (kvc/kernels/dsv4_kernels.h is the kernel layer). Allocates its workspace at
/// construction. Methods that fail throw kvc::Error and write nothing.
class Indexer {
 public:
  /// Creates an indexer on `device`. Throws kvc::Error for a bad config or device.
  /// @param[in] config  shape and query preparation (validated)
  /// @param[in] device  where keys, queries and scores live
  static std::unique_ptr<Indexer> create(const IndexerConfig& config, Device device);
  virtual ~Indexer() = default;
  /// The validated configuration.
  virtual const IndexerConfig& config() const = 0;
  /// The CUDA stream (a cudaStream_t) work is ordered on; ignored on the CPU.
  /// @param[in] stream  the stream
  virtual void set_stream(void* stream) = 0;

  /// Scores every visible entry of `keys` for every query token (see the file comment).
  /// Throws kvc::Error, before any work, for: keys of another format, dim or device, a
  /// compressed store required (not a ring); shapes and dtypes; batch or T past the config;
  /// lengths < T or with count(slot) < L / ratio; rope tables too short; out too narrow.
  /// @param[in] keys  the layer's indexer keys
  /// @param[in,out] args  queries, weights and the scores written
  virtual void score(const EntryStore& keys, const IndexerArgs& args) = 0;

 protected:
  Indexer() = default;
};

/// The top-k entries of each row of `scores` with the Selector (SelectPolicy::topk): row r gets
/// the min(k, num_valid[r]) best entries — ties to the lower id, NaN last — in descending score
/// order (`sorted`) or ascending id order, then -1 up to out.max_selected (DeepSeek's -1 for
/// entries that are not visible). Throws kvc::Error for k < 1, k > out.max_selected (the budget)
/// or out.rows != scores.rows, before anything runs.
/// @param[in] selector  a Selector on the scores' device
/// @param[in] scores    indexer scores (Indexer::score's out)
/// @param[in] k         entries to select per row (DeepSeek-V4: 512, 1024 or 2048)
/// @param[in] sorted    descending score order (true) or ascending entry id (false)
/// @param[in,out] out   selected ids and counts per row
void select_topk(Selector& selector, const ScoresView& scores, int k, bool sorted,
                 SelectionView& out);

}  // namespace dsv4
}  // namespace kvc
