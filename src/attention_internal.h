// Host code shared by the CPU and CUDA attention backends: argument checks that build the params
// structs, telemetry, and the CPU reference entry points.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/attention/params.h"
#include "kvc/config.h"
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

/// Fills `telemetry` for a decode call. `selection`: a host view of args.selection (select
/// modes), an empty one for the other modes, or null when the selection lives on the device and
/// was not copied: then the selection copy and every count that depends on it (tokens, totals,
/// attended bytes and ratio) stay empty and `complete` is false. Selected ids outside
/// [0, closed blocks) are not counted and counts are clamped to [0, max_selected], as the CUDA
/// kernels skip and clamp them (the CPU backend has rejected them before).
void fill_telemetry(const AttentionConfig& config, const KvStore& store, const DecodeArgs& args,
                    const SelectionView* selection, Telemetry* telemetry);

/// The CPU reference of decode over validated params (host pointers).
void cpu_decode(const AttentionParams& params, bool accumulate_f64);
/// The CPU reference of dense_decode over validated params (host pointers).
void cpu_dense_decode(const DenseParams& params, bool accumulate_f64);
/// The CPU merge of n rows of d elements (host pointers; out may alias a or b).
void cpu_merge(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
               float* out, float* lse, std::int64_t n, int d);

/// The CPU backend.
std::unique_ptr<AttentionBackend> create_cpu_backend(const AttentionConfig& config);

#if KVC_CUDA_ENABLED
/// The CUDA backend on `device` (present, checked by the caller).
std::unique_ptr<AttentionBackend> create_cuda_backend(const AttentionConfig& config, Device device);
/// merge_states on CUDA views (shapes already checked): checks that `device` is present and that
/// every pointer is memory it can read (names[i] in messages, in the order of the pointers), then
/// merges n rows of d elements on `stream`; out may alias a or b.
void cuda_merge(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                float* out, float* lse, std::int64_t n, int d, Device device, void* stream,
                const char* const names[6]);
#endif

}  // namespace attention
}  // namespace kvc
