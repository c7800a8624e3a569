// The Llama decoder forward on a CUDA device (see cuda_model.h).
#include "cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuda_kernels.h"
#include "cuda_model_util.h"
#include "device_array.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {

struct CudaLlamaModel::Impl {
  struct Layer {
    DeviceArray<float> attn_norm;  // [d_model]
    DeviceArray<float> ffn_norm;   // [d_model]
    DeviceArray<float> qkv;        // [q_dim + 2 kv_dim][d_model]
    DeviceArray<float> wo;         // [d_model][q_dim]
    DeviceArray<float> gate_up;    // [2 d_ff][d_model] (gate rows, then up rows)
    DeviceArray<float> down;       // [d_model][d_ff]
  };

  explicit Impl(const LlamaConfig& c) : rope(rope_inv_freq(c.rope_base, c.rope_dim)) {}

  cuda::Blas blas;
  std::vector<Layer> layers;
  DeviceArray<float> embd;         // [vocab][d_model]
  DeviceArray<float> output_norm;  // [d_model]
  DeviceArray<float> output;       // [vocab][d_model] when output.weight is present
  const float* lm_head = nullptr;  // output or embd
  cuda::RopeTable rope;

  // Per-step scratch (grown to the largest step).
  std::vector<std::int32_t> host_tokens;
  DeviceArray<std::int32_t> tokens;
  DeviceArray<float> x, xn, qkv, q, k, v, att, gu, h, logits;
};

CudaLlamaModel::CudaLlamaModel(const gguf::File& f, ThreadPool& pool)
    : config_(LlamaConfig::from_gguf(f)), info_(model_info(config_)) {
  KVC_CHECK(cuda_device_count() > 0,
            "cuda model: no CUDA device (kvc::cuda_device_count() = 0); use --device cpu");
  const LlamaConfig& c = config_;
  KVC_CHECK(c.head_dim <= cuda::kMaxHeadDim, "cuda model: head_dim = ", c.head_dim,
            " must be <= ", cuda::kMaxHeadDim);
  // Every shape and type is checked before the (long) dequantisation starts.
  const LlamaTensors tensors = LlamaTensors::from_gguf(f, c);
  const gguf::TensorInfo& embd = *tensors.embd;
  const gguf::TensorInfo* out = tensors.output;
  const gguf::TensorInfo& onorm = *tensors.output_norm;
  using Parts = LlamaTensors::Block;
  const std::vector<Parts>& parts = tensors.blocks;

  impl_ = std::make_unique<Impl>(c);
  Impl& m = *impl_;

  // Dequantise on the host threads, one layer per task, then upload layer by layer.
  struct HostLayer {
    std::vector<float> attn_norm, ffn_norm, qkv, wo, gate_up, down;
  };
  std::vector<HostLayer> host(static_cast<std::size_t>(c.num_layers));
  pool.parallel_for(c.num_layers, [&](int l, int) {
    const Parts& p = parts[static_cast<std::size_t>(l)];
    HostLayer& hl = host[static_cast<std::size_t>(l)];
    hl.attn_norm = f.dequantize_tensor(*p.attn_norm);
    hl.ffn_norm = f.dequantize_tensor(*p.ffn_norm);
    hl.qkv = dequantize_stacked(f, {p.q, p.k, p.v});
    hl.wo = f.dequantize_tensor(*p.o);
    hl.gate_up = dequantize_stacked(f, {p.gate, p.up});
    hl.down = f.dequantize_tensor(*p.down);
  });
  m.layers = std::vector<Impl::Layer>(static_cast<std::size_t>(c.num_layers));
  for (std::size_t l = 0; l < host.size(); ++l) {
    Impl::Layer& L = m.layers[l];
    HostLayer& hl = host[l];
    L.attn_norm.upload(hl.attn_norm);
    L.ffn_norm.upload(hl.ffn_norm);
    L.qkv.upload(hl.qkv);
    L.wo.upload(hl.wo);
    L.gate_up.upload(hl.gate_up);
    L.down.upload(hl.down);
    hl = HostLayer();
    weight_bytes_ += L.attn_norm.bytes() + L.ffn_norm.bytes() + L.qkv.bytes() + L.wo.bytes() +
                     L.gate_up.bytes() + L.down.bytes();
  }
  m.embd.upload(f.dequantize_tensor(embd));
  m.output_norm.upload(f.dequantize_tensor(onorm));
  weight_bytes_ += m.embd.bytes() + m.output_norm.bytes();
  if (out != nullptr) {
    m.output.upload(f.dequantize_tensor(*out));
    weight_bytes_ += m.output.bytes();
    m.lm_head = m.output.get();
  } else {
    m.lm_head = m.embd.get();  // tied
  }
  KVC_CUDA_THROW(cudaDeviceSynchronize());
}

CudaLlamaModel::~CudaLlamaModel() = default;

