// Fuzz target: every format codec of kvc/formats/formats.h and the 16-bit conversions of
// kvc/core/numeric.h, on arbitrary bytes (decoders) and arbitrary float vectors incl. NaN, ±inf,
// subnormals and FLT_MAX (encoders). Checks the outcomes formats.h documents:
//   - decoders: any code/scale byte decodes without UB; e4m3 0x7f/0xff and ue8m0 0xff are NaN,
//     everything else finite; q8/q4/fp8 decode = the correctly rounded product;
//   - conversions: f16/bf16/e4m3 bits round-trip through float (NaN → the canonical code);
//   - encoders: a non-finite vector gets a NaN scale (0xFF per mxfp4 group), zero payload and
//     NaN decodes; an all-zero vector gets scale +0 and decodes to zeros; any other finite vector
//     gets a finite scale > 0, finite decodes, |error| <= scale/2 (q8, int4) and the e2m1/e4m3
//     relative bound; encoding twice gives the same bits; mxfp4's payload rearranged into the
//     index copy's words (mxfp4_to_index_words) decodes to the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"

namespace {

using namespace kvc;
using namespace kvc::formats;
using kvc::fuzz::Input;
using kvc::fuzz::same_bits;

bool any_nonfinite(const std::vector<float>& x, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    if (!std::isfinite(x[i])) return true;
  }
  return false;
}

bool all_zero(const std::vector<float>& x, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    if (x[i] != 0.0f) return false;
  }
  return true;
}

// Correctly rounded float product through an exact double product (code * scale: <= 9 + 24 bits).
float exact_product(float code, float scale) {
  return static_cast<float>(static_cast<double>(code) * static_cast<double>(scale));
}

