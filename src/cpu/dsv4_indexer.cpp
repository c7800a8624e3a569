// Indexer on the CPU: the reference implementation of the lightning-indexer scores over mxfp4
// and fp8 keys (kvc/dsv4/indexer.h, arithmetic in kvc/dsv4/index_math.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4_cpu.h"
#include "dsv4_internal.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/index_math.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace dsv4 {
namespace detail {
namespace {

class CpuIndexer final : public Indexer {
 public:
  explicit CpuIndexer(const IndexerConfig& c) : config_(c) {}
  const IndexerConfig& config() const override { return config_; }
  void set_stream(void*) override {}

  void score(const EntryStore& keys, const IndexerArgs& a) override {
    const int T = check_indexer_score(config_, Device::cpu(), keys, a);
    const IndexerConfig& c = config_;
    const int H = c.num_heads, D = c.head_dim;
    const bool mx = c.key_format == EntryFormat::kMxfp4;
    const EntryStoreView kv = keys.view();
    if (keys.engine_pages()) {
      for (std::size_t b = 0; b < a.slots.size(); ++b) {
        const std::int64_t visible =
            std::min<std::int64_t>(a.lengths[b] / c.ratio, keys.count(a.slots[b]));
        check_rows_have_pages(kv, a.slots[b], 0, visible);
      }
    }
    // Prepared query of one token: mxfp4 [H][D/2] + [H][D/32], or e4m3 [H][D] + fp32 [H].
    std::vector<std::uint8_t> qp(static_cast<std::size_t>(H) * D),
        qsb(static_cast<std::size_t>(H) * D / 32);
    std::vector<float> qscale(static_cast<std::size_t>(H)), x(static_cast<std::size_t>(D));
    std::vector<float> dots(static_cast<std::size_t>(H));
    for (std::size_t b = 0; b < a.slots.size(); ++b) {
      const int slot = a.slots[b];
      const std::int64_t L = a.lengths[b];
      for (int t = 0; t < T; ++t) {
        const std::int64_t pos = L - T + t;
        const std::size_t row = b * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
        const std::uint16_t* q = a.q.ptr<const std::uint16_t>() + row * H * D;
        const float* w = a.weights.ptr<const float>() + row * H;
        const float* rc =
            c.query_rope ? a.rope_cos.ptr<const float>() + pos * (c.rope_dim / 2) : nullptr;
        const float* rsn =
            c.query_rope ? a.rope_sin.ptr<const float>() + pos * (c.rope_dim / 2) : nullptr;
        for (int h = 0; h < H; ++h) {
          for (int i = 0; i < D; ++i)
            x[static_cast<std::size_t>(i)] = bf16_bits_to_float(q[h * D + i]);
          prepare_query_head(x.data(), D, c.rope_dim, rc, rsn, c.query_hadamard);
          if (mx) {
            formats::mxfp4_encode(x.data(), D, qp.data() + h * D / 2, qsb.data() + h * D / 32,
                                  formats::kMxfp4DeepSeekAmaxFloor);
          } else {
            qscale[static_cast<std::size_t>(h)] =
                formats::ue8m0_to_float(formats::e4m3_ue8m0_encode(x.data(), D, qp.data() + h * D));
          }
        }
        const int visible =
            static_cast<int>(std::min<std::int64_t>((pos + 1) / c.ratio, keys.count(slot)));
        float* out = a.out.scores + row * static_cast<std::size_t>(a.out.max_blocks);
        for (int j = 0; j < visible; ++j) {
          const std::uint8_t* page = page_of(kv, slot, j);
          const int off = j % kv.layout.page_entries;
          const std::uint8_t* kp = entry_payload(kv.layout, page, off);
          const std::uint8_t* ks = entry_scales(kv.layout, page, off);
          if (mx) {
            for (int h = 0; h < H; ++h) {
              dots[static_cast<std::size_t>(h)] =
                  mxfp4_dot(qp.data() + h * D / 2, qsb.data() + h * D / 32, kp, ks, D);
            }
            out[j] = combine_heads_mxfp4(dots.data(), w, H);
          } else {
            for (int h = 0; h < H; ++h)
              dots[static_cast<std::size_t>(h)] = fp8_dot(qp.data() + h * D, kp, D);
            out[j] = combine_heads_fp8(dots.data(), w, qscale.data(), fp8_scaled_scale(ks), H);
          }
        }
        a.out.num_valid[row] = visible;
      }
    }
  }

 private:
  IndexerConfig config_;
};

}  // namespace

std::unique_ptr<Indexer> make_cpu_indexer(const IndexerConfig& c) {
  return std::make_unique<CpuIndexer>(c);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc
