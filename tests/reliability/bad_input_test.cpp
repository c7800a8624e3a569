// Bad input, systematically: every public entry point (KvStore create/open/append/ingest/reset/
// free/length, compute_footprint, BlockIndex, SelectPolicy/select_row/Selector, AttentionBackend
// decode/dense_decode, merge_states, the planner, format/mode parsing, TensorView) against every
// class of bad argument (null or misaligned pointer, wrong dtype/device, shape mismatch,
// unsupported head_dim or group size, slot out of range or not open, context past max, pool
// exhausted, NaN/inf where a finite value is required, bad selections and pitches).
//
// Each row asserts a kvc::Error whose message names the argument (the row's words), and that
// nothing changed: the stores' lengths, footprints, free pools and snapshot checksums, and every
// output buffer (filled with a poison pattern before each row).
//
// Rows marked KNOWN GAP describe input the API should reject (or name differently) but does not
// yet; they are reported to the owners (docs/reliability.md). While the gap is open such a row is
// reported as skipped with its note; once the API rejects the input, the row checks the message
// like any other and asks for the mark to be removed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/attention/merge.h"
#include "kvc/core/error.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/planner/planner.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::random_bits16;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int32_t kPoisonI = 0x5a5a5a5a;

// One row of a table: a call that must throw kvc::Error naming `words`.
struct Row {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> words;
  std::string known_gap;  // non-empty: KNOWN GAP, the note says what is missing (and where)
};

// FNV-1a over bytes.
std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

// Everything observable about a store that a rejected call must leave alone.
struct StoreState {
  std::vector<int> lengths;  // -1 for a closed slot
  std::size_t in_use = 0, total = 0;
  std::int64_t tokens = 0;
  int free_blocks = 0;
  std::uint64_t checksum = 0;  // of snapshot()
  std::vector<SlotState> snapshot;

  static StoreState of(const KvStore& s) {
    StoreState st;
    for (int i = 0; i < s.config().max_slots; ++i) {
      st.lengths.push_back(s.is_open(i) ? s.length(i) : -1);
    }
    const Footprint f = s.footprint();
    st.in_use = f.in_use;
    st.total = f.total();
    st.tokens = f.tokens;
    st.free_blocks = s.free_pool_blocks();
    st.snapshot = s.snapshot();
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const SlotState& x : st.snapshot) {
      h = fnv(h, &x.open, 1);
      h = fnv(h, &x.length, sizeof x.length);
      h = fnv(h, x.ring_k.data(), x.ring_k.size());
      h = fnv(h, x.ring_v.data(), x.ring_v.size());
      h = fnv(h, x.old_k.data(), x.old_k.size());
      h = fnv(h, x.old_v.data(), x.old_v.size());
      h = fnv(h, x.old_k_scale.data(), x.old_k_scale.size() * 4);
      h = fnv(h, x.old_v_scale.data(), x.old_v_scale.size() * 4);
      h = fnv(h, x.summaries.data(), x.summaries.size() * 4);
    }
    st.checksum = h;
    return st;
  }
  bool operator==(const StoreState& o) const {
    return lengths == o.lengths && in_use == o.in_use && total == o.total && tokens == o.tokens &&
           free_blocks == o.free_blocks && checksum == o.checksum && snapshot == o.snapshot;
  }
};

// A view with explicit fields (for shapes TensorView::contiguous would not build).
TensorView view(void* data, DType t, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(data, t, shape);
}

// `v` with its data pointer moved by `bytes` (misaligned).
TensorView shifted(TensorView v, std::size_t bytes) {
  v.data = static_cast<std::uint8_t*>(v.data) + bytes;
  return v;
}

TensorView with_dtype(TensorView v, DType t) {
  v.dtype = t;
  return v;
}

TensorView on_device(TensorView v, Device d) {
  v.device = d;
  return v;
}

TensorView null_data(TensorView v) {
  v.data = nullptr;
  return v;
}

class Cpu_Reliability_BadInput : public ::testing::Test {
 protected:
  // main_: Hkv 2, d 64, 3 slots, context 128, W 16, B 8, q8, all summaries.
  //   slot 0: 60 tokens (5 closed blocks + 4 open rows), slot 1: 1 token, slot 2 closed.
  // full_: Hkv 2, d 64, 2 slots, context 24, W 8, B 4, f16, mean K only, a pool of 4 blocks.
  //   slot 0: 24 tokens (at max_context, the pool used up), slot 1: 8 tokens (the ring full, so
  //   its next token needs a block the pool does not have); no slot left to open.
  void SetUp() override {
    mc_.num_kv_heads = 2;
    mc_.head_dim = 64;
    mc_.max_slots = 3;
    mc_.max_context = 128;
    mc_.recent_window = 16;
    mc_.block_size = 8;
    mc_.dtype = DType::kF16;
    mc_.old_format = Format::kQ8;
    mc_.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
    main_ = KvStore::create(mc_, Device::cpu());
    fill(*main_, main_->open_slot(), 60, 1);
    fill(*main_, main_->open_slot(), 1, 2);

    fc_ = mc_;
    fc_.max_slots = 2;
    fc_.max_context = 24;
    fc_.recent_window = 8;
    fc_.block_size = 4;
    fc_.old_format = Format::kF16;
    fc_.summaries = kSummaryMeanK;
    fc_.num_pool_blocks = 4;
    full_ = KvStore::create(fc_, Device::cpu());
    fill(*full_, full_->open_slot(), 24, 3);
    fill(*full_, full_->open_slot(), 8, 4);
    ASSERT_EQ(full_->free_pool_blocks(), 0);

    k1_ = random_bits16(4 * token(), DType::kF16, 5);
    v1_ = random_bits16(4 * token(), DType::kF16, 6);
    q_ = random_bits16(2 * 2 * 4 * 64 + 64, DType::kF16, 7);  // [batch 2, T 2, Hq 4, d 64] + slack
    scores_.assign(64 * 16, 0.0f);
    for (std::size_t i = 0; i < scores_.size(); ++i) scores_[i] = static_cast<float>(i % 7);
    num_valid_.assign(16, 5);
    poison();  // sizes the output buffers (rows point at them)
  }

  std::size_t token() const { return static_cast<std::size_t>(mc_.num_kv_heads) * mc_.head_dim; }

  static void fill(KvStore& s, int slot, int tokens, std::uint32_t seed) {
    const KvStoreConfig& c = s.config();
    const std::size_t n = static_cast<std::size_t>(tokens) * c.num_kv_heads * c.head_dim;
    auto k = random_bits16(n, c.dtype, seed);
    auto v = random_bits16(n, c.dtype, seed + 100);
    s.ingest(slot, view(k.data(), c.dtype, {tokens, c.num_kv_heads, c.head_dim}),
             view(v.data(), c.dtype, {tokens, c.num_kv_heads, c.head_dim}));
  }

  // [n, Hkv, d] K or V views over k1_/v1_.
  TensorView kv(std::vector<std::uint16_t>& data, std::int64_t n) {
    return view(data.data(), DType::kF16, {n, mc_.num_kv_heads, mc_.head_dim});
  }

  // Fills every output buffer with poison.
  void poison() {
    score_out_.assign(64 * 16, kNaN);
    score_valid_out_.assign(64, kPoisonI);
    sel_ids_.assign(64 * 16, kPoisonI);
    sel_counts_.assign(64, kPoisonI);
    report_.resize(4, 16);
    std::fill(report_.base_counts.begin(), report_.base_counts.end(), kPoisonI);
    std::fill(report_.final_counts.begin(), report_.final_counts.end(), kPoisonI);
    attn_out_.assign(2 * 2 * 4 * 64 + 64, 0x7777u);
    attn_lse_.assign(2 * 2 * 4 + 4, -1234.5f);
    merge_out_.assign(8 * 64 + 8, -77.0f);
    merge_lse_.assign(8 + 4, -77.0f);
  }

  // The attention tests' backend: Hq 4 / Hkv 2, d 64, f16, block-select exact, up to
  // `max_query_tokens` query tokens a call.
  static AttentionConfig small_attention(int max_query_tokens) {
    AttentionConfig ac;
    ac.num_q_heads = 4;
    ac.num_kv_heads = 2;
    ac.head_dim = 64;
    ac.dtype = DType::kF16;
    ac.mode = AttentionMode::kBlockSelectExact;
    ac.max_query_tokens = max_query_tokens;
    return ac;
  }

  // Asserts that every output buffer still holds its poison.
  void expect_poison_intact(const std::string& row) {
    auto all = [](const auto& v, auto x) {
      for (const auto& e : v) {
        if (std::memcmp(&e, &x, sizeof x) != 0) return false;
      }
      return true;
    };
    EXPECT_TRUE(all(score_out_, kNaN)) << row << ": wrote scores";
    EXPECT_TRUE(all(score_valid_out_, kPoisonI)) << row << ": wrote num_valid";
    EXPECT_TRUE(all(sel_ids_, kPoisonI)) << row << ": wrote selection ids";
    EXPECT_TRUE(all(sel_counts_, kPoisonI)) << row << ": wrote selection counts";
    EXPECT_TRUE(all(report_.base_counts, kPoisonI)) << row << ": wrote the report";
    EXPECT_TRUE(all(report_.final_counts, kPoisonI)) << row << ": wrote the report";
    EXPECT_TRUE(all(attn_out_, std::uint16_t{0x7777u})) << row << ": wrote attention out";
    EXPECT_TRUE(all(attn_lse_, -1234.5f)) << row << ": wrote lse";
    EXPECT_TRUE(all(merge_out_, -77.0f)) << row << ": wrote merge out";
    EXPECT_TRUE(all(merge_lse_, -77.0f)) << row << ": wrote merge lse";
  }

  // Runs the rows: each must throw kvc::Error naming its words and change nothing.
  void run(const std::vector<Row>& rows) {
    int gaps_open = 0;
    std::string gap_notes;
    for (const Row& r : rows) {
      SCOPED_TRACE(r.name);
      poison();
      const StoreState m0 = StoreState::of(*main_), f0 = StoreState::of(*full_);
      bool threw = false;
      std::string what;
      try {
        r.call();
      } catch (const Error& e) {
        threw = true;
        what = e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << r.name << ": threw a non-kvc exception: " << e.what();
        continue;
      }
      if (!r.known_gap.empty() && (!threw || !names_all(what, r.words))) {
        ++gaps_open;
        gap_notes += "\n  KNOWN GAP " + r.name + ": " + r.known_gap +
                     (threw ? " (message: " + what + ")" : " (no error)");
      } else {
        EXPECT_TRUE(threw) << r.name << ": no kvc::Error";
        for (const std::string& w : r.words) {
          EXPECT_NE(what.find(w), std::string::npos)
              << r.name << ": message lacks '" << w << "': " << what;
        }
        EXPECT_NE(what.find("[check '"), std::string::npos) << r.name << ": " << what;
        if (!r.known_gap.empty()) {
          ADD_FAILURE() << r.name << " is rejected now: remove its KNOWN GAP mark";
        }
      }
      EXPECT_TRUE(StoreState::of(*main_) == m0) << r.name << ": changed store main_";
      EXPECT_TRUE(StoreState::of(*full_) == f0) << r.name << ": changed store full_";
      expect_poison_intact(r.name);
    }
    if (gaps_open > 0) {
      std::printf("[ KNOWN GAP ] %d row(s) not rejected yet (reported):%s\n", gaps_open,
                  gap_notes.c_str());
      RecordProperty("known_gaps", gaps_open);
    }
  }

  static bool names_all(const std::string& what, const std::vector<std::string>& words) {
    for (const std::string& w : words) {
      if (what.find(w) == std::string::npos) return false;
    }
    return true;
  }

  KvStoreConfig mc_, fc_;
  std::unique_ptr<KvStore> main_, full_;
  std::vector<std::uint16_t> k1_, v1_, q_;
  std::vector<float> scores_;
  std::vector<std::int32_t> num_valid_;
  // Outputs (poisoned before every row).
  std::vector<float> score_out_;
  std::vector<std::int32_t> score_valid_out_, sel_ids_, sel_counts_;
  HostSelectionReport report_;
  std::vector<std::uint16_t> attn_out_;
  std::vector<float> attn_lse_, merge_out_, merge_lse_;
};

// --- KvStore ---------------------------------------------------------------------------------

TEST_F(Cpu_Reliability_BadInput, KvStoreConfigAndCreate) {
  auto create_with = [this](std::function<void(KvStoreConfig&)> edit) {
    return [this, edit] {
      KvStoreConfig c = mc_;
      edit(c);
      KvStore::create(c, Device::cpu());
    };
  };
  std::vector<Row> rows = {
      {"head_dim 96", create_with([](KvStoreConfig& c) { c.head_dim = 96; }), {"head_dim = 96"}},
      {"head_dim 0", create_with([](KvStoreConfig& c) { c.head_dim = 0; }), {"head_dim = 0"}},
      {"num_kv_heads 0",
       create_with([](KvStoreConfig& c) { c.num_kv_heads = 0; }),
       {"num_kv_heads = 0"}},
      {"num_kv_heads 257",
       create_with([](KvStoreConfig& c) { c.num_kv_heads = 257; }),
       {"num_kv_heads = 257"}},
      {"max_slots 0", create_with([](KvStoreConfig& c) { c.max_slots = 0; }), {"max_slots = 0"}},
      {"max_slots 65537",
       create_with([](KvStoreConfig& c) { c.max_slots = 65537; }),
       {"max_slots = 65537"}},
      {"max_context 0",
       create_with([](KvStoreConfig& c) { c.max_context = 0; }),
       {"max_context = 0"}},
      {"recent_window past max_context",
       create_with([](KvStoreConfig& c) { c.recent_window = 129; }),
       {"recent_window = 129"}},
      {"recent_window 0",
       create_with([](KvStoreConfig& c) { c.recent_window = 0; }),
       {"recent_window = 0"}},
      {"block_size 0", create_with([](KvStoreConfig& c) { c.block_size = 0; }), {"block_size = 0"}},
      {"block_size 1025",
       create_with([](KvStoreConfig& c) { c.block_size = 1025; }),
       {"block_size = 1025"}},
      {"dtype f32", create_with([](KvStoreConfig& c) { c.dtype = DType::kF32; }), {"dtype = f32"}},
      {"old_format mxfp4 (key-only)",
       create_with([](KvStoreConfig& c) { c.old_format = Format::kMxfp4; }),
       {"old_format = mxfp4"}},
      {"old_format bf16 with dtype f16",
       create_with([](KvStoreConfig& c) { c.old_format = Format::kBF16; }),
       {"old_format = bf16"}},
      {"num_pool_blocks -1",
       create_with([](KvStoreConfig& c) { c.num_pool_blocks = -1; }),
       {"num_pool_blocks = -1"}},
      {"pool past 2^30",
       create_with([](KvStoreConfig& c) { c.num_pool_blocks = (1 << 30) + 1; }),
       {"num_pool_blocks = 1073741825"}},
      {"summaries without mean K",
       create_with([](KvStoreConfig& c) { c.summaries = 2; }),
       {"summaries = 2", "kSummaryMeanK"}},
      {"summaries unknown bit",
       create_with([](KvStoreConfig& c) { c.summaries = 17; }),
       {"summaries = 17"}},
      {"device without an implementation",
       [this] { KvStore::create(mc_, Device::cuda(99)); },
       {"device = cuda:99"}},
      // max_slots x Hkv x W x d x 4 = 2^16 x 2^8 x 2^29 x 2^9 x 4 = 2^64: the ring's size_t wraps
      // to 0 and the store would be created with a 0-byte ring (fuzz/crashes/store_config/).
      {"ring bytes overflow size_t",
       [] {
         KvStoreConfig c;
         c.num_kv_heads = 256;
         c.head_dim = 512;
         c.max_slots = 65536;
         c.max_context = 1 << 29;
         c.recent_window = 1 << 29;
         c.block_size = 1;
         c.validate();
       },
       {"store size", "2^48"}},
      // 49152 slots x 2^30 - 1 logical blocks: a 192 TiB block table (the pool is 16 blocks and
      // the store size below 2^48 B). Without the bound `create` ends in std::bad_alloc.
      {"block table past 2^30 entries",
       [this] {
         KvStoreConfig c = mc_;
         c.max_slots = 49152;
         c.max_context = 1 << 30;
         c.recent_window = 1;
         c.block_size = 1;
         c.num_pool_blocks = 16;
         KvStore::create(c, Device::cpu());
       },
       {"block table", "max_slots x max_blocks_per_slot = 49152 x 1073741823", "2^30"}},
      {"block table one slot past the bound",
       [this] {
         KvStoreConfig c = mc_;
         c.max_slots = 65;  // 65 x 2^24 blocks = 2^30 + 2^24 entries
         c.max_context = (1 << 24) * 64 + 16;
         c.recent_window = 16;
         c.block_size = 64;
         c.num_pool_blocks = 64;
         c.validate();
       },
       {"block table", "65 x 16777216 = 1090519040", "2^30"}},
  };
  run(rows);
  // At the bound: 64 slots x 2^24 blocks = 2^30 entries is a valid config.
  KvStoreConfig c = mc_;
  c.max_slots = 64;
  c.max_context = (1 << 24) * 64 + 16;
  c.recent_window = 16;
  c.block_size = 64;
  c.num_pool_blocks = 64;
  EXPECT_NO_THROW(c.validate());
}

