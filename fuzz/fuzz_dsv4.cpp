// Fuzz target: the DeepSeek-V4 formats and objects of kvc/dsv4 on the CPU. A mode byte picks:
//   0 configs: EntryStoreConfig / CompressorConfig / IndexerConfig / SparseAttentionConfig
//     validate() either accepts or throws a well-formed kvc::Error; compute_footprint() throws
//     exactly when validate() does, else equals an independent 128-bit recomputation of the page
//     layouts (bf16 2d B, MODEL1 584 B padded to 576-byte pages, mxfp4 d/2 + d/32, fp8 d + 4) and
//     tables; the compressed() / window_ring() factories give max_entries = context / ratio or W;
//   1 entry codec: any row of floats (NaN, inf, subnormals, huge) encodes deterministically, and
//     encoding is a projection: re-encoding the decoded row decodes to the same bits;
//   2 stores: an EntryStore driven by arbitrary append / reserve / reset calls (bad slots,
//     duplicates, wrong widths and dtypes, capacity) either succeeds or throws kvc::Error with
//     every byte, count and free page as before; a twin fed the same entries one at a time holds
//     the same bytes; the footprint and the free stack agree with the counts; physical_entries
//     over arbitrary ids maps exactly the held entries to their pages' rows (or throws for bad
//     arguments, writing nothing);
//   3 compressor: a Compressor fed arbitrary chunks (and its store) equals a twin fed the same
//     tokens one at a time, bit for bit (entries, states, stored bytes); a failed call changes
//     neither state nor store.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/dsv4.h"

namespace {

using namespace kvc;
using namespace kvc::dsv4;
using kvc::fuzz::Input;
using u128 = unsigned __int128;

template <class F>
bool accepts(F f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    return false;
  }
}

EntryFormat read_format(Input& in) { return static_cast<EntryFormat>(in.u8() % 5); }

int read_dim(Input& in) {
  static const int kDims[] = {512, 128, 64, 32, 96, 1024, 0, -64, 448, 1056, 256};
  return in.flag() ? in.pick(kDims) : in.biased_int(1100);
}

EntryStoreConfig read_store_config(Input& in) {
  EntryStoreConfig c;
  c.format = read_format(in);
  c.dim = read_dim(in);
  c.max_slots = in.biased_int(4);
  c.max_entries = in.biased_int(200);
  static const int kPages[] = {64, 16, 32, 1024, 48, 0, 8, 2048, 17};
  c.page_entries = in.flag() ? in.pick(kPages) : in.biased_int(128);
  c.num_pages = in.flag() ? 0 : in.biased_int(24);
  c.ring = in.flag();
  return c;
}

/// Page bytes by the byte layouts of docs/dsv4.md, independently of entry_format.h.
u128 ref_page_bytes(const EntryStoreConfig& c) {
  const u128 n = static_cast<u128>(c.page_entries), d = static_cast<u128>(c.dim);
  switch (c.format) {
    case EntryFormat::kBf16:
      return n * 2 * d;
    case EntryFormat::kModel1Fp8:
      return (n * (448 + 128 + 8) + 575) / 576 * 576;
    case EntryFormat::kMxfp4:
      return n * (d / 2 + d / 32);
    case EntryFormat::kFp8Scaled:
      return n * (d + 4);
  }
  return 0;
}

