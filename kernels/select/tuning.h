// Internal: kernels::select with its variant choices pinned, for the GPU tests (every kernel
// instantiation against the CPU reference) and the benchmark (every variant measured in one run).
// Not installed; the library's own calls use SelectTuning{} (the built-in choices).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kvc/select/selection.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace kernels {
namespace select_detail {

/// Which stage-A variant a call runs. 0 / false: the built-in choice.
struct SelectTuning {
  /// Small path (m <= 65 ranks, rows <= 65536 blocks): scores per thread, 4, 8, 16 or 32 (the
  /// CTAs per row follow: ceil(max_blocks / (256 * small_items)), at most 8). A call whose row
  /// would need more than 8 CTAs is rejected (cudaErrorInvalidValue).
  int small_items = 0;
  /// Skip the small path (the cluster radix select runs instead), for comparison.
  bool no_small = false;
  /// Streaming path (65 < m <= 2049 ranks, no top_p): CTAs per row, 1..8 (0: the built-in
  /// choice, about one CTA per SM over the call's rows). Out of range: cudaErrorInvalidValue.
  int stream_ctas = 0;
  /// Streaming path: a CTA compacts its candidates when it buffers more than this many keys,
  /// in (4096, 12288] (0: 12288). Out of range: cudaErrorInvalidValue.
  int stream_trigger = 0;
  /// Skip the streaming path (the cluster radix select runs instead), for comparison.
  bool no_stream = false;
  /// Spread path (kernels/select/spread.cuh; the streaming path's shapes, at most 64 rows):
  /// CTAs per row, >= 1 (0: the built-in choice, as many as the device holds at once over the
  /// call's rows, at most one per 2048 blocks). Setting it takes the spread path wherever it
  /// applies. A grid that would not fit the device at once: cudaErrorInvalidValue.
  int spread_ctas = 0;
  /// Take the spread path wherever it applies (the built-in choice: at most 16 rows of more
  /// than 16384 blocks).
  bool force_spread = false;
  /// Never take the spread path (the streaming path runs instead), for comparison.
  bool no_spread = false;
};

/// kernels::select (kvc/kernels/select_kernels.h) with the variants of `tuning`; the same
/// contract, workspace query included (the workspace does not depend on the tuning).
cudaError_t select_tuned(void* d_temp, std::size_t& temp_bytes, const ScoresView& scores,
                         const SelectPolicy& policy, const SelectionView& out,
                         const SelectionReport* report, const SelectTuning& tuning,
                         cudaStream_t stream);

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc
