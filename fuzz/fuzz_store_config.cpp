// Fuzz target: KvStoreConfig::validate and compute_footprint on arbitrary configs and lengths,
// then (for configs small enough) a CPU KvStore driven by an arbitrary sequence of operations.
// Invariants:
//   - validate() either accepts or throws a well-formed kvc::Error, never anything else;
//     compute_footprint() throws exactly when validate() does or a length is out of range;
//   - an accepted config's footprint equals an independent 128-bit recomputation (no wrap-around
//     of size_t: a config whose bytes do not fit must be rejected);
//   - the store: every operation either succeeds or throws kvc::Error leaving the snapshot, the
//     lengths, the footprint and the free pool exactly as they were; footprint() equals
//     compute_footprint of the open slots' lengths; and a twin store fed the same tokens one by
//     one (append) instead of in chunks (ingest) holds bit-identical contents.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "footprint_ref.h"
#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/store/kv_store.h"

namespace {

using namespace kvc;
using kvc::fuzz::Input;
using kvc::fuzz::u128;

constexpr u128 kMaxStoreBytes = 1u << 20;  // drive a real store only below this capacity

bool validates(const KvStoreConfig& c) {
  try {
    c.validate();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    return false;
  }
}

KvStoreConfig read_config(Input& in) {
  static const int kHeadDims[] = {64, 128, 256, 512, 64, 64, 0, 32, 96, 1024, -64};
  KvStoreConfig c;
  c.num_kv_heads = in.biased_int(4);
  c.head_dim = in.flag() ? in.pick(kHeadDims) : in.biased_int(512);
  c.max_slots = in.biased_int(4);
  c.max_context = in.biased_int(255);
  c.recent_window = in.biased_int(48);
  c.block_size = in.biased_int(24);
  c.dtype = static_cast<DType>(in.u8() % 7);
  c.old_format = static_cast<Format>(in.u8() % 7);
  c.num_pool_blocks = in.flag() ? 0 : in.biased_int(24);
  c.summaries = in.flag() ? in.u32() : in.u8() % 17;
  c.index_format = static_cast<Format>(in.u8() % 7);
  c.summary_dtype = static_cast<DType>(in.u8() % 7);
  if (in.u8() % 4 == 0) {  // a context-parallel shard (where the store supports it)
    const int shards = in.flag() ? 1 + in.u8() % 4 : in.biased_int(4);
    fuzz::set_shards(c, shards, in.flag() ? in.u8() % 4 : in.biased_int(4), 0);
  }
  return c;
}

std::uint64_t rng_state = 1;
std::uint16_t next_bits(DType t) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  const auto r = static_cast<std::uint32_t>(rng_state >> 11);
  // Mostly normal values; now and then NaN / inf / subnormal codes (the store must keep them).
  if ((r & 0xff) == 0) return t == DType::kBF16 ? 0x7fc0u : 0x7e00u;
  if ((r & 0xff) == 1) return t == DType::kBF16 ? 0xff80u : 0xfc00u;
  const float f = static_cast<float>(static_cast<std::int32_t>(r >> 8) - (1 << 22)) / (1 << 20);
  return float_to_bits16(f, t == DType::kBF16);
}

struct Store {
  std::unique_ptr<KvStore> s;
  std::vector<int> lengths_of_open() const {
    std::vector<int> v;
    for (int i = 0; i < s->config().max_slots; ++i) v.push_back(s->is_open(i) ? s->length(i) : 0);
    return v;
  }
};

void check_consistent(const KvStore& s) {
  const KvStoreConfig& c = s.config();
  std::vector<int> lens;
  int used_blocks = 0;
  for (int i = 0; i < c.max_slots; ++i) {
    const int L = s.is_open(i) ? s.length(i) : 0;
    FUZZ_CHECK(L >= 0 && L <= c.max_context, "slot %d length %d", i, L);
    lens.push_back(L);
    const int old = L > c.recent_window ? L - c.recent_window : 0;
    const std::pair<int, int> sh = fuzz::shards_of(c, 0);
    used_blocks += static_cast<int>(
        fuzz::owned_count((old + c.block_size - 1) / c.block_size, sh.first, sh.second));
  }
  const Footprint f = s.footprint();
  const Footprint g = compute_footprint(c, lens);
  FUZZ_CHECK(f.total() == g.total() && f.in_use == g.in_use && f.tokens == g.tokens,
             "footprint() differs from compute_footprint(lengths)");
  FUZZ_CHECK(s.free_pool_blocks() == c.pool_blocks() - used_blocks,
             "free pool %d != %d - %d blocks in use", s.free_pool_blocks(), c.pool_blocks(),
             used_blocks);
}

