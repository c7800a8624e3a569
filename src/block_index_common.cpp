// BlockIndex: configuration and argument validation shared by the CPU and CUDA versions.
#include <cmath>
#include <vector>

#include "index_impl.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"

namespace kvc {

void BlockIndexConfig::validate() const {
  KVC_CHECK(num_kv_heads >= 1 && num_kv_heads <= 256, "num_kv_heads = ", num_kv_heads,
            " must be in [1, 256]");
  KVC_CHECK(num_q_heads >= num_kv_heads && num_q_heads % num_kv_heads == 0,
            "num_q_heads = ", num_q_heads, " must be a multiple of num_kv_heads = ", num_kv_heads);
  KVC_CHECK(num_q_heads / num_kv_heads <= 128,
            "group size num_q_heads / num_kv_heads = ", num_q_heads / num_kv_heads,
            " must be <= 128");
  KVC_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512,
            "head_dim = ", head_dim, " must be 64, 128, 256 or 512");
  KVC_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, "dtype = ", to_string(dtype),
            " must be f16 or bf16");
  KVC_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
            "softmax_scale = ", softmax_scale, " must be finite and >= 0 (0: 1/sqrt(head_dim))");
  KVC_CHECK(max_query_tokens >= 1 && max_query_tokens <= 64,
            "max_query_tokens = ", max_query_tokens, " must be in [1, 64]");
  KVC_CHECK(max_batch >= 1 && max_batch <= 65536, "max_batch = ", max_batch,
            " must be in [1, 65536]");
  KVC_CHECK(
      score == SummaryScore::kMeanK || score == SummaryScore::kQuestMinMax || is_token_score(score),
      "score = ", static_cast<int>(score), " is not a SummaryScore");
  KVC_CHECK(aggregate == GqaAggregate::kSum || aggregate == GqaAggregate::kMax,
            "aggregate = ", static_cast<int>(aggregate), " is not a GqaAggregate");
  KVC_CHECK(kernel == IndexKernel::kAuto || kernel == IndexKernel::kGeneral ||
                kernel == IndexKernel::kFast,
            "kernel = ", static_cast<int>(kernel), " is not an IndexKernel");
  KVC_CHECK(token_keys == TokenKeys::kOldBlocks || token_keys == TokenKeys::kIndexCopy,
            "token_keys = ", static_cast<int>(token_keys), " is not a TokenKeys");
  KVC_CHECK(max_blocks_per_slot >= 0 && max_blocks_per_slot <= (1 << 24),
            "max_blocks_per_slot = ", max_blocks_per_slot, " must be in [0, 2^24]");
  KVC_CHECK(candidates >= 0 && candidates <= kMaxCandidates, "candidates = ", candidates,
            " must be in [0, ", kMaxCandidates, "]");
  KVC_CHECK(candidates == 0 || score == SummaryScore::kTokenMass, "candidates = ", candidates,
            " (two-stage scoring) needs score = token_mass, not ", to_string(score));
  KVC_CHECK(candidates == 0 || candidate_score == SummaryScore::kMeanK ||
                candidate_score == SummaryScore::kQuestMinMax,
            "candidate_score = ", static_cast<int>(candidate_score),
            " must be kMeanK or kQuestMinMax (a summary score)");
  KVC_CHECK(candidates == 0 || kernel != IndexKernel::kFast, "candidates = ", candidates,
            " (two-stage scoring) runs the general token kernel; kernel = fast does not serve it");
  KVC_CHECK(candidates == 0 || max_blocks_per_slot <= (1 << 20), "candidates = ", candidates,
            " (two-stage scoring) ranks rows of up to 2^20 blocks; max_blocks_per_slot = ",
            max_blocks_per_slot);
  if (score == SummaryScore::kTokenMass) {
    // The CUDA index's scratch: every row's head scores of every block, plus per-chunk partials.
    const long double rows = static_cast<long double>(max_batch) * max_query_tokens *
                             (shared_across_heads ? 1 : num_kv_heads);
    const long double heads = shared_across_heads ? num_q_heads : num_q_heads / num_kv_heads;
    const long double bytes = rows * heads * (max_blocks_per_slot + 2.0L) * 8.0L;
    KVC_CHECK(bytes <= 281474976710656.0L, "score = token_mass needs ", bytes,
              " B of scratch (max_batch x max_query_tokens x rows x heads x "
              "max_blocks_per_slot); must be <= 2^48 B");
  }
}

