// AttentionBackend on CUDA: the workspace and the device copies of slots / lengths are allocated
// at construction; decode() checks every argument on the host with the CPU backend's code
// (attention::check_decode), then launches the kernel layer. No host synchronisation unless
// telemetry asks for it.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attention_internal.h"
#include "device_buffer.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/kernels/attention_kernels.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace attention {
namespace {

using detail::DeviceBuffer;
using detail::DeviceGuard;

/// Throws unless `p` (when not null) is memory a kernel on `device` can read: device memory of
/// that device, managed memory, or registered host memory. A host pointer in a view tagged CUDA
/// would otherwise fault inside a kernel.
void check_device_pointer(const void* p, const std::string& what, Device device) {
  if (p == nullptr) return;
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) cudaGetLastError();
  const bool ok =
      e == cudaSuccess &&
      ((a.type == cudaMemoryTypeDevice && a.device == device.index) ||
       a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeHost && a.devicePointer == p));
  KVC_CHECK(ok, what, " = ", p, " is not memory that ", to_string(device),
            " can read (a host pointer in a CUDA view?)");
}

/// A device int32 array mirrored by the last host values uploaded, so an unchanged array (the
/// slots of a decode loop) is not copied again: a call with the same slots as the previous one
/// puts no copy on the stream and can be captured in a CUDA graph.
class DeviceInts {
 public:
  DeviceInts() = default;
  explicit DeviceInts(int capacity) : buffer_(static_cast<std::size_t>(capacity) * 4) {}
  const std::int32_t* upload(const std::vector<int>& v, cudaStream_t stream) {
    static_assert(sizeof(int) == 4, "int must be 32-bit");
    if (v != last_) {
      // Pageable source: staged before the call returns, ordered on `stream`.
      KVC_CUDA_THROW(cudaMemcpyAsync(buffer_.as<void>(), v.data(), v.size() * 4,
                                     cudaMemcpyHostToDevice, stream));
      last_ = v;
    }
    return buffer_.as<std::int32_t>();
  }

 private:
  DeviceBuffer buffer_;
  std::vector<int> last_;
};

class CudaAttentionBackend final : public AttentionBackend {
 public:
  CudaAttentionBackend(const AttentionConfig& c, Device device) : config_(c), device_(device) {
    KVC_CHECK(!c.accumulate_f64,
              "accumulate_f64 = true is CPU only: the CUDA backend accumulates in float32");
    DeviceGuard guard(device_.index);
    // Sizing the workspace also loads every kernel this shape can use, so later calls (and
    // graph captures) find them loaded.
    workspace_bytes_ =
        kernels::attention_workspace_upper_bound(c.num_q_heads, c.num_kv_heads, c.head_dim);
    KVC_CHECK(workspace_bytes_ > 0, "cannot size the attention workspace on ", to_string(device_),
              " (head_dim = ", c.head_dim, ", group = ", c.group_size(), ")");
    workspace_ = DeviceBuffer(workspace_bytes_);
    slots_ = DeviceInts(c.max_batch);
    lengths_ = DeviceInts(c.max_batch);
    KVC_CUDA_THROW(cudaDeviceSynchronize());
  }

  const AttentionConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void decode(const KvStore& store, const DecodeArgs& args, Telemetry* telemetry) override {
    AttentionParams p = check_decode(config_, device_, store, args, false);
    check_batch(args.slots.size(), "slots.size()");
    DeviceGuard guard(device_.index);
    check_device_pointer(args.q.data, "q.data", device_);
    check_device_pointer(args.out.data, "out.data", device_);
    check_device_pointer(args.lse.data, "lse.data", device_);
    check_device_pointer(args.sink, "sink", device_);
    if (uses_selection(config_.mode)) {
      check_device_pointer(args.selection.ids, "selection.ids", device_);
      check_device_pointer(args.selection.counts, "selection.counts", device_);
    }
    p.max_splits = config_.max_splits;
    if (p.batch > 0) {
      p.slots = slots_.upload(args.slots, stream_);
      std::size_t bytes = workspace_bytes_;
      KVC_CUDA_THROW(kernels::attention_decode(workspace_.as<void>(), bytes, p, stream_));
    }
    if (telemetry != nullptr) fill(store, args, telemetry);
  }

  void dense_decode(const DenseDecodeArgs& args) override {
    DenseParams p = check_dense_decode(config_, device_, args);
    check_batch(args.lengths.size(), "lengths.size()");
    DeviceGuard guard(device_.index);
    check_device_pointer(args.q.data, "q.data", device_);
    check_device_pointer(args.k.data, "k.data", device_);
    check_device_pointer(args.v.data, "v.data", device_);
    check_device_pointer(args.out.data, "out.data", device_);
    check_device_pointer(args.lse.data, "lse.data", device_);
    check_device_pointer(args.sink, "sink", device_);
    p.max_splits = config_.max_splits;
    if (p.batch == 0) return;
    p.lengths = lengths_.upload(args.lengths, stream_);
    std::size_t bytes = workspace_bytes_;
    KVC_CUDA_THROW(kernels::dense_attention_decode(workspace_.as<void>(), bytes, p, stream_));
  }

 private:
  void check_batch(std::size_t n, const char* name) const {
    KVC_CHECK(n <= static_cast<std::size_t>(config_.max_batch), "batch = ", name, " = ", n,
              " must be <= max_batch = ", config_.max_batch, " (AttentionConfig)");
  }

  // Telemetry: counts from the host mirror of the lengths; the selection is copied from the
  // device (a stream synchronisation) only when the caller asks for it.
  void fill(const KvStore& store, const DecodeArgs& args, Telemetry* tm) {
    if (!uses_selection(config_.mode)) {
      const SelectionView none;
      fill_telemetry(config_, store, args, &none, tm);
      return;
    }
    if (!tm->wait_for_device) {
      fill_telemetry(config_, store, args, nullptr, tm);
      return;
    }
    const SelectionView& sel = args.selection;
    std::vector<std::int32_t> counts(static_cast<std::size_t>(sel.rows));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(sel.rows) *
                                  static_cast<std::size_t>(sel.max_selected));
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    if (!counts.empty()) {
      KVC_CUDA_THROW(
          cudaMemcpy(counts.data(), sel.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
    }
    if (!ids.empty()) {
      KVC_CUDA_THROW(cudaMemcpy(ids.data(), sel.ids, ids.size() * 4, cudaMemcpyDeviceToHost));
    }
    SelectionView host = sel;
    host.counts = counts.data();
    host.ids = ids.data();
    fill_telemetry(config_, store, args, &host, tm);
  }

  AttentionConfig config_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  DeviceInts slots_, lengths_;
  std::size_t workspace_bytes_ = 0;
  DeviceBuffer workspace_;
};

}  // namespace

std::unique_ptr<AttentionBackend> create_cuda_backend(const AttentionConfig& config,
                                                      Device device) {
  return std::make_unique<CudaAttentionBackend>(config, device);
}

void cuda_merge(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                float* out, float* lse, std::int64_t n, int d, Device device, void* stream,
                const char* const names[6]) {
  const int count = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < count, "merge_states on CUDA: ", names[0],
            " on device = ", to_string(device), " is not present (CUDA devices: ", count, ")");
  DeviceGuard guard(device.index);
  const void* ptrs[6] = {out_a, lse_a, out_b, lse_b, out, lse};
  for (int i = 0; i < 6; ++i) {
    check_device_pointer(ptrs[i], std::string("merge_states on CUDA: ") + names[i], device);
  }
  KVC_CUDA_THROW(kernels::merge_states(out_a, lse_a, out_b, lse_b, out, lse, n, d,
                                       static_cast<cudaStream_t>(stream)));
}

}  // namespace attention
}  // namespace kvc
