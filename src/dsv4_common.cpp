// DeepSeek-V4 objects: names, config validation, factories, the store's host mirror, the argument
// checks shared by the CPU and CUDA implementations, select_topk and EntryStore::read_entry.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dsv4_internal.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/tensor.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/dsv4/sparse_attention.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace dsv4 {

const char* to_string(EntryFormat f) {
  switch (f) {
    case EntryFormat::kBf16:
      return "bf16";
    case EntryFormat::kModel1Fp8:
      return "model1_fp8";
    case EntryFormat::kMxfp4:
      return "mxfp4";
    case EntryFormat::kFp8Scaled:
      return "fp8_scaled";
  }
  return "?";
}

namespace {

void check_device(Device device) {
  if (device.is_cpu()) return;
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
#endif
}

bool is_format(EntryFormat f) {
  return f == EntryFormat::kBf16 || f == EntryFormat::kModel1Fp8 || f == EntryFormat::kMxfp4 ||
         f == EntryFormat::kFp8Scaled;
}

void check_ratio(int ratio, const char* what) {
  KVC_CHECK(ratio == 4 || ratio == 128, what, " = ", ratio,
            " must be 4 (CSA, overlapping) or 128 (HCA)");
}

}  // namespace

// --- EntryStoreConfig ---------------------------------------------------------------------------

int EntryStoreConfig::pages_per_slot() const {
  return page_entries > 0 ? (max_entries + page_entries - 1) / page_entries : 0;
}

int EntryStoreConfig::pool_pages() const {
  if (num_pages != 0) return num_pages;
  const std::int64_t n = static_cast<std::int64_t>(max_slots) * pages_per_slot();
  return n > (std::int64_t{1} << 30) ? -1 : static_cast<int>(n);
}

PageLayout EntryStoreConfig::layout() const { return page_layout(format, dim, page_entries); }

std::size_t EntryStoreConfig::page_bytes() const { return layout().page_bytes; }

void EntryStoreConfig::validate() const {
  KVC_CHECK(is_format(format), "EntryStoreConfig: format = ", static_cast<int>(format),
            " is not an EntryFormat");
  switch (format) {
    case EntryFormat::kBf16:
      KVC_CHECK(dim >= 32 && dim <= 1024 && dim % 32 == 0, "EntryStoreConfig: dim = ", dim,
                " must be a multiple of 32 in [32, 1024] for bf16");
      break;
    case EntryFormat::kModel1Fp8:
      KVC_CHECK(dim == kModel1Dim, "EntryStoreConfig: dim = ", dim,
                " must be 512 for model1_fp8 (448 e4m3 + 64 bf16 RoPE dims)");
      break;
    case EntryFormat::kMxfp4:
    case EntryFormat::kFp8Scaled:
      KVC_CHECK(dim == 64 || dim == 128, "EntryStoreConfig: dim = ", dim, " must be 64 or 128 for ",
                to_string(format), " indexer keys");
      break;
  }
  KVC_CHECK(max_slots >= 1 && max_slots <= 65536, "EntryStoreConfig: max_slots = ", max_slots,
            " must be in [1, 65536]");
  KVC_CHECK(max_entries >= 1 && max_entries <= kMaxEntriesPerSlot,
            "EntryStoreConfig: max_entries = ", max_entries, " must be in [1, ", kMaxEntriesPerSlot,
            "]");
  KVC_CHECK(page_entries >= 16 && page_entries <= 1024 && page_entries % 16 == 0,
            "EntryStoreConfig: page_entries = ", page_entries,
            " must be a multiple of 16 in [16, 1024]");
  KVC_CHECK(num_pages >= 0 && num_pages <= (1 << 30), "EntryStoreConfig: num_pages = ", num_pages,
            " must be in [0, 2^30]");
  const std::int64_t table = static_cast<std::int64_t>(max_slots) * pages_per_slot();
  KVC_CHECK(table <= (std::int64_t{1} << 30),
            "EntryStoreConfig: max_slots * pages_per_slot = ", table,
            " must be <= 2^30 (block-table entries)");
  const std::int64_t pages = num_pages != 0 ? num_pages : table;
  const double bytes = static_cast<double>(pages) * static_cast<double>(page_bytes());
  KVC_CHECK(bytes < 281474976710656.0, "EntryStoreConfig: pool of ", pages, " pages x ",
            page_bytes(), " B must be < 2^48 bytes");
}

EntryStoreConfig EntryStoreConfig::compressed(EntryFormat format, int dim, int ratio,
                                              std::int64_t max_context, int max_slots) {
  check_ratio(ratio, "ratio");
  KVC_CHECK(max_context >= ratio && max_context <= kMaxContext, "max_context = ", max_context,
            " must be in [ratio = ", ratio, ", ", kMaxContext, "]");
  EntryStoreConfig c;
  c.format = format;
  c.dim = dim;
  c.max_slots = max_slots;
  c.max_entries = static_cast<int>(max_context / ratio);
  c.ring = false;
  c.validate();
  return c;
}

EntryStoreConfig EntryStoreConfig::window_ring(EntryFormat format, int dim, int window,
                                               int max_slots) {
  KVC_CHECK(format == EntryFormat::kBf16 || format == EntryFormat::kModel1Fp8,
            "window ring format = ", to_string(format), " must be bf16 or model1_fp8");
  KVC_CHECK(window >= 1 && window <= 65536, "window = ", window, " must be in [1, 65536]");
  EntryStoreConfig c;
  c.format = format;
  c.dim = dim;
  c.max_slots = max_slots;
  c.max_entries = window;
  c.ring = true;
  c.validate();
  return c;
}

EntryStoreFootprint compute_footprint(const EntryStoreConfig& config) {
  config.validate();
  EntryStoreFootprint f;
  const std::size_t pages = static_cast<std::size_t>(config.pool_pages());
  const std::size_t slots = static_cast<std::size_t>(config.max_slots);
  f.pool = pages * config.page_bytes();
  // counts [slots], block table [slots, pages_per_slot], free stack [pages] + its top [1].
  f.tables = 4 * (slots + slots * static_cast<std::size_t>(config.pages_per_slot()) + pages + 1);
  f.in_use = f.tables;
  return f;
}

// --- the host mirror of a store -----------------------------------------------------------------

namespace detail {

StoreState::StoreState(const EntryStoreConfig& config, bool engine_pages, int num_pages)
    : config_(config), engine_pages_(engine_pages), num_pages_(num_pages) {
  counts_.assign(static_cast<std::size_t>(config.max_slots), 0);
  if (!engine_pages) {
    table_.assign(static_cast<std::size_t>(config.max_slots) * config.pages_per_slot(), -1);
    // The top of the stack is page 0, so a fresh store hands out pages 0, 1, 2, ...
    free_.resize(static_cast<std::size_t>(num_pages));
    for (int i = 0; i < num_pages; ++i) free_[static_cast<std::size_t>(i)] = num_pages - 1 - i;
  }
}

int StoreState::pages_for(std::int64_t count) const {
  const std::int64_t rows =
      config_.ring ? std::min<std::int64_t>(count, config_.max_entries) : count;
  return static_cast<int>((rows + config_.page_entries - 1) / config_.page_entries);
}

void StoreState::check_slot(int slot, const char* name) const {
  KVC_CHECK(slot >= 0 && slot < config_.max_slots, name, " = ", slot,
            " must be in [0, max_slots = ", config_.max_slots, ")");
}

void StoreState::check_reserve(const std::vector<int>& slots,
                               const std::vector<std::int64_t>& targets) const {
  KVC_CHECK(targets.size() == slots.size(), "targets.size() = ", targets.size(),
            " must equal slots.size() = ", slots.size());
  check_distinct_slots(slots, config_.max_slots, "slots");
  std::int64_t need = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    const std::int64_t t = targets[i];
    KVC_CHECK(t >= count(s), "target of slot ", s, " = ", t, " must be >= its count = ", count(s));
    if (!config_.ring) {
      KVC_CHECK(t <= config_.max_entries, "slot ", s, ": ", t,
                " entries exceed the store's capacity max_entries = ", config_.max_entries);
    } else {
      KVC_CHECK(t <= std::numeric_limits<std::int32_t>::max(), "slot ", s, ": ", t,
                " tokens exceed a ring's 2^31 - 1");
    }
    need += pages_for(t) - pages_for(count(s));
  }
  if (!engine_pages_) {
    KVC_CHECK(need <= static_cast<std::int64_t>(free_.size()), "the page pool is exhausted: ", need,
              " pages needed, ", free_.size(), " free of num_pages = ", num_pages_);
  }
}

void StoreState::apply_reserve(const std::vector<int>& slots,
                               const std::vector<std::int64_t>& targets) {
  const int pitch = config_.pages_per_slot();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    if (!engine_pages_) {
      for (int col = pages_for(count(s)); col < pages_for(targets[i]); ++col) {
        table_[static_cast<std::size_t>(s) * pitch + col] = free_.back();
        free_.pop_back();
      }
    }
    counts_[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(targets[i]);
  }
}

