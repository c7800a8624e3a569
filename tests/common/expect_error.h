// expect_error: a test expects a call to throw kvc::Error whose message holds given words.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "kvc/core/error.h"

namespace kvc {
namespace testing {

/// Expects `fn` to throw kvc::Error whose message contains every string of `words`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> words) {
  try {
    fn();
    ADD_FAILURE() << "no kvc::Error thrown";
  } catch (const Error& e) {
    for (const char* w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message lacks '" << w << "': " << e.what();
    }
  }
}

}  // namespace testing
}  // namespace kvc