TEST_F(Cpu_Reliability_BadInput, KvStoreSlotsAppendIngest) {
  auto app = [this](std::vector<int> slots, TensorView k, TensorView v) {
    return [this, slots, k, v] { main_->append(slots, k, v); };
  };
  TensorView k1 = kv(k1_, 1), v1 = kv(v1_, 1), k2 = kv(k1_, 2), v2 = kv(v1_, 2);
  TensorView k3d = view(k1_.data(), DType::kF16, {1, 3, 64});
  TensorView strided = k2;
  strided.stride[0] = 2 * mc_.num_kv_heads * mc_.head_dim;  // a gap between tokens
  std::vector<Row> rows = {
      // open_slot / reset / free / length
      {"open_slot with every slot open",
       [this] { full_->open_slot(); },
       {"all max_slots = 2 slots are open"}},
      {"reset slot -1", [this] { main_->reset(-1); }, {"slot = -1", "max_slots = 3"}},
      {"reset slot 3", [this] { main_->reset(3); }, {"slot = 3", "max_slots = 3"}},
      {"reset closed slot", [this] { main_->reset(2); }, {"slot = 2 is not an open slot"}},
      {"free slot 7", [this] { main_->free(7); }, {"slot = 7"}},
      {"free closed slot", [this] { main_->free(2); }, {"slot = 2 is not an open slot"}},
      {"length of slot -1", [this] { (void)main_->length(-1); }, {"slot = -1"}},
      {"length of a closed slot",
       [this] { (void)main_->length(2); },
       {"slot = 2 is not an open slot"}},
      {"num_closed_blocks of slot 9", [this] { (void)main_->num_closed_blocks(9); }, {"slot = 9"}},
      {"open_block_tokens of a closed slot",
       [this] { (void)main_->open_block_tokens(2); },
       {"slot = 2"}},
      // append
      {"append slot out of range", app({3}, k1, v1), {"slots[0] = 3", "max_slots = 3"}},
      {"append slot -1", app({-1}, k1, v1), {"slots[0] = -1"}},
      {"append closed slot", app({2}, k1, v1), {"slots[0] = 2 is not an open slot"}},
      {"append same slot twice", app({0, 0}, k2, v2), {"slots[1] = 0 appears twice"}},
      {"append k null", app({0}, null_data(k1), v1), {"k.data = null"}},
      {"append v null", app({0}, k1, null_data(v1)), {"v.data = null"}},
      {"append k misaligned", app({0}, shifted(k1, 1), v1), {"k.data", "aligned to 2"}},
      {"append k dtype bf16",
       app({0}, with_dtype(k1, DType::kBF16), v1),
       {"k.dtype = bf16", "f16"}},
      {"append v dtype f32", app({0}, k1, with_dtype(v1, DType::kF32)), {"v.dtype = f32"}},
      {"append k on cuda",
       app({0}, on_device(k1, Device::cuda(0)), v1),
       {"k.device = cuda:0", "cpu"}},
      {"append k heads 3", app({0}, k3d, v1), {"k.shape = [1, 3, 64]", "[1, 2, 64]"}},
      {"append k rows != slots", app({0}, k2, v2), {"k.shape = [2, 2, 64]", "[1, 2, 64]"}},
      {"append v rows != k rows", app({0, 1}, k2, v1), {"v.shape = [1, 2, 64]"}},
      {"append k not contiguous", app({0, 1}, strided, v2), {"k must be contiguous"}},
      {"append past max_context",
       [&] { full_->append({0}, k1, v1); },
       {"slot 0", "24 + 1", "exceeds max_context = 24"}},
      {"append with the pool exhausted",
       [&] { full_->append({1}, k1, v1); },
       {"pool exhausted", "needs 1 new blocks", "only 0"}},
      // ingest
      {"ingest slot 3", [&] { main_->ingest(3, k2, v2); }, {"slot = 3"}},
      {"ingest closed slot", [&] { main_->ingest(2, k2, v2); }, {"slot = 2 is not an open slot"}},
      {"ingest k rank 2",
       [&] {
         main_->ingest(0, view(k1_.data(), DType::kF16, {2, 64}), v2);
       },
       {"k.ndim = 2"}},
      {"ingest chunk longer than max_context",
       [&] {
         std::vector<std::uint16_t> big(129 * token());
         main_->ingest(0, kv(big, 129), kv(big, 129));
       },
       {"k.shape[0] = 129", "max_context = 128"}},
      {"ingest past max_context",
       [&] { full_->ingest(0, k1, v1); },
       {"24 + 1", "exceeds max_context = 24"}},
      {"ingest with the pool exhausted", [&] { full_->ingest(1, k2, v2); }, {"pool exhausted"}},
      {"ingest v shorter than k", [&] { main_->ingest(0, k2, v1); }, {"v.shape = [1, 2, 64]"}},
      {"ingest k null", [&] { main_->ingest(0, null_data(k2), v2); }, {"k.data = null"}},
      {"ingest k misaligned", [&] { main_->ingest(0, shifted(k2, 1), v2); }, {"aligned to 2"}},
      {"ingest k dtype i8",
       [&] { main_->ingest(0, with_dtype(k2, DType::kI8), v2); },
       {"k.dtype = i8"}},
      {"ingest v on cuda",
       [&] { main_->ingest(0, k2, on_device(v2, Device::cuda(1))); },
       {"v.device = cuda:1"}},
      {"ingest negative token count",
       [&] {
         TensorView kn = k1, vn = v1;
         kn.shape[0] = vn.shape[0] = -1;
         main_->ingest(0, kn, vn);
       },
       {"k.shape[0] = -1", "must be >= 0"}},
      {"append k rank 7 (past kMaxDims)",
       app(
           {0},
           [&] {
             TensorView kn = k1;
             kn.ndim = 7;
             return kn;
           }(),
           v1),
       {"k.ndim = 7", "kMaxDims = 5"}},
      {"append k rank -1",
       app(
           {0},
           [&] {
             TensorView kn = k1;
             kn.ndim = -1;
             return kn;
           }(),
           v1),
       {"k.ndim = -1"}},
      {"append k element count past 2^62",
       app(
           {0},
           [&] {
             TensorView kn = k1;  // 1 x 2^61 x 2^10 elements
             kn.shape[1] = std::int64_t{1} << 61;
             kn.shape[2] = 1024;
             return kn;
           }(),
           v1),
       {"k.shape = [1, 2305843009213693952, 1024]", "kMaxViewElements"}},
      {"append v negative head_dim extent",
       app({0}, k1,
           [&] {
             TensorView vn = v1;
             vn.shape[2] = -64;
             return vn;
           }()),
       {"v.shape[2] = -64", "must be >= 0"}},
  };
  run(rows);
}