// Runs `op`; when it throws kvc::Error the store must be exactly as before.
template <class Op>
bool guarded(KvStore& s, Op op) {
  const auto before = s.snapshot();
  const Footprint fb = s.footprint();
  const int free_before = s.free_pool_blocks();
  try {
    op();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    FUZZ_CHECK(s.snapshot() == before, "a failed call changed the store: %s", e.what());
    FUZZ_CHECK(s.footprint().in_use == fb.in_use && s.free_pool_blocks() == free_before,
               "a failed call changed the footprint or pool: %s", e.what());
    return false;
  }
}

void drive_store(const KvStoreConfig& c, Input& in) {
  auto a = KvStore::create(c, Device::cpu());  // chunks as the input says
  auto b = KvStore::create(c, Device::cpu());  // the same tokens one at a time
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  rng_state = 0x9e3779b97f4a7c15ull ^ in.u32();
  for (int step = 0; step < 24 && !in.empty(); ++step) {
    const std::uint8_t op = in.u8() % 6;
    const int slot = static_cast<int>(in.range(-1, c.max_slots));
    if (op == 0) {
      const bool ok_a = guarded(*a, [&] { a->open_slot(); });
      const bool ok_b = guarded(*b, [&] { b->open_slot(); });
      FUZZ_CHECK(ok_a == ok_b, "open_slot differs");
    } else if (op == 1 || op == 2) {  // ingest T tokens (T may be 0 or past max_context)
      const int T = static_cast<int>(in.range(op == 1 ? 0 : -2, 70));
      const int rows = T > 0 ? T : 0;
      std::vector<std::uint16_t> k(rows * token), v(rows * token);
      for (auto& x : k) x = next_bits(c.dtype);
      for (auto& x : v) x = next_bits(c.dtype);
      const TensorView kv =
          TensorView::contiguous(k.data(), c.dtype, {T, c.num_kv_heads, c.head_dim});
      const TensorView vv =
          TensorView::contiguous(v.data(), c.dtype, {T, c.num_kv_heads, c.head_dim});
      const bool ok = guarded(*a, [&] { a->ingest(slot, kv, vv); });
      if (ok) {
        for (int t = 0; t < T; ++t) {
          const TensorView k1 = TensorView::contiguous(k.data() + t * token, c.dtype,
                                                       {1, c.num_kv_heads, c.head_dim});
          const TensorView v1 = TensorView::contiguous(v.data() + t * token, c.dtype,
                                                       {1, c.num_kv_heads, c.head_dim});
          b->append({slot}, k1, v1);
        }
      }
    } else if (op == 3) {  // one token to a list of slots (maybe repeated or closed)
      std::vector<int> slots;
      const int n = in.u8() % 4;
      for (int i = 0; i < n; ++i) slots.push_back(static_cast<int>(in.range(-1, c.max_slots)));
      std::vector<std::uint16_t> k(slots.size() * token), v(slots.size() * token);
      for (auto& x : k) x = next_bits(c.dtype);
      for (auto& x : v) x = next_bits(c.dtype);
      const std::int64_t ns = static_cast<std::int64_t>(slots.size());
      const TensorView kv =
          TensorView::contiguous(k.data(), c.dtype, {ns, c.num_kv_heads, c.head_dim});
      const TensorView vv =
          TensorView::contiguous(v.data(), c.dtype, {ns, c.num_kv_heads, c.head_dim});
      const bool ok_a = guarded(*a, [&] { a->append(slots, kv, vv); });
      const bool ok_b = guarded(*b, [&] { b->append(slots, kv, vv); });
      FUZZ_CHECK(ok_a == ok_b, "append differs between twins");
    } else if (op == 4) {
      const bool ok_a = guarded(*a, [&] { a->reset(slot); });
      const bool ok_b = guarded(*b, [&] { b->reset(slot); });
      FUZZ_CHECK(ok_a == ok_b, "reset differs");
    } else {
      const bool ok_a = guarded(*a, [&] { a->free(slot); });
      const bool ok_b = guarded(*b, [&] { b->free(slot); });
      FUZZ_CHECK(ok_a == ok_b, "free differs");
    }
    check_consistent(*a);
    check_consistent(*b);
    FUZZ_CHECK(a->snapshot() == b->snapshot(), "ingest and per-token append differ at step %d",
               step);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const KvStoreConfig c = read_config(in);
  std::vector<int> lengths;
  const int nl = in.u8() % 5;
  bool lengths_ok = nl <= c.max_slots;
  for (int i = 0; i < nl; ++i) {
    const int L = in.flag() ? static_cast<int>(in.range(0, c.max_context > 0 ? c.max_context : 0))
                            : in.biased_int(300);
    lengths.push_back(L);
    lengths_ok = lengths_ok && L >= 0 && L <= c.max_context;
  }
  const bool valid = validates(c);
  // Old blocks the lengths need, against the pool (this shard's blocks for a shard).
  std::int64_t blocks_needed = 0;
  const std::pair<int, int> sh = fuzz::shards_of(c, 0);
  for (int L : lengths) {
    if (!valid) break;
    const std::int64_t old = std::max<std::int64_t>(0, std::int64_t{L} - c.recent_window);
    blocks_needed +=
        fuzz::owned_count((old + c.block_size - 1) / c.block_size, sh.first, sh.second);
  }
  const bool pool_ok = valid && blocks_needed <= c.pool_blocks();
  Footprint f;
  bool threw = false;
  try {
    f = compute_footprint(c, lengths);
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    threw = true;
  }
  // It throws for a bad config or a length out of range; for lengths past the pool it throws
  // since the fix of finding 2 (docs/reliability.md), and before it reported in_use > total().
  FUZZ_CHECK(threw || (valid && lengths_ok), "compute_footprint accepted a bad config or length");
  FUZZ_CHECK(!threw || !valid || !lengths_ok || !pool_ok,
             "compute_footprint threw for a valid config and lengths that fit its pool");
  if (!valid) return 0;
  // Finding 4 (docs/reliability.md): a valid config's block table (max_slots x
  // max_blocks_per_slot int32 entries) is at most 2^30 entries, so create() never ends in
  // std::bad_alloc for it.
  const std::int64_t old_tokens = std::int64_t{c.max_context} - c.recent_window;
  const std::int64_t row_blocks =
      old_tokens > 0 ? (old_tokens + c.block_size - 1) / c.block_size : 0;
  const u128 table_entries = static_cast<u128>(c.max_slots) * static_cast<u128>(row_blocks);
  FUZZ_CHECK(table_entries <= (u128{1} << 30), "validate() accepted a block table of %llu entries",
             static_cast<unsigned long long>(table_entries));

  const fuzz::WideFootprint w = fuzz::wide_footprint(c);
  if (!fuzz::fits_size_t(w)) {
    // Finding 1 (docs/reliability.md): validate() must reject a config whose byte counts do not
    // fit size_t (they wrap and the store is created too small).
    FUZZ_CHECK(!fuzz::strict_mode(),
               "validate() accepted a config whose footprint overflows "
               "size_t: slots %d, Hkv %d, d %d, context %d, W %d, B %d, pool %d",
               c.max_slots, c.num_kv_heads, c.head_dim, c.max_context, c.recent_window,
               c.block_size, c.num_pool_blocks);
    return 0;
  }
  if (threw) return 0;
  FUZZ_CHECK(f.ring == w.ring && f.old_k == w.old_k && f.old_v == w.old_v && f.scales == w.scales &&
                 f.summaries == w.summaries && f.index_keys == w.index_keys &&
                 f.tables == w.tables && f.dense_equivalent_capacity == w.dense_capacity,
             "compute_footprint differs from the 128-bit recomputation");
  std::int64_t tokens = 0;
  for (int L : lengths) tokens += L;
  FUZZ_CHECK(f.tokens == tokens, "tokens %lld != %lld", static_cast<long long>(f.tokens),
             static_cast<long long>(tokens));
  FUZZ_CHECK(f.dense_equivalent_bytes ==
                 static_cast<std::size_t>(tokens) * c.num_kv_heads * c.head_dim * 4,
             "dense_equivalent_bytes");
  if (!pool_ok) {
    // Finding 2: accepted lengths that do not fit the pool (in_use then exceeds the capacity).
    FUZZ_CHECK(!fuzz::strict_mode(),
               "compute_footprint accepted lengths that need %lld blocks "
               "of a pool of %d (in_use %zu, total %zu)",
               static_cast<long long>(blocks_needed), c.pool_blocks(), f.in_use, f.total());
  } else {
    FUZZ_CHECK(f.in_use <= f.total(), "in_use %zu > total %zu", f.in_use, f.total());
  }
  if (w.total() <= kMaxStoreBytes) drive_store(c, in);
  return 0;
}
