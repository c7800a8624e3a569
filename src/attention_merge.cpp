// merge_states / merge_states_inplace: argument checks and dispatch by device.
#include <cstdint>
#include <string>

#include "attention_internal.h"
#include "kvc/attention/merge.h"
#include "kvc/core/error.h"

namespace kvc {

namespace {

// Checks a state pair (out [n, d], lse [n]) against the shape of the first state.
void check_state(const TensorView& out, const TensorView& lse, const char* out_name,
                 const char* lse_name, std::int64_t n, std::int64_t d, Device device) {
  check_view(out, out_name, DType::kF32, {n, d}, device, 4);
  check_view(lse, lse_name, DType::kF32, {n}, device, 4);
}

// `a_name`: the name of the first state's out view in messages ("out_a", or "out" in place).
void dispatch(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
              const TensorView& lse_b, const TensorView& out, const TensorView& lse,
              const char* a_name, const char* a_lse_name, void* stream) {
  KVC_CHECK(out_a.ndim == 2, a_name, ".ndim = ", out_a.ndim, " must be 2 ([n, d])");
  const std::int64_t n = out_a.shape[0];
  const std::int64_t d = out_a.shape[1];
  const Device device = out_a.device;
  KVC_CHECK(d >= 1 && d <= INT32_MAX, a_name, ".shape[1] = d = ", d, " must be in [1, 2^31)");
  check_state(out_a, lse_a, a_name, a_lse_name, n, d, device);
  check_state(out_b, lse_b, "out_b", "lse_b", n, d, device);
  check_state(out, lse, "out", "lse", n, d, device);
#if KVC_CUDA_ENABLED
  if (device.is_cuda()) {
    const std::string a_data = std::string(a_name) + ".data";
    const std::string a_lse_data = std::string(a_lse_name) + ".data";
    const char* const names[6] = {a_data.c_str(), a_lse_data.c_str(), "out_b.data",
                                  "lse_b.data",   "out.data",         "lse.data"};
    attention::cuda_merge(out_a.ptr<const float>(), lse_a.ptr<const float>(),
                          out_b.ptr<const float>(), lse_b.ptr<const float>(), out.ptr<float>(),
                          lse.ptr<float>(), n, static_cast<int>(d), device, stream, names);
    return;
  }
#endif
  static_cast<void>(stream);  // the CPU merge runs synchronously
  KVC_CHECK(device.is_cpu(), a_name, ".device = ", to_string(device),
            ": merge_states on CUDA needs kvc built with CUDA (KVC_WITH_CUDA)");
  attention::cpu_merge(out_a.ptr<const float>(), lse_a.ptr<const float>(), out_b.ptr<const float>(),
                       lse_b.ptr<const float>(), out.ptr<float>(), lse.ptr<float>(), n,
                       static_cast<int>(d));
}

}  // namespace

void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse,
                  void* stream) {
  dispatch(out_a, lse_a, out_b, lse_b, out, lse, "out_a", "lse_a", stream);
}

void merge_states_inplace(const TensorView& out, const TensorView& lse, const TensorView& out_b,
                          const TensorView& lse_b, void* stream) {
  dispatch(out, lse, out_b, lse_b, out, lse, "out", "lse", stream);
}

}  // namespace kvc
