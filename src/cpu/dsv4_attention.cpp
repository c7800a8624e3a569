// SparseAttention on the CPU: the reference CSA/HCA attention over the window ring (+ chunk) and
// the entry store, float32 accumulation (float64 on request) (kvc/dsv4/sparse_attention.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dsv4_cpu.h"
#include "dsv4_internal.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/sparse_attention.h"

namespace kvc {
namespace dsv4 {
namespace detail {
namespace {

/// Decodes one row of a store into `out` (dim floats).
void decode_row(const EntryStoreView& v, int slot, int row, float* out) {
  const std::uint8_t* page = page_of(v, slot, row);
  for (int i = 0; i < v.layout.dim; ++i) {
    out[i] = decode_element(v.layout, page, row % v.layout.page_entries, i);
  }
}

template <class Acc>
void attend(const SparseAttentionConfig& c, const std::vector<const float*>& rows, const float* q,
            const float* sink, float* out, float* lse) {
  const int d = c.head_dim;
  const Acc scale = static_cast<Acc>(c.scale());
  std::vector<Acc> logit(rows.size());
  Acc m = sink != nullptr ? static_cast<Acc>(*sink) : -std::numeric_limits<Acc>::infinity();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Acc acc = 0;
    for (int k = 0; k < d; ++k) acc += static_cast<Acc>(q[k]) * static_cast<Acc>(rows[i][k]);
    logit[i] = scale * acc;
    m = std::max(m, logit[i]);
  }
  Acc denom = sink != nullptr ? std::exp(static_cast<Acc>(*sink) - m) : Acc(0);
  std::vector<Acc> o(static_cast<std::size_t>(d), Acc(0));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Acc e = std::exp(logit[i] - m);
    denom += e;
    for (int k = 0; k < d; ++k) o[static_cast<std::size_t>(k)] += e * static_cast<Acc>(rows[i][k]);
  }
  for (int k = 0; k < d; ++k) {
    out[k] = denom > 0 ? static_cast<float>(o[static_cast<std::size_t>(k)] / denom) : 0.0f;
  }
  *lse =
      denom > 0 ? static_cast<float>(m + std::log(denom)) : -std::numeric_limits<float>::infinity();
}

class CpuSparseAttention final : public SparseAttention {
 public:
  explicit CpuSparseAttention(const SparseAttentionConfig& c) : config_(c) {}
  const SparseAttentionConfig& config() const override { return config_; }
  void set_stream(void*) override {}