void fuzz_configs(Input& in) {
  const EntryStoreConfig c = read_store_config(in);
  const bool ok = accepts([&] { c.validate(); });
  EntryStoreFootprint f;
  const bool fp_ok = accepts([&] { f = compute_footprint(c); });
  FUZZ_CHECK(ok == fp_ok, "validate %d but compute_footprint %d", ok, fp_ok);
  if (ok) {
    const u128 pps = (static_cast<u128>(c.max_entries) + c.page_entries - 1) / c.page_entries;
    const u128 pages = c.num_pages != 0 ? static_cast<u128>(c.num_pages) : c.max_slots * pps;
    const u128 pool = pages * ref_page_bytes(c);
    const u128 tables = 4 * (static_cast<u128>(c.max_slots) * (1 + pps) + pages + 1);
    FUZZ_CHECK(pool < (static_cast<u128>(1) << 48), "an accepted pool of 2^48 bytes or more");
    FUZZ_CHECK(static_cast<u128>(f.pool) == pool && static_cast<u128>(f.tables) == tables,
               "footprint pool %zu tables %zu differs from the recomputation", f.pool, f.tables);
    FUZZ_CHECK(static_cast<u128>(c.page_bytes()) == ref_page_bytes(c), "page_bytes %zu",
               c.page_bytes());
  }
  // The factories.
  const int ratio = in.flag() ? (in.flag() ? 4 : 128) : in.biased_int(130);
  const std::int64_t context = in.flag() ? std::int64_t{1} << 20 : in.biased_int(1 << 20);
  EntryStoreConfig made;
  if (accepts([&] {
        made = EntryStoreConfig::compressed(c.format, c.dim, ratio, context, c.max_slots);
      })) {
    FUZZ_CHECK(ratio == 4 || ratio == 128, "compressed() accepted ratio %d", ratio);
    FUZZ_CHECK(made.max_entries == context / ratio && !made.ring, "compressed() geometry");
  }
  const int window = in.biased_int(256);
  if (accepts(
          [&] { made = EntryStoreConfig::window_ring(c.format, c.dim, window, c.max_slots); })) {
    FUZZ_CHECK(made.ring && made.max_entries == window, "window_ring() geometry");
  }
  // The other configs: accept or throw a well-formed error.
  CompressorConfig cc;
  cc.ratio = ratio;
  cc.head_dim = c.dim;
  cc.max_slots = c.max_slots;
  cc.max_context = context;
  cc.max_tokens = in.biased_int(64);
  cc.max_batch = in.biased_int(4);
  cc.rms_eps = in.flag() ? 1e-6f : in.biased_float();
  cc.rope = in.flag();
  cc.rope_dim = in.biased_int(130);
  cc.hadamard = in.flag();
  if (accepts([&] { cc.validate(); })) {
    FUZZ_CHECK(std::isfinite(cc.rms_eps) && cc.rms_eps > 0, "rms_eps %a accepted", cc.rms_eps);
    FUZZ_CHECK(!cc.hadamard || cc.head_dim == 64 || cc.head_dim == 128, "hadamard of %d",
               cc.head_dim);
  }
  IndexerConfig ic;
  ic.key_format = c.format;
  ic.num_heads = in.biased_int(80);
  ic.head_dim = c.dim;
  ic.ratio = in.biased_int(130);
  ic.max_batch = in.biased_int(8);
  ic.max_query_tokens = in.biased_int(8);
  ic.query_rope = in.flag();
  ic.rope_dim = cc.rope_dim;
  accepts([&] { ic.validate(); });
  SparseAttentionConfig ac;
  ac.num_heads = in.biased_int(130);
  ac.head_dim = c.dim;
  ac.softmax_scale = in.flag() ? 0.0f : in.biased_float();
  ac.ratio = ratio;
  ac.hca = in.flag();
  ac.window = window;
  ac.max_batch = in.biased_int(8);
  ac.max_query_tokens = in.biased_int(8);
  ac.max_indices = in.biased_int(2048);
  if (accepts([&] { ac.validate(); })) {
    FUZZ_CHECK(std::isfinite(ac.softmax_scale) && ac.softmax_scale >= 0, "scale %a accepted",
               ac.softmax_scale);
  }
}

/// A valid entry format and dim from the input.
void read_valid_format(Input& in, EntryFormat& f, int& dim) {
  f = static_cast<EntryFormat>(in.u8() % 4);
  if (f == EntryFormat::kModel1Fp8) {
    dim = 512;
  } else if (f == EntryFormat::kBf16) {
    dim = 32 * (1 + in.u8() % 8);
  } else {
    dim = in.flag() ? 128 : 64;
  }
}

bool same_or_nan(float a, float b) {
  return fuzz::same_bits(a, b) || (std::isnan(a) && std::isnan(b));
}

void fuzz_codec(Input& in) {
  EntryFormat f;
  int dim;
  read_valid_format(in, f, dim);
  const int n = 16 * (1 + in.u8() % 2);
  const PageLayout l = page_layout(f, dim, n);
  const int off = in.u8() % n;
  std::vector<float> x(static_cast<std::size_t>(dim));
  const float scale = std::ldexp(1.0f, static_cast<int>(in.u8() % 64) - 32);
  for (auto& v : x)
    v = in.empty() ? 0.0f : (in.u8() < 40 ? in.biased_float() : scale * in.biased_float());
  std::vector<std::uint8_t> p1(l.page_bytes, 0x5a), p2(l.page_bytes, 0x5a), p3(l.page_bytes, 0x5a);
  encode_entry(l, x.data(), p1.data(), off);
  encode_entry(l, x.data(), p2.data(), off);
  FUZZ_CHECK(p1 == p2, "encoding the same row twice differs");
  std::vector<float> y(x.size());
  for (int i = 0; i < dim; ++i) y[i] = decode_element(l, p1.data(), off, i);
  encode_entry(l, y.data(), p3.data(), off);
  for (int i = 0; i < dim; ++i) {
    const float z = decode_element(l, p3.data(), off, i);
    FUZZ_CHECK(same_or_nan(z, y[i]), "%s dim %d: element %d decodes to %a, re-encoded %a (x %a)",
               to_string(f), dim, i, y[i], z, x[i]);
  }
}

/// Every byte a slot holds in logical order, and its count.
std::vector<std::uint8_t> contents(const EntryStore& s) {
  std::vector<std::uint8_t> buf, out;
  const EntryStoreView v = s.host_view(buf);
  const EntryStoreConfig& c = s.config();
  for (int slot = 0; slot < c.max_slots; ++slot) {
    const int n = s.count(slot);
    out.push_back(static_cast<std::uint8_t>(n));
    out.push_back(static_cast<std::uint8_t>(n >> 8));
    for (int e = c.ring ? std::max(0, n - c.max_entries) : 0; e < n; ++e) {
      const int row = entry_row(v, e);
      const std::uint8_t* page = page_of(v, slot, row);
      FUZZ_CHECK(page != nullptr, "slot %d entry %d has no page", slot, e);
      const std::uint8_t* p = entry_payload(v.layout, page, row % c.page_entries);
      const std::uint8_t* q = entry_scales(v.layout, page, row % c.page_entries);
      out.insert(out.end(), p, p + v.layout.payload_bytes);
      out.insert(out.end(), q, q + v.layout.scale_bytes);
    }
  }
  return out;
}

/// Counts, block table and free stack.
std::vector<std::int32_t> tables(const EntryStore& s) {
  std::vector<std::uint8_t> buf;
  const EntryStoreView v = s.host_view(buf);
  const EntryStoreConfig& c = s.config();
  std::vector<std::int32_t> t(v.counts, v.counts + c.max_slots);
  t.insert(t.end(), v.block_table,
           v.block_table + static_cast<std::size_t>(c.max_slots) * v.block_table_pitch);
  if (v.free_count != nullptr) t.insert(t.end(), v.free_pages, v.free_pages + *v.free_count);
  t.push_back(s.free_pages());
  return t;
}

void check_store(const EntryStore& s) {
  const EntryStoreConfig& c = s.config();
  std::int64_t pages = 0, rows = 0;
  for (int i = 0; i < c.max_slots; ++i) {
    const std::int64_t r = c.ring ? std::min(s.count(i), c.max_entries) : s.count(i);
    FUZZ_CHECK(c.ring || r <= c.max_entries, "slot %d holds %lld > %d", i,
               static_cast<long long>(r), c.max_entries);
    pages += (r + c.page_entries - 1) / c.page_entries;
    rows += r;
  }
  FUZZ_CHECK(pages + s.free_pages() == c.pool_pages(), "%lld pages used + %d free != %d",
             static_cast<long long>(pages), s.free_pages(), c.pool_pages());
  const EntryStoreFootprint f = s.footprint();
  FUZZ_CHECK(
      f.entries == rows && f.in_use == f.tables + static_cast<std::size_t>(pages) * c.page_bytes(),
      "footprint in_use %zu entries %lld", f.in_use, static_cast<long long>(f.entries));
}