void StoreState::reset(int slot) {
  if (!engine_pages_) {
    const int pitch = config_.pages_per_slot();
    for (int col = 0; col < pages_for(count(slot)); ++col) {
      std::int32_t& id = table_[static_cast<std::size_t>(slot) * pitch + col];
      free_.push_back(id);
      id = -1;
    }
  }
  counts_[static_cast<std::size_t>(slot)] = 0;
}

std::int64_t StoreState::pages_in_use() const {
  std::int64_t n = 0;
  for (std::int32_t c : counts_) n += pages_for(c);
  return n;
}

std::int64_t StoreState::rows_in_use() const {
  std::int64_t n = 0;
  for (std::int32_t c : counts_)
    n += config_.ring ? std::min<std::int64_t>(c, config_.max_entries) : c;
  return n;
}

EntryStoreFootprint StoreState::footprint() const {
  EntryStoreFootprint f;
  if (!engine_pages_) {
    f = compute_footprint(config_);
  } else {
    f.tables = 4 * static_cast<std::size_t>(config_.max_slots);
  }
  f.in_use = f.tables + static_cast<std::size_t>(pages_in_use()) * config_.page_bytes();
  f.entries = rows_in_use();
  return f;
}

std::int64_t check_store_append(const StoreState& state, const EntryStoreConfig& config,
                                const std::vector<int>& slots, const TensorView& x, Device device,
                                std::vector<std::int64_t>& targets) {
  KVC_CHECK(x.ndim == 3, "x.ndim = ", x.ndim, " must be 3 ([slots, T, dim])");
  KVC_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "x.dtype = ", to_string(x.dtype),
            " must be f32 or bf16");
  const std::int64_t n = static_cast<std::int64_t>(slots.size());
  const std::int64_t T = x.shape[1];
  KVC_CHECK(T >= 1, "x.shape[1] = ", T, " (entries per slot) must be >= 1");
  check_view(x, "x", x.dtype, {n, T, config.dim}, device, x.dtype == DType::kF32 ? 4 : 2);
  targets.resize(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    state.check_slot(slots[i], "slots[i]");
    targets[i] = state.count(slots[i]) + T;
  }
  state.check_reserve(slots, targets);
  return T;
}

void check_distinct_slots(const std::vector<int>& slots, int max_slots, const char* what) {
  std::vector<int> seen;
  seen.reserve(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    KVC_CHECK(slots[i] >= 0 && slots[i] < max_slots, what, "[", i, "] = ", slots[i],
              " must be in [0, max_slots = ", max_slots, ")");
    seen.push_back(slots[i]);
  }
  std::sort(seen.begin(), seen.end());
  for (std::size_t i = 1; i < seen.size(); ++i) {
    KVC_CHECK(seen[i] != seen[i - 1], what, " must be distinct: slot ", seen[i], " appears twice");
  }
}

// --- argument checks ----------------------------------------------------------------------------

namespace {

/// Rows of a [positions, rope_dim / 2] f32 table.
std::int64_t check_rope_table(const TensorView& t, const char* name, int rope_dim, Device device) {
  KVC_CHECK(t.ndim == 2, name, ".ndim = ", t.ndim, " must be 2 ([positions, rope_dim / 2])");
  check_view(t, name, DType::kF32, {-1, rope_dim / 2}, device, 4);
  return t.shape[0];
}

}  // namespace