  void forward(const EntryStore& ring, const EntryStore& entries,
               const SparseAttentionArgs& a) override {
    const int T = check_sparse_attention(config_, Device::cpu(), ring, entries, a);
    const SparseAttentionConfig& c = config_;
    const int H = c.num_heads, d = c.head_dim, W = c.window;
    const std::int64_t C = a.window_chunk.data != nullptr ? a.window_chunk.shape[1] : 0;
    const EntryStoreView rv = ring.view(), ev = entries.view();
    // Every check before any output: index ids and (engine-owned pages) page ids.
    for (std::size_t b = 0; b < a.slots.size(); ++b) {
      const int slot = a.slots[b];
      const std::int64_t R = ring.count(slot);
      if (ring.engine_pages()) check_rows_have_pages(rv, slot, std::max<std::int64_t>(0, R - W), R);
      for (int t = 0; t < T; ++t) {
        const std::int64_t pos = a.lengths[b] - T + t;
        const int visible =
            static_cast<int>(std::min<std::int64_t>((pos + 1) / c.ratio, entries.count(slot)));
        if (c.hca) {
          if (entries.engine_pages()) check_rows_have_pages(ev, slot, 0, visible);
          continue;
        }
        const std::int32_t* ids =
            a.indices.ids + (b * T + t) * static_cast<std::size_t>(a.indices.max_selected);
        for (int i = 0; i < a.indices.max_selected; ++i) {
          KVC_CHECK(ids[i] >= -1 && ids[i] < visible, "indices row ", b * T + t, " column ", i,
                    " = ", ids[i], " must be -1 or in [0, visible entries = ", visible, ")");
          if (ids[i] >= 0 && entries.engine_pages())
            check_rows_have_pages(ev, slot, ids[i], ids[i] + 1);
        }
      }
    }
    std::vector<float> buf;
    std::vector<const float*> rows;
    std::vector<float> qf(static_cast<std::size_t>(d)), o(static_cast<std::size_t>(d));
    for (std::size_t b = 0; b < a.slots.size(); ++b) {
      const int slot = a.slots[b];
      const std::int64_t R = ring.count(slot);
      for (int t = 0; t < T; ++t) {
        const std::int64_t pos = a.lengths[b] - T + t;
        const std::size_t qrow = b * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
        // Gather the rows this query attends: window tokens, then entries.
        std::vector<std::int64_t> window;
        for (std::int64_t p = std::max<std::int64_t>(0, pos - W + 1); p <= pos; ++p)
          window.push_back(p);
        std::vector<int> ents;
        const int visible =
            static_cast<int>(std::min<std::int64_t>((pos + 1) / c.ratio, entries.count(slot)));
        if (c.hca) {
          for (int j = 0; j < visible; ++j) ents.push_back(j);
        } else {
          const std::int32_t* ids =
              a.indices.ids + qrow * static_cast<std::size_t>(a.indices.max_selected);
          for (int i = 0; i < a.indices.max_selected; ++i) {
            if (ids[i] >= 0) ents.push_back(ids[i]);
          }
        }
        buf.assign((window.size() + ents.size()) * static_cast<std::size_t>(d), 0.0f);
        rows.clear();
        std::size_t k = 0;
        for (std::int64_t p : window) {
          float* dst = buf.data() + k++ * d;
          if (p < R) {
            decode_row(rv, slot, static_cast<int>(p % W), dst);
          } else {
            const std::uint16_t* src =
                a.window_chunk.ptr<const std::uint16_t>() +
                (b * static_cast<std::size_t>(C) + static_cast<std::size_t>(p - R)) * d;
            for (int i = 0; i < d; ++i) dst[i] = bf16_bits_to_float(src[i]);
          }
          rows.push_back(dst);
        }
        for (int j : ents) {
          float* dst = buf.data() + k++ * d;
          decode_row(ev, slot, j, dst);
          rows.push_back(dst);
        }
        for (int h = 0; h < H; ++h) {
          const std::size_t qo = (qrow * H + static_cast<std::size_t>(h)) * d;
          for (int i = 0; i < d; ++i)
            qf[static_cast<std::size_t>(i)] =
                bf16_bits_to_float(a.q.ptr<const std::uint16_t>()[qo + i]);
          float lse = 0.0f;
          const float* sink = a.sink != nullptr ? a.sink + h : nullptr;
          if (c.accumulate_f64) {
            attend<double>(c, rows, qf.data(), sink, o.data(), &lse);
          } else {
            attend<float>(c, rows, qf.data(), sink, o.data(), &lse);
          }
          for (int i = 0; i < d; ++i) {
            if (a.out.dtype == DType::kF32) {
              a.out.ptr<float>()[qo + i] = o[static_cast<std::size_t>(i)];
            } else {
              a.out.ptr<std::uint16_t>()[qo + i] =
                  float_to_bf16_bits(o[static_cast<std::size_t>(i)]);
            }
          }
          if (a.lse.data != nullptr)
            a.lse.ptr<float>()[qrow * H + static_cast<std::size_t>(h)] = lse;
        }
      }
    }
  }

 private:
  SparseAttentionConfig config_;
};

}  // namespace

std::unique_ptr<SparseAttention> make_cpu_sparse_attention(const SparseAttentionConfig& c) {
  return std::make_unique<CpuSparseAttention>(c);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc
