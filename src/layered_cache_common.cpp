// LayeredCache: config, layout, host mirror, validation and the layer adapter (shared by the CPU
// and CUDA implementations).
#include <algorithm>
#include <cstring>
#include <string>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc/store/block_codec.h"
#include "layered_cache_impl.h"
#include "store_impl.h"

namespace kvc {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Bytes per page (one block, all heads) of each pool array of one layer, in layout order; 0 for
// an array the config does not keep.
struct PageBytes {
  std::size_t k, v, k_scale, v_scale, summary, index_k, index_scale;
  int summaries;  ///< f32 summary arrays kept (mean K, mean V, min K, max K)
};

PageBytes page_bytes(const KvStoreConfig& c) {
  const StoreView g = detail::store_geometry(c);
  const std::size_t rows = static_cast<std::size_t>(c.num_kv_heads) * c.block_size;
  PageBytes p{};
  p.k = rows * store::k_row_bytes(g);
  p.v = rows * store::v_row_bytes(g);
  p.k_scale = formats::has_k_scale(c.old_format) ? rows * 4 : 0;
  p.v_scale = formats::has_v_scale(c.old_format) ? rows * 4 : 0;
  p.summary = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim * 4;
  p.summaries =
      1 + ((c.summaries & kSummaryMeanV) ? 1 : 0) + ((c.summaries & kSummaryMinMaxK) ? 2 : 0);
  const bool index = (c.summaries & kSummaryIndexKeys) != 0;
  p.index_k = index ? rows * store::index_payload_bytes(g) : 0;
  p.index_scale = index ? rows * store::index_scale_bytes(g) : 0;
  return p;
}

}  // namespace

void LayeredCacheConfig::validate() const {
  layer.validate();
  KVC_CHECK(num_layers >= 1 && num_layers <= 4096, "num_layers = ", num_layers,
            " must be in [1, 4096]");
  KVC_CHECK(layer.num_shards == 1, "layer.num_shards = ", layer.num_shards,
            " must be 1 (a LayeredCache holds whole sequences)");
  KVC_CHECK(pages == PageOwner::kKvc || pages == PageOwner::kEngine,
            "pages = ", static_cast<int>(pages), " must be PageOwner::kKvc or kEngine");
  KVC_CHECK(max_rollback >= 0 && max_rollback <= layer.recent_window,
            "max_rollback = ", max_rollback,
            " must be in [0, recent_window = ", layer.recent_window, "]");
  // Every byte count must stay far below 2^63: bound the whole allocation in long double.
  const PageBytes p = page_bytes(layer);
  const long double page = static_cast<long double>(
      p.k + p.v + p.k_scale + p.v_scale + p.summary * p.summaries + p.index_k + p.index_scale);
  const long double pool =
      (static_cast<long double>(layer.pool_blocks()) + 1.0L) * page * num_layers;
  const long double ring = (static_cast<long double>(layer.max_slots) + 1.0L) * layer.num_kv_heads *
                           layer.head_dim * 4.0L * (layer.recent_window + max_rollback) *
                           num_layers;
  KVC_CHECK(pool + ring <= 281474976710656.0L, "cache size ", pool + ring, " B (pool ", pool,
            " B + rings ", ring, " B for num_layers = ", num_layers, ") must be <= 2^48 B");
}

std::size_t LayeredCacheConfig::bytes_per_page() const {
  validate();
  const PageBytes p = page_bytes(layer);
  return static_cast<std::size_t>(num_layers) *
         (p.k + p.v + p.k_scale + p.v_scale + p.summary * p.summaries + p.index_k + p.index_scale);
}

std::size_t LayeredCacheConfig::pool_bytes(int num_pages) const {
  KVC_CHECK(num_pages >= 0 && num_pages <= (1 << 30), "num_pages = ", num_pages,
            " must be in [0, 2^30]");
  LayeredCacheConfig c = *this;
  c.layer.num_pool_blocks = num_pages;
  return static_cast<std::size_t>(num_layers) * detail::layered_layout(c).pool_stride;
}

std::size_t LayeredCacheConfig::ring_bytes() const {
  validate();
  return static_cast<std::size_t>(num_layers) * detail::layered_layout(*this).ring_stride;
}

std::size_t LayeredCacheConfig::table_entries() const {
  validate();
  return (static_cast<std::size_t>(layer.max_slots) + 1) * layer.max_blocks_per_slot();
}

