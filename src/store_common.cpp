// Device-independent parts of KvStore: config validation, footprint, snapshots.
#include <cstring>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

// Entries of the block table (max_slots x max_blocks_per_slot int32, 4 GiB at the bound, held on
// the host and, for a CUDA store, on the device too). Documented in docs/reliability.md.
constexpr long long kMaxBlockTableEntries = 1ll << 30;

}  // namespace

int KvStoreConfig::max_blocks_per_slot() const {
  const long long old_tokens = static_cast<long long>(max_context) - recent_window;
  if (old_tokens <= 0 || block_size <= 0) return 0;
  return static_cast<int>((old_tokens + block_size - 1) / block_size);
}

bool KvStoreConfig::owns_block(int block) const {
  return num_shards <= 1 || block % num_shards == shard_index;
}

int KvStoreConfig::owned_blocks(int num_blocks) const {
  return num_shards <= 1 ? num_blocks : store::owned_count(num_blocks, num_shards, shard_index);
}

int KvStoreConfig::owned_blocks_per_slot() const { return owned_blocks(max_blocks_per_slot()); }

int KvStoreConfig::pool_blocks() const {
  if (num_pool_blocks > 0) return num_pool_blocks;
  return static_cast<int>(static_cast<long long>(max_slots) * owned_blocks_per_slot());
}

void KvStoreConfig::validate() const {
  KVC_CHECK(num_kv_heads >= 1 && num_kv_heads <= 256, "num_kv_heads = ", num_kv_heads,
            " must be in [1, 256]");
  KVC_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512,
            "head_dim = ", head_dim, " must be 64, 128, 256 or 512");
  KVC_CHECK(max_slots >= 1 && max_slots <= 65536, "max_slots = ", max_slots,
            " must be in [1, 65536]");
  KVC_CHECK(max_context >= 1, "max_context = ", max_context, " must be >= 1");
  KVC_CHECK(recent_window >= 1 && recent_window <= max_context, "recent_window = ", recent_window,
            " must be in [1, max_context = ", max_context, "]");
  KVC_CHECK(block_size >= 1 && block_size <= 1024, "block_size = ", block_size,
            " must be in [1, 1024]");
  KVC_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, "dtype = ", to_string(dtype),
            " must be f16 or bf16");
  KVC_CHECK(formats::is_kv_format(old_format), "old_format = ", to_string(old_format),
            " must be f16, bf16, q8 or fp16k_q4v");
  KVC_CHECK(old_format != Format::kF16 || dtype == DType::kF16,
            "old_format = f16 needs dtype = f16 (dtype = ", to_string(dtype), ")");
  KVC_CHECK(old_format != Format::kBF16 || dtype == DType::kBF16,
            "old_format = bf16 needs dtype = bf16 (dtype = ", to_string(dtype), ")");
  KVC_CHECK(num_pool_blocks >= 0, "num_pool_blocks = ", num_pool_blocks, " must be >= 0");
  KVC_CHECK((summaries & kSummaryMeanK) != 0, "summaries = ", summaries,
            " must include kSummaryMeanK");
  KVC_CHECK((summaries & ~kSummaryAllBits) == 0, "summaries = ", summaries,
            " has unknown bits (valid: 0..", kSummaryAllBits, ")");
  KVC_CHECK(summary_dtype == DType::kF32 || summary_dtype == dtype,
            "summary_dtype = ", to_string(summary_dtype), " must be f32 or the store's dtype (",
            to_string(dtype), ")");
  KVC_CHECK(index_format == Format::kMxfp4 || index_format == Format::kFp8E4m3,
            "index_format = ", to_string(index_format), " must be mxfp4 or fp8_e4m3");
  KVC_CHECK(num_shards >= 1 && num_shards <= 65536, "num_shards = ", num_shards,
            " must be in [1, 65536]");
  KVC_CHECK(shard_index >= 0 && shard_index < num_shards, "shard_index = ", shard_index,
            " must be in [0, num_shards = ", num_shards, ")");
  const long long pool = num_pool_blocks > 0
                             ? num_pool_blocks
                             : static_cast<long long>(max_slots) * owned_blocks_per_slot();
  KVC_CHECK(pool <= (1ll << 30), "num_pool_blocks = ", pool, " must be <= 2^30");
  // The block table (one int32 per slot and logical block, on the host and on the device) is
  // sized by max_slots and max_context, not by the pool: bound it before anything allocates it.
  const long long table = static_cast<long long>(max_slots) * max_blocks_per_slot();
  KVC_CHECK(table <= kMaxBlockTableEntries,
            "block table = max_slots x max_blocks_per_slot = ", max_slots, " x ",
            max_blocks_per_slot(), " = ", table,
            " entries must be <= 2^30 (max_blocks_per_slot = ceil((max_context - recent_window) / "
            "block_size)); reduce max_slots or max_context, or raise block_size");
  const long long rows = pool * num_kv_heads * block_size;
  KVC_CHECK(rows <= (1ll << 40), "pool rows = ", rows, " (blocks x heads x block_size) too large");
  // Every byte count the store derives must fit in 64 bits with room to spare: bound the
  // allocation (and the dense-equivalent capacity it is compared with) in long double first.
  const long double d = head_dim, hkv = num_kv_heads;
  const long double ring = static_cast<long double>(max_slots) * hkv * recent_window * d * 4.0L;
  // Per old row: K and V payload and scales (at most 2d + 8 B) and the index copy (d + 4 B).
  const long double index_row = (summaries & kSummaryIndexKeys) ? d + 4.0L : 0.0L;
  const long double old = static_cast<long double>(rows) * (2.0L * d + 8.0L + index_row) +
                          static_cast<long double>(pool) * hkv * d * 16.0L;
  const long double tables =
      4.0L * (static_cast<long double>(max_slots) * (max_blocks_per_slot() + 1.0L) + pool + 1.0L);
  const long double dense = static_cast<long double>(max_slots) * max_context * hkv * d * 4.0L;
  constexpr long double kMaxBytes = 281474976710656.0L;  // 2^48 B = 256 TiB
  KVC_CHECK(ring + old + tables <= kMaxBytes, "store size ", ring + old + tables, " B (ring ", ring,
            " B + pool ", old, " B + tables ", tables,
            " B) must be <= 2^48 B; reduce max_slots, recent_window or num_pool_blocks");
  KVC_CHECK(dense <= 4.0L * kMaxBytes * 1024.0L,
            "max_slots x max_context x num_kv_heads x head_dim = ", dense / 4.0L,
            " elements is too large (dense-equivalent bytes must be <= 2^60)");
}

namespace {

struct Sizes {
  std::size_t ring_row, k_row, v_row, scales_row, index_row, summaries_block_head, per_block;
};

Sizes sizes_of(const KvStoreConfig& c) {
  Sizes z{};
  const std::size_t d = static_cast<std::size_t>(c.head_dim);
  z.ring_row = 2 * 2 * d;  // K and V, 16-bit
  z.k_row = formats::k_payload_bytes(c.old_format, c.head_dim);
  z.v_row = formats::v_payload_bytes(c.old_format, c.head_dim);
  z.scales_row = 4 * ((formats::has_k_scale(c.old_format) ? 1 : 0) +
                      (formats::has_v_scale(c.old_format) ? 1 : 0));
  // Index copy of K per token: payload + scales (mxfp4 d/2 + d/32, fp8_e4m3 d + 4).
  z.index_row = (c.summaries & kSummaryIndexKeys)
                    ? formats::indexer_key_bytes(c.index_format, c.head_dim)
                    : 0;
  int n = 1 + ((c.summaries & kSummaryMeanV) ? 1 : 0) + ((c.summaries & kSummaryMinMaxK) ? 2 : 0);
  z.summaries_block_head = (c.summary_dtype == DType::kF32 ? 4 : 2) * d * n;
  z.per_block =
      static_cast<std::size_t>(c.num_kv_heads) *
      (static_cast<std::size_t>(c.block_size) * (z.k_row + z.v_row + z.scales_row + z.index_row) +
       z.summaries_block_head);
  return z;
}

}  // namespace

Footprint compute_footprint(const KvStoreConfig& c, const std::vector<int>& lengths) {
  c.validate();
  KVC_CHECK(lengths.size() <= static_cast<std::size_t>(c.max_slots),
            "lengths.size() = ", lengths.size(), " must be <= max_slots = ", c.max_slots);
  const Sizes z = sizes_of(c);
  const std::size_t pool = static_cast<std::size_t>(c.pool_blocks());
  const std::size_t hkv = static_cast<std::size_t>(c.num_kv_heads);
  const std::size_t rows = pool * hkv * static_cast<std::size_t>(c.block_size);
  Footprint f;
  f.ring = static_cast<std::size_t>(c.max_slots) * hkv * c.recent_window * z.ring_row;
  f.old_k = rows * z.k_row;
  f.old_v = rows * z.v_row;
  f.scales = rows * z.scales_row;
  f.summaries = pool * hkv * z.summaries_block_head;
  f.index_keys = rows * z.index_row;
  f.tables = 4 * (static_cast<std::size_t>(c.max_slots) +
                  static_cast<std::size_t>(c.max_slots) * c.max_blocks_per_slot() + pool + 1);
  const std::size_t dense_token = hkv * static_cast<std::size_t>(c.head_dim) * 2 * 2;
  f.dense_equivalent_capacity =
      static_cast<std::size_t>(c.max_slots) * static_cast<std::size_t>(c.max_context) * dense_token;
  std::size_t in_use = f.tables;
  long long blocks_needed = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const int L = lengths[i];
    KVC_CHECK(L >= 0 && L <= c.max_context, "lengths[", i, "] = ", L, " must be in [0, ",
              c.max_context, "]");
    f.tokens += L;
    const int ring_rows = L < c.recent_window ? L : c.recent_window;
    in_use += static_cast<std::size_t>(ring_rows) * hkv * z.ring_row;
    const int old = L - c.recent_window > 0 ? L - c.recent_window : 0;
    const int owned = c.owned_blocks((old + c.block_size - 1) / c.block_size);
    blocks_needed += owned;
    in_use += static_cast<std::size_t>(owned) * z.per_block;
  }
  KVC_CHECK(blocks_needed <= static_cast<long long>(pool), "lengths need ", blocks_needed,
            " old blocks but num_pool_blocks = ", pool);
  f.dense_equivalent_bytes = static_cast<std::size_t>(f.tokens) * dense_token;
  f.in_use = in_use;
  return f;
}

