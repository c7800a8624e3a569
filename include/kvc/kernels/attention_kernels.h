/*! \file kvc/kernels/attention_kernels.h
 *  \brief Kernel layer of the AttentionBackend: split-K decode attention over a KvStore in every
 *  mode, dense attention over a plain cache, and the merge of partial states. Stream-ordered,
 *  graph-capturable launches over memory the caller owns.
 *
 *  How a call runs: every query row (b, t, q head) attends a *virtual list* of entries whose
 *  length depends only on maxima (the ring's W, the block size B, max_selected, the store's
 *  max_blocks_per_slot, T, or the plain cache's N). The list is cut into equal chunks; one CTA
 *  takes one (sequence, query token, kv head, chunk) and up to 8 query heads of that kv head, so
 *  K/V are read once for those heads (on tensor cores or CUDA cores, see KernelPath). The
 *  partial states of a row's chunks are merged (the LSE merge of merge.h), the sink added and
 *  out / lse written: inside one thread-block cluster through distributed shared memory when a
 *  row has at most 16 chunks (one launch), else through the workspace and a second launch.
 *  When one chunk covers a row (large batches), the first launch writes the result directly.
 *  Lengths, selections and counts are read on the device; the launch shape depends only on the
 *  batch, T, the maxima above and the device's SM count, so a captured graph replays correctly
 *  as lengths and selections change.
 *
 *  Workspace: two-phase, as CUB. Call with `d_workspace == nullptr` to get the bytes needed in
 *  `workspace_bytes` (nothing is launched); then call again with a buffer of at least that size.
 *  attention_workspace_upper_bound() gives a size that suffices for every call with a given head
 *  shape on the current device, whatever the store, batch or T.
 *
 *  The launches do not validate their data (that would need a host synchronisation): the
 *  AttentionBackend object checks every argument on the host (attention::check_decode) before
 *  it launches. Selected ids are read on the device: an id < 0 or >= the row's closed blocks is
 *  skipped, and a count outside [0, max_selected] is clamped (the CPU backend throws instead).
 *  Launchers never allocate, never synchronise, and return the first CUDA error.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/attention/params.h"

namespace kvc {
namespace kernels {

/// Which kernel attention_decode / dense_attention_decode run (AttentionParams::kernel_path,
/// DenseParams::kernel_path).
enum class KernelPath : int {
  /// By shape: the tensor-core kernel where it applies and the GQA group is >= 3, else the
  /// CUDA-core kernel. The tensor-core kernel is the staged one for one query token at head_dim
  /// 64 and 128: two slots (kTensorCoresStaged2) at head_dim 128 where the rows (batch * Hkv *
  /// head tiles) number at most the SMs, three (kTensorCoresStaged) elsewhere; for verify and
  /// larger head dims the register-pipelined one without the L2 prefetch
  /// (kTensorCoresNoPrefetch).
  kAuto = 0,
  /// The CUDA-core kernel (every shape and mode).
  kCudaCores = 1,
  /// The tensor-core kernel (mma.sync): head_dim 64..512, q in the cache's 16-bit dtype, not
  /// a summary mode, max_selected <= 512; a call it does not apply to returns
  /// cudaErrorNotSupported. With an L2 prefetch of the next ring / plain-cache tile (since the
  /// software pipeline the prefetch measured slower on the H200, so kAuto leaves it out).
  kTensorCores = 2,
  /// The tensor-core kernel without the L2 prefetch (kAuto's choice where tensor cores apply).
  kTensorCoresNoPrefetch = 3,
  /// The tensor-core kernel without the software pipeline of its ring / plain-cache tiles
  /// (each tile's loads issued just before the tile is computed; for benchmarks: what the
  /// pipeline buys).
  kTensorCoresUnpipelined = 4,
  /// kTensorCoresNoPrefetch with the selected blocks' ids and block-table entries read only
  /// after the row's length arrived (the order before 2026-12-04; for benchmarks: what reading
  /// them together with the slot buys).
  kTensorCoresLateIds = 5,
  /// kTensorCoresNoPrefetch launched as a programmatic dependent of the kernel before it (its
  /// CTAs scheduled while that kernel runs, waiting in griddepcontrol.wait before any read).
  /// Measured on the H200 (2026-12-04): 0.8 us faster than a plain launch for block-select
  /// attention launched back to back at B1 N128K, but the whole decode step slower behind the
  /// selector (B1 28.5 against 27.1 us, B8 84.4 against 74.2), so the other paths launch in
  /// plain stream order; for benchmarks.
  kTensorCoresProgrammatic = 6,
  /// The staged tensor-core kernel (head_dim 64 or 128; elsewhere cudaErrorNotSupported): each
  /// warp keeps three tiles of K and V in flight through its own slots in shared memory
  /// (cp.async, 16-bit rows copied whole and swizzled; no CTA barrier per tile) instead of one
  /// tile ahead in registers.
  kTensorCoresStaged = 7,
  /// kTensorCoresStaged with two slots per warp (kAuto's choice at head_dim 128 where the rows
  /// number at most the SMs; at head_dim 128 two and three slots both run two CTAs per SM).
  kTensorCoresStaged2 = 8,
  /// kTensorCoresStaged with four slots per warp (for benchmarks).
  kTensorCoresStaged4 = 9,
};

/// Bytes of workspace that suffice for any attention_decode or dense_attention_decode call with
/// this head shape on the current device (any store, batch, T or format).
/// @param[in] num_q_heads   Hq
/// @param[in] num_kv_heads  Hkv (Hq / Hkv in 1..128)
/// @param[in] head_dim      d: 64, 128, 256 or 512
/// @return the bytes, or 0 for an unsupported shape
std::size_t attention_workspace_upper_bound(int num_q_heads, int num_kv_heads, int head_dim);

/// Decode attention over a KvStore in params.mode (see kvc/attention/attention.h). Every output
/// element (out, and lse when not null) is written.
/// @param[in] d_workspace      device scratch, or null to query its size
/// @param[in,out] workspace_bytes  in: the size of d_workspace; out (query): the bytes needed
/// @param[in] params           validated parameters with device pointers: params.slots [batch]
///                             on the device; the store's lengths, block table and the selection
///                             are read on the device
/// @param[in] stream           stream the work is ordered on
/// @return cudaSuccess, cudaErrorInvalidValue for an unsupported shape or a workspace too small,
///         or the launch error
cudaError_t attention_decode(void* d_workspace, std::size_t& workspace_bytes,
                             const attention::AttentionParams& params, cudaStream_t stream);

/// Dense attention over a plain [batch, Hkv, N, d] f16/bf16 cache (AttentionBackend::
/// dense_decode): query t of sequence b sits at lengths[b] - T + t and attends positions
/// [0, pos] (window 0) or (pos - window, pos].
/// @param[in] d_workspace      device scratch, or null to query its size
/// @param[in,out] workspace_bytes  in: the size of d_workspace; out (query): the bytes needed
/// @param[in] params           validated parameters; params.lengths [batch] on the device
/// @param[in] stream           stream the work is ordered on
/// @return cudaSuccess, cudaErrorInvalidValue for an unsupported shape or a workspace too small,
///         or the launch error
cudaError_t dense_attention_decode(void* d_workspace, std::size_t& workspace_bytes,
                                   const attention::DenseParams& params, cudaStream_t stream);

/// out, lse = merge of two partial states over disjoint token sets, row by row (merge.h rules:
/// empty sets, NaN propagation). out may alias out_a or out_b, lse may alias lse_a or lse_b.
/// @param[in] d_out_a  [n, d] f32
/// @param[in] d_lse_a  [n] f32
/// @param[in] d_out_b  [n, d] f32
/// @param[in] d_lse_b  [n] f32
/// @param[out] d_out   [n, d] f32
/// @param[out] d_lse   [n] f32
/// @param[in] n        rows
/// @param[in] d        elements per row, >= 1
/// @param[in] stream   stream the work is ordered on
cudaError_t merge_states(const float* d_out_a, const float* d_lse_a, const float* d_out_b,
                         const float* d_lse_b, float* d_out, float* d_lse, std::int64_t n, int d,
                         cudaStream_t stream);

/// Accumulates (out_b, lse_b) into the running state (out, lse) in place (start from lse = -inf,
/// out = 0).
/// @param[in,out] d_out  [n, d] f32 running state
/// @param[in,out] d_lse  [n] f32 running log-sum-exp
/// @param[in] d_out_b    [n, d] f32
/// @param[in] d_lse_b    [n] f32
/// @param[in] n          rows
/// @param[in] d          elements per row, >= 1
/// @param[in] stream     stream the work is ordered on
cudaError_t merge_states_inplace(float* d_out, float* d_lse, const float* d_out_b,
                                 const float* d_lse_b, std::int64_t n, int d, cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc
