// Fuzz target: BlockIndexConfig validation and the CPU BlockIndex's score() on small stores with
// arbitrary scores, key sources, aggregates, shared rows, verify tokens, two-stage candidates
// and out-of-range fields, over K with NaN / ±inf sprinkled in and arbitrary query values.
// Invariants:
//   - a bad config or call throws a well-formed kvc::Error before anything is written (the
//     poisoned outputs stay poisoned);
//   - for a valid call, num_valid of every row is its sequence's closed blocks, and nothing past
//     them is written;
//   - two-stage token mass (candidates > 0): every block outside the first stage's selection
//     (SelectPolicy::anchor(C, {0}) of a one-stage index with candidate_score) scores -inf, and
//     with at least as many candidates as closed blocks the scores are one stage's, bit for bit.
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace {

using namespace kvc;
using kvc::fuzz::Input;

constexpr float kPoison = -12345.0f;

struct Scored {
  bool threw = false;
  std::vector<float> scores;
  std::vector<std::int32_t> valid;
};

Scored run(const BlockIndexConfig& c, const KvStore& store, const std::vector<int>& slots,
           std::vector<std::uint16_t>& q, int T, int rows, int pitch) {
  Scored r;
  r.scores.assign(static_cast<std::size_t>(rows) * pitch, kPoison);
  r.valid.assign(static_cast<std::size_t>(rows), -7);
  try {
    auto index = BlockIndex::create(c, Device::cpu());
    index->score(store, slots,
                 TensorView::contiguous(
                     q.data(), DType::kF16,
                     {static_cast<std::int64_t>(slots.size()), T, c.num_q_heads, c.head_dim}),
                 ScoresView{r.scores.data(), r.valid.data(), rows, pitch});
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    r.threw = true;
    for (float v : r.scores) FUZZ_CHECK(fuzz::same_bits(v, kPoison), "scores written, then threw");
    for (std::int32_t v : r.valid) FUZZ_CHECK(v == -7, "num_valid written, then threw");
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  // A small valid store: 1-2 kv heads, d 64, blocks of 8 or 16, two sequences.
  KvStoreConfig sc;
  sc.num_kv_heads = 1 + in.u8() % 2;
  sc.head_dim = 64;
  sc.block_size = in.flag() ? 8 : 16;
  sc.recent_window = sc.block_size * (1 + in.u8() % 3);
  sc.max_slots = 2;
  sc.max_context = 160;
  const Format olds[] = {Format::kF16, Format::kQ8, Format::kFp16kQ4v};
  sc.old_format = in.pick(olds);
  sc.summaries =
      kSummaryMeanK | (in.flag() ? kSummaryMinMaxK : 0u) | (in.flag() ? kSummaryIndexKeys : 0u);
  sc.index_format = in.flag() ? Format::kMxfp4 : Format::kFp8E4m3;
  auto store = KvStore::create(sc, Device::cpu());
  const std::size_t token = static_cast<std::size_t>(sc.num_kv_heads) * sc.head_dim;
  for (int s = 0; s < 2; ++s) {
    store->open_slot();
    const int n = static_cast<int>(in.range(0, sc.max_context));
    std::vector<std::uint16_t> kv(static_cast<std::size_t>(n) * token);
    for (std::size_t i = 0; i < kv.size(); ++i)
      kv[i] = static_cast<std::uint16_t>(0x3000u + ((i * 2654435761u) >> 20) % 0x1000u) |
              static_cast<std::uint16_t>(((i * 2654435761u) >> 7) & 0x8000u);
    for (int i = in.u8() % 4; i > 0 && !kv.empty(); --i) {  // NaN and ±inf in K
      const std::uint16_t specials[] = {0x7e00u, 0x7c00u, 0xfc00u};
      kv[in.u32() % kv.size()] = in.pick(specials);
    }
    if (n == 0) continue;
    try {  // the store's own rules for non-finite K are fuzz_store_config's subject
      store->ingest(s, TensorView::contiguous(kv.data(), DType::kF16, {n, sc.num_kv_heads, 64}),
                    TensorView::contiguous(kv.data(), DType::kF16, {n, sc.num_kv_heads, 64}));
    } catch (const Error& e) {
      FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    }
  }

  BlockIndexConfig c;
  c.num_kv_heads = sc.num_kv_heads;
  c.num_q_heads = sc.num_kv_heads * (1 + in.u8() % 3);
  c.head_dim = 64;
  c.score = static_cast<SummaryScore>(in.u8() % 5);  // 4 is not a SummaryScore
  c.aggregate = in.flag() ? GqaAggregate::kSum : GqaAggregate::kMax;
  c.shared_across_heads = in.flag();
  c.token_keys = in.flag() ? TokenKeys::kOldBlocks : TokenKeys::kIndexCopy;
  c.max_query_tokens = 1 + in.u8() % 3;
  c.max_batch = 2;
  c.max_blocks_per_slot = in.flag() ? sc.max_blocks_per_slot() : in.biased_int(40);
  c.candidates = in.flag() ? in.u8() % 12 : in.biased_int(20);
  c.candidate_score = static_cast<SummaryScore>(in.u8() % 5);
  c.kernel = in.flag() ? IndexKernel::kAuto : static_cast<IndexKernel>(in.u8() % 4);
  const int T = 1 + in.u8() % c.max_query_tokens;
  const std::vector<int> slots = in.flag() ? std::vector<int>{1, 0} : std::vector<int>{0};
  const int batch = static_cast<int>(slots.size());
  const int pitch = sc.max_blocks_per_slot() + (in.flag() ? in.u8() % 3 : 0);
  const int rows = batch * T * (c.shared_across_heads ? 1 : c.num_kv_heads);
  std::vector<std::uint16_t> q(static_cast<std::size_t>(batch) * T * c.num_q_heads * 64);
  for (std::uint16_t& x : q) x = in.u16();  // any f16, NaN and ±inf included

  bool valid_config = true;
  try {
    c.validate();
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    valid_config = false;
  }
  const Scored got = run(c, *store, slots, q, T, rows, pitch);
  FUZZ_CHECK(valid_config || got.threw, "score() accepted a config validate() refuses");
  if (got.threw) return 0;
  const int per_token = c.shared_across_heads ? 1 : c.num_kv_heads;
  for (int r = 0; r < rows; ++r) {
    const int closed = store->num_closed_blocks(slots[static_cast<std::size_t>(r / per_token / T)]);
    FUZZ_CHECK(got.valid[static_cast<std::size_t>(r)] == closed, "row %d: num_valid %d != %d", r,
               got.valid[static_cast<std::size_t>(r)], closed);
    for (int j = closed; j < pitch; ++j) {
      FUZZ_CHECK(fuzz::same_bits(got.scores[static_cast<std::size_t>(r) * pitch + j], kPoison),
                 "row %d: block %d past the closed ones written", r, j);
    }
  }
  if (c.score != SummaryScore::kTokenMass || c.candidates == 0) return 0;

  // The first stage alone, and one stage.
  BlockIndexConfig first = c;
  first.score = c.candidate_score;
  first.candidates = 0;
  const Scored f = run(first, *store, slots, q, T, rows, pitch);
  FUZZ_CHECK(!f.threw, "the first stage alone threw where two stages did not");
  BlockIndexConfig one = c;
  one.candidates = 0;
  const Scored o = run(one, *store, slots, q, T, rows, pitch);
  FUZZ_CHECK(!o.threw, "one stage threw where two stages did not");
  const SelectPolicy policy = SelectPolicy::anchor(c.candidates, {0});
  for (int r = 0; r < rows; ++r) {
    const int closed = got.valid[static_cast<std::size_t>(r)];
    const float* row = got.scores.data() + static_cast<std::size_t>(r) * pitch;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(policy.max_output(closed)) + 1);
    const int n = select_row(f.scores.data() + static_cast<std::size_t>(r) * pitch, closed, policy,
                             ids.data(), static_cast<int>(ids.size()));
    std::vector<char> in_set(static_cast<std::size_t>(closed), 0);
    for (int i = 0; i < n; ++i)
      in_set[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])] = 1;
    for (int j = 0; j < closed; ++j) {
      if (!in_set[static_cast<std::size_t>(j)]) {
        FUZZ_CHECK(fuzz::same_bits(row[j], -std::numeric_limits<float>::infinity()),
                   "row %d: block %d is no candidate, yet scores %g", r, j, row[j]);
      }
      if (c.candidates >= closed) {
        FUZZ_CHECK(fuzz::same_bits(row[j], o.scores[static_cast<std::size_t>(r) * pitch + j]),
                   "row %d: block %d: every block a candidate, yet %g != one stage's %g", r, j,
                   row[j], o.scores[static_cast<std::size_t>(r) * pitch + j]);
      }
    }
  }
  return 0;
}
