// BlockIndex on CUDA: the kernel layer's host logic (which kernels a call takes, its grid and
// scratch) and the object. The kernels are launched through index_launch.h, whose instantiations
// compile in their own files (index_*.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "index/score_wide.cuh"
#include "index/summary_variant.h"
#include "index/token_fast.cuh"
#include "index/token_variant.h"
#include "index/token_wide.cuh"
#include "index_impl.h"
#include "index_launch.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/kernels/select_kernels.h"
#include "launch.h"
#include "select/tuning.h"

namespace kvc {
namespace kernels {

namespace {

using namespace index_detail;

// The kTokenMass scratch of `rows` rows of `heads` heads over `max_blocks` blocks per slot: the
// block lse values, then (256-byte aligned) the partial normalisers, as many per row as the
// variant with the most needs (1 ring CTA + chunks of kTokBlocksPerCta in one stage; with two
// stages kStreamRingParts of them + chunks of kTokWarps, one candidate per warp; or
// kStreamRingParts / kStreamTcRingParts + chunks of kTokWarps * kStreamMinBlocksPerWarp). One
// helper sizes and carves, so the two cannot drift apart.
struct TokenMassLayout {
  std::size_t lse_bytes = 0, partial_offset = 0, total = 0;
  int parts = 0;
  TokenMassLayout(int rows, int heads, int max_blocks) {
    const int per_warp = kStreamRingParts + (max_blocks + kTokWarps - 1) / kTokWarps;
    const int min_chunk = kTokWarps * kStreamMinBlocksPerWarp;
    const int ring = kStreamRingParts > kStreamTcRingParts ? kStreamRingParts : kStreamTcRingParts;
    const int stream = ring + (max_blocks + min_chunk - 1) / min_chunk;
    parts = per_warp > stream ? per_warp : stream;
    lse_bytes = static_cast<std::size_t>(rows) * heads * max_blocks * 4;
    partial_offset = (lse_bytes + 255) / 256 * 256;
    total = partial_offset + static_cast<std::size_t>(rows) * parts * heads * 4;
  }
};

// The two-stage kTokenMass scratch (BlockIndexConfig::candidates = C > 0) of `rows` rows of
// `heads` heads whose scores have a pitch of `max_blocks`: the token stage's lse values and
// partials over the C + 1 candidate entries of a row (TokenMassLayout), then the first stage's
// selection (ids [rows, C + 1], counts [rows]) and the select kernels' workspace, each 256-byte
// aligned. `status` is the select kernels' answer for the bound (cudaErrorInvalidValue beyond
// their limits).
struct TwoStageLayout {
  TokenMassLayout mass;
  std::size_t ids_offset = 0, counts_offset = 0, select_offset = 0, select_bytes = 0, total = 0;
  cudaError_t status = cudaSuccess;
  TwoStageLayout(int rows, int heads, int candidates, int max_blocks)
      : mass(rows, heads, candidates + 1) {
    const auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
    const std::size_t pitch = static_cast<std::size_t>(candidates) + 1;
    ids_offset = align(mass.total);
    counts_offset = align(ids_offset + static_cast<std::size_t>(rows) * pitch * 4);
    select_offset = align(counts_offset + static_cast<std::size_t>(rows) * 4);
    status = select_workspace_bound(select_bytes, rows, max_blocks, candidates + 1);
    total = select_offset + select_bytes;
  }
};

int row_heads(const BlockIndexConfig& c) {
  return c.shared_across_heads ? c.num_q_heads : c.num_q_heads / c.num_kv_heads;
}

// Where the token scores read each old token's K.
KeyKind token_key_kind(const StoreView& s, const BlockIndexConfig& c) {
  return c.token_keys == TokenKeys::kIndexCopy
             ? (s.index_format == Format::kMxfp4 ? KeyKind::kMxfp4 : KeyKind::kFp8)
         : s.old_format == Format::kQ8 ? KeyKind::kQ8
                                       : KeyKind::k16;
}

// The token kernels' parameters every launch shares (one stage: lse rows of
// s.max_blocks_per_slot blocks, no candidate list); the caller sets the workspace and the chunking.
TokenScoreParams token_params(const StoreView& s, const BlockIndexConfig& c,
                              const std::int32_t* d_slots, int tokens, const void* d_q,
                              const ScoresView& out) {
  TokenScoreParams p;
  p.s = s;
  p.slots = d_slots;
  p.q = static_cast<const std::uint16_t*>(d_q);
  p.out = out;
  p.tokens = tokens;
  p.num_q_heads = c.num_q_heads;
  p.group = c.num_q_heads / c.num_kv_heads;
  p.heads = row_heads(c);
  p.lse_pitch = s.max_blocks_per_slot;
  p.cand = nullptr;
  p.cand_count = nullptr;
  p.cand_pitch = 0;
  p.scale = c.scale();
  p.mass = c.score == SummaryScore::kTokenMass;
  p.aggregate_max = c.aggregate == GqaAggregate::kMax;
  p.shared = c.shared_across_heads;
  p.q_bf16 = c.dtype == DType::kBF16;
  p.sel_ids = nullptr;
  p.sel_counts = nullptr;
  p.sel_pitch = 0;
  p.sel_k = 0;
  p.sel_order = SelectPolicy::Order::kScore;
  return p;
}

// Whether the wide tensor-core token kernel (kernels/index/token_wide.cuh) takes a call under
// kAuto: an mxfp4 index copy, f16 queries, head_dim 64 / 128 / 256 / 512 and 16-bit old K rows
// (the ring CTAs read the open block's rows as f16), where the G <= 8 tensor-core kernels
// (token_tensor_cores_serve) do not. The general kernel, which decodes every key once per 8
// heads on CUDA cores, made step_bench's grid MQA step (Hq 64 / Hkv 1 / d 512) 852 us at B1 and
// 6.4 ms at B8 N128K on an H100 (thirty-seventh session). The kernel reads queries 16 bytes at a
// time: a query tensor that is not 16-byte aligned keeps the general kernel.
bool wide_serves(const StoreView& s, const BlockIndexConfig& c, const void* d_q) {
  return reinterpret_cast<std::uintptr_t>(d_q) % 16 == 0 && c.kernel == IndexKernel::kAuto &&
         c.token_keys == TokenKeys::kIndexCopy && s.index_format == Format::kMxfp4 &&
         c.dtype == DType::kF16 && s.dtype == DType::kF16 &&
         (c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256 || c.head_dim == 512) &&
         (s.old_format == Format::kF16 || s.old_format == Format::kFp16kQ4v) &&
         !detail::token_tensor_cores_serve(c, s.index_format);
}

// Ring CTAs of the wide kernel: one per kWideRingRowsPerPass exact rows (the ring and up to
// block_size - 1 rows of the open block), at most kWideRingParts.
int wide_ring_parts(const StoreView& s) {
  const int rows = s.recent_window + s.block_size - 1;
  return std::max(
      1, std::min(kWideRingParts, (rows + kWideRingRowsPerPass - 1) / kWideRingRowsPerPass));
}

// kTokenMax / kTokenMass: the token kernel, then (mass) the finish kernel. `fast`: the
// tensor-core scorer serves the call, with the chunk kernel `which`.
cudaError_t token_scores(const StoreView& s, const BlockIndexConfig& c, const std::int32_t* d_slots,
                         int batch, int tokens, const void* d_q, const ScoresView& out,
                         void* d_workspace, std::size_t workspace_bytes, bool fast,
                         TokenKernels which, cudaStream_t stream) {
  if (which == TokenKernels::kAuto) {
    which = is_stream(kAutoTokenKernels) && stream_serves_block_size(s.block_size)
                ? kAutoTokenKernels
                : TokenKernels::kBlockPerWarp;
  }
  const bool streaming = fast && is_stream(which);
  if (streaming && !stream_serves_block_size(s.block_size)) return cudaErrorNotSupported;
  TokenScoreParams p = token_params(s, c, d_slots, tokens, d_q, out);
  const int rows = c.rows(batch, tokens);
  const TokenMassLayout layout(rows, p.heads, s.max_blocks_per_slot);
  p.parts = layout.parts;
  p.lse = nullptr;
  p.partial = nullptr;
  if (p.mass) {
    if (d_workspace == nullptr || workspace_bytes < layout.total) return cudaErrorInvalidValue;
    p.lse = static_cast<float*>(d_workspace);
    p.partial =
        reinterpret_cast<float*>(static_cast<std::uint8_t*>(d_workspace) + layout.partial_offset);
  }
  const KeyKind kind = token_key_kind(s, c);
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  p.ring_tc = streaming && uses_ring_tc(which);
  p.ring_parts = p.ring_tc ? kStreamTcRingParts : streaming ? kStreamRingParts : 1;
  const int loop = !streaming                           ? kLoopF16
                   : uses_rows(which)                   ? kLoopRows
                   : which == TokenKernels::kStreamLean ? kLoopLean
                                                        : kLoopF16;
  const bool lean = loop != kLoopF16;
  const bool wide = !fast && wide_serves(s, c, d_q);
  if (wide) p.ring_parts = wide_ring_parts(s);
  int bpw = which == TokenKernels::kStream8 || which == TokenKernels::kStreamRows8   ? 8
            : which == TokenKernels::kStream4 || which == TokenKernels::kStreamRows4 ? 4
            : which == TokenKernels::kStream2                                        ? 2
                                              : stream_blocks_per_warp(rows, owned);
  if (streaming && which == TokenKernels::kStreamRows) {
    int per_sm = 0, sms = 0;
    cudaError_t q = c.head_dim == 64 ? rows_resident_ctas_d64(s.block_size, per_sm)
                                     : rows_resident_ctas_d128(s.block_size, per_sm);
    if (q == cudaSuccess) q = kvc::detail::sm_count(sms);
    if (q != cudaSuccess) return q;
    bpw = rows_blocks_per_warp(rows, owned, p.mass ? p.ring_parts : 0,
                               static_cast<long long>(per_sm) * sms);
  }
  p.blocks_per_cta = streaming ? kTokWarps * bpw : kTokBlocksPerCta;
  p.safe_add =
      lean ? stream_lean_safe_add(c.head_dim, p.scale) : stream_safe_add(c.head_dim, p.scale);
  p.scale_bits = stream_scale_bits(p.scale);
  const int chunks = owned > 0 ? (owned + p.blocks_per_cta - 1) / p.blocks_per_cta : 1;
  const dim3 grid(chunks + (p.mass ? p.ring_parts : 0), rows);
  cudaError_t e = cudaSuccess;
  if (streaming) {
    e = c.head_dim == 64 ? launch_token_stream_d64(loop, s.block_size, grid, p, stream)
                         : launch_token_stream_d128(loop, s.block_size, grid, p, stream);
  } else if (fast) {  // mxfp4 index copy, f16 queries, d 64 / 128, G <= 8 (fast_kernel_serves)
    e = launch_token_fast(c.head_dim, s.block_size, grid, p, false, stream);
  } else if (wide) {  // the same with G > 8 or d 256 / 512 (wide_serves)
    e = launch_token_wide(c.head_dim, grid, p, false, stream);
  } else {
    e = launch_token_general(c.head_dim, kind, grid, p, false, stream);
  }
  if (e != cudaSuccess || !p.mass) return e;
  const int finish_x = owned > 0 ? (owned + kFinishThreads - 1) / kFinishThreads : 1;
  return launch_token_finish(dim3(finish_x, rows), p, p.ring_tc, stream);
}

// Two-stage kTokenMass (c.candidates > 0): the first stage's summary scores into `out`, its
// selection of candidates (detail::candidate_policy: the best c.candidates and block 0,
// ascending) by the select kernels, then a chunk kernel over the candidates only (the tensor-core
// one under kAuto where it serves, else the general one; either first sets every closed block's
// score to -inf) and the finish kernel, which writes the candidates' scores. Four launches, all
// shapes from the batch, T and the store's pitch.
// With `policy` and `selection` (block_scores_select; both or neither), the finish kernel also
// selects policy's topk into `selection` (token_mass_finish_kernel<true>).
cudaError_t two_stage_scores(const StoreView& s, const BlockIndexConfig& c,
                             const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                             const ScoresView& out, void* d_workspace, std::size_t workspace_bytes,
                             cudaStream_t stream, const SelectPolicy* policy = nullptr,
                             const SelectionView* selection = nullptr) {
  const int rows = c.rows(batch, tokens);
  const int pitch = c.candidates + 1;
  const TwoStageLayout layout(rows, row_heads(c), c.candidates, out.max_blocks);
  if (d_workspace == nullptr || layout.status != cudaSuccess || workspace_bytes < layout.total) {
    return cudaErrorInvalidValue;
  }
  auto* base = static_cast<std::uint8_t*>(d_workspace);
  BlockIndexConfig first = c;
  first.score = c.candidate_score;
  first.candidates = 0;
  first.kernel = IndexKernel::kAuto;  // c.kernel names the token stage's kernels
  cudaError_t e = summary_scores_with(SummaryKernels::kAuto, s, first, d_slots, batch, tokens, d_q,
                                      out, stream);
  if (e != cudaSuccess) return e;
  SelectionView candidates;
  candidates.ids = reinterpret_cast<std::int32_t*>(base + layout.ids_offset);
  candidates.counts = reinterpret_cast<std::int32_t*>(base + layout.counts_offset);
  candidates.rows = rows;
  candidates.max_selected = pitch;
  candidates.shared_across_heads = c.shared_across_heads;
  std::size_t select_bytes = layout.select_bytes;
  // The candidates keep C + 1 ranks, past the decode and small paths (k <= 64). Rows of up to
  // 4096 blocks take the set path (kernels/select/set.cuh: id order needs no ranks; in the
  // select kernels' built-in choice), longer ones the spread path: topk_bench, H200,
  // 2026-12-05, anchor(128, {0}) in id order: 8 x 4096 6.82 us on the set path against 22.2 on
  // the spread path and 31.3 on the streaming path (the built-in ranked choice there); 8 x 32768
  // 31.3 against 25.9. The workspace does not depend on the tuning.
  select_detail::SelectTuning spread;
  spread.force_spread = true;
  e = select_detail::select_tuned(base + layout.select_offset, select_bytes, out,
                                  detail::candidate_policy(c), candidates, nullptr, spread, stream);
  if (e != cudaSuccess) return e;
  TokenScoreParams p = token_params(s, c, d_slots, tokens, d_q, out);
  p.lse = reinterpret_cast<float*>(base);
  p.partial = reinterpret_cast<float*>(base + layout.mass.partial_offset);
  p.parts = layout.mass.parts;
  // The exact rows (the ring, then the open block) over one CTA per kTokThreads ring rows, at
  // most kStreamRingParts, as the streaming kernels split them. H200, 2026-12-05 (step_bench,
  // 128 candidates): ring 1024 at B1 N128K 86.8 -> 62.7 us with four parts; with ring 256 four
  // parts were no faster at B1 and slower at B32 (191 -> 201 us), so ring 256 keeps one.
  p.ring_parts = std::min(kStreamRingParts, (s.recent_window + kTokThreads - 1) / kTokThreads);
  p.ring_tc = false;
  p.blocks_per_cta = kTokBlocksPerCta;
  p.safe_add = 0;  // the streaming kernels' fields: neither chunk kernel here reads them
  p.scale_bits = 0;
  p.lse_pitch = pitch;
  p.cand = candidates.ids;
  p.cand_count = candidates.counts;
  p.cand_pitch = pitch;
  if (selection != nullptr) {
    p.sel_ids = selection->ids;
    p.sel_counts = selection->counts;
    p.sel_pitch = selection->max_selected;
    p.sel_k = policy->k;
    p.sel_order = policy->order;
  }
  // A shared row's kv heads over grid.z, one per CTA (token_row): a CTA walking the heads one
  // after the other waited out every head's round trips in turn (the ring CTA, and each warp's
  // candidates, per head), and a decode batch leaves most SMs idle anyway.
  const int head_ctas = c.shared_across_heads ? s.num_kv_heads : 1;
  const bool tensor_cores =
      c.kernel == IndexKernel::kAuto && detail::token_tensor_cores_serve(c, s.index_format);
  const bool wide = !tensor_cores && wide_serves(s, c, d_q);
  if (wide) p.ring_parts = wide_ring_parts(s);
  // One candidate per warp where the whole grid is one wave (a decode step of a few sequences:
  // the chunk CTAs, which wait for the candidates, are then the step's critical path, and the SMs
  // idle otherwise), two per warp otherwise (the tensor-core kernel at blocks of 16 / 32 / 64;
  // the general kernel always takes kTokBlocksPerCta).
  if (tensor_cores && (s.block_size == 16 || s.block_size == 32 || s.block_size == 64)) {
    int sms = 0;
    e = kvc::detail::sm_count(sms);
    if (e != cudaSuccess) return e;
    const long long one_wave = static_cast<long long>(rows) * head_ctas *
                               ((pitch + kTokWarps - 1) / kTokWarps + p.ring_parts);
    if (one_wave <= static_cast<long long>(fast_min_ctas(1)) * sms) p.blocks_per_cta = kTokWarps;
  }
  const int chunks = (pitch + p.blocks_per_cta - 1) / p.blocks_per_cta;
  const dim3 grid(chunks + p.ring_parts, rows, head_ctas);
  // The chunk kernel as a programmatic dependent of the selection: its ring CTAs (which need no
  // candidates) and every CTA's row set-up run while the candidates are being selected; the chunk
  // CTAs wait for them (token_fast_kernel, token_score_kernel).
  if (tensor_cores) {
    e = launch_token_fast(c.head_dim, s.block_size, grid, p, true, stream);
  } else if (wide) {
    e = launch_token_wide(c.head_dim, grid, p, true, stream);
  } else {
    e = launch_token_general(c.head_dim, token_key_kind(s, c), grid, p, true, stream);
  }
  if (e != cudaSuccess) return e;
  // The finish as a programmatic dependent of the chunk kernel: it reads the length and the
  // candidates before it waits. It is scheduled only once every chunk CTA has waited for the
  // selection (they let it launch after their pdl_wait), so the candidates are complete then.
  return launch_token_finish(dim3((pitch + kFinishThreads - 1) / kFinishThreads, rows), p, true,
                             stream);
}

// The summary kernels' parameters every tensor-core and byte-floor launch shares; the caller
// sets p.nb where its kernel uses it.
FastScoreParams summary_params(const StoreView& s, const BlockIndexConfig& c,
                               const std::int32_t* d_slots, int tokens, const void* d_q,
                               const ScoresView& out) {
  FastScoreParams p;
  p.s = s;
  p.slots = d_slots;
  p.q = static_cast<const std::uint16_t*>(d_q);
  p.out = out;
  p.tokens = tokens;
  p.num_q_heads = c.num_q_heads;
  p.group = c.num_q_heads / c.num_kv_heads;
  p.nb = 0;
  p.scale = c.scale();
  p.aggregate_max = c.aggregate == GqaAggregate::kMax;
  p.shared = c.shared_across_heads;
  p.q_bf16 = c.dtype == DType::kBF16;
  return p;
}

// kMeanK / kQuestMinMax with the byte-floor kernels (kernels/index/score_fast.cuh, score_rows.cuh,
// score_mma.cuh; `which` as kernels/index/summary_variant.h describes it).
cudaError_t fast_summary_scores(const StoreView& s, const BlockIndexConfig& c,
                                const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                                const ScoresView& out, SummaryKernels which, cudaStream_t stream) {
  FastScoreParams p = summary_params(s, c, d_slots, tokens, d_q, out);
  p.nb = detail::fast_summary_blocks_per_cta(c.num_kv_heads);
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  const bool quest = c.score == SummaryScore::kQuestMinMax;
  if (which == SummaryKernels::kAuto) {
    which = auto_summary_kernels(c.shared_across_heads, c.head_dim, s.summary_dtype, c.dtype);
  }
  if (which == SummaryKernels::kTensorCore || which == SummaryKernels::kTensorCoreTiles1 ||
      which == SummaryKernels::kTensorCoreTiles4 ||
      which == SummaryKernels::kTensorCoreQueryPerTile ||
      which == SummaryKernels::kTensorCorePrefetch1 ||
      which == SummaryKernels::kTensorCorePrefetch2 ||
      which == SummaryKernels::kTensorCorePrefetchNext) {
    if (!tensor_core_summary_serves(c.shared_across_heads, c.head_dim, s.summary_dtype, c.dtype)) {
      return cudaErrorNotSupported;
    }
    const SummaryMath math = s.summary_dtype == DType::kF32    ? SummaryMath::kTf32
                             : s.summary_dtype == DType::kBF16 ? SummaryMath::kBF16
                                                               : SummaryMath::kF16;
    const int tiles = which == SummaryKernels::kTensorCoreTiles1   ? 1
                      : which == SummaryKernels::kTensorCoreTiles4 ? 4
                                                                   : 0;
    p.query_per_tile = which == SummaryKernels::kTensorCoreQueryPerTile;
    // Prefetch distance: waves of resident CTAs, or -1 for the next CTA.
    const int waves = which == SummaryKernels::kTensorCorePrefetch1      ? 1
                      : which == SummaryKernels::kTensorCorePrefetch2    ? 2
                      : which == SummaryKernels::kTensorCorePrefetchNext ? -1
                                                                         : 0;
    return c.head_dim == 64
               ? launch_summary_mma_d64(quest, math, tiles, waves, owned, batch, p, stream)
               : launch_summary_mma_d128(quest, math, tiles, waves, owned, batch, p, stream);
  }
  if (which == SummaryKernels::kWarpPerRow) {
    if (c.shared_across_heads) return cudaErrorNotSupported;
    return launch_summary_rows(c.head_dim, quest, p.group, owned, batch * tokens, p, stream);
  }
  const dim3 grid(owned > 0 ? (owned + p.nb - 1) / p.nb : 1, batch * tokens);
  const std::size_t smem =
      (static_cast<std::size_t>(c.num_q_heads) * c.head_dim +
       (c.shared_across_heads ? static_cast<std::size_t>(c.num_kv_heads) * p.nb : 0)) *
      4;
  return launch_summary_fast(c.head_dim, quest, grid, smem, p, stream);
}

// kMeanK / kQuestMinMax with the general kernel (kernels/index/score.cuh).
cudaError_t general_summary_scores(const StoreView& s, const BlockIndexConfig& c,
                                   const std::int32_t* d_slots, int batch, int tokens,
                                   const void* d_q, const ScoresView& out, cudaStream_t stream) {
  ScoreParams p;
  p.s = s;
  p.slots = d_slots;
  p.q = static_cast<const std::uint16_t*>(d_q);
  p.out = out;
  p.tokens = tokens;
  p.num_q_heads = c.num_q_heads;
  p.group = c.num_q_heads / c.num_kv_heads;
  const int heads = c.shared_across_heads ? c.num_q_heads : p.group;
  p.heads_per_chunk = heads * c.head_dim <= kMaxSmemFloats ? heads : kMaxSmemFloats / c.head_dim;
  p.scale = c.scale();
  p.quest = c.score == SummaryScore::kQuestMinMax;
  p.aggregate_max = c.aggregate == GqaAggregate::kMax;
  p.shared = c.shared_across_heads;
  p.q_bf16 = c.dtype == DType::kBF16;
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  const int ctas_x = owned > 0 ? (owned + kBlocksPerCta - 1) / kBlocksPerCta : 1;
  const dim3 grid(ctas_x, c.rows(batch, tokens));
  const std::size_t smem = static_cast<std::size_t>(p.heads_per_chunk) * c.head_dim * 4;
  return launch_summary_general(c.head_dim, grid, smem, p, stream);
}

}  // namespace

cudaError_t block_scores_workspace_size(std::size_t& bytes, const BlockIndexConfig& c, int batch,
                                        int tokens, int max_blocks_per_slot) {
  bytes = 0;
  if (batch < 0 || tokens < 0 || max_blocks_per_slot < 0) return cudaErrorInvalidValue;
  if (c.score != SummaryScore::kTokenMass) return cudaSuccess;
  if (c.candidates > 0) {
    const TwoStageLayout layout(c.rows(batch, tokens), row_heads(c), c.candidates,
                                max_blocks_per_slot);
    bytes = layout.total;
    return layout.status;
  }
  bytes = TokenMassLayout(c.rows(batch, tokens), row_heads(c), max_blocks_per_slot).total;
  return cudaSuccess;
}

static_assert(kBlockScoresSelectMax == kFinishThreads,
              "block_scores_select: one finish CTA per row, one candidate and one pick per thread");

bool block_scores_select_serves(const BlockIndexConfig& c, const SelectPolicy& policy) {
  return c.score == SummaryScore::kTokenMass && c.candidates > 0 &&
         c.candidates + 1 <= kBlockScoresSelectMax && policy.kind == SelectPolicy::Kind::kTopK &&
         policy.k >= 0 && policy.k <= kBlockScoresSelectMax;
}

cudaError_t block_scores_select(const StoreView& s, const BlockIndexConfig& c,
                                const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                                const ScoresView& out, const SelectPolicy& policy,
                                const SelectionView& selection, void* d_workspace,
                                std::size_t workspace_bytes, cudaStream_t stream) {
  if (!block_scores_select_serves(c, policy)) return cudaErrorNotSupported;
  if (selection.rows != out.rows || selection.max_selected < policy.max_output(out.max_blocks) ||
      (out.rows > 0 &&
       (selection.counts == nullptr || (selection.ids == nullptr && selection.max_selected > 0)))) {
    return cudaErrorInvalidValue;
  }
  if (batch <= 0 || tokens <= 0) return cudaSuccess;
  return two_stage_scores(s, c, d_slots, batch, tokens, d_q, out, d_workspace, workspace_bytes,
                          stream, &policy, &selection);
}

cudaError_t block_scores(const StoreView& s, const BlockIndexConfig& c, const std::int32_t* d_slots,
                         int batch, int tokens, const void* d_q, const ScoresView& out,
                         cudaStream_t stream) {
  return block_scores(s, c, d_slots, batch, tokens, d_q, out, nullptr, 0, stream);
}

cudaError_t block_scores(const StoreView& s, const BlockIndexConfig& c, const std::int32_t* d_slots,
                         int batch, int tokens, const void* d_q, const ScoresView& out,
                         void* d_workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  return index_detail::block_scores_with(index_detail::TokenKernels::kAuto, s, c, d_slots, batch,
                                         tokens, d_q, out, d_workspace, workspace_bytes, stream);
}

cudaError_t index_detail::block_scores_with(TokenKernels which, const StoreView& s,
                                            const BlockIndexConfig& c, const std::int32_t* d_slots,
                                            int batch, int tokens, const void* d_q,
                                            const ScoresView& out, void* d_workspace,
                                            std::size_t workspace_bytes, cudaStream_t stream) {
  if (!is_token_score(c.score)) {
    return summary_scores_with(SummaryKernels::kAuto, s, c, d_slots, batch, tokens, d_q, out,
                               stream);
  }
  if (batch <= 0 || tokens <= 0) return cudaSuccess;
  if (c.kernel == IndexKernel::kFast && !detail::fast_kernel_serves(c, s.index_format)) {
    return cudaErrorInvalidValue;
  }
  if (c.score == SummaryScore::kTokenMass && c.candidates > 0) {
    return two_stage_scores(s, c, d_slots, batch, tokens, d_q, out, d_workspace, workspace_bytes,
                            stream);
  }
  return token_scores(s, c, d_slots, batch, tokens, d_q, out, d_workspace, workspace_bytes,
                      detail::uses_fast_kernel(c, s.index_format), which, stream);
}

cudaError_t index_detail::summary_scores_with(SummaryKernels which, const StoreView& s,
                                              const BlockIndexConfig& c,
                                              const std::int32_t* d_slots, int batch, int tokens,
                                              const void* d_q, const ScoresView& out,
                                              cudaStream_t stream) {
  if (batch <= 0 || tokens <= 0) return cudaSuccess;
  if (is_token_score(c.score)) return cudaErrorInvalidValue;
  if (c.kernel == IndexKernel::kFast && !detail::fast_kernel_serves(c, s.index_format)) {
    return cudaErrorInvalidValue;
  }
  if (detail::uses_fast_kernel(c, s.index_format)) {
    return fast_summary_scores(s, c, d_slots, batch, tokens, d_q, out, which, stream);
  }
  // Mean K with rows per kv head that the byte-floor kernels do not take (MQA Hq 64 / Hkv 1 /
  // d 512, head_dim 256 / 512) and 16-bit summaries of the queries' type: the wide tensor-core
  // kernel under kAuto (kernels/index/score_wide.cuh; it reads queries 16 bytes at a time).
  if (c.kernel == IndexKernel::kAuto && reinterpret_cast<std::uintptr_t>(d_q) % 16 == 0 &&
      wide_summary_serves(c.score == SummaryScore::kQuestMinMax, c.shared_across_heads, c.head_dim,
                          s.summary_dtype, c.dtype, false)) {
    const FastScoreParams p = summary_params(s, c, d_slots, tokens, d_q, out);  // rows per kv head
    const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
    return launch_summary_wide(c.head_dim, p.q_bf16, owned, c.rows(batch, tokens), p, stream);
  }
  return general_summary_scores(s, c, d_slots, batch, tokens, d_q, out, stream);
}

}  // namespace kernels

namespace detail {
namespace {

class CudaBlockIndex final : public BlockIndex {
 public:
  CudaBlockIndex(const BlockIndexConfig& c, Device device) : config_(c), device_(device) {
    DeviceGuard guard(device_.index);
    slots_ = DeviceBuffer(static_cast<std::size_t>(c.max_batch) * 4);
    // The largest call's scratch (kTokenMass; 0 bytes otherwise), allocated once here.
    std::size_t bytes = 0;
    KVC_CUDA_THROW(kernels::block_scores_workspace_size(bytes, c, c.max_batch, c.max_query_tokens,
                                                        c.max_blocks_per_slot));
    workspace_ = DeviceBuffer(bytes);
  }
  const BlockIndexConfig& config() const override { return config_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void score(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
             const ScoresView& out) override {
    const int T = validate_score_args(config_, store, slots, q, out, device_);
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaMemcpyAsync(slots_.as<void>(), slots.data(), slots.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    KVC_CUDA_THROW(kernels::block_scores(store.view(), config_, slots_.as<std::int32_t>(),
                                         static_cast<int>(slots.size()), T, q.data, out,
                                         workspace_.as<void>(), workspace_.bytes(), stream_));
  }

 private:
  BlockIndexConfig config_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer slots_, workspace_;
};

}  // namespace

std::unique_ptr<BlockIndex> make_cuda_block_index(const BlockIndexConfig& config, Device device) {
  return std::make_unique<CudaBlockIndex>(config, device);
}

}  // namespace detail
}  // namespace kvc
