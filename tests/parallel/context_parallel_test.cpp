// Context parallelism on the CPU: N shard stores (N = 1..4) fed the same tokens as one unsharded
// store hold exactly its blocks; their local scores are its scores; the global selection from
// gathered candidates is its selection (every policy; the order too where
// global_order_is_exact); the merged (out, lse) equals its attention to float rounding in every
// mode, for batches of sequences of different lengths, formats f16 / q8 / fp16k_q4v, verify
// tokens and a sink; plus the loopback communicator, the step order and bad arguments.
#include "kvc/parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace {

using testing::expect_error;
using testing::random_bits16;
using Ids = std::vector<std::int32_t>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

KvStoreConfig store_config(Format f, int num_shards = 1, int shard = 0) {
  KvStoreConfig c;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_slots = 5;
  c.max_context = 420;
  c.recent_window = 16;
  c.block_size = 4;
  c.dtype = DType::kF16;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  c.num_shards = num_shards;
  c.shard_index = shard;
  return c;
}

// One unsharded store and its N shards, fed identical operations.
struct Group {
  KvStoreConfig base;
  int n = 1;
  std::unique_ptr<KvStore> full;
  std::vector<std::unique_ptr<KvStore>> shards;

  Group(const KvStoreConfig& c, int num_shards) : base(c), n(num_shards) {
    full = KvStore::create(c, Device::cpu());
    for (int r = 0; r < n; ++r) {
      KvStoreConfig sc = c;
      sc.num_shards = n;
      sc.shard_index = r;
      shards.push_back(KvStore::create(sc, Device::cpu()));
    }
  }
  std::vector<KvStore*> all() {
    std::vector<KvStore*> v{full.get()};
    for (auto& s : shards) v.push_back(s.get());
    return v;
  }
  void open(int count) {
    for (KvStore* s : all()) {
      for (int i = 0; i < count; ++i) s->open_slot();
    }
  }
  void ingest(int slot, std::vector<std::uint16_t>& k, std::vector<std::uint16_t>& v) {
    const std::int64_t T =
        static_cast<std::int64_t>(k.size()) / (base.num_kv_heads * base.head_dim);
    for (KvStore* s : all()) {
      s->ingest(
          slot, TensorView::contiguous(k.data(), base.dtype, {T, base.num_kv_heads, base.head_dim}),
          TensorView::contiguous(v.data(), base.dtype, {T, base.num_kv_heads, base.head_dim}));
    }
  }
  void append(const std::vector<int>& slots, std::vector<std::uint16_t>& k,
              std::vector<std::uint16_t>& v) {
    const std::int64_t n_slots = static_cast<std::int64_t>(slots.size());
    for (KvStore* s : all()) {
      s->append(
          slots,
          TensorView::contiguous(k.data(), base.dtype, {n_slots, base.num_kv_heads, base.head_dim}),
          TensorView::contiguous(v.data(), base.dtype,
                                 {n_slots, base.num_kv_heads, base.head_dim}));
    }
  }
};

// Fills `slots` slots to about the lengths given: a prefill ingest, then batched appends. Blocks
// 3, 9 and 10 of slot 0 repeat block 2's keys so their scores tie exactly.
void fill(Group& g, const std::vector<int>& lengths, std::uint32_t seed, bool nan_block = false) {
  const KvStoreConfig& c = g.base;
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const int appends = 6;
  g.open(static_cast<int>(lengths.size()));
  std::mt19937 rng(seed);
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    const int n = std::max(0, lengths[s] - appends);
    auto k = random_bits16(n * token, c.dtype, rng(), 2.0f);
    auto v = random_bits16(n * token, c.dtype, rng());
    if (s == 0) {
      const std::size_t blk = static_cast<std::size_t>(c.block_size) * token;
      for (int copy : {3, 9, 10}) {
        if ((copy + 1) * blk <= k.size()) {
          std::copy(k.begin() + 2 * blk, k.begin() + 3 * blk, k.begin() + copy * blk);
        }
      }
      if (nan_block && 6 * blk <= k.size()) k[5 * blk + 3] = 0x7e00;  // NaN key in block 5
    }
    if (n > 0) g.ingest(static_cast<int>(s), k, v);
  }
  std::vector<int> slots;
  for (std::size_t s = 0; s < lengths.size(); ++s) slots.push_back(static_cast<int>(s));
  for (int a = 0; a < appends; ++a) {
    std::vector<int> batch;
    for (int s : slots) {
      if (g.full->length(s) < lengths[static_cast<std::size_t>(s)]) batch.push_back(s);
    }
    if (batch.empty()) break;
    auto k = random_bits16(batch.size() * token, c.dtype, rng(), 2.0f);
    auto v = random_bits16(batch.size() * token, c.dtype, rng());
    g.append(batch, k, v);
  }
}

// ---------------------------------------------------------------------------------------------
// Sharded store

TEST(Cpu_Sharding_Config, OwnershipCountsAndValidation) {
  KvStoreConfig c = store_config(Format::kQ8);
  const int maxb = c.max_blocks_per_slot();  // (420 - 16) / 4 = 101
  EXPECT_EQ(maxb, 101);
  EXPECT_EQ(c.owned_blocks_per_slot(), 101);
  EXPECT_EQ(c.pool_blocks(), 5 * 101);
  c.num_shards = 3;
  int total = 0;
  for (int r = 0; r < 3; ++r) {
    c.shard_index = r;
    EXPECT_EQ(c.owned_blocks(0), 0);
    EXPECT_EQ(c.owned_blocks(1), r == 0 ? 1 : 0);
    EXPECT_EQ(c.owned_blocks(7), r == 0 ? 3 : 2);  // 0,3,6 | 1,4 | 2,5
    EXPECT_TRUE(c.owns_block(r + 3));
    EXPECT_FALSE(c.owns_block(r + 1));
    total += c.owned_blocks_per_slot();
    EXPECT_EQ(c.pool_blocks(), 5 * c.owned_blocks_per_slot());
  }
  EXPECT_EQ(total, 101);
  c.num_shards = 200;  // more shards than blocks: the last ones own nothing
  c.shard_index = 150;
  EXPECT_EQ(c.owned_blocks_per_slot(), 0);
  EXPECT_EQ(c.pool_blocks(), 0);
  EXPECT_NO_THROW(c.validate());
  auto bad = [](auto mutate, const char* word) {
    KvStoreConfig b = store_config(Format::kQ8);
    mutate(b);
    expect_error([&] { b.validate(); }, {word});
  };
  bad([](KvStoreConfig& b) { b.num_shards = 0; }, "num_shards = 0");
  bad([](KvStoreConfig& b) { b.shard_index = 1; }, "shard_index = 1");
  bad(
      [](KvStoreConfig& b) {
        b.num_shards = 4;
        b.shard_index = -1;
      },
      "shard_index = -1");
}

// Every owned block of every shard holds the unsharded store's bytes; nothing else is pooled.
void expect_shards_hold_the_blocks(Group& g) {
  std::vector<std::uint8_t> fb;
  const StoreView f = g.full->host_view(fb);
  const std::size_t kb = store::k_row_bytes(f), vb = store::v_row_bytes(f);
  const int B = f.block_size, H = f.num_kv_heads, d = f.head_dim;
  std::vector<int> held(static_cast<std::size_t>(g.n), 0);
  for (int r = 0; r < g.n; ++r) {
    std::vector<std::uint8_t> sb;
    const StoreView s = g.shards[static_cast<std::size_t>(r)]->host_view(sb);
    EXPECT_EQ(s.num_shards, g.n);
    EXPECT_EQ(s.shard_index, r);
    for (int slot = 0; slot < f.max_slots; ++slot) {
      if (!g.full->is_open(slot)) continue;
      const int L = f.lengths[slot];
      ASSERT_EQ(s.lengths[slot], L);
      // The ring is replicated.
      for (int h = 0; h < H; ++h) {
        for (int p = std::max(0, L - f.recent_window); p < L; ++p) {
          const std::size_t o = store::ring_row_index(f, slot, h, p % f.recent_window) * d * 2;
          ASSERT_EQ(std::memcmp(static_cast<const std::uint8_t*>(f.ring_k) + o,
                                static_cast<const std::uint8_t*>(s.ring_k) + o, d * 2),
                    0);
          ASSERT_EQ(std::memcmp(static_cast<const std::uint8_t*>(f.ring_v) + o,
                                static_cast<const std::uint8_t*>(s.ring_v) + o, d * 2),
                    0);
        }
      }
      const int old = std::max(0, L - f.recent_window);
      const int blocks = (old + B - 1) / B;
      for (int b = 0; b < f.max_blocks_per_slot; ++b) {
        const int spb = s.block_table[slot * s.max_blocks_per_slot + b];
        if (b >= blocks || b % g.n != r) {
          ASSERT_EQ(spb, -1) << "shard " << r << " slot " << slot << " block " << b;
          continue;
        }
        ++held[static_cast<std::size_t>(r)];
        const int fpb = f.block_table[slot * f.max_blocks_per_slot + b];
        const int rows = std::min(B, old - b * B);
        for (int h = 0; h < H; ++h) {
          const std::size_t fr = store::old_row_index(f, fpb, h, 0);
          const std::size_t sr = store::old_row_index(s, spb, h, 0);
          ASSERT_EQ(std::memcmp(f.old_k + fr * kb, s.old_k + sr * kb, rows * kb), 0);
          ASSERT_EQ(std::memcmp(f.old_v + fr * vb, s.old_v + sr * vb, rows * vb), 0);
          if (f.old_k_scale)
            ASSERT_EQ(std::memcmp(f.old_k_scale + fr, s.old_k_scale + sr, rows * 4), 0);
          if (f.old_v_scale)
            ASSERT_EQ(std::memcmp(f.old_v_scale + fr, s.old_v_scale + sr, rows * 4), 0);
          if (rows < B) continue;
          const std::size_t fo = store::block_head_index(f, fpb, h) * d;
          const std::size_t so = store::block_head_index(s, spb, h) * d;
          for (const auto& pair :
               {std::make_pair(f.mean_k, s.mean_k), std::make_pair(f.mean_v, s.mean_v),
                std::make_pair(f.min_k, s.min_k), std::make_pair(f.max_k, s.max_k)}) {
            const std::size_t eb = store::summary_elem_bytes(f);
            ASSERT_EQ(std::memcmp(static_cast<const std::uint8_t*>(pair.first) + fo * eb,
                                  static_cast<const std::uint8_t*>(pair.second) + so * eb, d * eb),
                      0)
                << "summaries of block " << b << " on shard " << r;
          }
        }
      }
    }
    const KvStore& shard = *g.shards[static_cast<std::size_t>(r)];
    EXPECT_EQ(shard.free_pool_blocks(),
              shard.config().pool_blocks() - held[static_cast<std::size_t>(r)]);
  }
}

class Cpu_Sharding_Store : public ::testing::TestWithParam<std::tuple<Format, int>> {};

TEST_P(Cpu_Sharding_Store, ShardsHoldExactlyTheirBlocks) {
  const auto [format, n] = GetParam();
  Group g(store_config(format), n);
  fill(g, {170, 259, 9, 37, 404}, 11 + n);
  expect_shards_hold_the_blocks(g);
  // The footprints split the old blocks; each shard pays the whole ring and the tables.
  std::vector<int> lens;
  for (int s = 0; s < 5; ++s) lens.push_back(std::min(g.full->length(s), g.base.recent_window));
  KvStoreConfig ring_only = g.base;  // the ring bytes in use: a store with no old blocks
  ring_only.max_context = ring_only.recent_window;
  const Footprint ring = compute_footprint(ring_only, lens);
  const std::size_t ring_bytes = ring.in_use - ring.tables;
  const Footprint whole = g.full->footprint();
  std::size_t old_bytes = 0;
  for (auto& s : g.shards) {
    const Footprint f = s->footprint();
    EXPECT_EQ(f.tokens, whole.tokens);
    EXPECT_EQ(f.ring, whole.ring);
    old_bytes += f.in_use - f.tables - ring_bytes;
  }
  EXPECT_EQ(old_bytes, whole.in_use - whole.tables - ring_bytes);
  // Resets return each shard's blocks; refilling gives the same state again.
  for (auto* s : g.all()) s->reset(1);
  for (auto& s : g.shards) {
    int held = 0;
    for (int slot : {0, 2, 3, 4}) {
      held += s->config().owned_blocks((std::max(0, s->length(slot) - 16) + 3) / 4);
    }
    EXPECT_EQ(s->free_pool_blocks(), s->config().pool_blocks() - held);
  }
  std::mt19937 rng(5);
  auto k = random_bits16(100 * 128, DType::kF16, rng());
  auto v = random_bits16(100 * 128, DType::kF16, rng());
  g.ingest(1, k, v);
  expect_shards_hold_the_blocks(g);
}