int check_compressor_append(const CompressorConfig& c, Device device,
                            const std::vector<std::int64_t>& lengths, const std::vector<int>& slots,
                            const CompressorInputs& in, const EntryStore* store,
                            const TensorView& out) {
  KVC_CHECK(!slots.empty(), "slots must not be empty");
  KVC_CHECK(static_cast<int>(slots.size()) <= c.max_batch, "slots.size() = ", slots.size(),
            " exceeds max_batch = ", c.max_batch);
  check_distinct_slots(slots, c.max_slots, "slots");
  const std::int64_t n = static_cast<std::int64_t>(slots.size());
  KVC_CHECK(in.kv.ndim == 3, "kv.ndim = ", in.kv.ndim, " must be 3 ([slots, T, coff * head_dim])");
  const std::int64_t T = in.kv.shape[1];
  KVC_CHECK(T >= 1 && T <= c.max_tokens, "kv.shape[1] = ", T,
            " (tokens) must be in [1, max_tokens = ", c.max_tokens, "]");
  check_view(in.kv, "kv", DType::kF32, {n, T, c.width()}, device, 4);
  check_view(in.score, "score", DType::kF32, {n, T, c.width()}, device, 4);
  check_view(in.ape, "ape", DType::kF32, {c.ratio, c.width()}, device, 4);
  if (c.rms_norm) check_view(in.norm_weight, "norm_weight", DType::kF32, {c.head_dim}, device, 4);
  std::int64_t max_pos = -1;  // largest j * m among the new entries
  std::int64_t max_new = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t L = lengths[static_cast<std::size_t>(slots[i])];
    KVC_CHECK(L + T <= c.max_context, "slot ", slots[i], ": length ", L, " + ", T,
              " tokens exceeds max_context = ", c.max_context);
    const NewEntries e = new_entries(L, T, c.ratio);
    if (e.end > e.first) max_pos = std::max(max_pos, (e.end - 1) * c.ratio);
    max_new = std::max(max_new, e.end - e.first);
  }
  if (c.rope && max_pos >= 0) {
    const std::int64_t rc = check_rope_table(in.rope_cos, "rope_cos", c.rope_dim, device);
    const std::int64_t rs = check_rope_table(in.rope_sin, "rope_sin", c.rope_dim, device);
    KVC_CHECK(rc > max_pos && rs > max_pos, "rope tables: ", std::min(rc, rs),
              " positions, but entry position ", max_pos, " is needed");
  }
  if (out.data != nullptr) {
    KVC_CHECK(out.ndim == 3, "out.ndim = ", out.ndim, " must be 3 ([slots, max_new, head_dim])");
    check_view(out, "out", DType::kF32, {n, -1, c.head_dim}, device, 4);
    KVC_CHECK(out.shape[1] >= T / c.ratio + 1, "out.shape[1] = ", out.shape[1],
              " must be >= tokens / ratio + 1 = ", T / c.ratio + 1);
  }
  if (store != nullptr) {
    const EntryStoreConfig& sc = store->config();
    KVC_CHECK(store->device() == device, "store device = ", to_string(store->device()),
              " must be the compressor's ", to_string(device));
    KVC_CHECK(!sc.ring, "store must be a compressed store, not a window ring");
    KVC_CHECK(sc.dim == c.head_dim, "store dim = ", sc.dim, " must equal head_dim = ", c.head_dim);
    KVC_CHECK(sc.max_slots >= c.max_slots, "store max_slots = ", sc.max_slots,
              " must be >= the compressor's max_slots = ", c.max_slots);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const std::int64_t L = lengths[static_cast<std::size_t>(slots[i])];
      KVC_CHECK(store->count(slots[i]) == L / c.ratio, "store count of slot ", slots[i], " = ",
                store->count(slots[i]),
                " must equal the compressor's entries length / ratio = ", L / c.ratio);
    }
  }
  (void)max_new;
  return static_cast<int>(T);
}

int check_indexer_score(const IndexerConfig& c, Device device, const EntryStore& keys,
                        const IndexerArgs& a) {
  const EntryStoreConfig& kc = keys.config();
  KVC_CHECK(keys.device() == device, "keys device = ", to_string(keys.device()),
            " must be the indexer's ", to_string(device));
  KVC_CHECK(kc.format == c.key_format, "keys format = ", to_string(kc.format),
            " must be the indexer's key_format = ", to_string(c.key_format));
  KVC_CHECK(kc.dim == c.head_dim, "keys dim = ", kc.dim, " must equal head_dim = ", c.head_dim);
  KVC_CHECK(!kc.ring, "keys must be a compressed store, not a window ring");
  const std::int64_t B = static_cast<std::int64_t>(a.slots.size());
  KVC_CHECK(B >= 1 && B <= c.max_batch, "slots.size() = ", B,
            " must be in [1, max_batch = ", c.max_batch, "]");
  KVC_CHECK(a.lengths.size() == a.slots.size(), "lengths.size() = ", a.lengths.size(),
            " must equal slots.size() = ", a.slots.size());
  KVC_CHECK(a.q.ndim == 4, "q.ndim = ", a.q.ndim, " must be 4 ([batch, T, heads, head_dim])");
  const std::int64_t T = a.q.shape[1];
  KVC_CHECK(T >= 1 && T <= c.max_query_tokens, "q.shape[1] = ", T,
            " (query tokens) must be in [1, max_query_tokens = ", c.max_query_tokens, "]");
  check_view(a.q, "q", DType::kBF16, {B, T, c.num_heads, c.head_dim}, device, 16);
  check_view(a.weights, "weights", DType::kF32, {B, T, c.num_heads}, device, 4);
  std::int64_t max_pos = 0;
  for (std::size_t b = 0; b < a.slots.size(); ++b) {
    const int s = a.slots[b];
    KVC_CHECK(s >= 0 && s < kc.max_slots, "slots[", b, "] = ", s,
              " must be in [0, max_slots = ", kc.max_slots, ")");
    const std::int64_t L = a.lengths[b];
    KVC_CHECK(L >= T && L <= kMaxContext, "lengths[", b, "] = ", L, " must be in [T = ", T, ", ",
              kMaxContext, "]");
    KVC_CHECK(keys.count(s) >= L / c.ratio, "keys of slot ", s, ": count ", keys.count(s),
              " < lengths[", b, "] / ratio = ", L / c.ratio, " (compress the tokens first)");
    max_pos = std::max(max_pos, L - 1);
  }
  if (c.query_rope) {
    const std::int64_t rc = check_rope_table(a.rope_cos, "rope_cos", c.rope_dim, device);
    const std::int64_t rs = check_rope_table(a.rope_sin, "rope_sin", c.rope_dim, device);
    KVC_CHECK(rc > max_pos && rs > max_pos, "rope tables: ", std::min(rc, rs),
              " positions, but query position ", max_pos, " is needed");
  }
  KVC_CHECK(a.out.rows == B * T, "out.rows = ", a.out.rows, " must be batch * T = ", B * T);
  KVC_CHECK(a.out.max_blocks >= kc.max_entries, "out.max_blocks = ", a.out.max_blocks,
            " must be >= the keys' max_entries = ", kc.max_entries);
  KVC_CHECK(a.out.scores != nullptr && a.out.num_valid != nullptr,
            "out.scores and out.num_valid must not be null");
  return static_cast<int>(T);
}

int check_sparse_attention(const SparseAttentionConfig& c, Device device, const EntryStore& ring,
                           const EntryStore& entries, const SparseAttentionArgs& a) {
  const EntryStoreConfig& rc = ring.config();
  const EntryStoreConfig& ec = entries.config();
  KVC_CHECK(ring.device() == device && entries.device() == device,
            "ring and entries must live on the attention's device ", to_string(device));
  KVC_CHECK(rc.ring, "ring must be a window ring store (EntryStoreConfig::ring)");
  KVC_CHECK(rc.max_entries == c.window, "ring max_entries = ", rc.max_entries,
            " must equal window = ", c.window);
  KVC_CHECK(!ec.ring, "entries must be a compressed store, not a window ring");
  for (const EntryStoreConfig* sc : {&rc, &ec}) {
    KVC_CHECK(sc->format == EntryFormat::kBf16 || sc->format == EntryFormat::kModel1Fp8,
              "store format = ", to_string(sc->format), " must be bf16 or model1_fp8");
    KVC_CHECK(sc->dim == c.head_dim, "store dim = ", sc->dim,
              " must equal head_dim = ", c.head_dim);
  }
  const std::int64_t B = static_cast<std::int64_t>(a.slots.size());
  KVC_CHECK(B >= 1 && B <= c.max_batch, "slots.size() = ", B,
            " must be in [1, max_batch = ", c.max_batch, "]");
  KVC_CHECK(a.lengths.size() == a.slots.size(), "lengths.size() = ", a.lengths.size(),
            " must equal slots.size() = ", a.slots.size());
  KVC_CHECK(a.q.ndim == 4, "q.ndim = ", a.q.ndim, " must be 4 ([batch, T, heads, head_dim])");
  const std::int64_t T = a.q.shape[1];
  KVC_CHECK(T >= 1 && T <= c.max_query_tokens, "q.shape[1] = ", T,
            " (query tokens) must be in [1, max_query_tokens = ", c.max_query_tokens, "]");
  check_view(a.q, "q", DType::kBF16, {B, T, c.num_heads, c.head_dim}, device, 16);
  std::int64_t C = 0;
  if (a.window_chunk.data != nullptr) {
    KVC_CHECK(a.window_chunk.ndim == 3, "window_chunk.ndim = ", a.window_chunk.ndim,
              " must be 3 ([batch, C, head_dim])");
    C = a.window_chunk.shape[1];
    check_view(a.window_chunk, "window_chunk", DType::kBF16, {B, C, c.head_dim}, device, 16);
  }
  KVC_CHECK(T <= C + 1, "T = ", T, " query tokens need the window rows of the chunk: window_chunk ",
            "has C = ", C, " rows, T must be <= C + 1");
  const int rows = c.ratio;
  for (std::size_t b = 0; b < a.slots.size(); ++b) {
    const int s = a.slots[b];
    KVC_CHECK(s >= 0 && s < rc.max_slots && s < ec.max_slots, "slots[", b, "] = ", s,
              " must be below both stores' max_slots");
    const std::int64_t L = a.lengths[b];
    KVC_CHECK(L == ring.count(s) + C, "lengths[", b, "] = ", L, " must equal the ring's count ",
              ring.count(s), " + the chunk's ", C, " rows");
    KVC_CHECK(L >= T && L <= kMaxContext, "lengths[", b, "] = ", L, " must be in [T = ", T, ", ",
              kMaxContext, "]");
    KVC_CHECK(entries.count(s) >= L / rows, "entries of slot ", s, ": count ", entries.count(s),
              " < lengths[", b, "] / ratio = ", L / rows, " (compress the tokens first)");
  }
  if (!c.hca) {
    KVC_CHECK(a.indices.rows == B * T, "indices.rows = ", a.indices.rows,
              " must be batch * T = ", B * T);
    KVC_CHECK(a.indices.max_selected >= 0 && a.indices.max_selected <= c.max_indices,
              "indices.max_selected = ", a.indices.max_selected,
              " must be in [0, max_indices = ", c.max_indices, "]");
    KVC_CHECK(a.indices.ids != nullptr || a.indices.max_selected == 0,
              "indices.ids must not be null");
  }
  KVC_CHECK(a.out.ndim == 4, "out.ndim = ", a.out.ndim, " must be 4 ([batch, T, heads, head_dim])");
  KVC_CHECK(a.out.dtype == DType::kBF16 || a.out.dtype == DType::kF32,
            "out.dtype = ", to_string(a.out.dtype), " must be bf16 or f32");
  check_view(a.out, "out", a.out.dtype, {B, T, c.num_heads, c.head_dim}, device, 16);
  if (a.lse.data != nullptr) check_view(a.lse, "lse", DType::kF32, {B, T, c.num_heads}, device, 4);
  return static_cast<int>(T);
}

}  // namespace detail

