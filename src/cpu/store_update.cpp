// The CPU reference of one slot's update (see store_update.h).
#include "store_update.h"

#include <cstring>

#include "kvc/store/block_codec.h"

namespace kvc {
namespace detail {

void cpu_store_update(const StoreView& s, int slot, int length, int count, const std::uint16_t* k,
                      std::int64_t k_token_stride, const std::uint16_t* v,
                      std::int64_t v_token_stride, float* scratch) {
  const int W = s.recent_window, B = s.block_size, H = s.num_kv_heads;
  const std::size_t d = static_cast<std::size_t>(s.head_dim);
  const int L = length;
  const int old_begin = L > W ? L - W : 0;
  const int old_end = L + count > W ? L + count - W : 0;
  const int ring_begin = L > L + count - W ? L : L + count - W;
  const auto* rk = static_cast<const std::uint16_t*>(s.ring_k);
  const auto* rv = static_cast<const std::uint16_t*>(s.ring_v);
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  auto input = [&](const std::uint16_t* x, std::int64_t stride, int p, int h) {
    return x + static_cast<std::int64_t>(p - L) * stride +
           static_cast<std::int64_t>(h) * s.head_dim;
  };
  for (int p = old_begin; p < old_end; ++p) {
    if (!store::owns_block(s, p / B)) continue;
    const int pb = table[p / B];
    for (int h = 0; h < H; ++h) {
      const std::uint16_t *ks, *vs;
      if (p < L) {
        const std::size_t r = store::ring_row_index(s, slot, h, p % W) * d;
        ks = rk + r;
        vs = rv + r;
      } else {
        ks = input(k, k_token_stride, p, h);
        vs = input(v, v_token_stride, p, h);
      }
      store::encode_old_row(s, pb, h, p % B, ks, vs, scratch);
    }
  }
  for (int b = old_begin / B; b < old_end / B; ++b) {
    if (!store::owns_block(s, b)) continue;
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < s.head_dim; ++i) store::summarise_element(s, table[b], h, i);
    }
  }
  auto* wk = static_cast<std::uint16_t*>(s.ring_k);
  auto* wv = static_cast<std::uint16_t*>(s.ring_v);
  for (int p = ring_begin; p < L + count; ++p) {
    for (int h = 0; h < H; ++h) {
      const std::size_t dst = store::ring_row_index(s, slot, h, p % W) * d;
      std::memcpy(wk + dst, input(k, k_token_stride, p, h), d * 2);
      std::memcpy(wv + dst, input(v, v_token_stride, p, h), d * 2);
    }
  }
}

}  // namespace detail
}  // namespace kvc