/// physical_entries over arbitrary ids, slots and shapes: bad arguments throw a well-formed error
/// and write nothing; otherwise an id maps to -1 exactly when the slot does not hold it, and else
/// to the pool row of the page and offset page_of / entry_row name.
void check_physical(Input& in, const EntryStore& s) {
  // One byte per choice, and an exhausted input (zero bytes) still makes a valid call.
  const EntryStoreView v = s.view();
  const std::uint8_t tb = in.u8(), rb = in.u8(), kb = in.u8(), pb = in.u8();
  const int T = tb == 255 ? 0 : 1 + tb % 3, rows = rb == 255 ? 0 : 1 + rb % 4;
  const int k = kb == 255 ? 0 : 1 + kb % 6, pitch = k + (pb == 255 ? -1 : pb % 2);
  std::vector<std::int32_t> slots(4), ids(static_cast<std::size_t>(rows) * k);
  for (auto& x : slots) {
    const std::uint8_t b = in.u8();
    x = b == 255 ? -1 : b == 254 ? v.max_slots : b % v.max_slots;
  }
  const int span = v.max_entries + 40;  // ids past every count, and -1 / -2
  for (auto& x : ids) {
    const int e = (in.u8() | (in.u8() << 8)) % (span + 2);
    x = e < span ? e : e - span - 2;
  }
  const std::size_t n = static_cast<std::size_t>(rows) * std::max(pitch, 0);
  std::vector<std::int32_t> out(n + 1, -9);
  const SelectionView sel{ids.data(), nullptr, rows, k};
  if (!accepts([&] { physical_entries(v, slots.data(), T, sel, out.data(), pitch); })) {
    FUZZ_CHECK(std::all_of(out.begin(), out.end(), [](std::int32_t x) { return x == -9; }),
               "a refused physical_entries wrote");
    return;
  }
  FUZZ_CHECK(T >= 1 && rows % T == 0 && pitch >= k, "physical_entries accepted T %d rows %d", T,
             rows);
  for (int r = 0; r < rows; ++r) {
    const int slot = slots[r / T];
    for (int i = 0; i < k; ++i) {
      const int e = ids[static_cast<std::size_t>(r) * k + i];
      const std::int32_t got = out[static_cast<std::size_t>(r) * pitch + i];
      const int count = s.count(slot);
      const bool held = e >= 0 && e < count && (!v.ring || e >= count - v.max_entries);
      if (!held) {
        FUZZ_CHECK(got == -1, "slot %d id %d not held but mapped to %d", slot, e, got);
        continue;
      }
      const int row = entry_row(v, e), pe = v.layout.page_entries;
      const std::uint8_t* page = page_of(v, slot, row);
      FUZZ_CHECK(got >= 0 &&
                     page == v.pool + static_cast<std::size_t>(got / pe) * v.layout.page_bytes &&
                     got % pe == row % pe,
                 "slot %d id %d mapped to %d", slot, e, got);
    }
  }
  FUZZ_CHECK(out[n] == -9, "physical_entries wrote past its rows");
}

template <class Op>
bool guarded_store(EntryStore& s, Op op) {
  const auto bytes = contents(s);
  const auto t = tables(s);
  try {
    op();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    FUZZ_CHECK(contents(s) == bytes && tables(s) == t, "a failed call changed the store: %s",
               e.what());
    return false;
  }
}

std::vector<int> read_slots(Input& in, int max_slots) {
  std::vector<int> v(static_cast<std::size_t>(in.u8() % 4));
  for (auto& s : v) s = static_cast<int>(in.range(-1, max_slots));
  return v;
}

void fuzz_store(Input& in) {
  EntryStoreConfig c;
  read_valid_format(in, c.format, c.dim);
  c.ring = (c.format == EntryFormat::kBf16 || c.format == EntryFormat::kModel1Fp8) && in.flag();
  c.max_slots = 1 + in.u8() % 3;
  c.max_entries = 1 + in.u8() % 80;
  c.page_entries = 16 * (1 + in.u8() % 3);
  c.num_pages = in.flag() ? 0 : in.u8() % 12;
  if (!accepts([&] { c.validate(); })) return;
  auto a = EntryStore::create(c, Device::cpu());  // chunks as the input says
  auto b = EntryStore::create(c, Device::cpu());  // the same entries one at a time
  for (int step = 0; step < 16 && !in.empty(); ++step) {
    const std::uint8_t op = in.u8() % 4;
    const std::vector<int> slots = read_slots(in, c.max_slots);
    if (op <= 1) {
      const int T = static_cast<int>(in.range(-1, 40));
      const int width = in.u8() < 16 ? c.dim + 32 : c.dim;  // now and then a wrong width
      const bool bf16 = in.flag();
      const std::size_t n = slots.size() * static_cast<std::size_t>(std::max(T, 0)) * width;
      std::vector<float> x(n);
      for (auto& v : x)
        v = in.u8() < 8 ? in.biased_float()
                        : static_cast<float>(static_cast<std::int8_t>(in.u8())) / 8;
      std::vector<std::uint16_t> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = float_to_bf16_bits(x[i]);
      const std::int64_t ns = static_cast<std::int64_t>(slots.size());
      auto view = [&](std::size_t at, int t) {
        return bf16 ? TensorView::contiguous(h.data() + at, DType::kBF16, {ns, t, width})
                    : TensorView::contiguous(x.data() + at, DType::kF32, {ns, t, width});
      };
      if (!guarded_store(*a, [&] { a->append(slots, view(0, T)); })) continue;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        for (int t = 0; t < T; ++t) {
          const std::size_t at = (i * T + t) * width;
          const TensorView one =
              bf16 ? TensorView::contiguous(h.data() + at, DType::kBF16, {1, 1, width})
                   : TensorView::contiguous(x.data() + at, DType::kF32, {1, 1, width});
          b->append({slots[i]}, one);
        }
      }
    } else if (op == 2) {
      std::vector<int> targets;
      for (std::size_t i = 0; i < slots.size(); ++i)
        targets.push_back(static_cast<int>(in.range(-1, 90)));
      if (!guarded_store(*a, [&] { a->reserve(slots, targets); })) continue;
      b->reserve(slots, targets);
    } else {
      const int slot = slots.empty() ? static_cast<int>(in.range(-1, c.max_slots)) : slots[0];
      if (!guarded_store(*a, [&] { a->reset(slot); })) continue;
      b->reset(slot);
    }
    check_store(*a);
    check_physical(in, *a);
    FUZZ_CHECK(contents(*a) == contents(*b), "chunked and one-at-a-time stores differ");
    FUZZ_CHECK(tables(*a) == tables(*b), "chunked and one-at-a-time tables differ");
  }
}

/// A compressor and its store, and every entry it produced (the `out` rows) in order per slot.
struct Twin {
  std::unique_ptr<Compressor> comp;
  std::unique_ptr<EntryStore> store;
  std::vector<std::vector<float>> entries;
};

void fuzz_compressor(Input& in) {
  CompressorConfig c;
  c.ratio = in.flag() ? 4 : 128;
  static const int kDims[] = {64, 128, 32, 512};
  c.head_dim = c.ratio == 4 ? in.pick(kDims) : (in.flag() ? 64 : 32);
  c.max_slots = 1 + in.u8() % 3;
  c.max_context = c.ratio * (1 + in.u8() % 12);
  c.max_tokens = 1 + in.u8() % 64;
  c.max_batch = 1 + in.u8() % c.max_slots;
  c.rms_norm = in.flag();
  c.rope = in.flag();
  c.rope_dim = 2 * (1 + in.u8() % (c.head_dim / 2));
  c.hadamard = (c.head_dim == 64 || c.head_dim == 128) && in.flag();
  c.validate();
  const int W = c.width(), m = c.ratio, d = c.head_dim;
  EntryFormat f = EntryFormat::kBf16;
  if ((d == 64 || d == 128) && in.flag())
    f = in.flag() ? EntryFormat::kMxfp4 : EntryFormat::kFp8Scaled;
  if (d == 512 && in.flag()) f = EntryFormat::kModel1Fp8;
  const bool with_store = in.flag();
  const EntryStoreConfig sc = EntryStoreConfig::compressed(f, d, m, c.max_context, c.max_slots);
  std::uint64_t r = 0x9e3779b97f4a7c15ull ^ in.u32();
  auto next = [&] {  // values mostly normal, now and then extreme
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const auto u = static_cast<std::uint32_t>(r >> 20);
    if ((u & 0x3ff) == 0) return (u & 0x400) ? INFINITY : -1e30f;
    return static_cast<float>(static_cast<std::int32_t>(u & 0xfff) - 2048) / 512;
  };
  std::vector<float> ape(static_cast<std::size_t>(m) * W), norm(d);
  for (auto& v : ape) v = next() / 4;
  for (auto& v : norm) v = 1 + next() / 8;
  const std::int64_t positions = c.max_context + 1;
  std::vector<float> cos_t(static_cast<std::size_t>(positions) * (c.rope_dim / 2)),
      sin_t(cos_t.size());
  for (std::size_t i = 0; i < cos_t.size(); ++i) {
    cos_t[i] = std::cos(0.01f * static_cast<float>(i));
    sin_t[i] = std::sin(0.01f * static_cast<float>(i));
  }
  Twin a{Compressor::create(c, Device::cpu()), EntryStore::create(sc, Device::cpu()), {}};
  Twin b{Compressor::create(c, Device::cpu()), EntryStore::create(sc, Device::cpu()), {}};
  a.entries.resize(c.max_slots);
  b.entries.resize(c.max_slots);
  auto run = [&](Twin& t, const std::vector<int>& slots, const float* kv, const float* sc_, int T,
                 int width) {
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    const int max_new = T / m + 1;
    std::vector<float> out(static_cast<std::size_t>(n) * max_new * d, NAN);
    std::vector<std::int64_t> before;
    for (int s : slots) before.push_back(s >= 0 && s < c.max_slots ? t.comp->length(s) : 0);
    CompressorInputs ci;
    ci.kv = TensorView::contiguous(const_cast<float*>(kv), DType::kF32, {n, T, width});
    ci.score = TensorView::contiguous(const_cast<float*>(sc_), DType::kF32, {n, T, width});
    ci.ape = TensorView::contiguous(ape.data(), DType::kF32, {m, W});
    ci.norm_weight = TensorView::contiguous(norm.data(), DType::kF32, {d});
    ci.rope_cos = TensorView::contiguous(cos_t.data(), DType::kF32, {positions, c.rope_dim / 2});
    ci.rope_sin = TensorView::contiguous(sin_t.data(), DType::kF32, {positions, c.rope_dim / 2});
    t.comp->append(slots, ci, with_store ? t.store.get() : nullptr,
                   TensorView::contiguous(out.data(), DType::kF32, {n, max_new, d}));
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const std::int64_t L = before[i], k = (L + T) / m - L / m;
      auto& e = t.entries[static_cast<std::size_t>(slots[i])];
      e.insert(e.end(), out.begin() + static_cast<std::ptrdiff_t>(i * max_new * d),
               out.begin() + static_cast<std::ptrdiff_t>((i * max_new + k) * d));
    }
  };
  auto states = [&](const Twin& t) {
    std::vector<float> all, kv, s;
    for (int i = 0; i < c.max_slots; ++i) {
      t.comp->state(i, kv, s);
      all.insert(all.end(), kv.begin(), kv.end());
      all.insert(all.end(), s.begin(), s.end());
      all.push_back(static_cast<float>(t.comp->length(i)));
    }
    return all;
  };
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!fuzz::same_bits(x[i], y[i])) return false;
    return true;
  };
  for (int step = 0; step < 12 && !in.empty(); ++step) {
    const std::vector<int> slots = read_slots(in, c.max_slots);
    if (in.u8() % 8 == 0) {  // reset
      const int slot = static_cast<int>(in.range(-1, c.max_slots));
      const bool ok = accepts([&] { a.comp->reset(slot); });
      if (ok) {
        b.comp->reset(slot);
        a.store->reset(slot);
        b.store->reset(slot);
        a.entries[static_cast<std::size_t>(slot)].clear();
        b.entries[static_cast<std::size_t>(slot)].clear();
      }
      continue;
    }
    const int T = static_cast<int>(in.range(0, 70));
    const int width = in.u8() < 16 ? W + 32 : W;
    const std::size_t n = slots.size() * static_cast<std::size_t>(T) * width;
    std::vector<float> kv(n), sc_(n);
    for (auto& v : kv) v = next();
    for (auto& v : sc_) v = next();
    const auto state_before = states(a);
    const auto store_before = contents(*a.store);
    bool ok = true;
    try {
      run(a, slots, kv.data(), sc_.data(), T, width);
    } catch (const Error& e) {
      FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
      FUZZ_CHECK(same(states(a), state_before) && contents(*a.store) == store_before,
                 "a failed append changed the compressor or its store: %s", e.what());
      ok = false;
    }
    if (!ok) continue;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      for (int t = 0; t < T; ++t) {
        const std::size_t at = (i * T + t) * width;
        run(b, {slots[i]}, kv.data() + at, sc_.data() + at, 1, width);
      }
    }
    FUZZ_CHECK(same(states(a), states(b)), "chunked and one-at-a-time states differ");
    FUZZ_CHECK(contents(*a.store) == contents(*b.store), "chunked and one-at-a-time stores differ");
    for (int s = 0; s < c.max_slots; ++s)
      FUZZ_CHECK(same(a.entries[s], b.entries[s]), "slot %d: entries differ", s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  switch (in.u8() % 4) {
    case 0:
      fuzz_configs(in);
      break;
    case 1:
      fuzz_codec(in);
      break;
    case 2:
      fuzz_store(in);
      break;
    default:
      fuzz_compressor(in);
      break;
  }
  return 0;
}