TEST_F(Cpu_Reliability_BadInput, ComputeFootprint) {
  std::vector<Row> rows = {
      {"more lengths than slots",
       [this] {
         compute_footprint(mc_, {1, 2, 3, 4});
       },
       {"lengths.size() = 4", "max_slots = 3"}},
      {"length past max_context",
       [this] {
         compute_footprint(mc_, {1, 129});
       },
       {"lengths[1] = 129", "128"}},
      {"negative length", [this] { compute_footprint(mc_, {-1}); }, {"lengths[0] = -1"}},
      {"bad config",
       [this] {
         KvStoreConfig c = mc_;
         c.head_dim = 100;
         compute_footprint(c, {});
       },
       {"head_dim = 100"}},
  };
  run(rows);
}

// --- BlockIndex --------------------------------------------------------------------------------

TEST_F(Cpu_Reliability_BadInput, BlockIndex) {
  BlockIndexConfig ic;
  ic.num_q_heads = 4;
  ic.num_kv_heads = 2;
  ic.head_dim = 64;
  ic.dtype = DType::kF16;
  ic.max_query_tokens = 2;
  ic.max_batch = 2;
  auto index = BlockIndex::create(ic, Device::cpu());
  auto create_with = [ic](std::function<void(BlockIndexConfig&)> edit) {
    return [ic, edit] {
      BlockIndexConfig c = ic;
      edit(c);
      BlockIndex::create(c, Device::cpu());
    };
  };
  ScoresView out;
  out.scores = score_out_.data();
  out.num_valid = score_valid_out_.data();
  out.rows = 2;  // batch 1, T 1, Hkv 2
  out.max_blocks = main_->config().max_blocks_per_slot();
  TensorView q = view(q_.data(), DType::kF16, {1, 1, 4, 64});
  auto score = [&](KvStore& s, std::vector<int> slots, TensorView qv, ScoresView o) {
    return [&s, &index, slots, qv, o] { index->score(s, slots, qv, o); };
  };
  ScoresView rows3 = out, narrow = out, null_scores = out;
  rows3.rows = 3;
  narrow.max_blocks = out.max_blocks - 1;
  null_scores.scores = nullptr;
  std::vector<Row> rows = {
      {"create head_dim 96",
       create_with([](BlockIndexConfig& c) { c.head_dim = 96; }),
       {"head_dim = 96"}},
      {"create Hq not a multiple of Hkv",
       create_with([](BlockIndexConfig& c) { c.num_q_heads = 5; }),
       {"num_q_heads = 5", "num_kv_heads = 2"}},
      {"create group 129",
       create_with([](BlockIndexConfig& c) {
         c.num_kv_heads = 1;
         c.num_q_heads = 129;
       }),
       {"group size", "129"}},
      {"create dtype f32",
       create_with([](BlockIndexConfig& c) { c.dtype = DType::kF32; }),
       {"dtype = f32"}},
      {"create softmax_scale NaN",
       create_with([](BlockIndexConfig& c) { c.softmax_scale = kNaN; }),
       {"softmax_scale = nan"}},
      {"create softmax_scale inf",
       create_with([](BlockIndexConfig& c) { c.softmax_scale = kInf; }),
       {"softmax_scale = inf"}},
      {"create softmax_scale -1",
       create_with([](BlockIndexConfig& c) { c.softmax_scale = -1; }),
       {"softmax_scale = -1"}},
      {"create max_query_tokens 0",
       create_with([](BlockIndexConfig& c) { c.max_query_tokens = 0; }),
       {"max_query_tokens = 0"}},
      {"create max_batch 0",
       create_with([](BlockIndexConfig& c) { c.max_batch = 0; }),
       {"max_batch = 0"}},
      {"score store with other Hkv",
       [&] {
         BlockIndexConfig c = ic;
         c.num_kv_heads = 1;
         BlockIndex::create(c, Device::cpu())->score(*main_, {0}, q, out);
       },
       {"store num_kv_heads = 2", "num_kv_heads = 1"}},
      {"score store with other head_dim",
       [&] {
         BlockIndexConfig c = ic;
         c.head_dim = 128;
         BlockIndex::create(c, Device::cpu())->score(*main_, {0}, q, out);
       },
       {"store head_dim = 64", "head_dim = 128"}},
      {"score Quest without min/max summaries",
       [&] {
         BlockIndexConfig c = ic;
         c.score = SummaryScore::kQuestMinMax;
         BlockIndex::create(c, Device::cpu())->score(*full_, {0}, q, out);
       },
       {"kQuestMinMax", "kSummaryMinMaxK"}},
      {"score no slots", score(*main_, {}, q, out), {"slots.size() = 0"}},
      {"score batch past max_batch", score(*main_, {0, 1, 0}, q, out), {"slots.size() = 3"}},
      {"score q rank 3",
       score(*main_, {0}, view(q_.data(), DType::kF16, {1, 4, 64}), out),
       {"q.ndim = 3"}},
      {"score T 0",
       score(*main_, {0}, view(q_.data(), DType::kF16, {1, 0, 4, 64}), out),
       {"q.shape[1] = 0"}},
      {"score T past max_query_tokens",
       score(*main_, {0}, view(q_.data(), DType::kF16, {1, 3, 4, 64}), out),
       {"q.shape[1] = 3"}},
      {"score q dtype bf16",
       score(*main_, {0}, with_dtype(q, DType::kBF16), out),
       {"q.dtype = bf16"}},
      {"score q Hq 2",
       score(*main_, {0}, view(q_.data(), DType::kF16, {1, 1, 2, 64}), out),
       {"q.shape = [1, 1, 2, 64]"}},
      {"score q null", score(*main_, {0}, null_data(q), out), {"q.data = null"}},
      {"score q misaligned", score(*main_, {0}, shifted(q, 2), out), {"q.data", "aligned to 16"}},
      {"score closed slot", score(*main_, {2}, q, out), {"slots[0] = 2 is not an open slot"}},
      {"score slot out of range", score(*main_, {7}, q, out), {"slots[0] = 7"}},
      {"score out.scores null", score(*main_, {0}, q, null_scores), {"out.scores"}},
      {"score out.rows wrong", score(*main_, {0}, q, rows3), {"out.rows = 3", "must be 2"}},
      {"score out.max_blocks too small",
       score(*main_, {0}, q, narrow),
       {"out.max_blocks = 13", "= 14"}},
  };
  run(rows);
}

// --- Selector ------------------------------------------------------------------------------------

TEST_F(Cpu_Reliability_BadInput, SelectPolicy) {
  std::vector<Row> rows = {
      {"topk k -1", [] { SelectPolicy::topk(-1); }, {"k = -1"}},
      {"neighbors radius -1", [] { SelectPolicy::neighbors(2, -1); }, {"radius = -1"}},
      {"threshold delta NaN", [] { SelectPolicy::threshold(kNaN); }, {"delta = NaN"}},
      {"threshold delta -1", [] { SelectPolicy::threshold(-1.0f); }, {"delta = -1"}},
      {"threshold min > max",
       [] { SelectPolicy::threshold(0.5f, 5, 3); },
       {"min_blocks = 5", "max_blocks = 3"}},
      {"threshold max 0", [] { SelectPolicy::threshold(0.5f, 0, 0); }, {"max_blocks = 0"}},
      {"anchor id -1",
       [] {
         SelectPolicy::anchor(2, {3, -1});
       },
       {"anchors[1] = -1"}},
      {"anchor_neighbors radius -2",
       [] { SelectPolicy::anchor_neighbors(2, -2); },
       {"radius = -2"}},
      {"explicit include -2", [] { SelectPolicy::explicit_set(1, {-2}); }, {"include[0] = -2"}},
      {"explicit exclude -3",
       [] {
         SelectPolicy::explicit_set(1, {}, {0, -3});
       },
       {"exclude[1] = -3"}},
      {"score_cluster k 0", [] { SelectPolicy::score_cluster(0, 1.0f, 4); }, {"k = 0"}},
      {"score_cluster max < k",
       [] { SelectPolicy::score_cluster(4, 1.0f, 2); },
       {"max_blocks = 2", "k = 4"}},
      {"score_cluster delta inf is fine, -inf is not",
       [] { SelectPolicy::score_cluster(4, -kInf, 8); },
       {"delta = -inf"}},
      {"adaptive min 0",
       [] { SelectPolicy::score_cluster_adaptive(0, 4, 1.0f); },
       {"min_blocks = 0"}},
      {"top_p p 0", [] { SelectPolicy::top_p(0.0f); }, {"p = 0"}},
      {"top_p p 1.5", [] { SelectPolicy::top_p(1.5f); }, {"p = 1.5"}},
      {"top_p p NaN", [] { SelectPolicy::top_p(kNaN); }, {"p = nan"}},
      {"top_p softmax_scale NaN",
       [] { SelectPolicy::top_p(0.9f, 1, 8, kNaN); },
       {"softmax_scale = nan"}},
      {"top_p softmax_scale inf",
       [] { SelectPolicy::top_p(0.9f, 1, 8, kInf); },
       {"softmax_scale = inf"}},
      {"top_p softmax_scale 0",
       [] { SelectPolicy::top_p(0.9f, 1, 8, 0.0f); },
       {"softmax_scale = 0"}},
      {"in_order with an unknown order",
       [] { SelectPolicy::topk(2).in_order(static_cast<SelectPolicy::Order>(7)); },
       {"order = 7"}},
      {"unknown kind",
       [] {
         SelectPolicy p;
         p.kind = static_cast<SelectPolicy::Kind>(12);
         p.validate();
       },
       {"kind = 12"}},
  };
  run(rows);
}

