// SparseAttention on CUDA: the dsv4_sparse_attention launcher (two-phase workspace) and the
// object, which allocates the workspace bound at construction.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "dsv4/attention.cuh"
#include "dsv4_internal.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/sparse_attention.h"
#include "kvc/kernels/dsv4_kernels.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace {

using namespace dsv4_detail;

int attn_sm_count() {
  int n = 0;
  return kvc::detail::sm_count(n) == cudaSuccess ? n : 132;
}

/// How a call splits: chunks per query row at most, splits and chunks per split.
struct Split {
  int chunks = 0, splits = 1, cps = 1;
};

Split make_split(int max_rows, long long rows, int head_groups, int sms) {
  Split s;
  s.chunks = std::max(1, (max_rows + kAttnRows - 1) / kAttnRows);
  const long long fill = std::max<long long>(1, sms / std::max<long long>(1, rows * head_groups));
  s.splits = static_cast<int>(std::min<long long>(s.chunks, fill));
  s.cps = (s.chunks + s.splits - 1) / s.splits;
  s.splits = (s.chunks + s.cps - 1) / s.cps;
  return s;
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

/// Workspace bytes of a split call (0 for one split).
std::size_t part_bytes(const Split& s, long long rows, int H, int D) {
  if (s.splits <= 1) return 0;
  const std::size_t n = static_cast<std::size_t>(s.splits) * static_cast<std::size_t>(rows) * H;
  return align256(n * D * 4) + 2 * align256(n * 4);
}

template <int D>
cudaError_t run(const AttnParams& p, const Split& s, int rows, int head_groups,
                cudaStream_t stream) {
  const int smem = attn_smem_bytes(D);
  KVC_CUDA_CALL(
      cudaFuncSetAttribute(attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  attention_kernel<D><<<dim3(static_cast<unsigned>(s.splits), static_cast<unsigned>(rows),
                             static_cast<unsigned>(head_groups)),
                        kAttnThreads, static_cast<std::size_t>(smem), stream>>>(p);
  KVC_CUDA_CALL(cudaGetLastError());
  if (s.splits > 1) {
    combine_kernel<D>
        <<<dim3(static_cast<unsigned>(p.H), static_cast<unsigned>(rows)), D / 4, 0, stream>>>(p);
    KVC_CUDA_CALL(cudaGetLastError());
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t dsv4_sparse_attention(void* d_temp, std::size_t& temp_bytes,
                                  const dsv4::EntryStoreView& ring,
                                  const dsv4::EntryStoreView& entries,
                                  const dsv4::SparseAttentionConfig& c, const Dsv4AttentionArgs& a,
                                  cudaStream_t stream) {
  const int D = c.head_dim;
  if ((D != 128 && D != 512) || a.batch < 0 || a.T < 0 || c.num_heads < 1 || c.num_heads > 128 ||
      ring.layout.dim != D || entries.layout.dim != D || !ring.ring ||
      ring.max_entries != c.window ||
      (!c.hca && (a.indices_pitch < 0 || (a.indices_pitch > 0 && a.indices == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  const long long rows = static_cast<long long>(a.batch) * a.T;
  if (rows > 2147483647LL ||
      a.batch > 0 && (a.slots == nullptr || a.lengths == nullptr || a.q == nullptr ||
                      a.out == nullptr || (a.chunk_rows > 0 && a.chunk == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int head_groups = (c.num_heads + kAttnHeads - 1) / kAttnHeads;
  const int max_rows = c.window + (c.hca ? entries.max_entries : a.indices_pitch);
  const Split s = make_split(max_rows, rows, head_groups, attn_sm_count());
  const std::size_t need = part_bytes(s, rows, c.num_heads, D);
  if (d_temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  AttnParams p;
  p.ring = ring;
  p.entries = entries;
  p.slots = a.slots;
  p.lengths = a.lengths;
  p.T = a.T;
  p.H = c.num_heads;
  p.window = c.window;
  p.ratio = c.ratio;
  p.max_rows = max_rows;
  p.hca = c.hca;
  p.scale_log2 = c.scale() * kLog2e;
  p.q = a.q;
  p.chunk = a.chunk;
  p.chunk_rows = a.chunk_rows;
  p.indices = a.indices;
  p.indices_pitch = a.indices_pitch;
  p.sink = a.sink;
  p.out = a.out;
  p.out_bf16 = a.out_bf16;
  p.lse = a.lse;
  p.splits = s.splits;
  p.cps = s.cps;
  p.part_o = p.part_m = p.part_l = nullptr;
  if (s.splits > 1) {
    const std::size_t n =
        static_cast<std::size_t>(s.splits) * static_cast<std::size_t>(rows) * c.num_heads;
    unsigned char* base = static_cast<unsigned char*>(d_temp);
    p.part_o = reinterpret_cast<float*>(base);
    p.part_m = reinterpret_cast<float*>(base + align256(n * D * 4));
    p.part_l = reinterpret_cast<float*>(base + align256(n * D * 4) + align256(n * 4));
  }
  return D == 512 ? run<512>(p, s, static_cast<int>(rows), head_groups, stream)
                  : run<128>(p, s, static_cast<int>(rows), head_groups, stream);
}

}  // namespace kernels

namespace dsv4 {
namespace detail {
namespace {

using kvc::detail::DeviceBuffer;
using kvc::detail::DeviceGuard;

class CudaSparseAttention final : public SparseAttention {
 public:
  CudaSparseAttention(const SparseAttentionConfig& c, Device device) : config_(c), device_(device) {
    KVC_CHECK(c.head_dim == 128 || c.head_dim == 512,
              "SparseAttentionConfig: head_dim = ", c.head_dim, " must be 128 or 512 on CUDA");
    DeviceGuard guard(device_.index);
    staging_ = DeviceBuffer(8 * static_cast<std::size_t>(c.max_batch));
    // The workspace of the largest split call: splits * rows * head groups never exceeds the SM
    // count when there is more than one split (make_split), whatever the store.
    int dev = 0, sms = 0;
    KVC_CUDA_THROW(cudaGetDevice(&dev));
    KVC_CUDA_THROW(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const std::size_t n =
        static_cast<std::size_t>(std::max(1, sms)) * static_cast<std::size_t>(c.num_heads);
    temp_bytes_ = 2 * ((n * c.head_dim * 4 + 255) / 256 * 256 + 2 * ((n * 4 + 255) / 256 * 256));
    temp_ = DeviceBuffer(temp_bytes_);
  }
  const SparseAttentionConfig& config() const override { return config_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void forward(const EntryStore& ring, const EntryStore& entries,
               const SparseAttentionArgs& a) override {
    const int T = check_sparse_attention(config_, device_, ring, entries, a);
    DeviceGuard guard(device_.index);
    const std::vector<std::int32_t> h = pack_slots_lengths(a.slots, a.lengths);
    KVC_CUDA_THROW(cudaMemcpyAsync(staging_.as<void>(), h.data(), h.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    kernels::Dsv4AttentionArgs k;
    k.slots = staging_.as<std::int32_t>();
    k.lengths = k.slots + a.slots.size();
    k.batch = static_cast<int>(a.slots.size());
    k.T = T;
    k.q = a.q.ptr<const std::uint16_t>();
    k.chunk = a.window_chunk.data != nullptr ? a.window_chunk.ptr<const std::uint16_t>() : nullptr;
    k.chunk_rows = a.window_chunk.data != nullptr ? static_cast<int>(a.window_chunk.shape[1]) : 0;
    k.indices = config_.hca ? nullptr : a.indices.ids;
    k.indices_pitch = config_.hca ? 0 : a.indices.max_selected;
    k.sink = a.sink;
    k.out = a.out.data;
    k.out_bf16 = a.out.dtype == DType::kBF16;
    k.lse = a.lse.data != nullptr ? a.lse.ptr<float>() : nullptr;
    std::size_t need = 0;
    const EntryStoreView rv = ring.view(), ev = entries.view();
    KVC_CUDA_THROW(kernels::dsv4_sparse_attention(nullptr, need, rv, ev, config_, k, stream_));
    KVC_CHECK(need <= temp_bytes_, "internal: attention workspace ", need, " > ", temp_bytes_);
    std::size_t have = temp_bytes_;
    KVC_CUDA_THROW(
        kernels::dsv4_sparse_attention(temp_.as<void>(), have, rv, ev, config_, k, stream_));
  }

 private:
  SparseAttentionConfig config_;
  Device device_;
  DeviceBuffer staging_, temp_;
  std::size_t temp_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<SparseAttention> make_cuda_sparse_attention(const SparseAttentionConfig& c,
                                                            Device device) {
  return std::make_unique<CudaSparseAttention>(c, device);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc
