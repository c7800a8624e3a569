// BlockIndex, CPU reference.
#include "kvc/index/block_index.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "index_impl.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/index/score_math.h"
#include "kvc/select/selector.h"
#include "kvc/store/block_codec.h"

namespace kvc {
namespace detail {

#if KVC_CUDA_ENABLED
std::unique_ptr<BlockIndex> make_cuda_block_index(const BlockIndexConfig& config, Device device);
#endif

namespace {

class CpuBlockIndex final : public BlockIndex {
 public:
  explicit CpuBlockIndex(const BlockIndexConfig& c) : config_(c) {}
  const BlockIndexConfig& config() const override { return config_; }
  void set_stream(void*) override {}

  void score(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
             const ScoresView& out) override {
    const int T = validate_score_args(config_, store, slots, q, out, Device::cpu());
    if (is_token_score(config_.score)) {
      score_tokens(store, slots, q, out, T);
      return;
    }
    const StoreView s = store.view();
    const int Hq = config_.num_q_heads, Hkv = config_.num_kv_heads, d = config_.head_dim;
    const bool bf = config_.dtype == DType::kBF16;
    const auto* qb = q.ptr<const std::uint16_t>();
    std::vector<float> qf(static_cast<std::size_t>(Hq) * d);
    for (std::size_t b = 0; b < slots.size(); ++b) {
      const int slot = slots[b];
      // A shard scores its own closed blocks only: entry j is logical block owned_block_id(j).
      const int closed = store.config().owned_blocks(store.num_closed_blocks(slot));
      const std::int32_t* table =
          s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
      for (int t = 0; t < T; ++t) {
        const std::uint16_t* qt = qb + (b * T + t) * static_cast<std::size_t>(Hq) * d;
        for (std::size_t i = 0; i < qf.size(); ++i) qf[i] = bits16_to_float(qt[i], bf);
        const int row0 = static_cast<int>(b * T + t) * (config_.shared_across_heads ? 1 : Hkv);
        const int nrows = config_.shared_across_heads ? 1 : Hkv;
        for (int r = 0; r < nrows; ++r) {
          out.num_valid[row0 + r] = closed;
          float* row = out.scores + static_cast<std::size_t>(row0 + r) * out.max_blocks;
          for (int j = 0; j < closed; ++j)
            row[j] = summary_score(s, table, j, qf.data(), r, config_.score);
        }
      }
    }
  }