void LayeredCache::begin_update(const std::vector<int>& slots, int count) {
  begin_update(slots, std::vector<int>(slots.size(), count));
}

void LayeredCache::append(const std::vector<int>& slots, const TensorView& k, const TensorView& v) {
  const LayeredCacheConfig& c = config();
  const std::int64_t n = static_cast<std::int64_t>(slots.size());
  const std::int64_t shape[] = {c.num_layers, n, c.layer.num_kv_heads, c.layer.head_dim};
  for (const TensorView* t : {&k, &v}) {
    const char* name = t == &k ? "k" : "v";
    KVC_CHECK(t->ndim == 4, name, ".ndim = ", t->ndim, " must be 4 ([L, slots, Hkv, d])");
    for (int i = 0; i < 4; ++i) {
      KVC_CHECK(t->shape[i] == shape[i], name, ".shape[", i, "] = ", t->shape[i], " must be ",
                shape[i], " ([L, slots, Hkv, d])");
    }
  }
  if (slots.empty()) return;
  begin_update(slots, 1);
  write_all(k, v);
}

void LayeredCache::ingest(int slot, const TensorView& k, const TensorView& v) {
  const LayeredCacheConfig& c = config();
  for (const TensorView* t : {&k, &v}) {
    const char* name = t == &k ? "k" : "v";
    KVC_CHECK(t->ndim == 4, name, ".ndim = ", t->ndim, " must be 4 ([L, T, Hkv, d])");
    KVC_CHECK(t->shape[0] == c.num_layers, name, ".shape[0] = ", t->shape[0],
              " must be num_layers = ", c.num_layers);
    KVC_CHECK(t->shape[1] == k.shape[1], name, ".shape[1] = ", t->shape[1],
              " must equal k.shape[1] = ", k.shape[1]);
  }
  const std::int64_t T = k.shape[1];
  KVC_CHECK(T >= 0 && T <= c.layer.max_context, "k.shape[1] = ", T,
            " must be in [0, max_context = ", c.layer.max_context, "]");
  length(slot);  // throws for a slot that is not open
  if (T == 0) return;
  begin_update({slot}, static_cast<int>(T));
  write_all(k, v);
}

namespace detail {

LayeredLayout layered_layout(const LayeredCacheConfig& c) {
  const KvStoreConfig& s = c.layer;
  const PageBytes p = page_bytes(s);
  LayeredLayout z;
  z.pages = s.pool_blocks();
  const std::size_t pages = static_cast<std::size_t>(z.pages) + 1;  // + the trash page
  std::size_t at = 0;
  auto take = [&](std::size_t per_page) {
    if (per_page == 0) return kNoArray;
    const std::size_t o = at;
    at += align_up(per_page * pages);
    z.arrays[z.num_arrays++] = {o, per_page};
    return o;
  };
  z.old_k = take(p.k);
  z.old_v = take(p.v);
  z.k_scale = take(p.k_scale);
  z.v_scale = take(p.v_scale);
  z.mean_k = take(p.summary);
  z.mean_v = take((s.summaries & kSummaryMeanV) ? p.summary : 0);
  z.min_k = take((s.summaries & kSummaryMinMaxK) ? p.summary : 0);
  z.max_k = take((s.summaries & kSummaryMinMaxK) ? p.summary : 0);
  z.index_k = take(p.index_k);
  z.index_k_scale = take(p.index_scale);
  z.pool_stride = at;
  const std::size_t ring = (static_cast<std::size_t>(s.max_slots) + 1) * s.num_kv_heads *
                           s.recent_window * s.head_dim * 2;
  z.ring_k = 0;
  z.ring_v = align_up(ring);
  z.ring_stride = 2 * align_up(ring);
  z.spill_stride = 2 * align_up((static_cast<std::size_t>(s.max_slots) + 1) * s.num_kv_heads *
                                c.max_rollback * s.head_dim * 2);
  return z;
}

KvStoreConfig layer_config(const LayeredCacheConfig& c) {
  KvStoreConfig s = c.layer;
  s.num_pool_blocks = c.layer.pool_blocks();
  return s;
}

StoreView layer_view(const LayeredCacheConfig& c, const LayeredLayout& z, std::uint8_t* pool,
                     std::uint8_t* ring, int l) {
  StoreView v = store_geometry(layer_config(c));
  std::uint8_t* base = pool + static_cast<std::size_t>(l) * z.pool_stride;
  auto at = [&](std::size_t o) { return o == kNoArray ? nullptr : base + o; };
  v.old_k = at(z.old_k);
  v.old_v = at(z.old_v);
  v.old_k_scale = reinterpret_cast<float*>(at(z.k_scale));
  v.old_v_scale = reinterpret_cast<float*>(at(z.v_scale));
  // (decltype: the summaries' element type is the store's; the layout is bytes.)
  v.mean_k = reinterpret_cast<decltype(v.mean_k)>(at(z.mean_k));
  v.mean_v = reinterpret_cast<decltype(v.mean_v)>(at(z.mean_v));
  v.min_k = reinterpret_cast<decltype(v.min_k)>(at(z.min_k));
  v.max_k = reinterpret_cast<decltype(v.max_k)>(at(z.max_k));
  v.index_k = at(z.index_k);
  v.index_k_scale = at(z.index_k_scale);
  std::uint8_t* r = ring + static_cast<std::size_t>(l) * z.ring_stride;
  v.ring_k = r + z.ring_k;
  v.ring_v = r + z.ring_v;
  return v;
}

// --- host mirror ---------------------------------------------------------------------------

LayeredState::LayeredState(const LayeredCacheConfig& c) : c_(c) {
  c_.validate();
  const KvStoreConfig& s = c_.layer;
  max_blocks = s.max_blocks_per_slot();
  lengths.assign(static_cast<std::size_t>(s.max_slots), 0);
  open.assign(static_cast<std::size_t>(s.max_slots), 0);
  spill_begin.assign(static_cast<std::size_t>(s.max_slots), 0);
  if (c_.pages == PageOwner::kKvc) {
    table.assign(static_cast<std::size_t>(s.max_slots) * max_blocks, -1);
    const int pool = s.pool_blocks();
    free_pages.resize(static_cast<std::size_t>(pool));
    for (int i = 0; i < pool; ++i) free_pages[static_cast<std::size_t>(i)] = pool - 1 - i;
  }
}

void LayeredState::check_open(int slot, const char* arg) const {
  KVC_CHECK(slot >= 0 && slot < c_.layer.max_slots, arg, " = ", slot,
            " must be in [0, max_slots = ", c_.layer.max_slots, ")");
  KVC_CHECK(open[static_cast<std::size_t>(slot)] != 0, arg, " = ", slot,
            " is not an open slot (open_slot() first)");
}

int LayeredState::open_slot() {
  for (int s = 0; s < c_.layer.max_slots; ++s) {
    if (!open[static_cast<std::size_t>(s)]) {
      open[static_cast<std::size_t>(s)] = 1;
      lengths[static_cast<std::size_t>(s)] = 0;
      spill_begin[static_cast<std::size_t>(s)] = 0;
      return s;
    }
  }
  KVC_CHECK(false, "open_slot: all max_slots = ", c_.layer.max_slots, " slots are open");
  return -1;
}

int LayeredState::blocks_in_use(int length) const {
  const int B = c_.layer.block_size;
  return (old_count(length, c_.layer.recent_window) + B - 1) / B;
}

void LayeredState::validate_update(const std::vector<int>& slots,
                                   const std::vector<int>& counts) const {
  KVC_CHECK(!slots.empty(), "slots is empty");
  KVC_CHECK(counts.size() == slots.size(), "counts.size() = ", counts.size(),
            " must equal slots.size() = ", slots.size());
  std::vector<std::uint8_t> seen(open.size(), 0);
  long long need = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i], count = counts[i];
    KVC_CHECK(s >= 0 && s < c_.layer.max_slots, "slots[", i, "] = ", s,
              " must be in [0, max_slots = ", c_.layer.max_slots, ")");
    KVC_CHECK(open[static_cast<std::size_t>(s)] != 0, "slots[", i, "] = ", s,
              " is not an open slot (open_slot() first)");
    KVC_CHECK(!seen[static_cast<std::size_t>(s)], "slots[", i, "] = ", s,
              " appears twice in one call");
    seen[static_cast<std::size_t>(s)] = 1;
    KVC_CHECK(count >= 1, "count = ", count, " (slots[", i, "] = ", s, ") must be >= 1");
    const long long L = lengths[static_cast<std::size_t>(s)];
    KVC_CHECK(L + count <= c_.layer.max_context, "slot ", s, ": length ", L, " + ", count,
              " new tokens = ", L + count, " exceeds max_context = ", c_.layer.max_context);
    need += blocks_in_use(static_cast<int>(L + count)) - blocks_in_use(static_cast<int>(L));
  }
  if (c_.pages == PageOwner::kKvc) {
    KVC_CHECK(need <= static_cast<long long>(free_pages.size()),
              "pool exhausted: the update needs ", need, " new pages but only ", free_pages.size(),
              " of num_pool_blocks = ", c_.layer.pool_blocks(), " are free");
  }
}

void LayeredState::apply_update(const std::vector<int>& slots, const std::vector<int>& counts) {
  const int W = c_.layer.recent_window, R = c_.max_rollback;
  for (std::size_t e = 0; e < slots.size(); ++e) {
    const int count = counts[e];
    const std::size_t i = static_cast<std::size_t>(slots[e]);
    const int L = lengths[i];
    if (c_.pages == PageOwner::kKvc) {
      for (int b = blocks_in_use(L); b < blocks_in_use(L + count); ++b) {
        table[i * max_blocks + b] = free_pages.back();
        free_pages.pop_back();
      }
    }
    lengths[i] = L + count;
    spill_begin[i] = std::max(spill_begin[i], old_count(L + count, W) - R);
  }
}

int LayeredState::rollback_floor(int slot) const {
  check_open(slot, "slot");
  const int begin = spill_begin[static_cast<std::size_t>(slot)];
  // Old positions below `begin` cannot come back to the ring: the length must keep them old.
  return begin > 0 ? begin + c_.layer.recent_window : 0;
}

void LayeredState::validate_truncate(int slot, int n) const {
  check_open(slot, "slot");
  const int L = lengths[static_cast<std::size_t>(slot)];
  KVC_CHECK(n >= 0 && n <= L, "new_length = ", n, " must be in [0, length = ", L, "]");
  const int floor = rollback_floor(slot);
  KVC_CHECK(n >= floor, "new_length = ", n, " is below the rollback floor ", floor, " of slot ",
            slot, ": tokens that left the ring before the last max_rollback = ", c_.max_rollback,
            " cannot come back (raise LayeredCacheConfig::max_rollback, or reset the slot)");
}

std::vector<int> LayeredState::truncated_pages(int slot, int n) const {
  std::vector<int> out;
  if (c_.pages != PageOwner::kKvc) return out;
  const std::size_t i = static_cast<std::size_t>(slot);
  for (int b = blocks_in_use(lengths[i]) - 1; b >= blocks_in_use(n); --b) {
    out.push_back(table[i * max_blocks + b]);
  }
  return out;
}

void LayeredState::apply_truncate(int slot, int n) {
  const std::size_t i = static_cast<std::size_t>(slot);
  if (c_.pages == PageOwner::kKvc) {
    for (int b = blocks_in_use(lengths[i]) - 1; b >= blocks_in_use(n); --b) {
      free_pages.push_back(table[i * max_blocks + b]);
      table[i * max_blocks + b] = -1;
    }
  }
  lengths[i] = n;
}

void LayeredState::apply_reset(int slot) {
  const std::size_t i = static_cast<std::size_t>(slot);
  if (c_.pages == PageOwner::kKvc) {
    const int used = blocks_in_use(lengths[i]);
    for (int b = 0; b < used; ++b) {
      free_pages.push_back(table[i * max_blocks + b]);
      table[i * max_blocks + b] = -1;
    }
  }
  lengths[i] = 0;
  spill_begin[i] = 0;
}

std::vector<PageCopy> LayeredState::apply_fork_kvc(int src, int dst) {
  apply_reset(dst);
  const std::size_t s = static_cast<std::size_t>(src), d = static_cast<std::size_t>(dst);
  std::vector<PageCopy> pairs;
  for (int b = 0; b < blocks_in_use(lengths[s]); ++b) {
    const int page = free_pages.back();
    free_pages.pop_back();
    table[d * max_blocks + b] = page;
    pairs.push_back({table[s * max_blocks + b], page});
  }
  lengths[d] = lengths[s];
  spill_begin[d] = spill_begin[s];
  return pairs;
}

// --- the read-only KvStore of one layer -----------------------------------------------------

namespace {

class LayerStore final : public KvStore {
 public:
  LayerStore(const LayeredCacheBase& owner, int layer)
      : owner_(owner), layer_(layer), config_(layer_config(owner.config())) {}

  const KvStoreConfig& config() const override { return config_; }
  Device device() const override { return owner_.device(); }
  int open_slot() override { read_only("open_slot"); }
  void reset(int) override { read_only("reset"); }
  void free(int) override { read_only("free"); }
  bool is_open(int slot) const override { return owner_.is_open(slot); }
  void append(const std::vector<int>&, const TensorView&, const TensorView&) override {
    read_only("append");
  }
  void ingest(int, const TensorView&, const TensorView&) override { read_only("ingest"); }
  int length(int slot) const override { return owner_.length(slot); }
  Footprint footprint() const override {
    std::vector<int> lens(static_cast<std::size_t>(config_.max_slots), 0);
    for (int s = 0; s < config_.max_slots; ++s) {
      if (owner_.is_open(s)) lens[static_cast<std::size_t>(s)] = owner_.length(s);
    }
    return compute_footprint(config_, lens);
  }
  int free_pool_blocks() const override { return owner_.free_pages(); }
  StoreView view() const override { return owner_.layer_device_view(layer_); }
  StoreView host_view(std::vector<std::uint8_t>& buffer) const override {
    return owner_.layer_host_view(layer_, buffer);
  }
  void set_stream(void*) override { read_only("set_stream"); }
  void* stream() const override { return owner_.stream_handle(); }
  void refresh_host_state() override { read_only("refresh_host_state"); }

 private:
  [[noreturn]] void read_only(const char* what) const {
    KVC_CHECK(false, "layer(", layer_, ").", what,
              ": a LayeredCache layer is read-only (use the LayeredCache's own methods)");
    throw Error("unreachable");
  }
  const LayeredCacheBase& owner_;
  int layer_;
  KvStoreConfig config_;
};

}  // namespace

// --- shared host-side logic ------------------------------------------------------------------

LayeredCacheBase::LayeredCacheBase(const LayeredCacheConfig& config, Device device)
    : config_(config), device_(device), layout_(layered_layout(config)), state_(config) {
  for (int l = 0; l < config_.num_layers; ++l) {
    layers_.push_back(std::make_unique<LayerStore>(*this, l));
  }
  written_.assign(static_cast<std::size_t>(config_.num_layers), 1);
}

LayeredCacheBase::~LayeredCacheBase() = default;

int LayeredCacheBase::open_slot() { return state_.open_slot(); }

bool LayeredCacheBase::is_open(int slot) const {
  return slot >= 0 && slot < config_.layer.max_slots &&
         state_.open[static_cast<std::size_t>(slot)] != 0;
}

int LayeredCacheBase::length(int slot) const {
  state_.check_open(slot, "slot");
  return state_.lengths[static_cast<std::size_t>(slot)];
}

namespace {

void check_no_pending(const std::vector<std::uint8_t>& written, const char* call) {
  for (std::size_t l = 0; l < written.size(); ++l) {
    KVC_CHECK(written[l] != 0, call, ": layer ", l,
              " of the update begun last was not written (write() every layer first)");
  }
}

}  // namespace

void LayeredCacheBase::reset(int slot) {
  state_.check_open(slot, "slot");
  check_no_pending(written_, "reset");
  do_reset(slot);
  state_.apply_reset(slot);
}

void LayeredCacheBase::free(int slot) {
  reset(slot);
  state_.open[static_cast<std::size_t>(slot)] = 0;
}

void LayeredCacheBase::begin_update(const std::vector<int>& slots, const std::vector<int>& counts) {
  check_no_pending(written_, "begin_update");
  state_.validate_update(slots, counts);
  do_plan(slots, counts);
  pending_lengths_.clear();
  for (int s : slots) pending_lengths_.push_back(state_.lengths[static_cast<std::size_t>(s)]);
  state_.apply_update(slots, counts);
  pending_slots_ = slots;
  pending_counts_ = counts;
  std::fill(written_.begin(), written_.end(), 0);
}