INSTANTIATE_TEST_SUITE_P(All, Cpu_Sharding_Store,
                         ::testing::Combine(::testing::Values(Format::kF16, Format::kQ8,
                                                              Format::kFp16kQ4v),
                                            ::testing::Values(1, 2, 3, 4)));

TEST(Cpu_Sharding_Store, PoolSizedForOwnedBlocksAndExhaustionNamed) {
  KvStoreConfig c = store_config(Format::kQ8, 4, 1);
  c.num_pool_blocks = 2;  // shard 1 owns blocks 1, 5, 9, ...: two of them fit
  auto s = KvStore::create(c, Device::cpu());
  s->open_slot();
  const std::size_t token = 2 * 64;
  auto k = random_bits16(52 * token, DType::kF16, 1);  // 36 old tokens: blocks 0..8, owns 1, 5
  s->ingest(0, TensorView::contiguous(k.data(), DType::kF16, {52, 2, 64}),
            TensorView::contiguous(k.data(), DType::kF16, {52, 2, 64}));
  EXPECT_EQ(s->free_pool_blocks(), 0);
  auto k2 = random_bits16(4 * token, DType::kF16, 2);  // block 9 starts: a third owned block
  expect_error(
      [&] {
        s->ingest(0, TensorView::contiguous(k2.data(), DType::kF16, {4, 2, 64}),
                  TensorView::contiguous(k2.data(), DType::kF16, {4, 2, 64}));
      },
      {"pool exhausted", "needs 1"});
  EXPECT_EQ(s->length(0), 52);
}

// ---------------------------------------------------------------------------------------------
// Index over a shard

