/*! \file kvc/dsv4/compressor.h
 *  \brief Compressor: DeepSeek-V4's learned gated pooling of `ratio` tokens into one compressed
 *  entry, from the engine's projected kv and gate logits, with an incremental state per slot in
 *  kvc memory, and an optional fused epilogue that writes the entry into an EntryStore.
 *
 *  Inputs per token p (the engine's projections, fp32): kv[p] and score[p], each coff * d wide
 *  (coff = 2 for ratio 4, 1 for ratio 128), and the learned bias ape [ratio, coff * d], added to
 *  the score by the token's position in its block: s[p] = score[p] + ape[p % ratio].
 *
 *  Entry j (complete once tokens [j m, (j+1) m) are in; m = ratio) pools, per channel c < d:
 *  - ratio 4 (overlapping): 8 rows — the previous block's 4 tokens (j-1) through channels [0, d)
 *    and its own 4 tokens through channels [d, 2d); for j = 0 the previous rows are empty
 *    (logit -inf, value 0); one joint softmax over the 8 rows;
 *  - ratio 128: its own 128 tokens.
 *  pooled[c] = pool_channel(rows) (kvc/dsv4/math.h: softmax over rows per channel, exp_portable).
 *  Then the epilogue, each stage on or off, all in bf16 as DeepSeek's code: x = bf16(pooled);
 *  RMSNorm with `norm_weight` (rms_factor, canonical sum of squares); interleaved RoPE on the last
 *  rope_dim dims at position j m (rope_bf16 with the engine's cos/sin table row j m); the
 *  Walsh–Hadamard transform (d = 64 or 128, rounded to bf16); and the store's quantisation
 *  (encode_entry) into row j of the slot.
 *
 *  State: per slot the rows of tokens not yet pooled into every entry that needs them, in
 *  DeepSeek's layout [coff * m, coff * d] for kv and for s: for ratio 4, rows [0, m) hold the last
 *  complete block and rows [m, m + L % m) the current partial block; for ratio 128 rows
 *  [0, L % m) the partial block; every other row is kv 0, s -inf. Since every entry is computed
 *  from the same row values by the same function, appending token by token, in a prefill chunk,
 *  or in chunks that start anywhere (chunked prefill) gives bit-identical entries and states.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/dsv4/entry_store.h"

namespace kvc {
namespace dsv4 {

/// Geometry and epilogue of a Compressor. Validated by validate().
struct CompressorConfig {
  int ratio = 4;       ///< m: tokens per entry, 4 (overlapping) or 128
  int head_dim = 512;  ///< d: elements per entry, a multiple of 32 in [32, 1024]
  int max_slots = 1;   ///< sequence slots, 1..65536
  /// Tokens one slot may hold, in [ratio, kMaxContext] (positions 0 .. max_context-1).
  std::int64_t max_context = kMaxContext;
  /// Largest token count of one append() per slot (CUDA launch shape), 1..2^20.
  int max_tokens = 1;
  int max_batch = 1;      ///< largest number of slots of one append(), 1..max_slots
  bool rms_norm = true;   ///< epilogue: RMSNorm with a weight
  float rms_eps = 1e-6f;  ///< RMSNorm epsilon, finite and > 0
  bool rope = true;       ///< epilogue: interleaved RoPE on the last rope_dim dims at position j m
  int rope_dim = 64;      ///< rotated elements, even, in [2, head_dim]
  bool hadamard = false;  ///< epilogue: Walsh–Hadamard transform (head_dim 64 or 128)

  /// coff: 2 for ratio 4 (overlapping), 1 for ratio 128.
  int coff() const { return ratio == 4 ? 2 : 1; }
  /// Width of one token's kv, score and ape rows: coff * head_dim.
  int width() const { return coff() * head_dim; }
  /// Rows of one slot's state: coff * ratio.
  int state_rows() const { return coff() * ratio; }
  /// Throws kvc::Error naming the first field out of range.
  void validate() const;
};

/// Inputs of one append(): T tokens for each of `slots`, on the compressor's device.
struct CompressorInputs {
  TensorView kv;           ///< [slots, T, width] f32: the engine's projected kv
  TensorView score;        ///< [slots, T, width] f32: the engine's gate logits (without ape)
  TensorView ape;          ///< [ratio, width] f32: the learned position bias
  TensorView norm_weight;  ///< [head_dim] f32 (rms_norm), else ignored
  /// [positions, rope_dim / 2] f32 cos of each position (rope), else ignored; row j * ratio is
  /// read for entry j, so it needs more than the largest j * ratio of the call.
  TensorView rope_cos;
  TensorView rope_sin;  ///< like rope_cos, the sines
};

/// The compressor of one layer (its main entries, or its indexer's keys), with a CPU reference
/// and a CUDA implementation behind one interface. All state memory is allocated at
/// construction. Methods that fail throw kvc::Error and change nothing.
class Compressor {
 public:
  /// Creates a compressor on `device`. Throws kvc::Error for a bad config or device.
  /// @param[in] config  geometry and epilogue (validated)
  /// @param[in] device  where the state lives and the work runs
  static std::unique_ptr<Compressor> create(const CompressorConfig& config, Device device);
  virtual ~Compressor() = default;

  /// The validated configuration.
  virtual const CompressorConfig& config() const = 0;
  /// Where the state lives.
  virtual Device device() const = 0;
  /// Tokens appended to `slot` since its last reset (host mirror).
  /// @param[in] slot  0..max_slots-1
  virtual std::int64_t length(int slot) const = 0;
  /// Empties `slot`'s state (length 0, rows kv 0 / s -inf).
  /// @param[in] slot  0..max_slots-1
  virtual void reset(int slot) = 0;

  /// Appends T tokens to each of `slots` (distinct) and produces every entry they complete:
  /// entry j of slot s for floor(L / m) <= j < floor((L + T) / m), L = length(s).
  /// - `store` (or null): the entries are encoded into rows j of the store's slot s (reserve +
  ///   encode_entry). The store must be on this device, of dim head_dim, not a ring, with
  ///   count(s) == floor(L / m) for every slot, and room for the new entries.
  /// - `out` (or data = null): [slots, max_new, head_dim] f32, max_new >= floor(T / m) + 1,
  ///   row k of slot i receives entry floor(L_i / m) + k after the epilogue (before the store's
  ///   quantisation), rows past the slot's new entries untouched.
  /// @param[in] slots   distinct slots
  /// @param[in] in      the tokens' kv, score, ape and the epilogue's tables
  /// @param[in,out] store  where entries go, or null
  /// @param[out] out    entry values, or a view with data = null
  virtual void append(const std::vector<int>& slots, const CompressorInputs& in, EntryStore* store,
                      const TensorView& out) = 0;

  /// Copies `slot`'s state into `kv` and `score` ([state_rows, width] each, host vectors),
  /// synchronising a CUDA compressor: DeepSeek's kv_state / score_state layout.
  /// @param[in]  slot   the slot
  /// @param[out] kv     state kv rows
  /// @param[out] score  state s rows (score + ape; -inf where empty)
  virtual void state(int slot, std::vector<float>& kv, std::vector<float>& score) const = 0;
  /// The CUDA stream (a cudaStream_t) work is ordered on; ignored on the CPU.
  /// @param[in] stream  the stream
  virtual void set_stream(void* stream) = 0;
  /// Bytes of state allocated at construction (kv and score planes, lengths).
  virtual std::size_t state_bytes() const = 0;

 protected:
  Compressor() = default;
};

}  // namespace dsv4
}  // namespace kvc