LayeredCacheBase::UpdateStrides LayeredCacheBase::check_update_view(const TensorView& t,
                                                                    const char* name) const {
  const KvStoreConfig& s = config_.layer;
  const std::size_t n = pending_slots_.size();
  std::int64_t total = 0;
  bool uniform = true;
  for (int c : pending_counts_) {
    total += c;
    uniform = uniform && c == pending_counts_[0];
  }
  KVC_CHECK(t.dtype == s.dtype, name, ".dtype = ", to_string(t.dtype), " must be ",
            to_string(s.dtype));
  KVC_CHECK(t.device == device_, name, ".device = ", to_string(t.device), " must be ",
            to_string(device_));
  KVC_CHECK(t.ndim == 3 || (t.ndim == 4 && uniform), name, ".ndim = ", t.ndim,
            " must be 3 ([total_tokens, Hkv, d])",
            uniform ? " or 4 ([slots, count, Hkv, d])" : " (the counts differ)");
  const bool packed = t.ndim == 3;
  const std::int64_t want4[] = {static_cast<std::int64_t>(n), pending_counts_[0], s.num_kv_heads,
                                s.head_dim};
  const std::int64_t want3[] = {total, s.num_kv_heads, s.head_dim};
  const std::int64_t* want = packed ? want3 : want4;
  for (int i = 0; i < t.ndim; ++i) {
    KVC_CHECK(t.shape[i] == want[i], name, ".shape[", i, "] = ", t.shape[i], " must be ", want[i],
              packed ? " ([total_tokens, Hkv, d])" : " ([slots, count, Hkv, d])");
  }
  const int h = t.ndim - 2;
  KVC_CHECK(t.stride[h + 1] == 1 && (s.num_kv_heads == 1 || t.stride[h] == s.head_dim), name,
            ": each token's [Hkv, d] must be contiguous (strides [..., ", t.stride[h], ", ",
            t.stride[h + 1], "])");
  const std::int64_t token_elems = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  UpdateStrides u;
  u.token = packed ? t.stride[0] : t.stride[1];
  const std::int64_t entry = packed ? 0 : t.stride[0];
  KVC_CHECK(total <= 1 || u.token >= token_elems, name, ": token stride ", u.token,
            " must be >= Hkv * d = ", token_elems, " (rows must not overlap)");
  KVC_CHECK(packed || n <= 1 || entry >= pending_counts_[0] * token_elems, name,
            ".stride[0] = ", entry,
            " must be >= count * Hkv * d = ", pending_counts_[0] * token_elems,
            " (rows must not overlap)");
  std::int64_t row = 0;
  for (std::size_t e = 0; e < n; ++e) {
    u.start.push_back(packed ? row * u.token : static_cast<std::int64_t>(e) * entry);
    row += pending_counts_[e];
  }
  KVC_CHECK(t.data != nullptr, name, ".data = null");
  KVC_CHECK(reinterpret_cast<std::uintptr_t>(t.data) % 2 == 0, name, ".data is not 2-byte aligned");
  return u;
}

void LayeredCacheBase::write(int layer, const TensorView& k, const TensorView& v) {
  KVC_CHECK(layer >= 0 && layer < config_.num_layers, "layer = ", layer,
            " must be in [0, num_layers = ", config_.num_layers, ")");
  KVC_CHECK(!pending_slots_.empty() && !written_[static_cast<std::size_t>(layer)],
            "write(layer = ", layer,
            "): no update is pending for this layer (begin_update() first; each layer "
            "once)");
  const UpdateStrides ks = check_update_view(k, "k");
  const UpdateStrides vs = check_update_view(v, "v");
  do_write(layer, pending_slots_, pending_lengths_, pending_counts_, k.data, v.data, ks, vs);
  written_[static_cast<std::size_t>(layer)] = 1;
}

void LayeredCacheBase::write_all(const TensorView& k, const TensorView& v) {
  KVC_CHECK(!pending_slots_.empty() &&
                std::none_of(written_.begin(), written_.end(), [](std::uint8_t w) { return w; }),
            "write_all: no update is pending, or a layer of it was written already "
            "(begin_update() first)");
  const int L = config_.num_layers;
  auto layer0 = [&](const TensorView& t, const char* name) {
    KVC_CHECK(t.ndim >= 4 && t.ndim <= 5, name, ".ndim = ", t.ndim,
              " must be 4 ([L, total_tokens, Hkv, d]) or 5 ([L, slots, count, Hkv, d])");
    KVC_CHECK(t.shape[0] == L, name, ".shape[0] = ", t.shape[0], " must be num_layers = ", L);
    TensorView s = t;
    s.ndim = t.ndim - 1;
    for (int i = 0; i < s.ndim; ++i) {
      s.shape[i] = t.shape[i + 1];
      s.stride[i] = t.stride[i + 1];
    }
    return s;
  };
  const UpdateStrides ks = check_update_view(layer0(k, "k"), "k");
  const UpdateStrides vs = check_update_view(layer0(v, "v"), "v");
  do_write_all(pending_slots_, pending_lengths_, pending_counts_, k.data, v.data, k.stride[0],
               v.stride[0], ks, vs);
  std::fill(written_.begin(), written_.end(), 1);
}

