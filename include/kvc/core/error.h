/*! \file kvc/core/error.h
 *  \brief kvc::Error and KVC_CHECK: how kvc reports bad arguments.
 *
 *  Every public entry point validates its arguments before it changes anything or launches a
 *  kernel. A failed check throws kvc::Error whose message names the argument, its value and the
 *  bound it broke, followed by the source location of the check.
 */
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvc {

/// The exception kvc throws for bad arguments and for failures of the underlying runtime.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace detail
}  // namespace kvc

/// Throws kvc::Error when `cond` is false. The remaining arguments are streamed into the message;
/// by convention they name the argument, its value and the bound:
/// `KVC_CHECK(slot < n, "slot = ", slot, " must be < max_slots = ", n)`.
#define KVC_CHECK(cond, ...)                                                                     \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      ::kvc::detail::throw_error(__FILE__, __LINE__, #cond, ::kvc::detail::concat(__VA_ARGS__)); \
    }                                                                                            \
  } while (0)