void check_decoders(Input& in) {
  const std::uint8_t byte = in.u8();
  const float scale = in.biased_float();
  // q8: rn(q * scale).
  const auto q = static_cast<std::int8_t>(byte);
  const float d8 = q8_decode(q, scale);
  const float r8 = exact_product(static_cast<float>(q), scale);
  FUZZ_CHECK(std::isnan(d8) == std::isnan(r8) && (std::isnan(d8) || d8 == r8),
             "q8_decode(%d, %a) = %a, expected %a", q, scale, d8, r8);
  // int4: both nibbles, sign-extended (code -8 is never produced but must decode).
  const std::uint8_t packed[1] = {byte};
  for (int i = 0; i < 2; ++i) {
    const int code = q4_code(i ? (byte >> 4) : (byte & 0xfu));
    FUZZ_CHECK(code >= -8 && code <= 7, "q4_code = %d", code);
    const float d4 = q4_decode(packed, i, scale);
    const float r4 = exact_product(static_cast<float>(code), scale);
    FUZZ_CHECK(std::isnan(d4) == std::isnan(r4) && (std::isnan(d4) || d4 == r4),
               "q4_decode(%02x, %d, %a) = %a, expected %a", byte, i, scale, d4, r4);
  }
  // e4m3 and ue8m0 bytes.
  const float e = e4m3_to_float(byte);
  const bool e_nan = (byte & 0x7fu) == 0x7fu;
  FUZZ_CHECK(std::isnan(e) == e_nan, "e4m3_to_float(%02x) = %a", byte, e);
  if (!e_nan) {
    FUZZ_CHECK(std::fabs(e) <= kE4m3Max, "e4m3_to_float(%02x) = %a beyond 448", byte, e);
    FUZZ_CHECK(float_to_e4m3(e) == byte, "e4m3 %02x -> %a -> %02x", byte, e, float_to_e4m3(e));
  }
  const float f8 = fp8_e4m3_decode(byte, scale);
  const float rf8 = static_cast<float>(static_cast<double>(e) * static_cast<double>(scale));
  FUZZ_CHECK(std::isnan(f8) == std::isnan(rf8) && (std::isnan(f8) || f8 == rf8),
             "fp8_e4m3_decode(%02x, %a) = %a, expected %a", byte, scale, f8, rf8);
  const float u = ue8m0_to_float(byte);
  if (byte == 0xffu) {
    FUZZ_CHECK(std::isnan(u), "ue8m0 ff must be NaN, got %a", u);
  } else {
    FUZZ_CHECK(u > 0.0f && std::isfinite(u) && u == std::ldexp(1.0f, byte - 127),
               "ue8m0_to_float(%02x) = %a", byte, u);
  }
  // mxfp4: any packed byte with any scale byte.
  const std::uint8_t sbyte = in.u8();
  std::uint8_t mx_scales[1] = {sbyte};
  for (int i = 0; i < 2; ++i) {
    const float m = mxfp4_decode(packed, mx_scales, i);
    if (sbyte == 0xffu) {
      FUZZ_CHECK(std::isnan(m), "mxfp4 with scale ff must be NaN, got %a", m);
    } else {
      // rn(±magnitude * 2^(byte-127)): exact, except that bytes 253/254 with large magnitudes
      // overflow to ±inf (arbitrary bytes; the encoder never writes those codes: it gives 254
      // to no finite group and saturates the codes of byte 253, see the vector checks below).
      const unsigned nib = i ? (byte >> 4) : (byte & 0xfu);
      const double mag = (nib & 8u) ? -e2m1_magnitude(nib) : e2m1_magnitude(nib);
      const float want = static_cast<float>(mag * std::ldexp(1.0, sbyte - 127));
      FUZZ_CHECK(same_bits(m, want) || (m == 0.0f && want == 0.0f),
                 "mxfp4_decode(%02x, %02x, %d) = %a, expected %a", byte, sbyte, i, m, want);
    }
  }
  // 16-bit conversions.
  const std::uint16_t h = in.u16();
  const float hf = half_bits_to_float(h);
  const float bf = bf16_bits_to_float(h);
  const bool h_nan = (h & 0x7fffu) > 0x7c00u;
  const bool b_nan = (h & 0x7fffu) > 0x7f80u;
  FUZZ_CHECK(std::isnan(hf) == h_nan, "half %04x -> %a", h, hf);
  FUZZ_CHECK(std::isnan(bf) == b_nan, "bf16 %04x -> %a", h, bf);
  FUZZ_CHECK(float_to_half_bits(hf) == (h_nan ? 0x7e00u : h), "half %04x -> %a -> %04x", h, hf,
             float_to_half_bits(hf));
  FUZZ_CHECK(float_to_bf16_bits(bf) == (b_nan ? 0x7fc0u : h), "bf16 %04x -> %a -> %04x", h, bf,
             float_to_bf16_bits(bf));
  // float -> 16-bit of any float: nearest (checked against a double reference of the neighbours).
  const float x = in.biased_float();
  const std::uint16_t hb = float_to_half_bits(x);
  if (std::isnan(x)) {
    FUZZ_CHECK(hb == 0x7e00u && float_to_bf16_bits(x) == 0x7fc0u, "NaN -> %04x", hb);
  } else {
    const float back = half_bits_to_float(hb);
    FUZZ_CHECK(!std::isnan(back) && (std::signbit(back) == std::signbit(x)),
               "float_to_half_bits(%a) = %04x", x, hb);
    if (std::isfinite(back) && std::fabs(x) < 65504.0f) {
      // |x - back| <= half an ulp of the f16 result (2^-25 for subnormals).
      const int ex = back == 0.0f ? -24 : std::max(std::ilogb(back) - 10, -24);
      FUZZ_CHECK(std::fabs(static_cast<double>(x) - back) <= std::ldexp(1.0, ex - 1) * 1.0000001,
                 "float_to_half_bits(%a) = %04x (%a) not nearest", x, hb, back);
    }
    const float bback = bf16_bits_to_float(float_to_bf16_bits(x));
    FUZZ_CHECK(!std::isnan(bback) && std::signbit(bback) == std::signbit(x),
               "float_to_bf16_bits(%a) -> %a", x, bback);
  }
}

bool same_bits_float(float a, float b) { return kvc::fuzz::same_bits(a, b); }

// The documented outcome of one encoded vector: NaN scale, zero codes and NaN decodes when any
// element is non-finite; scale +0, zero codes and zero decodes for an all-zero vector; otherwise a
// finite scale > 0 and finite decodes.
template <class Decode, class NonzeroCode>
void check_vector(const std::vector<float>& x, int n, float s, bool nonfinite, bool zero,
                  const char* what, Decode decode, NonzeroCode nonzero_code) {
  if (nonfinite) {
    FUZZ_CHECK(std::isnan(s), "%s: non-finite vector has scale %a", what, s);
  } else if (zero) {
    FUZZ_CHECK(kvc::float_bits(s) == 0u, "%s: all-zero vector has scale %a", what, s);
  } else {
    FUZZ_CHECK(std::isfinite(s) && s > 0.0f, "%s: finite vector has scale %a", what, s);
  }
  for (int i = 0; i < n; ++i) {
    const float d = decode(i);
    if (nonfinite || zero) {
      FUZZ_CHECK(!nonzero_code(i), "%s: code %d not zero", what, i);
      FUZZ_CHECK(nonfinite ? std::isnan(d) : d == 0.0f, "%s: element %d decodes to %a", what, i, d);
    } else {
      FUZZ_CHECK(std::isfinite(d), "%s: x[%d] = %a decodes to %a (scale %a)", what, i, x[i], d, s);
    }
  }
}