 private:
  // kTokenMax / kTokenMass, in the documented float32 order (docs/selection.md): per row, for
  // each kv head of the row and each closed block (ascending), the block's keys are decoded once
  // and every head of that kv head takes l = scale * (Σ_e q[e] * k[e], e ascending) per token
  // (ascending); the max rule keeps nan_max over the tokens, the mass rule a LogSumExp of the
  // non-NaN logits (NaN if any was NaN). The mass normaliser of head g adds, in this order, the
  // visible ring rows (positions O..pos ascending), the open block's rows, then the non-NaN
  // block values (blocks ascending). Heads are aggregated in ascending order. With two stages
  // (config().candidates > 0) only the row's candidate blocks (candidate_blocks) are read, enter
  // the normaliser and get a score; every other closed block scores -inf.
  void score_tokens(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
                    const ScoresView& out, int T) const {
    using index_math::LogSumExp;
    using index_math::nan_max;
    const StoreView s = store.view();
    const int Hq = config_.num_q_heads, Hkv = config_.num_kv_heads, d = config_.head_dim;
    const int G = Hq / Hkv, B = s.block_size, W = s.recent_window;
    const float scale = config_.scale();
    const bool bf = config_.dtype == DType::kBF16;
    const bool mass = config_.score == SummaryScore::kTokenMass;
    const bool index_copy = config_.token_keys == TokenKeys::kIndexCopy;
    const bool shared = config_.shared_across_heads;
    const bool two_stage = mass && config_.candidates > 0;
    std::vector<char> candidate;  // two stages: the row's candidate blocks
    const int nrows = shared ? 1 : Hkv, heads = shared ? Hq : G;
    const auto* qb = q.ptr<const std::uint16_t>();
    std::vector<float> qf(static_cast<std::size_t>(Hq) * d), keys(static_cast<std::size_t>(B) * d);
    std::vector<float> val;  // [heads, closed]: m_g(j), or lse_g(j) (NaN: a NaN logit)
    std::vector<LogSumExp> z(static_cast<std::size_t>(heads));
    auto logit = [&](int g, const float* k) {
      const float* qg = qf.data() + static_cast<std::size_t>(g) * d;
      float acc = 0.0f;
      for (int e = 0; e < d; ++e) acc += qg[e] * k[e];
      return scale * acc;
    };
    for (std::size_t b = 0; b < slots.size(); ++b) {
      const int slot = slots[b];
      const int L = s.lengths[slot];
      const int closed = store.config().owned_blocks(store.num_closed_blocks(slot));
      const int old = L > W ? L - W : 0;
      const std::int32_t* table =
          s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
      val.assign(static_cast<std::size_t>(heads) * closed, 0.0f);
      for (int t = 0; t < T; ++t) {
        const std::uint16_t* qt = qb + (b * T + t) * static_cast<std::size_t>(Hq) * d;
        for (std::size_t i = 0; i < qf.size(); ++i) qf[i] = bits16_to_float(qt[i], bf);
        const int pos = L - T + t;
        const int row0 = static_cast<int>(b * T + t) * nrows;
        for (int r = 0; r < nrows; ++r) {
          const int g_first = shared ? 0 : r * G;
          const int h_first = shared ? 0 : r, h_count = shared ? Hkv : 1;
          // Two stages: only the candidates' tokens are read; the rest score -inf.
          if (two_stage) candidate_blocks(s, table, qf.data(), r, closed, candidate);
          auto scored = [&](int j) {
            return !two_stage || candidate[static_cast<std::size_t>(j)] != 0;
          };
          for (LogSumExp& zg : z) zg = LogSumExp{};
          for (int h = h_first; h < h_first + h_count; ++h) {
            const int gl0 = (h - h_first) * G;  // row-local index of the kv head's first q head
            for (int j = 0; j < closed; ++j) {
              if (!scored(j)) continue;
              const int pb = table[store::owned_block_id(s, j)];
              for (int i = 0; i < B; ++i) {
                for (int e = 0; e < d; ++e) {
                  keys[static_cast<std::size_t>(i) * d + e] =
                      index_copy ? store::index_k_at(s, pb, h, i, e)
                                 : store::old_k_at(s, pb, h, i, e);
                }
              }
              for (int gl = gl0; gl < gl0 + G; ++gl) {
                float m = index_math::neg_inf();
                LogSumExp st;
                bool nan = false;
                for (int i = 0; i < B; ++i) {
                  const float l =
                      logit(g_first + gl, keys.data() + static_cast<std::size_t>(i) * d);
                  m = nan_max(m, l);
                  if (is_nan(l)) {
                    nan = true;
                  } else {
                    st.add(l);
                  }
                }
                val[static_cast<std::size_t>(gl) * closed + j] = !mass ? m
                                                                 : nan ? formats::quiet_nan()
                                                                       : st.value();
              }
            }
            if (!mass) continue;
            // The exact part of the normaliser: ring rows O..pos, then the open block's rows.
            auto add_exact = [&](const float* k) {
              for (int gl = gl0; gl < gl0 + G; ++gl) {
                const float l = logit(g_first + gl, k);
                if (!is_nan(l)) z[static_cast<std::size_t>(gl)].add(l);
              }
            };
            for (int p = old; p <= pos; ++p) {
              for (int e = 0; e < d; ++e) keys[e] = store::ring_k_at(s, slot, h, p % W, e);
              add_exact(keys.data());
            }
            if (old % B > 0) {
              const int pb = table[old / B];
              for (int i = 0; i < old % B; ++i) {
                for (int e = 0; e < d; ++e) keys[e] = store::old_k_at(s, pb, h, i, e);
                add_exact(keys.data());
              }
            }
          }
          if (mass) {
            for (int gl = 0; gl < heads; ++gl) {
              for (int j = 0; j < closed; ++j) {
                if (!scored(j)) continue;
                const float v = val[static_cast<std::size_t>(gl) * closed + j];
                if (!is_nan(v)) z[static_cast<std::size_t>(gl)].add(v);
              }
            }
          }
          out.num_valid[row0 + r] = closed;
          float* row = out.scores + static_cast<std::size_t>(row0 + r) * out.max_blocks;
          for (int j = 0; j < closed; ++j) {
            if (!scored(j)) {
              row[j] = index_math::neg_inf();
              continue;
            }
            float acc = 0.0f;
            LogSumExp sum;
            bool nan = false;
            for (int gl = 0; gl < heads; ++gl) {
              float v = val[static_cast<std::size_t>(gl) * closed + j];
              if (mass) v = index_math::log_share(v, z[static_cast<std::size_t>(gl)].value());
              if (mass && config_.aggregate == GqaAggregate::kSum) {
                if (is_nan(v)) {
                  nan = true;
                } else {
                  sum.add(v);
                }
                continue;
              }
              acc = gl == 0                                   ? v
                    : config_.aggregate == GqaAggregate::kSum ? acc + v
                                                              : nan_max(acc, v);
            }
            row[j] = !(mass && config_.aggregate == GqaAggregate::kSum) ? acc
                     : nan                                              ? formats::quiet_nan()
                                                                        : sum.value();
          }
        }
      }
    }
  }