TEST_F(Cpu_Reliability_BadInput, Selector) {
  auto selector = Selector::create(Device::cpu());
  const SelectPolicy top4 = SelectPolicy::topk(4);
  ScoresView sv;
  sv.scores = scores_.data();
  sv.num_valid = num_valid_.data();
  sv.rows = 4;
  sv.max_blocks = 16;
  SelectionView out;
  out.ids = sel_ids_.data();
  out.counts = sel_counts_.data();
  out.rows = 4;
  out.max_selected = 4;
  auto sel = [&](ScoresView s, SelectPolicy p, SelectionView o, bool with_report = false,
                 int report_rows = 4, int report_pitch = 4) {
    return [&, s, p, o, with_report, report_rows, report_pitch]() mutable {
      o.ids = o.ids ? sel_ids_.data() : nullptr;  // the poisoned buffers of this row
      o.counts = o.counts ? sel_counts_.data() : nullptr;
      SelectionReport r = report_.view();
      r.rows = report_rows;
      r.pitch = report_pitch;
      selector->select(s, p, o, with_report ? &r : nullptr);
    };
  };
  ScoresView neg_rows = sv, neg_blocks = sv, null_nv = sv, null_scores = sv, bad_nv = sv;
  neg_rows.rows = -1;
  neg_blocks.max_blocks = -1;
  null_nv.num_valid = nullptr;
  null_scores.scores = nullptr;
  std::vector<std::int32_t> nv_past = {5, 17, 5, 5}, nv_neg = {5, 5, -1, 5};
  bad_nv.num_valid = nv_past.data();
  ScoresView neg_nv = sv;
  neg_nv.num_valid = nv_neg.data();
  SelectionView rows3 = out, pitch3 = out, pitch_neg = out, null_ids = out, null_counts = out;
  rows3.rows = 3;
  pitch3.max_selected = 3;
  pitch_neg.max_selected = -1;
  null_ids.ids = nullptr;
  null_counts.counts = nullptr;
  SelectionView wide = out;
  wide.max_selected = 16;
  SelectPolicy bad_policy = top4;
  bad_policy.k = -3;
  std::int32_t row_out[8];
  std::vector<Row> rows = {
      {"create on an absent device", [] { Selector::create(Device::cuda(99)); }, {"cuda:99"}},
      {"invalid policy", sel(sv, bad_policy, out), {"k = -3"}},
      {"out.rows != scores.rows", sel(sv, top4, rows3), {"out.rows = 3", "scores.rows = 4"}},
      {"scores.rows -1", sel(neg_rows, top4, out), {"scores.rows = -1"}},
      {"scores.max_blocks -1", sel(neg_blocks, top4, out), {"scores.max_blocks = -1"}},
      {"pitch below the policy bound",
       sel(sv, top4, pitch3),
       {"out.max_selected = 3", "4 blocks", "never truncated"}},
      {"pitch below neighbors' bound",
       sel(sv, SelectPolicy::neighbors(2, 1), out),
       {"out.max_selected = 4", "6 blocks"}},
      {"pitch -1", sel(sv, top4, pitch_neg), {"out.max_selected = -1"}},
      {"num_valid null", sel(null_nv, top4, out), {"scores.num_valid = null"}},
      {"scores null", sel(null_scores, top4, out), {"scores.scores = null"}},
      {"out.ids null", sel(sv, top4, null_ids), {"out.ids = null"}},
      {"out.counts null", sel(sv, top4, null_counts), {"out.counts = null"}},
      {"num_valid past max_blocks",
       sel(bad_nv, top4, out),
       {"scores.num_valid[1] = 17", "max_blocks = 16"}},
      {"num_valid negative", sel(neg_nv, top4, out), {"scores.num_valid[2] = -1"}},
      {"report rows", sel(sv, top4, out, true, 3, 4), {"report.rows = 3"}},
      {"report pitch",
       sel(sv, SelectPolicy::topk(8), wide, true, 4, 7),
       {"report.pitch = 7", "8 blocks"}},
      {"select_row num_valid -1",
       [&] { select_row(scores_.data(), -1, top4, row_out, 8); },
       {"num_valid = -1"}},
      {"select_row scores null",
       [&] { select_row(nullptr, 3, top4, row_out, 8); },
       {"scores = null"}},
      {"select_row out null",
       [&] { select_row(scores_.data(), 3, top4, nullptr, 8); },
       {"out = null"}},
      {"select_row max_out too small",
       [&] { select_row(scores_.data(), 9, top4, row_out, 3); },
       {"max_out = 3", "4 blocks"}},
  };
  run(rows);
}

// --- AttentionBackend
// ------------------------------------------------------------------------------