TEST(Cpu_Sharding_Index, LocalScoresAreTheUnshardedScoresOfOwnedBlocks) {
  for (int n : {1, 2, 3, 4}) {
    Group g(store_config(Format::kFp16kQ4v), n);
    fill(g, {170, 259, 9, 37}, 3);
    for (bool shared : {false, true}) {
      BlockIndexConfig ic;
      ic.num_q_heads = 4;
      ic.num_kv_heads = 2;
      ic.head_dim = 64;
      ic.shared_across_heads = shared;
      ic.max_batch = 4;
      ic.max_query_tokens = 2;
      auto index = BlockIndex::create(ic, Device::cpu());
      const std::vector<int> slots{1, 3, 0, 2};
      auto q = random_bits16(4 * 2 * 4 * 64, DType::kF16, 9);
      const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {4, 2, 4, 64});
      const int rows = ic.rows(4, 2);
      const int maxb = g.base.max_blocks_per_slot();
      std::vector<float> fs(static_cast<std::size_t>(rows) * maxb);
      std::vector<std::int32_t> fv(rows);
      index->score(*g.full, slots, qv, ScoresView{fs.data(), fv.data(), rows, maxb});
      for (int r = 0; r < n; ++r) {
        const int owned = g.shards[r]->config().owned_blocks_per_slot();
        std::vector<float> ss(static_cast<std::size_t>(rows) * owned, kNaN);
        std::vector<std::int32_t> sv(rows, -7);
        index->score(*g.shards[r], slots, qv, ScoresView{ss.data(), sv.data(), rows, owned});
        for (int row = 0; row < rows; ++row) {
          ASSERT_EQ(sv[row], g.shards[r]->config().owned_blocks(fv[row]));
          for (int j = 0; j < sv[row]; ++j) {
            const float a = ss[static_cast<std::size_t>(row) * owned + j];
            const float b = fs[static_cast<std::size_t>(row) * maxb + j * n + r];
            ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "n " << n << " shard " << r << " row " << row;
          }
        }
        // A score view sized for the unsharded store is accepted; one too small is named.
        std::vector<float> small(static_cast<std::size_t>(rows) * std::max(owned - 1, 1));
        if (owned > 1 && n > 1) {
          expect_error(
              [&] {
                index->score(*g.shards[r], slots, qv,
                             ScoresView{small.data(), sv.data(), rows, owned - 1});
              },
              {"owned_blocks_per_slot", "blocks this shard can own"});
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The decode step

BlockIndexConfig index_config(bool shared, int T, int batch) {
  BlockIndexConfig ic;
  ic.num_q_heads = 4;
  ic.num_kv_heads = 2;
  ic.head_dim = 64;
  ic.shared_across_heads = shared;
  ic.max_batch = batch;
  ic.max_query_tokens = T;
  return ic;
}

ContextParallelConfig cp_config(const SelectPolicy& policy, AttentionMode mode, bool shared, int T,
                                int batch) {
  ContextParallelConfig c;
  c.index = index_config(shared, T, batch);
  c.policy = policy;
  c.attention.num_q_heads = 4;
  c.attention.num_kv_heads = 2;
  c.attention.head_dim = 64;
  c.attention.mode = mode;
  c.attention.max_query_tokens = T;
  c.attention.num_representatives = uses_summaries(mode) ? 2 : 0;
  return c;
}

struct Result {
  Ids ids;  // [rows, pitch]
  std::vector<int> counts;
  int pitch = 0;
  std::vector<float> out;  // [batch, T, Hq, d] f32
  std::vector<float> lse;  // [batch, T, Hq]
  HostSelectionReport report;
};

// The unsharded pipeline: score, select, attend.
Result single_device(const KvStore& store, const ContextParallelConfig& c,
                     const std::vector<int>& slots, const TensorView& q, const float* sink,
                     Telemetry* tm = nullptr) {
  Result res;
  const int batch = static_cast<int>(slots.size());
  const int T = static_cast<int>(q.shape[1]);
  const int rows = c.index.rows(batch, T);
  const int maxb = store.config().max_blocks_per_slot();
  DecodeArgs args;
  args.slots = slots;
  args.q = q;
  args.sink = sink;
  if (uses_selection(c.attention.mode)) {
    auto index = BlockIndex::create(c.index, Device::cpu());
    std::vector<float> scores(static_cast<std::size_t>(rows) * maxb);
    std::vector<std::int32_t> valid(rows);
    ScoresView sv{scores.data(), valid.data(), rows, maxb};
    index->score(store, slots, q, sv);
    res.pitch = c.policy.max_output(maxb);
    res.ids.assign(static_cast<std::size_t>(rows) * res.pitch, -1);
    res.counts.assign(rows, 0);
    SelectionView sel{res.ids.data(), res.counts.data(), rows, res.pitch,
                      c.index.shared_across_heads};
    res.report.resize(rows, res.pitch);
    SelectionReport rep = res.report.view();
    Selector::create(Device::cpu())->select(sv, c.policy, sel, &rep);
    args.selection = sel;
  }
  const int Hq = c.index.num_q_heads, d = c.index.head_dim;
  const std::int64_t qrows = static_cast<std::int64_t>(batch) * T * Hq;
  res.out.assign(qrows * d, kNaN);
  res.lse.assign(qrows, kNaN);
  args.out = TensorView::contiguous(res.out.data(), DType::kF32, {batch, T, Hq, d});
  args.lse = TensorView::contiguous(res.lse.data(), DType::kF32, {batch, T, Hq});
  AttentionBackend::create(c.attention, Device::cpu())->decode(store, args, tm);
  return res;
}

struct Sharded {
  std::vector<std::unique_ptr<ContextParallelDecoder>> decoders;
  std::vector<std::unique_ptr<ShardCommunicator>> comms;
  std::vector<std::vector<float>> outs, lses;
};

// The sharded pipeline through run_context_parallel_step; every shard gets the merged result.
Sharded context_parallel(Group& g, const ContextParallelConfig& c, const std::vector<int>& slots,
                         const TensorView& q, const float* sink,
                         std::vector<HostSelectionReport>* reports = nullptr) {
  Sharded sh;
  sh.comms = make_loopback_communicators(g.n);
  const int batch = static_cast<int>(slots.size());
  const int T = static_cast<int>(q.shape[1]);
  std::vector<ShardStep> steps(static_cast<std::size_t>(g.n));
  sh.outs.assign(g.n, std::vector<float>(static_cast<std::size_t>(batch) * T * 4 * 64, kNaN));
  sh.lses.assign(g.n, std::vector<float>(static_cast<std::size_t>(batch) * T * 4, kNaN));
  for (int r = 0; r < g.n; ++r) {
    sh.decoders.push_back(ContextParallelDecoder::create(c, g.shards[r]->config(), Device::cpu()));
    ShardStep& s = steps[r];
    s.decoder = sh.decoders.back().get();
    s.store = g.shards[r].get();
    s.comm = sh.comms[r].get();
    s.q = q;
    s.sink = sink;
    s.out = TensorView::contiguous(sh.outs[r].data(), DType::kF32, {batch, T, 4, 64});
    s.lse = TensorView::contiguous(sh.lses[r].data(), DType::kF32, {batch, T, 4});
  }
  if (reports == nullptr) {
    run_context_parallel_step(steps, slots);
    return sh;
  }
  // The same steps by hand, to collect the global selection's reports.
  for (auto& s : steps) s.decoder->select_local(*s.store, slots, s.q);
  for (auto& s : steps) s.decoder->exchange_candidates(*s.comm);
  reports->resize(g.n);
  for (int r = 0; r < g.n; ++r) {
    const SelectionView v = steps[r].decoder->selection();
    (*reports)[r].resize(v.rows, v.max_selected);
    SelectionReport rep = (*reports)[r].view();
    steps[r].decoder->select_global(*steps[r].store, &rep);
  }
  for (auto& s : steps) s.decoder->attend(*s.store, s.sink);
  for (auto& s : steps) s.decoder->exchange_states(*s.comm);
  for (auto& s : steps) s.decoder->merge(s.out, s.lse);
  return sh;
}

Ids row_ids(const std::int32_t* ids, int count) { return Ids(ids, ids + count); }

void expect_same_selection(const Result& want, const ContextParallelDecoder& dec,
                           const SelectPolicy& policy, const std::string& what) {
  const SelectionView got = dec.selection();
  ASSERT_EQ(got.rows, static_cast<int>(want.counts.size())) << what;
  for (int r = 0; r < got.rows; ++r) {
    Ids w = row_ids(want.ids.data() + static_cast<std::size_t>(r) * want.pitch, want.counts[r]);
    Ids g = row_ids(got.ids + static_cast<std::size_t>(r) * got.max_selected, got.counts[r]);
    if (!global_order_is_exact(policy)) {
      std::sort(w.begin(), w.end());
      std::sort(g.begin(), g.end());
    }
    ASSERT_EQ(g, w) << what << " row " << r;
    for (int i = got.counts[r]; i < got.max_selected; ++i) {
      ASSERT_EQ(got.ids[static_cast<std::size_t>(r) * got.max_selected + i], -1);
    }
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
      continue;
    }
    ASSERT_FALSE(std::isnan(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], want[i], 2e-5 + 2e-5 * std::fabs(want[i])) << what << " at " << i;
  }
}

// The policies whose selection is a rank prefix (their report is exact in full).
bool prefix_kind(const SelectPolicy& p) {
  using K = SelectPolicy::Kind;
  return p.kind == K::kTopK || p.kind == K::kThreshold || p.kind == K::kScoreCluster ||
         p.kind == K::kScoreClusterAdaptive || p.kind == K::kTopP;
}

struct StepCase {
  Format format;
  int shards;
  SelectPolicy policy;
  bool shared;
  int T;
};

void run_step_case(const StepCase& sc, AttentionMode mode, bool with_sink, std::uint32_t seed) {
  Group g(store_config(sc.format), sc.shards);
  // Lengths: many closed blocks, open blocks at different owners, no old tokens at all.
  fill(g, {170, 259, 9, 37, 404}, seed);
  const std::vector<int> slots{1, 4, 2, 0, 3, 0};  // a slot may repeat in a batch
  const int batch = static_cast<int>(slots.size());
  const ContextParallelConfig c = cp_config(sc.policy, mode, sc.shared, sc.T, batch);
  auto q = random_bits16(static_cast<std::size_t>(batch) * sc.T * 4 * 64, DType::kF16, seed + 1);
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {batch, sc.T, 4, 64});
  std::vector<float> sink{0.5f, -1.0f, 2.0f, 0.0f};
  const float* s = with_sink ? sink.data() : nullptr;
  const Result want = single_device(*g.full, c, slots, qv, s);
  std::vector<HostSelectionReport> reports;
  const Sharded got =
      context_parallel(g, c, slots, qv, s, uses_selection(mode) ? &reports : nullptr);
  const std::string what = std::string(to_string(sc.format)) + " N=" + std::to_string(sc.shards) +
                           " " + to_string(sc.policy.kind) + "/" + to_string(sc.policy.order) +
                           " mode " + to_string(mode) + (sc.shared ? " shared" : "") +
                           " T=" + std::to_string(sc.T);
  for (int r = 0; r < sc.shards; ++r) {
    if (uses_selection(mode)) {
      expect_same_selection(want, *got.decoders[r], sc.policy,
                            what + " shard " + std::to_string(r));
      const HostSelectionReport& rep = reports[r];
      for (int row = 0; row < rep.rows; ++row) {
        const float a = rep.cutoff_margin[row], b = want.report.cutoff_margin[row];
        ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)))
            << what << " cutoff margin row " << row << ": " << a << " vs " << b;
        ASSERT_EQ(rep.base_counts[row], want.report.base_counts[row]) << what;
        ASSERT_EQ(rep.final_counts[row], want.report.final_counts[row]) << what;
        for (int i = 0; i < rep.base_counts[row]; ++i) {
          ASSERT_EQ(rep.base_ids[row * rep.pitch + i], want.report.base_ids[row * want.pitch + i]);
        }
        if (prefix_kind(sc.policy)) {
          const float x = rep.score_spread[row], y = want.report.score_spread[row];
          ASSERT_TRUE(std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y))) << what;
        }
      }
    }
    expect_close(got.outs[r], want.out, what + " out, shard " + std::to_string(r));
    expect_close(got.lses[r], want.lse, what + " lse, shard " + std::to_string(r));
    // Every shard merges the same states in the same order: identical bits.
    ASSERT_EQ(std::memcmp(got.outs[r].data(), got.outs[0].data(), got.outs[0].size() * 4), 0);
    ASSERT_EQ(std::memcmp(got.lses[r].data(), got.lses[0].data(), got.lses[0].size() * 4), 0);
  }
  if (sc.shards == 1 && (!uses_selection(mode) || global_order_is_exact(sc.policy))) {
    // One shard is the unsharded computation, in the same order: bit for bit.
    ASSERT_EQ(std::memcmp(got.outs[0].data(), want.out.data(), want.out.size() * 4), 0) << what;
    ASSERT_EQ(std::memcmp(got.lses[0].data(), want.lse.data(), want.lse.size() * 4), 0) << what;
  }
}