  // Row r's summary score (kMeanK or kQuestMinMax, `score`) of its closed block j: per query head
  // of the row, ascending, scale * head_score, aggregated by config().aggregate. qf: the token's
  // queries as float, [Hq, d].
  float summary_score(const StoreView& s, const std::int32_t* table, int j, const float* qf, int r,
                      SummaryScore score) const {
    const int Hq = config_.num_q_heads, G = Hq / config_.num_kv_heads, d = config_.head_dim;
    const int h_begin = config_.shared_across_heads ? 0 : r * G;
    const int h_end = config_.shared_across_heads ? Hq : (r + 1) * G;
    const int pb = table[store::owned_block_id(s, j)];
    float acc = 0.0f;
    for (int g = h_begin; g < h_end; ++g) {
      const float v = config_.scale() * head_score(s, pb, g / G, qf + g * d, score);
      acc = g == h_begin ? v : config_.aggregate == GqaAggregate::kSum ? acc + v : std::max(acc, v);
    }
    return acc;
  }

  // The two-stage rule's candidates of a row (config().candidates > 0): its `closed` blocks'
  // summary scores by config().candidate_score, then candidate_policy()'s selection of them (the
  // best `candidates` in the Selector's rank order, and block 0), as the CUDA index selects
  // them. in[j] = 1 for a candidate.
  void candidate_blocks(const StoreView& s, const std::int32_t* table, const float* qf, int r,
                        int closed, std::vector<char>& in) const {
    std::vector<float> first(static_cast<std::size_t>(closed));
    for (int j = 0; j < closed; ++j)
      first[static_cast<std::size_t>(j)] =
          summary_score(s, table, j, qf, r, config_.candidate_score);
    const SelectPolicy policy = candidate_policy(config_);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(policy.max_output(closed)));
    const int n =
        select_row(first.data(), closed, policy, ids.data(), static_cast<int>(ids.size()));
    in.assign(static_cast<std::size_t>(closed), 0);
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])] = 1;
  }

  float head_score(const StoreView& s, int pool_block, int kv_head, const float* q,
                   SummaryScore score) const {
    const std::size_t o = store::block_head_index(s, pool_block, kv_head) * s.head_dim;
    float acc = 0.0f;
    if (score == SummaryScore::kMeanK) {
      for (int i = 0; i < s.head_dim; ++i) acc += q[i] * store::summary_at(s, s.mean_k, o + i);
    } else {
      for (int i = 0; i < s.head_dim; ++i) {
        acc += std::max(q[i] * store::summary_at(s, s.min_k, o + i),
                        q[i] * store::summary_at(s, s.max_k, o + i));
      }
    }
    return acc;
  }

  BlockIndexConfig config_;
};

}  // namespace
}  // namespace detail

std::unique_ptr<BlockIndex> BlockIndex::create(const BlockIndexConfig& config, Device device) {
  config.validate();
  if (device.is_cpu()) return std::make_unique<detail::CpuBlockIndex>(config);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return detail::make_cuda_block_index(config, device);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

}  // namespace kvc
