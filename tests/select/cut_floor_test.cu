// select_detail::cut_floor_score (kernels/select/common.cuh): the spread path's sampled pass
// tests each raw score against the score of a cut's smallest key instead of encoding and shifting
// the 64-bit rank key. Host code, no GPU: against the key test it replaces, (encode(sk, id) >> (B
// - pbits)) >= prefix, a larger score key is always at or above the cut, a smaller one always
// below, and one equal to it always above where the cut ends between scores; for every id width
// 0..20, cuts of every prefix length (whole-score cuts, cuts inside the id bits, the empty prefix)
// and keys on, just above and just below the floor. And raw_score_floor, the same test on the raw
// float score, against the key test.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "select/common.cuh"

namespace kvc {
namespace {

using kernels::select_detail::Cut;
using kernels::select_detail::cut_floor_score;
using kernels::select_detail::KeyCodec;
using kernels::select_detail::make_key_codec;

bool key_at_or_above(const KeyCodec& codec, const Cut& c, std::uint32_t sk, int id) {
  const std::uint64_t ck = codec.encode(sk, id);
  return (ck >> (codec.bits - c.pbits)) >= c.prefix;
}

// A cut of pbits leading bits through the key of (sk, id): its prefix is that key's first pbits.
Cut cut_through(const KeyCodec& codec, std::uint32_t sk, int id, int pbits) {
  const std::uint64_t ck = codec.encode(sk, id);
  return Cut{pbits == 0 ? 0ull : ck >> (codec.bits - pbits), pbits, 0, 0};
}

// Whether cut c ends between scores: its smallest key's id part is zero.
bool between_scores(const KeyCodec& codec, const Cut& c) {
  const int shift = codec.bits - c.pbits;
  const std::uint64_t t = shift >= 64 ? 0ull : c.prefix << shift;
  return (t & codec.id_mask) == 0u;
}

// The floor's score test against the key test for key (sk, id).
::testing::AssertionResult floor_agrees(const KeyCodec& codec, const Cut& c, std::uint32_t sk,
                                        int id) {
  const std::uint32_t f = cut_floor_score(c, codec);
  const bool above = key_at_or_above(codec, c, sk, id);
  const bool ok = sk > f ? above : sk < f ? !above : (above || !between_scores(codec, c));
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "floor " << f << " sk " << sk << " id " << id << " above " << above << " cut prefix "
         << c.prefix << " pbits " << c.pbits;
}

TEST(Selector_CutScoreFloor, MatchesTheKeyTestOnRandomCuts) {
  std::mt19937_64 rng(0x5eedf100ull);
  for (int id_bits = 0; id_bits <= 20; ++id_bits) {
    SCOPED_TRACE("id bits " + std::to_string(id_bits));
    const KeyCodec codec = make_key_codec(1 << id_bits);
    ASSERT_EQ(codec.id_bits, id_bits);
    const int ids = 1 << id_bits;
    for (int trial = 0; trial < 400; ++trial) {
      const auto cut_sk = static_cast<std::uint32_t>(rng());
      const int cut_id = static_cast<int>(rng() % ids);
      const int pbits = static_cast<int>(rng() % (codec.bits + 1));
      const Cut c = cut_through(codec, cut_sk, cut_id, pbits);
      const std::uint32_t f = cut_floor_score(c, codec);
      // Keys around the floor's score (on it, one either side) and the cut's own score, with
      // ids around the cut's, and random keys.
      const std::uint32_t scores[] = {
          f, f + 1u, f - 1u, cut_sk, cut_sk + 1u, cut_sk - 1u, static_cast<std::uint32_t>(rng())};
      const int probe_ids[] = {0,
                               ids - 1,
                               cut_id,
                               cut_id + 1 < ids ? cut_id + 1 : 0,
                               cut_id > 0 ? cut_id - 1 : 0,
                               static_cast<int>(rng() % ids)};
      for (std::uint32_t sk : scores) {
        for (int id : probe_ids) ASSERT_TRUE(floor_agrees(codec, c, sk, id));
      }
    }
  }
}

// Every key of a small codec (3 id bits, score keys around a few values) against every cut.
TEST(Selector_CutScoreFloor, ExhaustiveOverASmallKeySpace) {
  const KeyCodec codec = make_key_codec(8);
  const std::uint32_t bases[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xfffffffeu};
  for (std::uint32_t base : bases) {
    for (std::uint32_t dsk = 0; dsk < 2; ++dsk) {
      for (int cid = 0; cid < 8; ++cid) {
        for (int pbits = 0; pbits <= codec.bits; ++pbits) {
          const Cut c = cut_through(codec, base + dsk, cid, pbits);
          for (std::uint32_t sk = base - 1u; sk != base + 3u; ++sk) {
            for (int id = 0; id < 8; ++id) ASSERT_TRUE(floor_agrees(codec, c, sk, id));
          }
        }
      }
    }
  }
}

// The cuts the sampled pass makes end inside no score: the floor is the cut's score prefix, and
// every id of it lies at or above the cut.
TEST(Selector_CutScoreFloor, WholeScoreCutsTakeEveryIdOfTheirScore) {
  const KeyCodec codec = make_key_codec(131072);
  for (std::uint32_t sk : {0u, 12345u, 0xbf800000u, 0xffffffffu}) {
    for (int pbits : {1, 12, 24, 32}) {
      const Cut c = cut_through(codec, sk, static_cast<int>(codec.id_mask), pbits);
      const std::uint32_t f = cut_floor_score(c, codec);
      ASSERT_TRUE(between_scores(codec, c));
      EXPECT_EQ(f, pbits == 32 ? sk : (sk >> (32 - pbits)) << (32 - pbits));
      for (int id : {0, 1, 65536, static_cast<int>(codec.id_mask)}) {
        EXPECT_TRUE(key_at_or_above(codec, c, f, id)) << "pbits " << pbits << " id " << id;
      }
    }
  }
}

// raw_score_floor: the whole-score floor's test on the raw float equals the test on its score
// key, for every float class (NaN of both signs and payloads, the infinities, the zeros,
// denormals, normals) against floors at every class of key, the unproduced ones included (between
// NaN's 0 and -inf's, 0x7fffffff, above +inf's) and the probes' own keys, one either side.
TEST(Selector_CutScoreFloor, RawFloatTestMatchesTheKeyTest) {
  using kernels::select_detail::raw_score_floor;
  using kernels::select_detail::RawScoreFloor;
  std::mt19937_64 rng(0xf10a7ull);
  std::vector<std::uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
      0xff800001u, 0x7fffffffu, 0xffffffffu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu,
      0x00800000u, 0x80800000u, 0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0xff7fffffu};
  for (int i = 0; i < 300; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<std::uint32_t> floors = {0u,          1u,          0x00123456u, 0x007ffffeu,
                                       0x007fffffu, 0x00800000u, 0x7ffffffeu, 0x7fffffffu,
                                       0x80000000u, 0x80000001u, 0xbf800000u, 0xff7fffffu,
                                       0xff800000u, 0xff800001u, 0xfffffffeu, 0xffffffffu};
  for (std::uint32_t b : bits) {
    const std::uint32_t k = select_rules::score_key(bits_float(b));
    for (std::uint32_t d : {0u, 1u, 0xffffffffu}) floors.push_back(k + d);
  }
  for (std::uint32_t fs : floors) {
    const RawScoreFloor r = raw_score_floor(fs);
    for (std::uint32_t b : bits) {
      const float x = bits_float(b);
      ASSERT_EQ(r.takes(x), select_rules::score_key(x) >= fs)
          << std::hex << "floor " << fs << " x bits " << b;
    }
  }
}

}  // namespace
}  // namespace kvc