class Cpu_ContextParallel_Exact : public ::testing::TestWithParam<std::tuple<Format, int, int>> {};

std::vector<SelectPolicy> policies() {
  using O = SelectPolicy::Order;
  return {SelectPolicy::topk(5),
          SelectPolicy::topk(0),
          SelectPolicy::topk(200),
          SelectPolicy::topk(7).in_order(O::kChronological),
          SelectPolicy::neighbors(4, 1),
          SelectPolicy::neighbors(3, 2).in_order(O::kChronological),
          SelectPolicy::neighbors(2, 1).in_order(O::kDescending),
          SelectPolicy::threshold(1.5f, 2, 12),
          SelectPolicy::threshold(kInf, 0, SelectPolicy::kNoLimit),
          SelectPolicy::anchor(3, {0, 5, 77}),
          SelectPolicy::anchor_neighbors(2, 1, {0}).in_order(O::kChronological),
          SelectPolicy::explicit_set(3, {1, 7}, {2}),
          SelectPolicy::score_cluster(3, 0.5f, 10),
          SelectPolicy::score_cluster_adaptive(2, 9, 0.3f).in_order(O::kDescending),
          SelectPolicy::top_p(0.8f, 1, 20, 1.0f)};
}

TEST_P(Cpu_ContextParallel_Exact, EveryPolicyMatchesOneStore) {
  const auto [format, n, variant] = GetParam();
  const bool shared = variant == 1;
  const int T = variant == 2 ? 3 : 1;
  std::uint32_t seed = 100;
  for (const SelectPolicy& p : policies()) {
    run_step_case({format, n, p, shared, T}, AttentionMode::kBlockSelectExact, variant == 2,
                  seed++);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, Cpu_ContextParallel_Exact,
    ::testing::Combine(::testing::Values(Format::kF16, Format::kQ8, Format::kFp16kQ4v),
                       ::testing::Values(1, 2, 3, 4), ::testing::Values(0, 1, 2)));

TEST(Cpu_ContextParallel_Modes, EveryAttentionModeMergesToOneStore) {
  const AttentionMode modes[] = {AttentionMode::kDense,
                                 AttentionMode::kDenseRecentOnly,
                                 AttentionMode::kRecentOnly,
                                 AttentionMode::kBlockSummary,
                                 AttentionMode::kBlockSelectLossy,
                                 AttentionMode::kBlockSelectExact};
  for (int n : {1, 2, 3, 4}) {
    for (AttentionMode m : modes) {
      for (int T : {1, 4}) {
        run_step_case({Format::kFp16kQ4v, n, SelectPolicy::topk(6), false, T}, m, true, 7 * n + T);
      }
    }
  }
}

TEST(Cpu_ContextParallel_Selection, TiesAndNaNScoresRankAsOnOneStore) {
  // Blocks 2, 3, 9 and 10 of slot 0 tie exactly; block 5 has a NaN key, so its score is NaN.
  for (int n : {2, 3, 4}) {
    Group g(store_config(Format::kF16), n);
    fill(g, {170, 259}, 21, /*nan_block=*/true);
    const std::vector<int> slots{0, 1};
    for (const SelectPolicy& p : policies()) {
      const ContextParallelConfig c = cp_config(p, AttentionMode::kBlockSelectExact, false, 1, 2);
      auto q = random_bits16(2 * 4 * 64, DType::kF16, 5);
      const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {2, 1, 4, 64});
      // The selection only (attention over a NaN block would be NaN on both sides).
      auto index = BlockIndex::create(c.index, Device::cpu());
      const int rows = c.index.rows(2, 1), maxb = g.base.max_blocks_per_slot();
      std::vector<float> scores(static_cast<std::size_t>(rows) * maxb);
      std::vector<std::int32_t> valid(rows);
      ScoresView sv{scores.data(), valid.data(), rows, maxb};
      index->score(*g.full, slots, qv, sv);
      ASSERT_TRUE(std::isnan(scores[5]));  // slot 0, kv head 0, block 5
      ASSERT_EQ(scores[2], scores[9]);
      Result want;
      want.pitch = p.max_output(maxb);
      want.ids.assign(static_cast<std::size_t>(rows) * want.pitch, -1);
      want.counts.assign(rows, 0);
      SelectionView sel{want.ids.data(), want.counts.data(), rows, want.pitch, false};
      Selector::create(Device::cpu())->select(sv, p, sel);
      auto comms = make_loopback_communicators(n);
      std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
      for (int r = 0; r < n; ++r) {
        dec.push_back(ContextParallelDecoder::create(c, g.shards[r]->config(), Device::cpu()));
        dec[r]->select_local(*g.shards[r], slots, qv);
      }
      for (int r = 0; r < n; ++r) dec[r]->exchange_candidates(*comms[r]);
      for (int r = 0; r < n; ++r) {
        dec[r]->select_global(*g.shards[r]);
        expect_same_selection(want, *dec[r], p,
                              std::string(to_string(p.kind)) + " N=" + std::to_string(n));
      }
    }
  }
}

