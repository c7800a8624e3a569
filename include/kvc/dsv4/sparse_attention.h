/*! \file kvc/dsv4/sparse_attention.h
 *  \brief SparseAttention: DeepSeek-V4's CSA and HCA attention — MQA of H query heads over one
 *  512-dim latent per row that is both K and V, from two inputs that are never concatenated:
 *  the window ring (plus, for a prefill chunk, the chunk's own rows) and the compressed entry
 *  store addressed by an index list (CSA) or read whole (HCA).
 *
 *  Query t of sequence b sits at position p = L_b - T + t. It attends
 *  - the window: the tokens max(0, p - W + 1) .. p, where a token below R_b (the ring's count)
 *    is read from the ring (row token % W) and a token >= R_b from the chunk (`window_chunk`
 *    row token - R_b; L_b = R_b + chunk tokens). Decode with the new token already in the ring
 *    passes no chunk (T = 1); a prefill chunk passes its rows and appends them to the ring after;
 *  - the entries: CSA — the ids of the query's row of `indices` (row b * T + t; -1 = skip;
 *    ids must be < the visible count min((p + 1) / ratio, count)); HCA — every visible entry.
 *  One softmax over the union, scale `softmax_scale` (512^-1/2), the per-head sink in the
 *  denominator only: with logits l_i = scale · q_h · kv_i and M = max(max_i l_i, sink_h),
 *  out_h = Σ_i e^(l_i - M) kv_i / (Σ_i e^(l_i - M) + e^(sink_h - M)) and
 *  lse_h = M + ln(Σ_i e^(l_i - M) + e^(sink_h - M)) (no sink: the terms drop). Entries and ring
 *  rows are decoded exactly (kBf16 or kModel1Fp8). The CPU reference accumulates in float32
 *  (float64 on request, an oracle); the CUDA kernel uses bf16 tensor cores with fp32
 *  accumulation and splits P = softmax weights into two bf16 halves (the GPU tests bound it by
 *  1e-4 relative L2 of the reference with f32 out, 2e-3 with bf16 out).
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
namespace dsv4 {

/// Shape and mode of a SparseAttention. Validated by validate().
struct SparseAttentionConfig {
  int num_heads = 64;          ///< H: query heads, 1..128
  int head_dim = 512;          ///< d of the latent (q, K and V): a multiple of 64 in [64, 512]
  float softmax_scale = 0.0f;  ///< logit scale; 0 means head_dim^-1/2; finite, >= 0
  int ratio = 4;               ///< tokens per entry: 4 (CSA) or 128 (HCA)
  bool hca = false;            ///< attend every visible entry (HCA) instead of an index list (CSA)
  int window = 128;            ///< W: the window ring's size (must equal the ring store's)
  int max_batch = 1;           ///< most sequences per call, 1..65536
  int max_query_tokens = 1;    ///< most query tokens per sequence per call, 1..2^20
  int max_indices = 2048;      ///< CSA: widest index row (top-k), 1..2^20
  /// CPU only: accumulate in float64 (an oracle for tests). The CUDA backend rejects it.
  bool accumulate_f64 = false;

  /// softmax_scale, or head_dim^-1/2 when it is 0.
  float scale() const;
  /// Throws kvc::Error naming the first field out of range.
  void validate() const;
};

/// Arguments of SparseAttention::forward. Device data lives on the attention's device.
struct SparseAttentionArgs {
  std::vector<int> slots;  ///< slot of each sequence (host); the same in ring and entries
  std::vector<std::int64_t> lengths;  ///< L_b: tokens of each sequence, queries included (host)
  TensorView q;                       ///< [batch, T, H, d] bf16
  /// [batch, C, d] bf16: the rows of tokens R_b .. R_b + C - 1 not yet in the ring (C may be 0:
  /// data = null); L_b = R_b + C and T <= C + 1.
  TensorView window_chunk;
  /// CSA: rows batch * T, ids of the entries each query attends (-1 = skip), max_selected <=
  /// max_indices; counts are not read (every column is). Ignored for HCA.
  SelectionView indices;
  const float* sink = nullptr;  ///< [H] per-head sink logits on the device, or null
  TensorView out;               ///< [batch, T, H, d] bf16 or f32; every element is written
  TensorView lse;               ///< [batch, T, H] f32, or data = null
};

/// Sparse attention over a window ring and an entry store, with a CPU reference and a CUDA
/// implementation behind one interface. The CUDA implementation allocates its workspace at
/// construction. Every argument is checked before any work; a failed check throws kvc::Error
/// naming the argument and writes nothing.
class SparseAttention {
 public:
  /// Creates the attention on `device`. Throws kvc::Error for a bad config or device.
  /// @param[in] config  shape and mode (validated)
  /// @param[in] device  where stores and tensors live
  static std::unique_ptr<SparseAttention> create(const SparseAttentionConfig& config,
                                                 Device device);
  virtual ~SparseAttention() = default;
  /// The validated configuration.
  virtual const SparseAttentionConfig& config() const = 0;
  /// The CUDA stream (a cudaStream_t) work is ordered on; ignored on the CPU.
  /// @param[in] stream  the stream
  virtual void set_stream(void* stream) = 0;

  /// Attention of `args.q` over `ring` and `entries` (see the file comment).
  /// @param[in] ring     the layer's window ring (ring store, max_entries == window, dim d)
  /// @param[in] entries  the layer's compressed entries (dim d, kBf16 or kModel1Fp8)
  /// @param[in,out] args  queries, chunk, indices, sink, and the out / lse written
  virtual void forward(const EntryStore& ring, const EntryStore& entries,
                       const SparseAttentionArgs& args) = 0;

 protected:
  SparseAttention() = default;
};

}  // namespace dsv4
}  // namespace kvc