TEST_F(Cpu_Reliability_BadInput, AttentionCreateAndDecode) {
  const AttentionConfig ac = small_attention(2);
  auto backend = AttentionBackend::create(ac, Device::cpu());
  auto create_with = [ac](std::function<void(AttentionConfig&)> edit) {
    return [ac, edit] {
      AttentionConfig c = ac;
      edit(c);
      AttentionBackend::create(c, Device::cpu());
    };
  };
  // A valid call: batch 1 (slot 0: 5 closed blocks), T 1, selection {4, 0} per kv head.
  std::vector<std::int32_t> ids = {4, 0, -1, 1, 2, -1}, counts = {2, 2};
  auto args = [&] {
    DecodeArgs a;
    a.slots = {0};
    a.q = view(q_.data(), DType::kF16, {1, 1, 4, 64});
    a.selection.ids = ids.data();
    a.selection.counts = counts.data();
    a.selection.rows = 2;
    a.selection.max_selected = 3;
    a.out = view(attn_out_.data(), DType::kF16, {1, 1, 4, 64});
    a.lse = view(attn_lse_.data(), DType::kF32, {1, 1, 4});
    return a;
  };
  poison();
  {  // the valid call works (and is not part of the table)
    DecodeArgs a = args();
    ASSERT_NO_THROW(backend->decode(*main_, a));
  }
  auto dec = [&](std::function<void(DecodeArgs&)> edit, AttentionBackend* b = nullptr,
                 KvStore* s = nullptr) {
    return [&, edit, b, s] {
      DecodeArgs a = args();
      edit(a);
      (b ? b : backend.get())->decode(s ? *s : *main_, a);
    };
  };
  AttentionConfig other = ac;
  other.num_kv_heads = 1;
  auto backend_hkv1 = AttentionBackend::create(other, Device::cpu());
  other = ac;
  other.head_dim = 128;
  auto backend_d128 = AttentionBackend::create(other, Device::cpu());
  other = ac;
  other.max_query_tokens = 32;
  auto backend_t32 = AttentionBackend::create(other, Device::cpu());
  other = ac;
  other.mode = AttentionMode::kBlockSummary;
  auto backend_summary = AttentionBackend::create(other, Device::cpu());
  other.num_representatives = 9;
  auto backend_reps9 = AttentionBackend::create(other, Device::cpu());
  std::vector<std::uint16_t> big_q(17 * 4 * 64), big_out(17 * 4 * 64);
  std::vector<Row> rows = {
      {"create Hq not a multiple",
       create_with([](AttentionConfig& c) {
         c.num_q_heads = 6;
         c.num_kv_heads = 4;
       }),
       {"num_q_heads = 6", "num_kv_heads = 4"}},
      {"create group 256",
       create_with([](AttentionConfig& c) {
         c.num_q_heads = 256;
         c.num_kv_heads = 1;
       }),
       {"group size", "256"}},
      {"create head_dim 96",
       create_with([](AttentionConfig& c) { c.head_dim = 96; }),
       {"head_dim = 96"}},
      {"create dtype f32",
       create_with([](AttentionConfig& c) { c.dtype = DType::kF32; }),
       {"dtype = f32"}},
      {"create softmax_scale NaN",
       create_with([](AttentionConfig& c) { c.softmax_scale = kNaN; }),
       {"softmax_scale = nan"}},
      {"create softmax_scale -inf",
       create_with([](AttentionConfig& c) { c.softmax_scale = -kInf; }),
       {"softmax_scale = -inf"}},
      {"create num_representatives 2000",
       create_with([](AttentionConfig& c) { c.num_representatives = 2000; }),
       {"num_representatives = 2000"}},
      {"create max_query_tokens 0",
       create_with([](AttentionConfig& c) { c.max_query_tokens = 0; }),
       {"max_query_tokens = 0"}},
      {"create unknown mode",
       create_with([](AttentionConfig& c) { c.mode = static_cast<AttentionMode>(99); }),
       {"mode = 99"}},
      {"create unknown representative policy",
       create_with([](AttentionConfig& c) {
         c.representative_policy = static_cast<RepresentativePolicy>(9);
       }),
       {"representative_policy = 9"}},
      {"create on an absent device",
       [ac] { AttentionBackend::create(ac, Device::cuda(99)); },
       {"cuda:99"}},
      {"store with other Hkv",
       dec([](DecodeArgs&) {}, backend_hkv1.get()),
       {"store num_kv_heads = 2", "num_kv_heads = 1"}},
      {"store with other head_dim",
       dec([](DecodeArgs&) {}, backend_d128.get()),
       {"store head_dim = 64", "head_dim = 128"}},
      {"q dtype bf16", dec([](DecodeArgs& a) { a.q.dtype = DType::kBF16; }), {"q.dtype = bf16"}},
      {"q null", dec([](DecodeArgs& a) { a.q.data = nullptr; }), {"q.data = null"}},
      {"q misaligned",
       dec([](DecodeArgs& a) { a.q = shifted(a.q, 2); }),
       {"q.data", "aligned to 16"}},
      {"q on cuda",
       dec([](DecodeArgs& a) { a.q.device = Device::cuda(0); }),
       {"q.device = cuda:0"}},
      {"q Hq 2",
       dec([&](DecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {1, 1, 2, 64});
       }),
       {"q.shape = [1, 1, 2, 64]"}},
      {"q batch != slots",
       dec([&](DecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {2, 1, 4, 64});
       }),
       {"q.shape = [2, 1, 4, 64]"}},
      {"T 0",
       dec([&](DecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {1, 0, 4, 64});
       }),
       {"T = 0"}},
      {"T past max_query_tokens",
       dec([&](DecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {1, 3, 4, 64});
       }),
       {"T = 3"}},
      {"T past the ring",
       dec(
           [&](DecodeArgs& a) {
             a.q = view(big_q.data(), DType::kF16, {1, 17, 4, 64});
             a.out = view(big_out.data(), DType::kF16, {1, 17, 4, 64});
             a.lse.data = nullptr;
           },
           backend_t32.get()),
       {"T = 17", "recent_window = 16"}},
      {"out dtype i32", dec([](DecodeArgs& a) { a.out.dtype = DType::kI32; }), {"out.dtype = i32"}},
      {"out shape",
       dec([&](DecodeArgs& a) {
         a.out = view(attn_out_.data(), DType::kF16, {1, 1, 4, 32});
       }),
       {"out.shape = [1, 1, 4, 32]"}},
      {"out null", dec([](DecodeArgs& a) { a.out.data = nullptr; }), {"out.data = null"}},
      {"lse dtype f16", dec([](DecodeArgs& a) { a.lse.dtype = DType::kF16; }), {"lse.dtype = f16"}},
      {"lse shape",
       dec([&](DecodeArgs& a) {
         a.lse = view(attn_lse_.data(), DType::kF32, {1, 4});
       }),
       {"lse.shape = [1, 4]"}},
      {"slot out of range",
       dec([](DecodeArgs& a) { a.slots = {9}; }),
       {"slots[0] = 9", "max_slots = 3"}},
      {"slot not open",
       dec([](DecodeArgs& a) { a.slots = {2}; }),
       {"slots[0] = 2 is not an open slot"}},
      {"slot shorter than T",
       dec([&](DecodeArgs& a) {
         a.slots = {1};
         a.q = view(q_.data(), DType::kF16, {1, 2, 4, 64});
         a.out = view(attn_out_.data(), DType::kF16, {1, 2, 4, 64});
         a.lse.data = nullptr;
         a.selection.rows = 4;
       }),
       {"slots[0] = 1 holds 1 tokens", "T = 2"}},
      {"summary mode without mean V",
       dec([](DecodeArgs&) {}, backend_summary.get(), full_.get()),
       {"kSummaryMeanV"}},
      {"representatives past block_size",
       dec([](DecodeArgs&) {}, backend_reps9.get()),
       {"num_representatives = 9", "block_size = 8"}},
      {"selection rows",
       dec([](DecodeArgs& a) { a.selection.rows = 1; }),
       {"selection.rows = 1", "must be 2"}},
      {"selection shared but rows per head",
       dec([](DecodeArgs& a) { a.selection.shared_across_heads = true; }),
       {"selection.rows = 2", "must be 1"}},
      {"selection counts null",
       dec([](DecodeArgs& a) { a.selection.counts = nullptr; }),
       {"selection.counts = null"}},
      {"selection ids null",
       dec([](DecodeArgs& a) { a.selection.ids = nullptr; }),
       {"selection.ids = null"}},
      {"selection pitch -1",
       dec([](DecodeArgs& a) { a.selection.max_selected = -1; }),
       {"selection.max_selected = -1"}},
      {"selection count past pitch",
       dec([&](DecodeArgs& a) {
         static std::int32_t c[2] = {4, 2};
         a.selection.counts = c;
       }),
       {"selection.counts[0] = 4", "max_selected = 3"}},
      {"selection count negative",
       dec([&](DecodeArgs& a) {
         static std::int32_t c[2] = {2, -1};
         a.selection.counts = c;
       }),
       {"selection.counts[1] = -1"}},
      {"selection id past the closed blocks",
       dec([&](DecodeArgs& a) {
         static std::int32_t i[6] = {4, 5, -1, 1, 2, -1};
         a.selection.ids = i;
       }),
       {"selection.ids[0][1] = 5", "closed blocks = 5"}},
      {"selection id -1 inside the count",
       dec([&](DecodeArgs& a) {
         static std::int32_t i[6] = {4, 0, -1, -1, 2, -1};
         a.selection.ids = i;
       }),
       {"selection.ids[1][0] = -1"}},
      {"selection id twice",
       dec([&](DecodeArgs& a) {
         static std::int32_t i[6] = {3, 3, -1, 1, 2, -1};
         a.selection.ids = i;
       }),
       {"selection.ids[0][1] = 3", "selected twice"}},
  };
  run(rows);
}