TEST(Cpu_ContextParallel_Telemetry, ShardCountsAddUpToOneStore) {
  for (AttentionMode m :
       {AttentionMode::kDense, AttentionMode::kDenseRecentOnly, AttentionMode::kBlockSummary,
        AttentionMode::kBlockSelectLossy, AttentionMode::kBlockSelectExact}) {
    const int n = 3;
    Group g(store_config(Format::kQ8), n);
    fill(g, {170, 259, 9, 37, 404}, 8);
    const std::vector<int> slots{0, 1, 2, 3, 4};
    const ContextParallelConfig c = cp_config(SelectPolicy::neighbors(3, 1), m, false, 2, 5);
    auto q = random_bits16(5 * 2 * 4 * 64, DType::kF16, 4);
    const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {5, 2, 4, 64});
    Telemetry whole;
    single_device(*g.full, c, slots, qv, nullptr, &whole);
    auto comms = make_loopback_communicators(n);
    std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
    for (int r = 0; r < n; ++r) {
      dec.push_back(ContextParallelDecoder::create(c, g.shards[r]->config(), Device::cpu()));
      dec[r]->select_local(*g.shards[r], slots, qv);
    }
    for (int r = 0; r < n; ++r) dec[r]->exchange_candidates(*comms[r]);
    std::vector<Telemetry> parts(n);
    for (int r = 0; r < n; ++r) {
      dec[r]->select_global(*g.shards[r]);
      dec[r]->attend(*g.shards[r], nullptr, &parts[r]);
    }
    for (int row = 0; row < whole.rows; ++row) {
      AttendedTokens sum;
      for (const Telemetry& t : parts) {
        sum.recent += t.tokens[row].recent;
        sum.old_exact += t.tokens[row].old_exact;
        sum.summaries += t.tokens[row].summaries;
        sum.representatives += t.tokens[row].representatives;
      }
      ASSERT_EQ(sum.recent, whole.tokens[row].recent) << to_string(m) << " row " << row;
      ASSERT_EQ(sum.old_exact, whole.tokens[row].old_exact) << to_string(m) << " row " << row;
      ASSERT_EQ(sum.summaries, whole.tokens[row].summaries) << to_string(m);
      ASSERT_EQ(sum.representatives, whole.tokens[row].representatives) << to_string(m);
      ASSERT_EQ(parts[1].tokens[row].recent, 0);  // the ring counts on shard 0 only
    }
  }
}

TEST(Cpu_ContextParallel, OutputInTheAttentionDtypeAndNoLse) {
  Group g(store_config(Format::kFp16kQ4v), 2);
  fill(g, {170, 259}, 2);
  const std::vector<int> slots{0, 1};
  const ContextParallelConfig c =
      cp_config(SelectPolicy::topk(4), AttentionMode::kBlockSelectExact, false, 1, 2);
  auto q = random_bits16(2 * 4 * 64, DType::kF16, 3);
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {2, 1, 4, 64});
  const Result want = single_device(*g.full, c, slots, qv, nullptr);
  auto comms = make_loopback_communicators(2);
  std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
  std::vector<std::vector<std::uint16_t>> outs(2, std::vector<std::uint16_t>(2 * 4 * 64, 0xffff));
  std::vector<ShardStep> steps(2);
  for (int r = 0; r < 2; ++r) {
    dec.push_back(ContextParallelDecoder::create(c, g.shards[r]->config(), Device::cpu()));
    steps[r] = ShardStep{
        dec[r].get(),   g.shards[r].get(),
        comms[r].get(), qv,
        nullptr,        TensorView::contiguous(outs[r].data(), DType::kF16, {2, 1, 4, 64}),
        TensorView{}};
  }
  run_context_parallel_step(steps, slots);
  for (std::size_t i = 0; i < want.out.size(); ++i) {
    const float got = bits16_to_float(outs[0][i], false);
    ASSERT_NEAR(got, want.out[i], 2e-3 + 1e-3 * std::fabs(want.out[i])) << i;
    ASSERT_EQ(outs[0][i], outs[1][i]);
  }
}