// --- configs ------------------------------------------------------------------------------------

void CompressorConfig::validate() const {
  check_ratio(ratio, "CompressorConfig: ratio");
  KVC_CHECK(head_dim >= 32 && head_dim <= 1024 && head_dim % 32 == 0,
            "CompressorConfig: head_dim = ", head_dim, " must be a multiple of 32 in [32, 1024]");
  KVC_CHECK(max_slots >= 1 && max_slots <= 65536, "CompressorConfig: max_slots = ", max_slots,
            " must be in [1, 65536]");
  KVC_CHECK(max_context >= ratio && max_context <= kMaxContext,
            "CompressorConfig: max_context = ", max_context, " must be in [ratio = ", ratio, ", ",
            kMaxContext, "]");
  KVC_CHECK(max_tokens >= 1 && max_tokens <= (1 << 20),
            "CompressorConfig: max_tokens = ", max_tokens, " must be in [1, 2^20]");
  KVC_CHECK(max_batch >= 1 && max_batch <= max_slots, "CompressorConfig: max_batch = ", max_batch,
            " must be in [1, max_slots = ", max_slots, "]");
  KVC_CHECK(std::isfinite(rms_eps) && rms_eps > 0.0f, "CompressorConfig: rms_eps = ", rms_eps,
            " must be finite and > 0");
  if (rope) {
    KVC_CHECK(rope_dim >= 2 && rope_dim <= head_dim && rope_dim % 2 == 0,
              "CompressorConfig: rope_dim = ", rope_dim,
              " must be even in [2, head_dim = ", head_dim, "]");
  }
  if (hadamard) {
    KVC_CHECK(head_dim == 64 || head_dim == 128, "CompressorConfig: hadamard needs head_dim 64 or ",
              "128, got head_dim = ", head_dim);
  }
}

void IndexerConfig::validate() const {
  KVC_CHECK(key_format == EntryFormat::kMxfp4 || key_format == EntryFormat::kFp8Scaled,
            "IndexerConfig: key_format = ", to_string(key_format), " must be mxfp4 or fp8_scaled");
  KVC_CHECK(num_heads >= 16 && num_heads <= 64 && num_heads % 16 == 0,
            "IndexerConfig: num_heads = ", num_heads, " must be a multiple of 16 in [16, 64]");
  KVC_CHECK(head_dim == 64 || head_dim == 128, "IndexerConfig: head_dim = ", head_dim,
            " must be 64 or 128");
  KVC_CHECK(ratio == 1 || ratio == 4 || ratio == 128, "IndexerConfig: ratio = ", ratio,
            " must be 4 (V4 CSA), 128 or 1 (V3.2: one key per token)");
  KVC_CHECK(max_batch >= 1 && max_batch <= 65536, "IndexerConfig: max_batch = ", max_batch,
            " must be in [1, 65536]");
  KVC_CHECK(max_query_tokens >= 1 && max_query_tokens <= (1 << 20),
            "IndexerConfig: max_query_tokens = ", max_query_tokens, " must be in [1, 2^20]");
  if (query_rope) {
    KVC_CHECK(rope_dim >= 2 && rope_dim <= head_dim && rope_dim % 2 == 0,
              "IndexerConfig: rope_dim = ", rope_dim, " must be even in [2, head_dim = ", head_dim,
              "]");
  }
}

float SparseAttentionConfig::scale() const {
  return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

void SparseAttentionConfig::validate() const {
  KVC_CHECK(num_heads >= 1 && num_heads <= 128, "SparseAttentionConfig: num_heads = ", num_heads,
            " must be in [1, 128]");
  KVC_CHECK(head_dim >= 64 && head_dim <= 512 && head_dim % 64 == 0,
            "SparseAttentionConfig: head_dim = ", head_dim,
            " must be a multiple of 64 in [64, 512]");
  KVC_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
            "SparseAttentionConfig: softmax_scale = ", softmax_scale, " must be finite and >= 0");
  check_ratio(ratio, "SparseAttentionConfig: ratio");
  KVC_CHECK(window >= 1 && window <= 65536, "SparseAttentionConfig: window = ", window,
            " must be in [1, 65536]");
  KVC_CHECK(max_batch >= 1 && max_batch <= 65536, "SparseAttentionConfig: max_batch = ", max_batch,
            " must be in [1, 65536]");
  KVC_CHECK(max_query_tokens >= 1 && max_query_tokens <= (1 << 20),
            "SparseAttentionConfig: max_query_tokens = ", max_query_tokens,
            " must be in [1, 2^20]");
  KVC_CHECK(max_indices >= 1 && max_indices <= (1 << 20),
            "SparseAttentionConfig: max_indices = ", max_indices, " must be in [1, 2^20]");
}

// --- factories ----------------------------------------------------------------------------------

std::unique_ptr<EntryStore> EntryStore::create(const EntryStoreConfig& config, Device device) {
  config.validate();
  check_device(device);
  if (device.is_cpu()) return detail::make_cpu_entry_store(config, nullptr, 0, nullptr, 0);
#if KVC_CUDA_ENABLED
  return detail::make_cuda_entry_store(config, device, nullptr, 0, nullptr, 0);
#else
  return nullptr;  // unreachable: check_device throws for a CUDA device in a CPU-only build
#endif
}

std::unique_ptr<EntryStore> EntryStore::create_on_pages(const EntryStoreConfig& config,
                                                        Device device, void* pool, int num_pages,
                                                        std::int32_t* block_table,
                                                        int block_table_pitch) {
  config.validate();
  check_device(device);
  KVC_CHECK(pool != nullptr, "pool must not be null");
  KVC_CHECK(reinterpret_cast<std::uintptr_t>(pool) % 16 == 0, "pool must be 16-byte aligned");
  KVC_CHECK(num_pages >= 1 && num_pages <= (1 << 30), "num_pages = ", num_pages,
            " must be in [1, 2^30]");
  KVC_CHECK(block_table != nullptr, "block_table must not be null");
  KVC_CHECK(block_table_pitch >= config.pages_per_slot(), "block_table_pitch = ", block_table_pitch,
            " must be >= pages_per_slot = ", config.pages_per_slot());
  if (device.is_cpu()) {
    return detail::make_cpu_entry_store(config, pool, num_pages, block_table, block_table_pitch);
  }
#if KVC_CUDA_ENABLED
  return detail::make_cuda_entry_store(config, device, pool, num_pages, block_table,
                                       block_table_pitch);
#else
  return nullptr;  // unreachable: check_device throws for a CUDA device in a CPU-only build
#endif
}

namespace {

void check_physical_entries(const EntryStoreView& v, int T, const SelectionView& in,
                            int out_pitch) {
  KVC_CHECK(T >= 1, "physical_entries: T = ", T, " must be >= 1");
  KVC_CHECK(in.rows >= 0 && in.rows % T == 0, "physical_entries: in.rows = ", in.rows,
            " must be a multiple of T = ", T);
  KVC_CHECK(in.max_selected >= 0 && out_pitch >= in.max_selected,
            "physical_entries: out_pitch = ", out_pitch,
            " must be >= in.max_selected = ", in.max_selected);
  KVC_CHECK(static_cast<std::int64_t>(v.num_pages) * v.layout.page_entries <=
                std::numeric_limits<std::int32_t>::max(),
            "physical_entries: num_pages x page_entries = ",
            static_cast<std::int64_t>(v.num_pages) * v.layout.page_entries,
            " pool rows must be <= 2^31 - 1 (int32 indices)");
}

}  // namespace

