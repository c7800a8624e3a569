// Host code shared by the CPU and CUDA attention backends: argument checks that build the params
// structs, telemetry, and the CPU reference entry points.
#pragma once

#include <memory>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/attention/params.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace attention {

/// Checks every argument of decode() and returns the params (slots left null: the caller points
/// them at host or device memory). `host_readable`: the selection and lengths can be read on
/// the host, so the selected ids are checked too (range [0, closed blocks), distinct).
AttentionParams check_decode(const AttentionConfig& config, Device device, const KvStore& store,
                             const DecodeArgs& args, bool host_readable);

/// Checks every argument of dense_decode() and returns the params (lengths left null).
DenseParams check_dense_decode(const AttentionConfig& config, Device device,
                               const DenseDecodeArgs& args);

/// Fills `telemetry` for a decode call whose selection is host-readable (`selection`: a host
/// view of args.selection, or an empty one for the modes without a selection).
void fill_telemetry(const AttentionConfig& config, const KvStore& store, const DecodeArgs& args,
                    const SelectionView& selection, Telemetry* telemetry);

/// The CPU reference of decode over validated params (host pointers).
void cpu_decode(const AttentionParams& params, bool accumulate_f64);
/// The CPU reference of dense_decode over validated params (host pointers).
void cpu_dense_decode(const DenseParams& params, bool accumulate_f64);
/// The CPU merge of n rows of d elements (host pointers; out may alias a or b).
void cpu_merge(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
               float* out, float* lse, std::int64_t n, int d);

/// The CPU backend.
std::unique_ptr<AttentionBackend> create_cpu_backend(const AttentionConfig& config);

}  // namespace attention
}  // namespace kvc
