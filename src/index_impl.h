// Which CUDA kernel of the BlockIndex serves a call (internal; shared by the argument checks and
// the launchers so that the two cannot disagree).
#pragma once

#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace detail {

/// Shared memory of the fast summary kernel, in floats: the token's queries (Hq x d) and, for
/// shared rows, one partial per (kv head, block) of a CTA.
constexpr int kFastSummarySmemFloats = 12288;

/// Closed blocks one CTA of the fast summary kernel scores: a multiple of 32, with
/// blocks x kv heads = 256 threads' items when hkv <= 8 (32 blocks otherwise).
int fast_summary_blocks_per_cta(int num_kv_heads);

/// True when the byte-floor kernel serves `c` for a store whose index copy is `index_format`:
/// kMeanK / kQuestMinMax whose queries (and shared-row partials) fit the kernel's shared memory;
/// kTokenMax / kTokenMass from an mxfp4 index copy with f16 queries, head_dim 64 or 128 and
/// G <= 8 (tensor cores, kernels/index/token_fast.cuh).
bool fast_kernel_serves(const BlockIndexConfig& c, Format index_format);

/// True when the tensor-core token kernel (kernels/index/token_fast.cuh) can score `c`'s tokens:
/// an mxfp4 index copy, f16 queries, head_dim 64 or 128, G <= 8. fast_kernel_serves adds that
/// one stage reads every block (two stages run it by their own rule: kAuto and this).
bool token_tensor_cores_serve(const BlockIndexConfig& c, Format index_format);

/// True when a call with `c` runs the fast kernel: kFast always (validated to serve), kAuto when
/// it serves, kGeneral never.
bool uses_fast_kernel(const BlockIndexConfig& c, Format index_format);

/// The first stage of two-stage scoring (c.candidates > 0) as a Selector policy: the best
/// c.candidates blocks of the first-stage scores and block 0 (SelectPolicy::anchor), listed in
/// ascending block order. The CPU index applies it with select_row, the CUDA index with the
/// select kernels, so that both keep the same candidates for the same first-stage scores.
SelectPolicy candidate_policy(const BlockIndexConfig& c);

}  // namespace detail
}  // namespace kvc
