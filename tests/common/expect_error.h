// expect_error: a test expects a call to throw kvc::Error whose message holds given words. The
// one helper of every test target (the CPU, CUDA and DeepSeek-V4 suites had nine copies).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "kvc/core/error.h"

namespace kvc {
namespace testing {

/// Expects `fn` to throw kvc::Error whose message contains every word of [first, last). Any other
/// exception propagates (the test fails with it).
template <class Fn, class It>
void expect_error_words(Fn&& fn, It first, It last) {
  try {
    fn();
    ADD_FAILURE() << "no kvc::Error thrown"
                  << (first != last ? "; expected one naming '" + std::string(*first) + "'" : "");
  } catch (const Error& e) {
    const std::string message = e.what();
    for (; first != last; ++first) {
      EXPECT_NE(message.find(*first), std::string::npos)
          << "message lacks '" << *first << "': " << message;
    }
  }
}

/// Expects `fn` to throw kvc::Error whose message contains every string of `words`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> words) {
  expect_error_words(fn, words.begin(), words.end());
}

/// The same for words built at run time.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& words) {
  expect_error_words(fn, words.begin(), words.end());
}

/// The same for one word.
template <class Fn>
void expect_error(Fn&& fn, const char* word) {
  expect_error_words(fn, &word, &word + 1);
}

/// The same for one word built at run time.
template <class Fn>
void expect_error(Fn&& fn, const std::string& word) {
  expect_error_words(fn, &word, &word + 1);
}

}  // namespace testing
}  // namespace kvc