TEST(Cpu_ContextParallel, RepeatedStepsAfterAppendsStayExact) {
  // A decode loop: append a token to every sequence, then a step; the open block moves from
  // shard to shard and blocks close on their owners.
  const int n = 3;
  Group g(store_config(Format::kQ8), n);
  fill(g, {60, 77, 18}, 31);
  const std::vector<int> slots{0, 1, 2};
  const ContextParallelConfig c =
      cp_config(SelectPolicy::neighbors(2, 1), AttentionMode::kBlockSelectExact, false, 1, 3);
  auto comms = make_loopback_communicators(n);
  std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
  for (int r = 0; r < n; ++r) {
    dec.push_back(ContextParallelDecoder::create(c, g.shards[r]->config(), Device::cpu()));
  }
  std::mt19937 rng(4);
  for (int step = 0; step < 12; ++step) {
    auto k = random_bits16(3 * 128, DType::kF16, rng(), 2.0f);
    auto v = random_bits16(3 * 128, DType::kF16, rng());
    g.append(slots, k, v);
    auto q = random_bits16(3 * 4 * 64, DType::kF16, rng());
    const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {3, 1, 4, 64});
    const Result want = single_device(*g.full, c, slots, qv, nullptr);
    std::vector<std::vector<float>> outs(n, std::vector<float>(3 * 4 * 64, kNaN));
    std::vector<std::vector<float>> lses(n, std::vector<float>(3 * 4, kNaN));
    for (int r = 0; r < n; ++r) {
      // One "process" per shard would call decode(); here they interleave through the loopback.
      dec[r]->select_local(*g.shards[r], slots, qv);
      dec[r]->exchange_candidates(*comms[r]);
    }
    for (int r = 0; r < n; ++r) {
      dec[r]->select_global(*g.shards[r]);
      dec[r]->attend(*g.shards[r], nullptr);
      dec[r]->exchange_states(*comms[r]);
    }
    for (int r = 0; r < n; ++r) {
      dec[r]->merge(TensorView::contiguous(outs[r].data(), DType::kF32, {3, 1, 4, 64}),
                    TensorView::contiguous(lses[r].data(), DType::kF32, {3, 1, 4}));
      expect_same_selection(want, *dec[r], c.policy, "step " + std::to_string(step));
      expect_close(outs[r], want.out, "out step " + std::to_string(step));
      expect_close(lses[r], want.lse, "lse step " + std::to_string(step));
    }
  }
}

// The example of docs/parallel.md ("Wiring it into an engine"), compiled and run: N shards
// driven by one thread, the loopback standing in for NCCL.
TEST(Cpu_ContextParallel_Docs, Example) {
  const int N = 2;
  const kvc::Device device = kvc::Device::cpu();  // an engine: kvc::Device::cuda(r) for shard r
  kvc::KvStoreConfig store_config;
  store_config.num_kv_heads = 2;
  store_config.head_dim = 64;
  store_config.max_context = 4096;
  store_config.recent_window = 64;
  store_config.block_size = 16;
  kvc::ContextParallelConfig cp;
  cp.index.num_q_heads = cp.attention.num_q_heads = 8;
  cp.index.num_kv_heads = cp.attention.num_kv_heads = 2;
  cp.index.head_dim = cp.attention.head_dim = 64;
  std::vector<std::uint16_t> k = random_bits16(1000 * 2 * 64, DType::kF16, 1);
  std::vector<std::uint16_t> q = random_bits16(8 * 64, DType::kF16, 2);
  const kvc::TensorView prompt_k = TensorView::contiguous(k.data(), DType::kF16, {1000, 2, 64});
  const kvc::TensorView new_q = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 8, 64});
  std::vector<std::vector<float>> out(N, std::vector<float>(8 * 64)), lse(N, std::vector<float>(8));
  // example-begin parallel
  // Once: one store and one decoder per shard (per GPU), and the communicators.
  cp.policy = kvc::SelectPolicy::topk(8);
  auto comms = kvc::make_loopback_communicators(N);  // GPUs: kvc::create_nccl_communicators(ids)
  std::vector<std::unique_ptr<kvc::KvStore>> stores;
  std::vector<std::unique_ptr<kvc::ContextParallelDecoder>> decoders;
  for (int r = 0; r < N; ++r) {
    kvc::KvStoreConfig sc = store_config;
    sc.num_shards = N;
    sc.shard_index = r;
    stores.push_back(kvc::KvStore::create(sc, device));
    decoders.push_back(kvc::ContextParallelDecoder::create(cp, sc, device));
  }
  // Prefill: every shard ingests every token (it keeps only its own old blocks).
  for (auto& store : stores) {
    const int slot = store->open_slot();
    store->ingest(slot, prompt_k, prompt_k);
  }
  // Every decode step (after every shard appended the new token): one call for all shards.
  const std::vector<int> slots{0};
  std::vector<kvc::ShardStep> steps;
  for (int r = 0; r < N; ++r) {
    steps.push_back({decoders[r].get(), stores[r].get(), comms[r].get(), new_q, nullptr,
                     kvc::TensorView::contiguous(out[r].data(), kvc::DType::kF32, {1, 1, 8, 64}),
                     kvc::TensorView::contiguous(lse[r].data(), kvc::DType::kF32, {1, 1, 8})});
  }
  kvc::run_context_parallel_step(steps, slots);  // out[r], lse[r]: the same on every shard
  // example-end parallel
  for (int r = 0; r < N; ++r) {
    // 936 old tokens: 58 closed blocks, 29 on each shard.
    EXPECT_EQ(stores[r]->config().owned_blocks(stores[r]->num_closed_blocks(0)), 29);
  }
  EXPECT_EQ(out[0], out[1]);
  auto whole = KvStore::create(store_config, device);
  whole->open_slot();
  whole->ingest(0, prompt_k, prompt_k);
  const Result want = single_device(*whole, cp, slots, new_q, nullptr);
  expect_close(out[0], want.out, "docs example out");
  expect_close(lse[0], want.lse, "docs example lse");
}

// ---------------------------------------------------------------------------------------------
// Candidates, communicators, errors

TEST(Cpu_ContextParallel, CandidatesPerRow) {
  EXPECT_EQ(candidates_per_row(SelectPolicy::topk(8), 100), 9);
  EXPECT_EQ(candidates_per_row(SelectPolicy::topk(8), 5), 5);
  EXPECT_EQ(candidates_per_row(SelectPolicy::topk(0), 5), 1);
  EXPECT_EQ(candidates_per_row(SelectPolicy::topk(3), 0), 0);
  EXPECT_EQ(candidates_per_row(SelectPolicy::neighbors(4, 3), 100), 5);
  EXPECT_EQ(candidates_per_row(SelectPolicy::explicit_set(2, {50}), 100), 3);
  EXPECT_EQ(candidates_per_row(SelectPolicy::threshold(1.0f, 2, 16), 100), 17);
  EXPECT_EQ(candidates_per_row(SelectPolicy::threshold(1.0f), 100), 100);
  EXPECT_EQ(candidates_per_row(SelectPolicy::score_cluster(4, 1.0f, 12), 100), 13);
  EXPECT_EQ(candidates_per_row(SelectPolicy::score_cluster_adaptive(2, 30, 1.0f), 20), 20);
  EXPECT_EQ(candidates_per_row(SelectPolicy::top_p(0.9f, 1, 4), 100), 100);
  expect_error([] { candidates_per_row(SelectPolicy::topk(3), -1); }, {"owned_blocks = -1"});
  EXPECT_TRUE(global_order_is_exact(SelectPolicy::topk(3)));
  EXPECT_TRUE(global_order_is_exact(SelectPolicy::top_p(0.5f)));
  EXPECT_FALSE(global_order_is_exact(SelectPolicy::neighbors(3, 1)));
  EXPECT_TRUE(global_order_is_exact(
      SelectPolicy::neighbors(3, 1).in_order(SelectPolicy::Order::kChronological)));
  EXPECT_FALSE(global_order_is_exact(SelectPolicy::anchor(3)));
}

