// Context-parallel decoder, CPU reference: host buffers and plain loops for the three data
// movements of a step (pack candidates, build the global score rows, merge the states).
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "kvc/attention/merge.h"
#include "kvc/attention/params.h"
#include "kvc/core/error.h"
#include "kvc/store/block_codec.h"
#include "parallel_internal.h"

namespace kvc {
namespace parallel {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
std::vector<T> sized(std::size_t n) {
  return std::vector<T>(n > 0 ? n : 1);  // never a null data() for an empty buffer
}

class CpuDecoder final : public DecoderBase {
 public:
  CpuDecoder(const ContextParallelConfig& config, const KvStoreConfig& store)
      : DecoderBase(config, store, Device::cpu()) {
    const Sizes& z = sizes();
    const std::size_t rows = static_cast<std::size_t>(z.max_rows);
    const std::size_t n = static_cast<std::size_t>(z.num_shards);
    const std::size_t state = static_cast<std::size_t>(z.max_q_rows) * (z.head_dim + 1);
    local_scores_ = sized<float>(rows * z.owned_blocks);
    local_valid_ = sized<std::int32_t>(rows);
    local_ids_ = sized<std::int32_t>(rows * z.candidates);
    local_counts_ = sized<std::int32_t>(rows);
    cand_send_ = sized<BlockCandidate>(rows * z.candidates);
    cand_recv_ = sized<BlockCandidate>(n * rows * z.candidates);
    global_scores_ = sized<float>(rows * z.global_blocks);
    global_valid_ = sized<std::int32_t>(rows);
    global_ids_ = sized<std::int32_t>(rows * z.global_selected);
    global_counts_ = sized<std::int32_t>(rows);
    state_send_ = sized<float>(state);
    state_recv_ = sized<float>(n * state);
    Buffers b;
    b.local_scores = local_scores_.data();
    b.local_valid = local_valid_.data();
    b.local_ids = local_ids_.data();
    b.local_counts = local_counts_.data();
    b.cand_send = cand_send_.data();
    b.cand_recv = cand_recv_.data();
    b.global_scores = global_scores_.data();
    b.global_valid = global_valid_.data();
    b.global_ids = global_ids_.data();
    b.global_counts = global_counts_.data();
    b.state_send = state_send_.data();
    b.state_recv = state_recv_.data();
    init(b);
  }

 protected:
  void upload_slots(const std::vector<int>&) override {}

  void pack_candidates(const StepShape& shape) override {
    const Sizes& z = sizes();
    const std::size_t M = static_cast<std::size_t>(z.candidates);
    for (int r = 0; r < shape.rows; ++r) {
      const int count = local_counts_[r];
      for (std::size_t m = 0; m < M; ++m) {
        BlockCandidate& c = cand_send_[r * M + m];
        if (static_cast<int>(m) < count) {
          const int j = local_ids_[r * M + m];
          c.score = local_scores_[static_cast<std::size_t>(r) * z.owned_blocks + j];
          c.id = j * z.num_shards + z.shard_index;  // store::owned_block_id
        } else {
          c.score = kNaN;
          c.id = -1;
        }
      }
    }
  }

  void build_global_rows(const StoreView& s, const StepShape& shape) override {
    const Sizes& z = sizes();
    const std::size_t M = static_cast<std::size_t>(z.candidates);
    const std::size_t G = static_cast<std::size_t>(z.global_blocks);
    const int rows_per_seq = shape.rows / shape.batch;
    for (int r = 0; r < shape.rows; ++r) {
      const int L = s.lengths[shape.slots[r / rows_per_seq]];
      const int closed = attention::row_range(L, 1, 0, s.recent_window, s.block_size).num_closed;
      global_valid_[r] = closed;
      float* row = global_scores_.data() + r * G;
      for (int j = 0; j < closed; ++j) row[j] = kNaN;
      for (int src = 0; src < z.num_shards; ++src) {
        const BlockCandidate* c =
            cand_recv_.data() + (static_cast<std::size_t>(src) * shape.rows + r) * M;
        for (std::size_t m = 0; m < M; ++m) {
          if (c[m].id < 0) continue;
          KVC_CHECK(c[m].id < closed, "select_global: shard ", src, " sent block ", c[m].id,
                    " for row ", r, " which has ", closed,
                    " closed blocks (shards out of step: same slots, q and lengths?)");
          row[c[m].id] = c[m].score;
        }
      }
    }
  }

  void merge_states(const StepShape& shape, const TensorView& out, float* lse) override {
    const Sizes& z = sizes();
    const int d = z.head_dim;
    const std::size_t rows = static_cast<std::size_t>(shape.q_rows);
    const std::size_t per_shard = rows * (d + 1);
    std::vector<float> acc(static_cast<std::size_t>(d));
    for (std::size_t r = 0; r < rows; ++r) {
      float acc_lse = -std::numeric_limits<float>::infinity();
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int src = 0; src < z.num_shards; ++src) {
        const float* state = state_recv_.data() + src * per_shard;
        const MergeWeights w = merge_weights(acc_lse, state[rows * d + r]);
        merge_row(acc.data(), state + r * d, w, acc.data(), d);
        acc_lse = w.lse;
      }
      for (int i = 0; i < d; ++i) attention::store_element(out.data, r * d + i, out.dtype, acc[i]);
      if (lse != nullptr) lse[r] = acc_lse;
    }
  }

 private:
  std::vector<float> local_scores_;
  std::vector<std::int32_t> local_valid_, local_ids_, local_counts_;
  std::vector<BlockCandidate> cand_send_, cand_recv_;
  std::vector<float> global_scores_;
  std::vector<std::int32_t> global_valid_, global_ids_, global_counts_;
  std::vector<float> state_send_, state_recv_;
};

}  // namespace

std::unique_ptr<ContextParallelDecoder> make_cpu_decoder(const ContextParallelConfig& config,
                                                         const KvStoreConfig& store) {
  return std::make_unique<CpuDecoder>(config, store);
}

}  // namespace parallel
}  // namespace kvc
