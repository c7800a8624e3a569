// Where two store snapshots differ: the first differing slot, field and element, with both
// values, so that a failed CPU-vs-GPU comparison says what to look at instead of "false".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kvc/store/kv_store.h"

namespace kvc {
namespace testing {

namespace detail {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

template <typename T>
bool first_difference(const char* field, const std::vector<T>& a, const std::vector<T>& b,
                      std::ostringstream& out) {
  if (a.size() != b.size()) {
    out << field << ": sizes " << a.size() << " vs " << b.size();
    return true;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    bool differ;
    if constexpr (std::is_same_v<T, float>) {
      differ = bits_of(a[i]) != bits_of(b[i]);
    } else {
      differ = a[i] != b[i];
    }
    if (!differ) continue;
    std::size_t count = 0;
    for (std::size_t j = i; j < a.size(); ++j) {
      if constexpr (std::is_same_v<T, float>) {
        count += bits_of(a[j]) != bits_of(b[j]);
      } else {
        count += a[j] != b[j];
      }
    }
    out << field << "[" << i << "] of " << a.size() << ": ";
    if constexpr (std::is_same_v<T, float>) {
      out << a[i] << " (0x" << std::hex << bits_of(a[i]) << ") vs " << std::dec << b[i] << " (0x"
          << std::hex << bits_of(b[i]) << std::dec << ")";
    } else {
      out << static_cast<unsigned>(a[i]) << " vs " << static_cast<unsigned>(b[i]);
    }
    out << "; " << count << " elements differ";
    return true;
  }
  return false;
}

}  // namespace detail

/// "" when `a` and `b` are equal (SlotState::operator==), else the first difference.
inline std::string snapshot_difference(const std::vector<SlotState>& a,
                                       const std::vector<SlotState>& b) {
  std::ostringstream out;
  if (a.size() != b.size()) {
    out << "slot counts " << a.size() << " vs " << b.size();
    return out.str();
  }
  for (std::size_t s = 0; s < a.size(); ++s) {
    if (a[s] == b[s]) continue;
    out << "slot " << s << ": ";
    const SlotState &x = a[s], &y = b[s];
    if (x.open != y.open || x.length != y.length) {
      out << "open/length " << x.open << "/" << x.length << " vs " << y.open << "/" << y.length;
    } else if (detail::first_difference("ring_k", x.ring_k, y.ring_k, out) ||
               detail::first_difference("ring_v", x.ring_v, y.ring_v, out) ||
               detail::first_difference("old_k", x.old_k, y.old_k, out) ||
               detail::first_difference("old_v", x.old_v, y.old_v, out) ||
               detail::first_difference("old_k_scale", x.old_k_scale, y.old_k_scale, out) ||
               detail::first_difference("old_v_scale", x.old_v_scale, y.old_v_scale, out) ||
               detail::first_difference("summaries", x.summaries, y.summaries, out) ||
               detail::first_difference("index_k", x.index_k, y.index_k, out) ||
               detail::first_difference("index_k_scale", x.index_k_scale, y.index_k_scale, out)) {
    }
    return out.str();
  }
  return "";
}

}  // namespace testing
}  // namespace kvc