TEST(Cpu_Loopback, AllGatherCompletesWhenTheLastShardCalls) {
  auto comms = make_loopback_communicators(3);
  ASSERT_EQ(comms.size(), 3u);
  std::vector<std::vector<int>> send(3), recv(3, std::vector<int>(12, -1));
  for (int r = 0; r < 3; ++r) send[r] = {10 * r, 10 * r + 1, 10 * r + 2, 10 * r + 3};
  comms[2]->all_gather(send[2].data(), recv[2].data(), 16, nullptr);
  comms[0]->all_gather(send[0].data(), recv[0].data(), 16, nullptr);
  EXPECT_EQ(recv[0][0], -1);  // not before the last shard
  expect_error([&] { comms[0]->all_gather(send[0].data(), recv[0].data(), 16, nullptr); },
               {"shard 0", "twice"});
  expect_error([&] { comms[1]->all_gather(send[1].data(), recv[1].data(), 8, nullptr); },
               {"sends 8 bytes", "16"});
  comms[1]->all_gather(send[1].data(), recv[1].data(), 16, nullptr);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(recv[r], (std::vector<int>{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}));
  }
  EXPECT_EQ(comms[1]->num_shards(), 3);
  EXPECT_EQ(comms[1]->shard_index(), 1);
  expect_error([] { make_loopback_communicators(0); }, {"num_shards = 0"});
}

TEST(Cpu_Nccl, EntryPointsSayWhetherNcclIsBuiltIn) {
  if (nccl_available()) {
    expect_error([] { make_nccl_communicator(nullptr); }, {"comm = null"});
  } else {
    expect_error([] { make_nccl_communicator(nullptr); }, {"without NCCL"});
    expect_error([] { create_nccl_communicators({0, 1}); }, {"without NCCL"});
  }
}

TEST(Cpu_ContextParallel, BadArgumentsAndStepOrderAreNamed) {
  Group g(store_config(Format::kQ8), 2);
  fill(g, {170, 40}, 1);
  const std::vector<int> slots{0, 1};
  ContextParallelConfig c =
      cp_config(SelectPolicy::topk(4), AttentionMode::kBlockSelectExact, false, 1, 2);
  auto bad_config = [&](auto mutate, const char* word) {
    ContextParallelConfig b = c;
    mutate(b);
    expect_error([&] { ContextParallelDecoder::create(b, g.shards[0]->config(), Device::cpu()); },
                 {word});
  };
  bad_config([](ContextParallelConfig& b) { b.attention.num_q_heads = 8; },
             "attention.num_q_heads = 8");
  bad_config([](ContextParallelConfig& b) { b.attention.head_dim = 128; },
             "attention.head_dim = 128");
  bad_config([](ContextParallelConfig& b) { b.attention.dtype = DType::kBF16; },
             "attention.dtype = bf16");
  bad_config([](ContextParallelConfig& b) { b.index.max_query_tokens = 2; },
             "attention.max_query_tokens = 1");
  bad_config([](ContextParallelConfig& b) { b.policy.k = -1; }, "k = -1");
  KvStoreConfig other = g.shards[0]->config();
  other.head_dim = 128;
  expect_error([&] { ContextParallelDecoder::create(c, other, Device::cpu()); },
               {"store head_dim = 128"});

  auto dec = ContextParallelDecoder::create(c, g.shards[0]->config(), Device::cpu());
  auto comms = make_loopback_communicators(2);
  auto wrong = make_loopback_communicators(3);
  auto q = random_bits16(2 * 4 * 64, DType::kF16, 3);
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {2, 1, 4, 64});
  expect_error([&] { dec->select_global(*g.shards[0]); },
               {"select_global", "must follow exchange_candidates"});
  expect_error([&] { dec->exchange_candidates(*comms[0]); }, {"must follow select_local"});
  expect_error([&] { dec->select_local(*g.shards[1], slots, qv); },
               {"shard 1 of 2", "serves shard 0 of 2"});
  expect_error([&] { dec->select_local(*g.full, slots, qv); }, {"shard 0 of 1"});
  expect_error([&] { dec->select_local(*g.shards[0], {0, 1, 0}, qv); }, {"slots.size() = 3"});
  expect_error([&] { dec->select_local(*g.shards[0], {0, 4}, qv); }, {"slots[1] = 4"});
  dec->select_local(*g.shards[0], slots, qv);
  EXPECT_EQ(dec->candidate_exchange().bytes, static_cast<std::size_t>(c.index.rows(2, 1)) * 5 * 8);
  expect_error([&] { dec->exchange_candidates(*comms[1]); }, {"rank 1 of 2", "shard 0 of 2"});
  expect_error([&] { dec->exchange_candidates(*wrong[0]); }, {"rank 0 of 3"});
  expect_error([&] { dec->attend(*g.shards[0], nullptr); },
               {"attend", "must follow select_global"});
  expect_error([&] { dec->merge(TensorView{}, TensorView{}); },
               {"merge", "must follow exchange_states"});

  std::vector<ShardStep> steps(2);
  auto dec1 = ContextParallelDecoder::create(c, g.shards[1]->config(), Device::cpu());
  steps[0] = ShardStep{dec1.get(), g.shards[1].get(), comms[1].get(), qv, nullptr, {}, {}};
  steps[1] = ShardStep{dec.get(), g.shards[0].get(), comms[0].get(), qv, nullptr, {}, {}};
  expect_error([&] { run_context_parallel_step(steps, slots); },
               {"shards[0]", "shard_index = 1", "shard order"});
  steps.resize(1);
  expect_error([&] { run_context_parallel_step(steps, slots); },
               {"num_shards = 2", "shards.size() = 1"});
}

}  // namespace
}  // namespace kvc