KvShape CudaLlamaModel::kv_shape(int capacity) const {
  KvShape s;
  s.num_layers = config_.num_layers;
  s.num_q_heads = config_.num_heads;
  s.num_kv_heads = config_.num_kv_heads;
  s.head_dim = config_.head_dim;
  s.capacity = capacity;
  return s;
}

std::string CudaLlamaModel::device_name() const { return cuda::device_name(); }

void CudaLlamaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                             ThreadPool& /*pool*/, const ForwardOptions& options) {
  forward(tokens, count, cache, logits, options);
}

void CudaLlamaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                             const ForwardOptions& options) {
  check_forward_args(tokens, count, cache, config_.vocab_size, options);
  KVC_CHECK(cache.on_device(), "forward: the CUDA model needs a cache on the device, not ",
            cache.describe(), " (make_cuda_kv_cache)");
  for (int t0 = 0; t0 < count; t0 += options.chunk) {
    const int n = std::min(options.chunk, count - t0);
    const bool last = t0 + n == count;
    float* out = nullptr;
    if (logits != nullptr && options.all_logits) {
      out = logits + static_cast<std::size_t>(t0) * config_.vocab_size;
    } else if (logits != nullptr && last) {
      out = logits;
    }
    step(tokens + t0, n, cache, out, options.all_logits);
  }
}

void CudaLlamaModel::step(const int* tokens, int count, KvCache& cache, float* logits,
                          bool all_logits) {
  const LlamaConfig& c = config_;
  Impl& m = *impl_;
  const int T = count;
  const int D = c.d_model;
  const int qd = c.num_heads * c.head_dim;
  const int kvd = c.num_kv_heads * c.head_dim;
  const int qkv_ld = qd + 2 * kvd;
  const int pos0 = cache.length();
  const std::size_t t = static_cast<std::size_t>(T);
  const float* rope = m.rope.ensure(pos0 + T);

  m.host_tokens.assign(tokens, tokens + T);
  std::int32_t* d_tokens = m.tokens.ensure(t);
  KVC_CUDA_THROW(
      cudaMemcpy(d_tokens, m.host_tokens.data(), t * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  float* x = m.x.ensure(t * D);
  float* xn = m.xn.ensure(t * D);
  float* qkv = m.qkv.ensure(t * qkv_ld);
  float* q = m.q.ensure(t * qd);
  float* k = m.k.ensure(t * kvd);
  float* v = m.v.ensure(t * kvd);
  float* att = m.att.ensure(t * qd);
  float* gu = m.gu.ensure(t * 2 * c.d_ff);
  float* h = m.h.ensure(t * c.d_ff);

  cuda::QkvShape qs;
  qs.num_q_heads = c.num_heads;
  qs.num_kv_heads = c.num_kv_heads;
  qs.head_dim = c.head_dim;
  qs.rope_dim = c.rope_dim;

  KVC_CUDA_THROW(cuda::embed(m.embd.get(), d_tokens, T, D, 1.0f, x, nullptr));
  for (int l = 0; l < c.num_layers; ++l) {
    const Impl::Layer& L = m.layers[static_cast<std::size_t>(l)];
    KVC_CUDA_THROW(cuda::rms_norm(x, L.attn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    m.blas.gemm(xn, T, D, L.qkv.get(), qkv_ld, D, qkv, qkv_ld, false);
    KVC_CUDA_THROW(cuda::split_qkv_rope(qkv, rope, qs, T, pos0, q, k, v, nullptr));
    cache.append_device(l, pos0, T, k, v);
    cache.attend_device(l, pos0, T, q, att);
    m.blas.gemm(att, T, qd, L.wo.get(), D, qd, x, D, true);  // x += attention output

    KVC_CUDA_THROW(cuda::rms_norm(x, L.ffn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    m.blas.gemm(xn, T, D, L.gate_up.get(), 2 * c.d_ff, D, gu, 2 * c.d_ff, false);
    KVC_CUDA_THROW(cuda::silu_mul(gu, h, T, c.d_ff, nullptr));
    m.blas.gemm(h, T, c.d_ff, L.down.get(), D, c.d_ff, x, D, true);  // x += feed-forward
  }
  cache.advance(T);

  if (logits == nullptr) {
    KVC_CUDA_THROW(cudaGetLastError());
    return;
  }
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  const std::size_t vocab = static_cast<std::size_t>(c.vocab_size);
  float* d_logits = m.logits.ensure(static_cast<std::size_t>(rows) * vocab);
  KVC_CUDA_THROW(cuda::rms_norm(x + static_cast<std::size_t>(first) * D, m.output_norm.get(), xn,
                                rows, D, c.rms_eps, nullptr));
  m.blas.gemm(xn, rows, D, m.lm_head, c.vocab_size, D, d_logits, c.vocab_size, false);
  // Synchronous on the legacy default stream: returns once every launch above has finished.
  KVC_CUDA_THROW(cudaMemcpy(logits, d_logits,
                            static_cast<std::size_t>(rows) * vocab * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

}  // namespace mini_decoder
}  // namespace kvc