// The |error| <= scale/2 promise of q8 and int4, measured on the exact quotient: the decoded
// value is rn(code * scale), so allow half an ulp of the decoded value on top.
void check_int_error(float x, float dec, float scale, const char* what) {
  const double err = std::fabs(static_cast<double>(x) - static_cast<double>(dec));
  const double ulp = std::ldexp(1.0, std::max(std::ilogb(dec == 0.0f ? scale : dec) - 23, -149));
  FUZZ_CHECK(err <= static_cast<double>(scale) * 0.5 + ulp, "%s: x = %a decodes to %a, scale %a",
             what, x, dec, scale);
}

void check_encoders(Input& in) {
  const int kind = in.u8() % 4;
  int n = 1 + in.u8() % 96;
  if (kind == 1) n = 2 * ((n + 1) / 2);  // int4: even
  if (kind == 2) n = 32 * (1 + n % 3);   // mxfp4: groups of 32
  std::vector<float> x(static_cast<std::size_t>(n));
  const std::uint8_t fill = in.u8();
  for (int i = 0; i < n; ++i) {
    // Mostly raw/special floats; sometimes one magnitude scaled (extreme-range vectors).
    x[i] = in.biased_float();
    if (fill & 1u)
      x[i] = std::ldexp(static_cast<float>(static_cast<std::int8_t>(in.u8())),
                        static_cast<int>(fill) - 140);
  }
  const bool nonfinite = any_nonfinite(x, 0, n);
  const bool zero = all_zero(x, 0, n);
  switch (kind) {
    case 0: {  // q8
      std::vector<std::int8_t> q(n, 0x55), q2(n);
      const float s = q8_encode(x.data(), n, q.data());
      FUZZ_CHECK(same_bits_float(s, q8_encode(x.data(), n, q2.data())) && q == q2,
                 "q8_encode not deterministic");
      check_vector(
          x, n, s, nonfinite, zero, "q8", [&](int i) { return q8_decode(q[i], s); },
          [&](int i) { return q[i] != 0; });
      if (!nonfinite && !zero) {
        for (int i = 0; i < n; ++i) {
          FUZZ_CHECK(q[i] >= -127, "q8 code -128");
          check_int_error(x[i], q8_decode(q[i], s), s, "q8");
        }
      }
      break;
    }
    case 1: {  // int4
      std::vector<std::uint8_t> p(n / 2, 0x55), p2(n / 2);
      const float s = q4_encode(x.data(), n, p.data());
      FUZZ_CHECK(same_bits_float(s, q4_encode(x.data(), n, p2.data())) && p == p2,
                 "q4_encode not deterministic");
      check_vector(
          x, n, s, nonfinite, zero, "q4", [&](int i) { return q4_decode(p.data(), i, s); },
          [&](int i) { return ((p[i / 2] >> (4 * (i & 1))) & 0xfu) != 0; });
      if (!nonfinite && !zero) {
        for (int i = 0; i < n; ++i) {
          const int code = q4_code((p[i / 2] >> (4 * (i & 1))) & 0xfu);
          FUZZ_CHECK(code >= -7, "int4 code -8");
          check_int_error(x[i], q4_decode(p.data(), i, s), s, "q4");
        }
      }
      break;
    }
    case 2: {  // mxfp4, per group of 32
      const int groups = n / kMxfp4Group;
      std::vector<std::uint8_t> p(n / 2, 0x55), sc(groups, 0x55), p2(n / 2), sc2(groups);
      mxfp4_encode(x.data(), n, p.data(), sc.data());
      mxfp4_encode(x.data(), n, p2.data(), sc2.data());
      FUZZ_CHECK(p == p2 && sc == sc2, "mxfp4_encode not deterministic");
      // The index copy's rearranged words decode to the same bits.
      std::vector<std::uint32_t> words(n / 8);
      std::memcpy(words.data(), p.data(), n / 2);
      mxfp4_to_index_words(reinterpret_cast<std::uint8_t*>(words.data()), n);
      for (int i = 0; i < n; ++i) {
        FUZZ_CHECK(same_bits(mxfp4_index_decode(reinterpret_cast<const std::uint8_t*>(words.data()),
                                                sc.data(), i),
                             mxfp4_decode(p.data(), sc.data(), i)),
                   "index-copy word of element %d decodes differently", i);
      }
      for (int g = 0; g < groups; ++g) {
        const int b = g * kMxfp4Group, e = b + kMxfp4Group;
        const bool gnf = any_nonfinite(x, b, e), gz = all_zero(x, b, e);
        const float amax = abs_max(x.data() + b, kMxfp4Group);
        FUZZ_CHECK(sc[g] == mxfp4_scale_byte(amax), "group %d scale byte %02x", g, sc[g]);
        if (gnf) FUZZ_CHECK(sc[g] == 0xffu, "non-finite group %d has scale %02x", g, sc[g]);
        if (gnf || gz) {
          for (int i = b / 2; i < e / 2; ++i) FUZZ_CHECK(p[i] == 0, "payload of group %d not 0", g);
        }
        const float scale = ue8m0_to_float(sc[g]);
        for (int i = b; i < e; ++i) {
          const float d = mxfp4_decode(p.data(), sc.data(), i);
          if (gnf) {
            FUZZ_CHECK(std::isnan(d), "non-finite group decodes %a", d);
            continue;
          }
          // The decoded value in double (no overflow): magnitude * 2^e.
          const unsigned nib = (p[i / 2] >> (4 * (i & 1))) & 0xfu;
          const double dd =
              ((nib & 8u) ? -1.0 : 1.0) * e2m1_magnitude(nib) * std::ldexp(1.0, sc[g] - 127);
          // A finite group decodes to finite values (docs/formats.md, "Saturation at the top of
          // the float range"): elements whose nearest e2m1 would overflow are capped at the
          // largest finite code of the scale, 3 * 2^126 for byte 253.
          FUZZ_CHECK(std::isfinite(d), "finite x = %a decodes to %a (scale byte %02x)", x[i], d,
                     sc[g]);
          FUZZ_CHECK(static_cast<double>(d) == dd, "x = %a decodes to %a, expected %a", x[i], d,
                     dd);
          if (!gz) {
            // The code: the nearest e2m1 of x / 2^e computed in double (exact), then capped.
            const double y = static_cast<double>(x[i]) / std::ldexp(1.0, sc[g] - 127);
            const double ay = std::fabs(y);
            unsigned want = 0;
            const double mids[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
            while (want < 7 && (ay > mids[want] || (ay == mids[want] && (want & 1u)))) ++want;
            const double top = std::ldexp(1.0, 128);  // first magnitude that is not finite
            while (e2m1_magnitude(want) * std::ldexp(1.0, sc[g] - 127) >= top) --want;
            if (want != 0 && y < 0) want |= 8u;
            // x * 2^-e is rounded in float where it is subnormal; skip those (tiny) elements.
            const bool subnormal_y = ay != 0.0 && ay < std::ldexp(1.0, -126);
            FUZZ_CHECK(subnormal_y || nib == want, "x = %a (scale byte %02x): code %x, expected %x",
                       x[i], sc[g], nib, want);
          }
          FUZZ_CHECK(d == 0.0f || std::signbit(d) == std::signbit(x[i]), "sign of %a -> %a", x[i],
                     d);
          // e2m1 keeps 1 mantissa bit: |err| <= |x|/4 for normal codes, <= scale/4 near zero,
          // and amax <= 6 * scale by the scale rule (up to the subnormal rounding of x * 2^-e).
          const double err = std::fabs(static_cast<double>(x[i]) - dd);
          FUZZ_CHECK(err <= std::fabs(static_cast<double>(x[i])) * 0.25 + scale * 0.25 + 1e-45,
                     "mxfp4: x = %a decodes to %a (scale %a)", x[i], d, scale);
        }
      }
      break;
    }
    default: {  // fp8 e4m3 with an fp32 scale
      std::vector<std::uint8_t> q(n, 0x55), q2(n);
      const float s = fp8_e4m3_encode(x.data(), n, q.data());
      FUZZ_CHECK(same_bits_float(s, fp8_e4m3_encode(x.data(), n, q2.data())) && q == q2,
                 "fp8_e4m3_encode not deterministic");
      check_vector(
          x, n, s, nonfinite, zero, "fp8", [&](int i) { return fp8_e4m3_decode(q[i], s); },
          [&](int i) { return q[i] != 0; });
      if (!nonfinite && !zero) {
        for (int i = 0; i < n; ++i) {
          FUZZ_CHECK((q[i] & 0x7fu) != 0x7fu, "fp8 code %02x is NaN for x = %a", q[i], x[i]);
          const float d = fp8_e4m3_decode(q[i], s);
          const double err = std::fabs(static_cast<double>(x[i]) - d);
          // 3 mantissa bits: relative 2^-4, subnormal step 2^-9 * scale (half of it), and the
          // 464/448 saturation at the top; plus the two roundings of x/scale and code*scale.
          const double bound = std::fabs(static_cast<double>(x[i])) * (1.0 / 16 + 1e-6) +
                               static_cast<double>(s) * std::ldexp(1.0, -10) * 1.000001 + 1e-45;
          FUZZ_CHECK(err <= bound, "fp8: x = %a decodes to %a (scale %a, code %02x)", x[i], d, s,
                     q[i]);
        }
      }
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t mode = in.u8();
  if (mode & 1u) {
    while (!in.empty()) check_decoders(in);
  } else {
    check_encoders(in);
  }
  return 0;
}