TEST_F(Cpu_Reliability_BadInput, DenseDecode) {
  const AttentionConfig ac = small_attention(2);
  auto backend = AttentionBackend::create(ac, Device::cpu());
  std::vector<std::uint16_t> cache = random_bits16(2 * 2 * 8 * 64 + 64, DType::kF16, 9);
  auto args = [&] {
    DenseDecodeArgs a;
    a.q = view(q_.data(), DType::kF16, {1, 1, 4, 64});
    a.k = view(cache.data(), DType::kF16, {1, 2, 8, 64});
    a.v = view(cache.data(), DType::kF16, {1, 2, 8, 64});
    a.lengths = {5};
    a.out = view(attn_out_.data(), DType::kF16, {1, 1, 4, 64});
    a.lse = view(attn_lse_.data(), DType::kF32, {1, 1, 4});
    return a;
  };
  auto dd = [&](std::function<void(DenseDecodeArgs&)> edit) {
    return [&, edit] {
      DenseDecodeArgs a = args();
      edit(a);
      backend->dense_decode(a);
    };
  };
  std::vector<Row> rows = {
      {"lengths != q batch",
       dd([](DenseDecodeArgs& a) {
         a.lengths = {5, 5};
       }),
       {"q.shape = [1, 1, 4, 64]", "[2, -1, 4, 64]"}},
      {"k dtype f32", dd([](DenseDecodeArgs& a) { a.k.dtype = DType::kF32; }), {"k.dtype = f32"}},
      {"v dtype != k dtype",
       dd([](DenseDecodeArgs& a) { a.v.dtype = DType::kBF16; }),
       {"v.dtype = bf16", "f16"}},
      {"k Hkv 1",
       dd([&](DenseDecodeArgs& a) {
         a.k = view(cache.data(), DType::kF16, {1, 1, 8, 64});
       }),
       {"k.shape = [1, 1, 8, 64]"}},
      {"v N != k N",
       dd([&](DenseDecodeArgs& a) {
         a.v = view(cache.data(), DType::kF16, {1, 2, 7, 64});
       }),
       {"v.shape = [1, 2, 7, 64]"}},
      {"k null", dd([](DenseDecodeArgs& a) { a.k.data = nullptr; }), {"k.data = null"}},
      {"v misaligned",
       dd([](DenseDecodeArgs& a) { a.v = shifted(a.v, 8); }),
       {"v.data", "aligned to 16"}},
      {"window -1", dd([](DenseDecodeArgs& a) { a.window = -1; }), {"window = -1"}},
      {"length below T",
       dd([](DenseDecodeArgs& a) { a.lengths = {0}; }),
       {"lengths[0] = 0", "T = 1"}},
      {"length past N",
       dd([](DenseDecodeArgs& a) { a.lengths = {9}; }),
       {"lengths[0] = 9", "N = 8"}},
      {"T 3",
       dd([&](DenseDecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {1, 3, 4, 64});
       }),
       {"T = 3"}},
      {"negative N",
       dd([&](DenseDecodeArgs& a) {
         a.k = view(cache.data(), DType::kF16, {1, 2, -4, 64});
         a.v = view(cache.data(), DType::kF16, {1, 2, -4, 64});
       }),
       {"k.shape[2] = -4", "must be >= 0"}},
      {"negative N, empty batch",
       dd([&](DenseDecodeArgs& a) {
         a.lengths = {};
         a.q = view(q_.data(), DType::kF16, {0, 1, 4, 64});
         a.out = view(attn_out_.data(), DType::kF16, {0, 1, 4, 64});
         a.lse = view(attn_lse_.data(), DType::kF32, {0, 1, 4});
         a.k = view(cache.data(), DType::kF16, {0, 2, -4, 64});
         a.v = view(cache.data(), DType::kF16, {0, 2, -4, 64});
       }),
       {"k.shape[2] = -4", "must be >= 0"}},
      {"q negative T",
       dd([&](DenseDecodeArgs& a) {
         a.q = view(q_.data(), DType::kF16, {1, -1, 4, 64});
       }),
       {"q.shape[1] = -1", "must be >= 0"}},
  };
  run(rows);
}

TEST_F(Cpu_Reliability_BadInput, MergeStates) {
  std::vector<float> a(8 * 64, 0.5f), la(8, 0.0f), b(8 * 64, 0.25f), lb(8, -1.0f);
  auto ov = [](std::vector<float>& v, std::int64_t n, std::int64_t d) {
    return view(v.data(), DType::kF32, {n, d});
  };
  auto lv = [](std::vector<float>& v, std::int64_t n) { return view(v.data(), DType::kF32, {n}); };
  auto m = [&](TensorView oa, TensorView lsa, TensorView ob, TensorView lsb, TensorView o,
               TensorView l) { return [=] { merge_states(oa, lsa, ob, lsb, o, l); }; };
  const TensorView A = ov(a, 8, 64), LA = lv(la, 8), Bv = ov(b, 8, 64), LB = lv(lb, 8);
  const TensorView O = ov(merge_out_, 8, 64), L = lv(merge_lse_, 8);
  std::vector<Row> rows = {
      {"out_a rank 1", m(lv(a, 8), LA, Bv, LB, O, L), {"out_a.ndim = 1"}},
      {"d 0", m(ov(a, 8, 0), LA, Bv, LB, O, L), {"d = 0"}},
      {"lse_a rows", m(A, lv(la, 7), Bv, LB, O, L), {"lse_a.shape = [7]"}},
      {"out_b shape", m(A, LA, ov(b, 8, 32), LB, O, L), {"out_b.shape = [8, 32]"}},
      {"out dtype f16", m(A, LA, Bv, LB, with_dtype(O, DType::kF16), L), {"out.dtype = f16"}},
      {"lse_b null", m(A, LA, Bv, null_data(LB), O, L), {"lse_b.data = null"}},
      {"out_b misaligned", m(A, LA, shifted(Bv, 2), LB, O, L), {"out_b.data", "aligned to 4"}},
      {"out_b on another device",
       m(A, LA, on_device(Bv, Device::cuda(0)), LB, O, L),
       {"out_b.device = cuda:0"}},
      {"in place: out rank 3",
       [&] {
         merge_states_inplace(view(merge_out_.data(), DType::kF32, {2, 4, 64}), L, Bv, LB);
       },
       {"out.ndim = 3"}},
      {"in place: lse_b dtype",
       [&] { merge_states_inplace(O, L, Bv, with_dtype(LB, DType::kI32)); },
       {"lse_b.dtype = i32"}},
  };
  run(rows);
}

// --- planner, names, views
// -------------------------------------------------------------------------

TEST_F(Cpu_Reliability_BadInput, PlannerAndParsing) {
  using namespace planner;
  auto fp = [](std::function<void(ModelSpec&)> edit, std::int64_t context = 4096, int batch = 1) {
    return [edit, context, batch] {
      ModelSpec m = smollm2_135m();
      edit(m);
      footprint(m, context, batch);
    };
  };
  const auto none = [](ModelSpec&) {};
  std::vector<Row> rows = {
      {"context 0", fp(none, 0), {"context = 0"}},
      {"batch 0", fp(none, 4096, 0), {"batch = 0"}},
      {"batch 65537", fp(none, 4096, 65537), {"batch = 65537"}},
      {"context past the model's", fp(none, 8193), {"context = 8193", "max_context = 8192"}},
      {"context past the csa kind's",
       fp(
           [](ModelSpec& m) {
             m = deepseek_v4_flash();
             m.max_context = 0;
           },
           (1 << 20) + 1),
       {"context = 1048577", "layer kind", "1048576"}},
      {"head_dim 96", fp([](ModelSpec& m) { m.head_dim = 96; }), {"head_dim = 96"}},
      {"num_kv_heads 0", fp([](ModelSpec& m) { m.num_kv_heads = 0; }), {"num_kv_heads = 0"}},
      {"kv_dtype f32", fp([](ModelSpec& m) { m.kv_dtype = DType::kF32; }), {"kv_dtype = f32"}},
      {"max_context -1", fp([](ModelSpec& m) { m.max_context = -1; }), {"max_context = -1"}},
      {"no layers", fp([](ModelSpec& m) { m.layers.clear(); }), {"layers is empty"}},
      {"layer count 0",
       fp([](ModelSpec& m) { m.layers[0].count = 0; }),
       {"layers[0] (layer 0, dense).count = 0"}},
      {"unknown layer kind",
       fp([](ModelSpec& m) { m.layers[0].kind = static_cast<LayerKind>(9); }),
       {".kind = 9"}},
      {"block_select old_format mxfp4",
       fp([](ModelSpec& m) {
         BlockSelectParams p;
         p.old_format = Format::kMxfp4;
         m.layers = {LayerSpec::block_select(2, p)};
       }),
       {".block.old_format = mxfp4"}},
      {"block_select block_size 0",
       fp([](ModelSpec& m) {
         BlockSelectParams p;
         p.block_size = 0;
         m.layers = {LayerSpec::dense(1), LayerSpec::block_select(2, p)};
       }),
       {"layers[1] (layer 1, block_select).block.block_size = 0"}},
      {"block_select summaries without mean K",
       fp([](ModelSpec& m) {
         BlockSelectParams p;
         p.summaries = kSummaryMeanV;
         m.layers = {LayerSpec::block_select(1, p)};
       }),
       {".block.summaries = 2"}},
      {"block_select format f16 with kv_dtype bf16",
       fp([](ModelSpec& m) {
         BlockSelectParams p;
         p.old_format = Format::kF16;
         m.layers = {LayerSpec::block_select(1, p)};
       }),
       {"layers[0]", "old_format = f16 needs dtype = f16"}},
      {"csa ratio 0",
       fp([](ModelSpec& m) {
         m.layers = {LayerSpec::csa(1, EntryFormat::k16Bit, Format::kMxfp4, 128, 0)};
       }),
       {".compressed.ratio = 0"}},
      {"window 0",
       fp([](ModelSpec& m) { m.layers = {LayerSpec::sliding_window(1, EntryFormat::k16Bit, 0)}; }),
       {".compressed.window = 0"}},
      {"dsv4_fp8 with head_dim 64",
       fp([](ModelSpec& m) { m.layers = {LayerSpec::hca(1, EntryFormat::kDsv4Fp8)}; }),
       {"dsv4_fp8 needs head_dim = 512", "head_dim = 64"}},
      {"compressor_state_bytes 9",
       fp([](ModelSpec& m) {
         m.layers = {LayerSpec::hca(1)};
         m.layers[0].compressed.compressor_state_bytes = 9;
       }),
       {".compressed.compressor_state_bytes = 9"}},
      {"mxfp4 indexer_dim 100",
       fp([](ModelSpec& m) {
         m.layers = {LayerSpec::csa(1, EntryFormat::k16Bit, Format::kMxfp4, 100)};
       }),
       {"indexer_dim = 100", "multiple of 32"}},
      {"indexer_format q8",
       fp([](ModelSpec& m) { m.layers = {LayerSpec::csa(1, EntryFormat::k16Bit, Format::kQ8)}; }),
       {"indexer_format = q8"}},
      {"bytes past 64 bits",
       fp(
           [](ModelSpec& m) {
             m.num_kv_heads = 256;
             m.head_dim = 512;
             m.max_context = 0;
           },
           (std::int64_t{1} << 31) - 1, 65536),
       {"does not fit 64 bits"}},
      {"entry_bytes dsv4_fp8 head_dim 128",
       [] { entry_bytes(EntryFormat::kDsv4Fp8, 128, 2); },
       {"head_dim = 128"}},
      {"entry_bytes 16bit of 4-byte elements",
       [] { entry_bytes(EntryFormat::k16Bit, 128, 4); },
       {"kv_dtype_bytes = 4"}},
      {"entry_bytes unknown format",
       [] { entry_bytes(static_cast<EntryFormat>(7), 512, 2); },
       {"entry_format = 7"}},
      {"entry_bytes head_dim 0", [] { entry_bytes(EntryFormat::k16Bit, 0, 2); }, {"head_dim = 0"}},
      {"indexer_key_bytes q8",
       [] { indexer_key_bytes(Format::kQ8, 128); },
       {"indexer_format = q8"}},
      {"indexer_key_bytes mxfp4 dim 48",
       [] { indexer_key_bytes(Format::kMxfp4, 48); },
       {"indexer_dim = 48"}},
      {"indexer_key_bytes dim 0",
       [] { indexer_key_bytes(Format::kFp8E4m3, 0); },
       {"indexer_dim = 0"}},
      {"store_config context 0", [] { store_config(smollm2_135m(), {}, 0, 1); }, {"context = 0"}},
      {"store_config batch 0", [] { store_config(smollm2_135m(), {}, 16, 0); }, {"batch = 0"}},
      {"parse_format unknown", [] { parse_format("q9"); }, {"format = 'q9'"}},
      {"parse_format empty", [] { parse_format(""); }, {"format = ''"}},
      {"parse_format wrong case", [] { parse_format("F16"); }, {"format = 'F16'"}},
      {"parse_attention_mode unknown", [] { parse_attention_mode("fast"); }, {"mode = 'fast'"}},
      {"TensorView rank 6",
       [] {
         TensorView::contiguous(nullptr, DType::kF32, {1, 1, 1, 1, 1, 1});
       },
       {"rank = 6", "kMaxDims = 5"}},
  };
  run(rows);
}

// NaN or inf in a query is data, not a bad argument (docs/reliability.md): decode does not read
// q on the host to validate it (on a GPU it is device memory) and throws nothing; a NaN query
// head gives a NaN output row and lse for that head only, the other heads are unaffected. The GPU
// counterpart is Cuda_Attention.NanPropagates.
TEST_F(Cpu_Reliability_BadInput, NanOrInfQueryIsNotAnErrorAndPropagates) {
  const AttentionConfig ac = small_attention(1);
  auto backend = AttentionBackend::create(ac, Device::cpu());
  std::vector<std::int32_t> ids = {4, 0, -1, 1, 2, -1}, counts = {2, 2};
  for (const std::uint16_t bad : {std::uint16_t{0x7e00u}, std::uint16_t{0x7c00u}}) {  // NaN, +inf
    SCOPED_TRACE(bad);
    std::vector<std::uint16_t> q(q_.begin(), q_.begin() + 4 * 64);
    q[1 * 64 + 7] = bad;  // head 1 (kv head 0)
    DecodeArgs a;
    a.slots = {0};
    a.q = view(q.data(), DType::kF16, {1, 1, 4, 64});
    a.selection.ids = ids.data();
    a.selection.counts = counts.data();
    a.selection.rows = 2;
    a.selection.max_selected = 3;
    a.out = view(attn_out_.data(), DType::kF16, {1, 1, 4, 64});
    a.lse = view(attn_lse_.data(), DType::kF32, {1, 1, 4});
    const StoreState m0 = StoreState::of(*main_);
    ASSERT_NO_THROW(backend->decode(*main_, a));
    EXPECT_TRUE(StoreState::of(*main_) == m0);
    for (int h = 0; h < 4; ++h) {
      const bool nan_row = h == 1 && bad == 0x7e00u;
      if (h == 1 && !nan_row) continue;  // +inf: NaN or inf-dominated, not specified
      EXPECT_EQ(std::isnan(attn_lse_[h]), nan_row) << "head " << h;
      for (int i = 0; i < 64; ++i) {
        const std::uint16_t o = attn_out_[h * 64 + i];
        const bool is_nan = (o & 0x7c00u) == 0x7c00u && (o & 0x3ffu) != 0;
        ASSERT_EQ(is_nan, nan_row) << "head " << h << " element " << i;
      }
    }
  }
}

// After all those rejected calls, the stores still work (and the rejected calls above left no
// half-done state behind: the next append goes exactly where it should).
TEST_F(Cpu_Reliability_BadInput, StoresStillWorkAfterRejectedCalls) {
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW(main_->append({0, 0}, kv(k1_, 2), kv(v1_, 2)), Error);
    EXPECT_THROW(full_->append({1}, kv(k1_, 1), kv(v1_, 1)), Error);
  }
  const int before = main_->length(1);
  main_->append({1}, kv(k1_, 1), kv(v1_, 1));
  EXPECT_EQ(main_->length(1), before + 1);
  full_->free(0);  // returns 4 blocks
  EXPECT_EQ(full_->free_pool_blocks(), 4);
  EXPECT_NO_THROW(full_->append({1}, kv(k1_, 1), kv(v1_, 1)));
  EXPECT_EQ(full_->length(1), 9);
  EXPECT_EQ(full_->open_slot(), 0);
}

}  // namespace
}  // namespace kvc
