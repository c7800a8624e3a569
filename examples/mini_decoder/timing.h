/*! \file examples/mini_decoder/timing.h
 *  \brief Wall and process CPU time for the mini-decoder's programs and their reports.
 */
#pragma once

#include <chrono>
#include <ctime>

namespace kvc {
namespace mini_decoder {

/// The clock every wall time of the mini-decoder is read from.
using Clock = std::chrono::steady_clock;

/// Wall seconds since `t0`.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Process CPU seconds (all threads): with a busy machine, wall time alone misleads.
inline double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

}  // namespace mini_decoder
}  // namespace kvc