void physical_entries(const EntryStoreView& v, const std::int32_t* slots, int T,
                      const SelectionView& in, std::int32_t* out, int out_pitch) {
  check_physical_entries(v, T, in, out_pitch);
  if (in.rows == 0 || in.max_selected == 0) return;
  KVC_CHECK(slots != nullptr && in.ids != nullptr && out != nullptr,
            "physical_entries: slots, in.ids and out must not be null");
  for (int b = 0; b < in.rows / T; ++b) {
    KVC_CHECK(slots[b] >= 0 && slots[b] < v.max_slots, "physical_entries: slots[", b,
              "] = ", slots[b], " must be in [0, max_slots = ", v.max_slots, ")");
  }
  for (int r = 0; r < in.rows; ++r) {
    for (int i = 0; i < in.max_selected; ++i) {
      out[static_cast<std::size_t>(r) * out_pitch + i] = physical_entry(
          v, slots[r / T], in.ids[static_cast<std::size_t>(r) * in.max_selected + i]);
    }
  }
}

std::vector<float> EntryStore::read_entry(int slot, int e) const {
  const EntryStoreConfig& c = config();
  KVC_CHECK(slot >= 0 && slot < c.max_slots, "slot = ", slot,
            " must be in [0, max_slots = ", c.max_slots, ")");
  const int n = count(slot);
  const int lo = c.ring ? std::max(0, n - c.max_entries) : 0;
  KVC_CHECK(e >= lo && e < n, "entry ", e, " of slot ", slot, " is not held (rows [", lo, ", ", n,
            "))");
  std::vector<std::uint8_t> buffer;
  const EntryStoreView v = host_view(buffer);
  const int row = entry_row(v, e);
  const std::uint8_t* page = page_of(v, slot, row);
  KVC_CHECK(page != nullptr, "slot ", slot, " row ", row, " has no valid page in the block table");
  std::vector<float> out(static_cast<std::size_t>(c.dim));
  for (int i = 0; i < c.dim; ++i) {
    out[static_cast<std::size_t>(i)] = decode_element(v.layout, page, row % c.page_entries, i);
  }
  return out;
}

std::unique_ptr<Compressor> Compressor::create(const CompressorConfig& config, Device device) {
  config.validate();
  check_device(device);
  if (device.is_cpu()) return detail::make_cpu_compressor(config);
#if KVC_CUDA_ENABLED
  return detail::make_cuda_compressor(config, device);
#else
  return nullptr;  // unreachable: check_device throws for a CUDA device in a CPU-only build
#endif
}

std::unique_ptr<Indexer> Indexer::create(const IndexerConfig& config, Device device) {
  config.validate();
  check_device(device);
  if (device.is_cpu()) return detail::make_cpu_indexer(config);
#if KVC_CUDA_ENABLED
  return detail::make_cuda_indexer(config, device);
#else
  return nullptr;  // unreachable: check_device throws for a CUDA device in a CPU-only build
#endif
}

std::unique_ptr<SparseAttention> SparseAttention::create(const SparseAttentionConfig& config,
                                                         Device device) {
  config.validate();
  check_device(device);
  KVC_CHECK(!config.accumulate_f64 || device.is_cpu(),
            "SparseAttentionConfig: accumulate_f64 is CPU-only (an oracle), device = ",
            to_string(device));
  if (device.is_cpu()) return detail::make_cpu_sparse_attention(config);
#if KVC_CUDA_ENABLED
  return detail::make_cuda_sparse_attention(config, device);
#else
  return nullptr;  // unreachable: check_device throws for a CUDA device in a CPU-only build
#endif
}

// --- top-k --------------------------------------------------------------------------------------

void select_topk(Selector& selector, const ScoresView& scores, int k, bool sorted,
                 SelectionView& out) {
  KVC_CHECK(k >= 1, "k = ", k, " must be >= 1");
  KVC_CHECK(k <= out.max_selected, "k = ", k,
            " exceeds the budget out.max_selected = ", out.max_selected);
  KVC_CHECK(out.rows == scores.rows, "out.rows = ", out.rows,
            " must equal scores.rows = ", scores.rows);
  SelectPolicy p = SelectPolicy::topk(k);
  p.order = sorted ? SelectPolicy::Order::kScore : SelectPolicy::Order::kChronological;
  selector.select(scores, p, out);
}

}  // namespace dsv4
}  // namespace kvc
