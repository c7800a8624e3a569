// Pieces of the Selector shared by its implementations (not installed).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/select/selector.h"

namespace kvc {
namespace select_internal {

/// `ids` with the negative entries kept (validation rejects them), sorted ascending, duplicates
/// removed; entries >= num_blocks dropped when num_blocks >= 0.
std::vector<std::int32_t> sorted_distinct(const std::vector<std::int32_t>& ids, int num_blocks);

/// The checks Selector::select makes on every device before it writes anything: the policy,
/// the view shapes and pointers, out.max_selected and the report's rows and pitch. It does not
/// read num_valid (which may live on the device).
void check_select_args(const ScoresView& scores, const SelectPolicy& policy,
                       const SelectionView& out, const SelectionReport* report);

/// The largest scores.max_blocks (row pitch) the CUDA selector takes: 2^20 blocks.
constexpr int kMaxBlocksCuda = 1 << 20;

/// The CPU reference selector.
std::unique_ptr<Selector> make_cpu_selector();

/// The CUDA selector on `device` (present); with `limits` its workspace is allocated now for
/// every call within them, without it on the first call (growing when needed). Defined in
/// src/cuda/selector.cu (CUDA builds only).
std::unique_ptr<Selector> make_cuda_selector(Device device, const SelectorLimits* limits);

}  // namespace select_internal
}  // namespace kvc