void LayeredCacheBase::do_write_all(const std::vector<int>& slots,
                                    const std::vector<int>& old_lengths,
                                    const std::vector<int>& counts, const void* k, const void* v,
                                    std::int64_t k_layer, std::int64_t v_layer,
                                    const UpdateStrides& ks, const UpdateStrides& vs) {
  for (int l = 0; l < config_.num_layers; ++l) {
    do_write(l, slots, old_lengths, counts, static_cast<const std::uint16_t*>(k) + l * k_layer,
             static_cast<const std::uint16_t*>(v) + l * v_layer, ks, vs);
  }
}

void LayeredCacheBase::truncate(int slot, int new_length) {
  check_no_pending(written_, "truncate");
  state_.validate_truncate(slot, new_length);
  const int W = config_.layer.recent_window;
  const int L = state_.lengths[static_cast<std::size_t>(slot)];
  // Old positions [O', O) come back to the ring from the spill.
  const int from = old_count(new_length, W), to = old_count(L, W);
  do_truncate(slot, new_length, from, to, state_.truncated_pages(slot, new_length));
  state_.apply_truncate(slot, new_length);
}

int LayeredCacheBase::rollback_floor(int slot) const { return state_.rollback_floor(slot); }

void LayeredCacheBase::fork(int src, int dst) {
  check_no_pending(written_, "fork");
  state_.check_open(src, "src");
  state_.check_open(dst, "dst");
  KVC_CHECK(src != dst, "fork: src = dst = ", src);
  const std::size_t s = static_cast<std::size_t>(src), d = static_cast<std::size_t>(dst);
  if (config_.pages == PageOwner::kKvc) {
    // dst's pages go back first, then dst pops its copies.
    const long long need = state_.blocks_in_use(state_.lengths[s]);
    const long long have =
        static_cast<long long>(state_.free_pages.size()) + state_.blocks_in_use(state_.lengths[d]);
    KVC_CHECK(need <= have, "fork: pool exhausted: src = ", src, " needs ", need,
              " pages but only ", have, " are free");
    LayeredState trial = state_;
    const std::vector<PageCopy> pairs = trial.apply_fork_kvc(src, dst);
    do_fork(src, dst, pairs);
    state_ = std::move(trial);
  } else {
    do_fork(src, dst, {});
    state_.lengths[d] = state_.lengths[s];
    state_.spill_begin[d] = state_.spill_begin[s];
  }
}

const KvStore& LayeredCacheBase::layer(int layer) const {
  KVC_CHECK(layer >= 0 && layer < config_.num_layers, "layer = ", layer,
            " must be in [0, num_layers = ", config_.num_layers, ")");
  return *layers_[static_cast<std::size_t>(layer)];
}

int LayeredCacheBase::free_pages() const { return static_cast<int>(state_.free_pages.size()); }

Footprint LayeredCacheBase::footprint() const {
  Footprint one = layers_[0]->footprint();
  Footprint f;
  const std::size_t L = static_cast<std::size_t>(config_.num_layers);
  f.ring = one.ring * L;
  f.old_k = one.old_k * L;
  f.old_v = one.old_v * L;
  f.scales = one.scales * L;
  f.summaries = one.summaries * L;
  f.index_keys = one.index_keys * L;
  f.tables = one.tables;  // one set for every layer
  f.tokens = one.tokens;
  f.dense_equivalent_bytes = one.dense_equivalent_bytes * L;
  f.dense_equivalent_capacity = one.dense_equivalent_capacity * L;
  f.in_use = (one.in_use - one.tables) * L + one.tables;
  return f;
}

}  // namespace detail

std::unique_ptr<LayeredCache> LayeredCache::create(const LayeredCacheConfig& config, Device device,
                                                   const EngineMemory& memory) {
  config.validate();
  for (const void* p :
       {static_cast<const void*>(memory.pool), static_cast<const void*>(memory.block_table),
        static_cast<const void*>(memory.ring)}) {
    KVC_CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0,
              "engine memory (pool, block_table, ring) must be 256-byte aligned");
  }
  if (device.is_cpu()) return detail::make_cpu_layered_cache(config, memory);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return detail::make_cuda_layered_cache(config, device, memory);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

}  // namespace kvc