const char* to_string(SummaryScore score) {
  switch (score) {
    case SummaryScore::kMeanK:
      return "mean_k";
    case SummaryScore::kQuestMinMax:
      return "quest";
    case SummaryScore::kTokenMax:
      return "token_max";
    case SummaryScore::kTokenMass:
      return "token_mass";
  }
  return "?";
}

const char* to_string(IndexKernel kernel) {
  switch (kernel) {
    case IndexKernel::kAuto:
      return "auto";
    case IndexKernel::kGeneral:
      return "general";
    case IndexKernel::kFast:
      return "fast";
  }
  return "?";
}

const char* to_string(TokenKeys keys) {
  switch (keys) {
    case TokenKeys::kOldBlocks:
      return "old_blocks";
    case TokenKeys::kIndexCopy:
      return "index_copy";
  }
  return "?";
}

float BlockIndexConfig::scale() const {
  return softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace detail {

int fast_summary_blocks_per_cta(int num_kv_heads) {
  return num_kv_heads >= 8 ? 32 : 32 * (8 / num_kv_heads);
}

bool fast_kernel_serves(const BlockIndexConfig& c, Format index_format) {
  if (!is_token_score(c.score)) {
    const long long partials =
        c.shared_across_heads
            ? static_cast<long long>(c.num_kv_heads) * fast_summary_blocks_per_cta(c.num_kv_heads)
            : 0;
    return static_cast<long long>(c.num_q_heads) * c.head_dim + partials <= kFastSummarySmemFloats;
  }
  return c.candidates == 0 && token_tensor_cores_serve(c, index_format);
}

bool token_tensor_cores_serve(const BlockIndexConfig& c, Format index_format) {
  return c.token_keys == TokenKeys::kIndexCopy && index_format == Format::kMxfp4 &&
         c.dtype == DType::kF16 && (c.head_dim == 64 || c.head_dim == 128) &&
         c.num_q_heads / c.num_kv_heads <= 8;
}

bool uses_fast_kernel(const BlockIndexConfig& c, Format index_format) {
  return c.kernel == IndexKernel::kFast ||
         (c.kernel == IndexKernel::kAuto && fast_kernel_serves(c, index_format));
}

SelectPolicy candidate_policy(const BlockIndexConfig& c) {
  SelectPolicy policy = SelectPolicy::anchor(c.candidates, {0});
  policy.order = SelectPolicy::Order::kChronological;
  return policy;
}

int validate_score_args(const BlockIndexConfig& c, const KvStore& store,
                        const std::vector<int>& slots, const TensorView& q, const ScoresView& out,
                        Device device) {
  const KvStoreConfig& sc = store.config();
  KVC_CHECK(store.device() == device, "store.device() = ", to_string(store.device()),
            " must be the index's device ", to_string(device));
  KVC_CHECK(sc.num_kv_heads == c.num_kv_heads, "store num_kv_heads = ", sc.num_kv_heads,
            " must equal the index's num_kv_heads = ", c.num_kv_heads);
  KVC_CHECK(sc.head_dim == c.head_dim, "store head_dim = ", sc.head_dim,
            " must equal the index's head_dim = ", c.head_dim);
  KVC_CHECK(c.score != SummaryScore::kQuestMinMax || (sc.summaries & kSummaryMinMaxK),
            "score = kQuestMinMax needs a store with kSummaryMinMaxK (summaries = ", sc.summaries,
            ")");
  KVC_CHECK(c.candidates == 0 || c.candidate_score != SummaryScore::kQuestMinMax ||
                (sc.summaries & kSummaryMinMaxK),
            "candidate_score = kQuestMinMax needs a store with kSummaryMinMaxK (summaries = ",
            sc.summaries, ")");
  if (is_token_score(c.score) && c.token_keys == TokenKeys::kIndexCopy) {
    KVC_CHECK((sc.summaries & kSummaryIndexKeys) != 0, "score = ", to_string(c.score),
              " with token_keys = index_copy needs a store with kSummaryIndexKeys (summaries = ",
              sc.summaries, ")");
  }
  if (c.score == SummaryScore::kTokenMass) {
    KVC_CHECK(c.candidates == 0 || out.max_blocks <= c.max_blocks_per_slot,
              "out.max_blocks = ", out.max_blocks,
              " exceeds the index's max_blocks_per_slot = ", c.max_blocks_per_slot,
              " (two-stage scoring sizes its selection scratch from it)");
    KVC_CHECK(sc.num_shards == 1,
              "score = token_mass needs an unsharded store (num_shards = ", sc.num_shards,
              "): its normaliser spans every block of the sequence");
    KVC_CHECK(sc.max_blocks_per_slot() <= c.max_blocks_per_slot,
              "store max_blocks_per_slot = ", sc.max_blocks_per_slot(),
              " exceeds the index's max_blocks_per_slot = ", c.max_blocks_per_slot,
              " (score = token_mass sizes its scratch from BlockIndexConfig::max_blocks_per_slot)");
  }
  KVC_CHECK(
      !device.is_cuda() || c.kernel != IndexKernel::kFast || fast_kernel_serves(c, sc.index_format),
      "kernel = fast does not serve score = ", to_string(c.score),
      " (token_keys = ", to_string(c.token_keys), ", index_format = ", to_string(sc.index_format),
      ", Hq = ", c.num_q_heads, ", Hkv = ", c.num_kv_heads, ", head_dim = ", c.head_dim,
      "); use kernel = auto or general");
  const int batch = static_cast<int>(slots.size());
  KVC_CHECK(batch >= 1 && batch <= c.max_batch, "slots.size() = ", batch, " must be in [1, ",
            c.max_batch, "]");
  KVC_CHECK(q.ndim == 4, "q.ndim = ", q.ndim, " must be 4 ([batch, T, Hq, d])");
  const int T = static_cast<int>(q.shape[1]);
  KVC_CHECK(T >= 1 && T <= c.max_query_tokens, "q.shape[1] = ", T,
            " (query tokens) must be in [1, max_query_tokens = ", c.max_query_tokens, "]");
  check_view(q, "q", c.dtype, {batch, T, c.num_q_heads, c.head_dim}, device);
  for (int b = 0; b < batch; ++b) {
    const int s = slots[static_cast<std::size_t>(b)];
    KVC_CHECK(store.is_open(s), "slots[", b, "] = ", s, " is not an open slot of the store");
  }
  KVC_CHECK(out.scores != nullptr && out.num_valid != nullptr,
            "out.scores and out.num_valid must be non-null");
  KVC_CHECK(out.rows == c.rows(batch, T), "out.rows = ", out.rows, " must be ", c.rows(batch, T),
            " (batch x T", c.shared_across_heads ? "" : " x num_kv_heads", ")");
  if (sc.num_shards > 1) {  // a shard's rows hold its own blocks only
    KVC_CHECK(out.max_blocks >= sc.owned_blocks_per_slot(), "out.max_blocks = ", out.max_blocks,
              " must be >= the store's owned_blocks_per_slot = ", sc.owned_blocks_per_slot(),
              " (blocks this shard can own)");
  } else {
    KVC_CHECK(out.max_blocks >= sc.max_blocks_per_slot(), "out.max_blocks = ", out.max_blocks,
              " must be >= the store's max_blocks_per_slot = ", sc.max_blocks_per_slot());
  }
  return T;
}

}  // namespace detail
}  // namespace kvc