int KvStore::num_closed_blocks(int slot) const {
  const int old = length(slot) - config().recent_window;
  return old > 0 ? old / config().block_size : 0;
}

int KvStore::open_block_tokens(int slot) const {
  const int old = length(slot) - config().recent_window;
  return old > 0 ? old % config().block_size : 0;
}

namespace {

template <class T>
void append_bytes(std::vector<T>& dst, const void* src, std::size_t n_elems) {
  const std::size_t at = dst.size();
  dst.resize(at + n_elems);
  if (n_elems) std::memcpy(dst.data() + at, src, n_elems * sizeof(T));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

}  // namespace

bool SlotState::operator==(const SlotState& o) const {
  return open == o.open && length == o.length && ring_k == o.ring_k && ring_v == o.ring_v &&
         old_k == o.old_k && old_v == o.old_v && same_bits(old_k_scale, o.old_k_scale) &&
         same_bits(old_v_scale, o.old_v_scale) && same_bits(summaries, o.summaries) &&
         index_k == o.index_k && index_k_scale == o.index_k_scale;
}

std::vector<SlotState> KvStore::snapshot() const {
  std::vector<std::uint8_t> buffer;
  const StoreView s = host_view(buffer);
  const KvStoreConfig& c = config();
  const std::size_t d = static_cast<std::size_t>(c.head_dim);
  const std::size_t kb = store::k_row_bytes(s), vb = store::v_row_bytes(s);
  std::vector<SlotState> out(static_cast<std::size_t>(c.max_slots));
  for (int slot = 0; slot < c.max_slots; ++slot) {
    SlotState& st = out[static_cast<std::size_t>(slot)];
    st.open = is_open(slot);
    if (!st.open) continue;
    const int L = s.lengths[slot];
    st.length = L;
    const int first = L > c.recent_window ? L - c.recent_window : 0;
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int p = first; p < L; ++p) {
        const std::size_t r = store::ring_row_index(s, slot, h, p % c.recent_window);
        append_bytes(st.ring_k, static_cast<const std::uint8_t*>(s.ring_k) + r * d * 2, d * 2);
        append_bytes(st.ring_v, static_cast<const std::uint8_t*>(s.ring_v) + r * d * 2, d * 2);
      }
    }
    const int old = first;
    const int blocks = (old + c.block_size - 1) / c.block_size;
    for (int b = 0; b < blocks; ++b) {
      if (!c.owns_block(b)) continue;
      const int pb = s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b];
      const int rows = (b + 1) * c.block_size <= old ? c.block_size : old - b * c.block_size;
      const bool closed = rows == c.block_size;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const std::size_t r0 = store::old_row_index(s, pb, h, 0);
        append_bytes(st.old_k, s.old_k + r0 * kb, rows * kb);
        append_bytes(st.old_v, s.old_v + r0 * vb, rows * vb);
        if (s.old_k_scale) append_bytes(st.old_k_scale, s.old_k_scale + r0, rows);
        if (s.old_v_scale) append_bytes(st.old_v_scale, s.old_v_scale + r0, rows);
        if (s.index_k) {
          const std::size_t ib = store::index_payload_bytes(s), is = store::index_scale_bytes(s);
          append_bytes(st.index_k, s.index_k + r0 * ib, rows * ib);
          append_bytes(st.index_k_scale, s.index_k_scale + r0 * is, rows * is);
        }
        if (!closed) continue;
        const std::size_t o = store::block_head_index(s, pb, h) * d;
        for (const void* a : {s.mean_k, s.mean_v, s.min_k, s.max_k}) {
          if (a == nullptr) continue;
          for (std::size_t i = 0; i < d; ++i)
            st.summaries.push_back(store::summary_at(s, a, o + i));
        }
      }
    }
  }
  return out;
}

}  // namespace kvc
