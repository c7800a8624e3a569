// The dense f32 reference cache on a CUDA device (see cuda_kv_cache.h).
#include "cuda_kv_cache.h"

#include <cuda_runtime.h>

#include <cmath>
#include <sstream>

#include "cuda_kernels.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "kvc_cache.h"

namespace kvc {
namespace mini_decoder {

CudaDenseKvCache::CudaDenseKvCache(const KvShape& shape) : shape_(shape) {
  KVC_CHECK(shape.num_layers >= 1 && shape.num_kv_heads >= 1 && shape.head_dim >= 1 &&
                shape.head_dim <= cuda::kMaxHeadDim && shape.num_q_heads >= shape.num_kv_heads &&
                shape.num_q_heads % shape.num_kv_heads == 0,
            "cuda kv cache: layers = ", shape.num_layers, ", q heads = ", shape.num_q_heads,
            ", kv heads = ", shape.num_kv_heads, ", head_dim = ", shape.head_dim,
            " (q heads must be a multiple of kv heads; head_dim in [1, ", cuda::kMaxHeadDim, "])");
  KVC_CHECK(shape.capacity >= 1 && shape.capacity <= (1 << 24),
            "cuda kv cache: capacity = ", shape.capacity, " must be in [1, 2^24]");
  KVC_CHECK(cuda_device_count() > 0, "cuda kv cache: no CUDA device");
  const std::size_t floats = layer_floats() * shape.num_layers;
  k_.ensure(floats);
  v_.ensure(floats);
}

CudaDenseKvCache::~CudaDenseKvCache() = default;

std::size_t CudaDenseKvCache::token_floats() const {
  return static_cast<std::size_t>(shape_.num_kv_heads) * shape_.head_dim;
}

std::size_t CudaDenseKvCache::layer_floats() const {
  return token_floats() * static_cast<std::size_t>(shape_.capacity);
}

const float* CudaDenseKvCache::k_device(int layer) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "cuda kv cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  return k_.get() + layer_floats() * static_cast<std::size_t>(layer);
}

const float* CudaDenseKvCache::v_device(int layer) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "cuda kv cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  return v_.get() + layer_floats() * static_cast<std::size_t>(layer);
}

void CudaDenseKvCache::check_range(int layer, int pos0, int count) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "cuda kv cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  KVC_CHECK(pos0 == length_, "cuda kv cache: pos0 = ", pos0, " must equal length = ", length_);
  KVC_CHECK(count >= 1 && count <= shape_.capacity - pos0, "cuda kv cache: count = ", count,
            " must be in [1, capacity - pos0 = ", shape_.capacity - pos0, "]");
}

void CudaDenseKvCache::append(int layer, int pos0, int count, const float* k, const float* v) {
  check_range(layer, pos0, count);
  const std::size_t n = token_floats() * static_cast<std::size_t>(count);
  float* d = staging_.ensure(2 * n);
  KVC_CUDA_THROW(cudaMemcpy(d, k, n * sizeof(float), cudaMemcpyHostToDevice));
  KVC_CUDA_THROW(cudaMemcpy(d + n, v, n * sizeof(float), cudaMemcpyHostToDevice));
  append_device(layer, pos0, count, d, d + n);
}

void CudaDenseKvCache::attend(int layer, int pos0, int count, const float* q, float* out,
                              ThreadPool& /*pool*/) {
  check_range(layer, pos0, count);
  const std::size_t n = static_cast<std::size_t>(count) * shape_.num_q_heads *
                        static_cast<std::size_t>(shape_.head_dim);
  float* d = staging_.ensure(2 * n);
  KVC_CUDA_THROW(cudaMemcpy(d, q, n * sizeof(float), cudaMemcpyHostToDevice));
  attend_device(layer, pos0, count, d, d + n);
  KVC_CUDA_THROW(cudaMemcpy(out, d + n, n * sizeof(float), cudaMemcpyDeviceToHost));
}

void CudaDenseKvCache::append_device(int layer, int pos0, int count, const float* d_k,
                                     const float* d_v) {
  check_range(layer, pos0, count);
  const std::size_t offset = layer_floats() * static_cast<std::size_t>(layer) +
                             token_floats() * static_cast<std::size_t>(pos0);
  const std::size_t bytes = token_floats() * static_cast<std::size_t>(count) * sizeof(float);
  KVC_CUDA_THROW(cudaMemcpyAsync(k_.get() + offset, d_k, bytes, cudaMemcpyDeviceToDevice, nullptr));
  KVC_CUDA_THROW(cudaMemcpyAsync(v_.get() + offset, d_v, bytes, cudaMemcpyDeviceToDevice, nullptr));
}

void CudaDenseKvCache::attend_device(int layer, int pos0, int count, const float* d_q,
                                     float* d_out) {
  check_range(layer, pos0, count);
  cuda::DenseAttentionParams p;
  p.q = d_q;
  p.k = k_device(layer);
  p.v = v_device(layer);
  p.out = d_out;
  p.count = count;
  p.pos0 = pos0;
  p.num_q_heads = shape_.num_q_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));  // as DenseKvCache
  KVC_CUDA_THROW(cuda::dense_attention(p, nullptr));
}

void CudaDenseKvCache::advance(int count) {
  KVC_CHECK(count >= 0 && count <= shape_.capacity - length_, "cuda kv cache: advance(", count,
            ") past capacity ", shape_.capacity, " from length ", length_);
  length_ += count;
}

std::size_t CudaDenseKvCache::footprint_bytes() const {
  return token_floats() * static_cast<std::size_t>(length_) * shape_.num_layers * 2 * sizeof(float);
}

std::size_t CudaDenseKvCache::reserved_bytes() const {
  return layer_floats() * shape_.num_layers * 2 * sizeof(float);
}

std::string CudaDenseKvCache::describe() const {
  std::ostringstream os;
  os << "dense f32 on cuda (" << shape_.num_layers << " layers x " << shape_.num_kv_heads
     << " kv heads x " << shape_.head_dim << " dims, capacity " << shape_.capacity << ")";
  return os.str();
}

void copy_prefix(const CudaDenseKvCache& src, int count, KvCache& dst) {
  KVC_CHECK(count >= 0 && count <= src.length(), "copy_prefix: count = ", count,
            " must be in [0, source length = ", src.length(), "]");
  KVC_CHECK(dst.length() == 0, "copy_prefix: the destination holds ", dst.length(),
            " tokens; it must be empty");
  KVC_CHECK(dst.on_device(), "copy_prefix: the destination (", dst.describe(),
            ") is not on the CUDA device");
  if (count == 0) return;
  // Token-major layers: the first `count` tokens of a layer are the [count][Hkv][d] rows that
  // append takes.
  for (int layer = 0; layer < src.num_layers(); ++layer) {
    dst.append_device(layer, 0, count, src.k_device(layer), src.v_device(layer));
  }
  dst.advance(count);
}

std::unique_ptr<KvCache> make_cuda_kv_cache(const KvOptions& options, const KvShape& shape,
                                            std::string* note) {
  options.validate();
  if (options.is_reference()) {
    if (note != nullptr) *note = "dense f32 reference on the device";
    return std::make_unique<CudaDenseKvCache>(shape);
  }
  KVC_CHECK(options.device != "cpu",
            "--kv-device = cpu with the model on CUDA: the CUDA forward keeps K/V on the device, "
            "so kvc must run there too (use --kv-device cuda or auto, or --device cpu)");
  KvOptions o = options;
  o.device = "cuda";  // auto: CUDA, or a clear error naming the part that cannot run there
  const Device device = pick_kv_device(o, note);
  return std::make_unique<KvcKvCache>(options, shape, device);
}

}  // namespace mini_decoder
}  // namespace kvc
