// Context-parallel decoder on CUDA: device buffers allocated once, and three small kernels for
// the data movements of a step (pack candidates, build the global score rows, merge the
// gathered states) with the same arithmetic as the CPU reference (kvc/attention/merge.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "kvc/attention/merge.h"
#include "kvc/attention/params.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/store/block_codec.h"
#include "parallel_internal.h"

namespace kvc {
namespace parallel {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float device_nan() { return bits_float(0x7fc00000u); }

// Grid: rows. cand_send[r, m] = (score, logical id) of the row's m-th local pick, else padding.
__global__ void __launch_bounds__(kThreads)
    pack_kernel(const float* local_scores, int owned_pitch, const std::int32_t* local_ids,
                const std::int32_t* local_counts, int M, int num_shards, int shard_index,
                BlockCandidate* out) {
  const int r = blockIdx.x;
  const int count = local_counts[r];
  for (int m = threadIdx.x; m < M; m += blockDim.x) {
    BlockCandidate c;
    if (m < count) {
      const int j = local_ids[static_cast<std::size_t>(r) * M + m];
      c.score = local_scores[static_cast<std::size_t>(r) * owned_pitch + j];
      c.id = j * num_shards + shard_index;
    } else {
      c.score = device_nan();
      c.id = -1;
    }
    out[static_cast<std::size_t>(r) * M + m] = c;
  }
}

// Grid: rows. The row's closed-block count from the device lengths, NaN over [0, closed), then
// every shard's candidates at their logical ids (distinct across shards: no write conflicts).
__global__ void __launch_bounds__(kThreads)
    build_rows_kernel(StoreView s, const std::int32_t* slots, int rows, int rows_per_seq,
                      const BlockCandidate* recv, int num_shards, int M, float* scores, int pitch,
                      std::int32_t* valid) {
  const int r = blockIdx.x;
  const int L = s.lengths[slots[r / rows_per_seq]];
  const int closed = L > s.recent_window ? (L - s.recent_window) / s.block_size : 0;
  float* row = scores + static_cast<std::size_t>(r) * pitch;
  for (int j = threadIdx.x; j < closed; j += blockDim.x) row[j] = device_nan();
  if (threadIdx.x == 0) valid[r] = closed;
  __syncthreads();
  for (int e = threadIdx.x; e < num_shards * M; e += blockDim.x) {
    const int src = e / M, m = e % M;
    const BlockCandidate c = recv[(static_cast<std::size_t>(src) * rows + r) * M + m];
    if (c.id >= 0 && c.id < closed) row[c.id] = c.score;
  }
}

// Grid: q_rows. The merge in shard order, as the CPU's merge_states: thread 0 computes the
// chain's weights (merge_weights from the running lse and shard s's lse) once per row, a chunk of
// kThreads shards at a time, into shared memory; every thread then folds its elements (at most
// 512 / kThreads: head_dim <= 512) over the chunk with the same two products and sum per step.
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const float* recv, int q_rows, int d, int num_shards, void* out, DType out_dtype,
                 float* lse) {
  constexpr int kPer = 512 / kThreads;
  __shared__ float wa[kThreads], wb[kThreads];
  const int r = blockIdx.x;
  const std::size_t per_shard = static_cast<std::size_t>(q_rows) * (d + 1);
  float acc[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
  float acc_lse = -INFINITY;  // thread 0's running lse
  for (int s0 = 0; s0 < num_shards; s0 += kThreads) {
    const int n = num_shards - s0 < kThreads ? num_shards - s0 : kThreads;
    if (threadIdx.x == 0) {
      for (int k = 0; k < n; ++k) {
        const float* state = recv + static_cast<std::size_t>(s0 + k) * per_shard;
        const MergeWeights w =
            merge_weights(acc_lse, state[static_cast<std::size_t>(q_rows) * d + r]);
        wa[k] = w.a;
        wb[k] = w.b;
        acc_lse = w.lse;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * kThreads;
      if (i >= d) break;
      for (int k = 0; k < n; ++k) {
        const float* state = recv + static_cast<std::size_t>(s0 + k) * per_shard;
        acc[j] = fadd_rn(fmul_rn(wa[k], acc[j]),
                         fmul_rn(wb[k], state[static_cast<std::size_t>(r) * d + i]));
      }
    }
    __syncthreads();  // the chunk's weights are read before thread 0 writes the next ones
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads;
    if (i < d)
      attention::store_element(out, static_cast<std::size_t>(r) * d + i, out_dtype, acc[j]);
  }
  if (threadIdx.x == 0 && lse != nullptr) lse[r] = acc_lse;
}

class CudaDecoder final : public DecoderBase {
 public:
  CudaDecoder(const ContextParallelConfig& config, const KvStoreConfig& store, Device device)
      : DecoderBase(config, store, device) {
    detail::DeviceGuard guard(device.index);
    const Sizes& z = sizes();
    const std::size_t rows = static_cast<std::size_t>(z.max_rows);
    const std::size_t n = static_cast<std::size_t>(z.num_shards);
    const std::size_t state = static_cast<std::size_t>(z.max_q_rows) * (z.head_dim + 1);
    auto make = [](std::size_t bytes) { return detail::DeviceBuffer(bytes > 0 ? bytes : 16); };
    local_scores_ = make(rows * z.owned_blocks * 4);
    local_valid_ = make(rows * 4);
    local_ids_ = make(rows * z.candidates * 4);
    local_counts_ = make(rows * 4);
    cand_send_ = make(rows * z.candidates * sizeof(BlockCandidate));
    cand_recv_ = make(n * rows * z.candidates * sizeof(BlockCandidate));
    global_scores_ = make(rows * z.global_blocks * 4);
    global_valid_ = make(rows * 4);
    global_ids_ = make(rows * z.global_selected * 4);
    global_counts_ = make(rows * 4);
    state_send_ = make(state * 4);
    state_recv_ = make(n * state * 4);
    slots_ = make(static_cast<std::size_t>(config.index.max_batch) * 4);
    Buffers b;
    b.local_scores = local_scores_.as<float>();
    b.local_valid = local_valid_.as<std::int32_t>();
    b.local_ids = local_ids_.as<std::int32_t>();
    b.local_counts = local_counts_.as<std::int32_t>();
    b.cand_send = cand_send_.as<BlockCandidate>();
    b.cand_recv = cand_recv_.as<BlockCandidate>();
    b.global_scores = global_scores_.as<float>();
    b.global_valid = global_valid_.as<std::int32_t>();
    b.global_ids = global_ids_.as<std::int32_t>();
    b.global_counts = global_counts_.as<std::int32_t>();
    b.state_send = state_send_.as<float>();
    b.state_recv = state_recv_.as<float>();
    init(b);
    KVC_CUDA_THROW(cudaDeviceSynchronize());
  }

 protected:
  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(stream()); }

  void upload_slots(const std::vector<int>& slots) override {
    detail::DeviceGuard guard(device().index);
    KVC_CUDA_THROW(cudaMemcpyAsync(slots_.as<void>(), slots.data(), slots.size() * 4,
                                   cudaMemcpyHostToDevice, cuda_stream()));
  }

  void pack_candidates(const StepShape& shape) override {
    const Sizes& z = sizes();
    if (shape.rows == 0 || z.candidates == 0) return;
    detail::DeviceGuard guard(device().index);
    pack_kernel<<<shape.rows, kThreads, 0, cuda_stream()>>>(
        buffers().local_scores, z.owned_blocks, buffers().local_ids, buffers().local_counts,
        z.candidates, z.num_shards, z.shard_index, buffers().cand_send);
    KVC_CUDA_THROW(cudaGetLastError());
  }

  void build_global_rows(const StoreView& s, const StepShape& shape) override {
    const Sizes& z = sizes();
    if (shape.rows == 0) return;
    detail::DeviceGuard guard(device().index);
    build_rows_kernel<<<shape.rows, kThreads, 0, cuda_stream()>>>(
        s, slots_.as<std::int32_t>(), shape.rows, shape.rows / shape.batch, buffers().cand_recv,
        z.num_shards, z.candidates, buffers().global_scores, z.global_blocks,
        buffers().global_valid);
    KVC_CUDA_THROW(cudaGetLastError());
  }

  void merge_states(const StepShape& shape, const TensorView& out, float* lse) override {
    const Sizes& z = sizes();
    if (shape.q_rows == 0) return;
    detail::DeviceGuard guard(device().index);
    merge_kernel<<<shape.q_rows, kThreads, 0, cuda_stream()>>>(
        buffers().state_recv, shape.q_rows, z.head_dim, z.num_shards, out.data, out.dtype, lse);
    KVC_CUDA_THROW(cudaGetLastError());
  }

 private:
  detail::DeviceBuffer local_scores_, local_valid_, local_ids_, local_counts_, cand_send_,
      cand_recv_, global_scores_, global_valid_, global_ids_, global_counts_, state_send_,
      state_recv_, slots_;
};

}  // namespace

std::unique_ptr<ContextParallelDecoder> make_cuda_decoder(const ContextParallelConfig& config,
                                                          const KvStoreConfig& store,
                                                          Device device) {
  return std::make_unique<CudaDecoder>(config, store, device);
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error of a plain host pointer on old runtimes
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

void cuda_loopback_copy(const std::vector<const void*>& sends, const std::vector<void*>& recvs,
                        const std::vector<void*>& streams, std::size_t bytes) {
  for (void* s : streams) KVC_CUDA_THROW(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
  for (std::size_t dst = 0; dst < recvs.size(); ++dst) {
    for (std::size_t src = 0; src < sends.size(); ++src) {
      KVC_CUDA_THROW(cudaMemcpy(static_cast<unsigned char*>(recvs[dst]) + src * bytes, sends[src],
                                bytes, cudaMemcpyDefault));
    }
  }
}

}  // namespace parallel
}  // namespace kvc
