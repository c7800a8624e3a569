// The Llama decoder forward on a CUDA device (see cuda_model.h).
#include "cuda_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuda_kernels.h"
#include "device_array.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

void blas_check(cublasStatus_t s, const char* what) {
  KVC_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuda model: ", what, " failed: ", cublasGetStatusName(s),
            " (", cublasGetStatusString(s), ")");
}

// Row-major [rows][k] f32 of the tensors stacked one after the other (the CPU model's stacks).
std::vector<float> stacked(const gguf::File& f, const std::vector<const gguf::TensorInfo*>& parts) {
  std::vector<float> out;
  for (const gguf::TensorInfo* p : parts) {
    const std::vector<float> v = f.dequantize_tensor(*p);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// y[m][0:n] (+)= x[m][0:k] . W^T with W row-major [n][k]; all row-major on the device. In
// cuBLAS's column-major terms: Y^T (n x m, ld ldy) = W (A = the column-major k x n array W^T,
// transposed) times X^T (k x m, ld ldx).
void gemm(cublasHandle_t blas, const float* x, int m, int ldx, const float* w, int n, int k,
          float* y, int ldy, bool accumulate) {
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  blas_check(
      cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, k, x, ldx, &beta, y, ldy),
      "cublasSgemm");
}

}  // namespace

struct CudaLlamaModel::Impl {
  struct Layer {
    DeviceArray<float> attn_norm;  // [d_model]
    DeviceArray<float> ffn_norm;   // [d_model]
    DeviceArray<float> qkv;        // [q_dim + 2 kv_dim][d_model]
    DeviceArray<float> wo;         // [d_model][q_dim]
    DeviceArray<float> gate_up;    // [2 d_ff][d_model] (gate rows, then up rows)
    DeviceArray<float> down;       // [d_model][d_ff]
  };

  ~Impl() {
    if (blas != nullptr) cublasDestroy(blas);
  }

  // RoPE table rows for positions [0, positions): the CPU model's angles (double) as floats.
  void ensure_rope(int positions, const LlamaConfig& c) {
    if (positions <= rope_positions) return;
    const int n = std::max({positions, 2 * rope_positions, 256});
    const int half = c.rope_dim / 2;
    std::vector<float> table(static_cast<std::size_t>(n) * c.rope_dim);
    for (int p = 0; p < n; ++p) {
      float* row = table.data() + static_cast<std::size_t>(p) * c.rope_dim;
      for (int j = 0; j < half; ++j) {
        const double angle = static_cast<double>(p) * inv_freq[static_cast<std::size_t>(j)];
        row[j] = static_cast<float>(std::cos(angle));
        row[half + j] = static_cast<float>(std::sin(angle));
      }
    }
    rope.upload(table);
    rope_positions = n;
  }

  cublasHandle_t blas = nullptr;
  std::vector<Layer> layers;
  DeviceArray<float> embd;         // [vocab][d_model]
  DeviceArray<float> output_norm;  // [d_model]
  DeviceArray<float> output;       // [vocab][d_model] when output.weight is present
  const float* lm_head = nullptr;  // output or embd
  std::vector<double> inv_freq;    // [rope_dim / 2]
  DeviceArray<float> rope;         // [rope_positions][rope_dim]
  int rope_positions = 0;

  // Per-step scratch (grown to the largest step).
  std::vector<std::int32_t> host_tokens;
  DeviceArray<std::int32_t> tokens;
  DeviceArray<float> x, xn, qkv, q, k, v, att, gu, h, logits;
};

CudaLlamaModel::CudaLlamaModel(const gguf::File& f, ThreadPool& pool)
    : config_(LlamaConfig::from_gguf(f)), impl_(std::make_unique<Impl>()) {
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

  Impl& m = *impl_;
  blas_check(cublasCreate(&m.blas), "cublasCreate");
  // Plain f32 GEMMs (no TF32 tensor cores), on the legacy default stream like every kernel.
  blas_check(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  blas_check(cublasSetStream(m.blas, nullptr), "cublasSetStream");

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
    hl.qkv = stacked(f, {p.q, p.k, p.v});
    hl.wo = f.dequantize_tensor(*p.o);
    hl.gate_up = stacked(f, {p.gate, p.up});
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
  m.inv_freq.resize(static_cast<std::size_t>(c.rope_dim / 2));
  for (int i = 0; i < c.rope_dim / 2; ++i) {
    m.inv_freq[static_cast<std::size_t>(i)] =
        std::pow(static_cast<double>(c.rope_base), -2.0 * i / c.rope_dim);
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

std::string CudaLlamaModel::device_name() const {
  int dev = 0;
  KVC_CUDA_THROW(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KVC_CUDA_THROW(cudaGetDeviceProperties(&prop, dev));
  return "cuda:" + std::to_string(dev) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
}

void CudaLlamaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                             const ForwardOptions& options) {
  KVC_CHECK(count >= 1, "forward: count = ", count, " must be >= 1");
  KVC_CHECK(options.chunk >= 1, "forward: chunk = ", options.chunk, " must be >= 1");
  KVC_CHECK(count <= cache.capacity() - cache.length(), "forward: ", count,
            " tokens do not fit: the cache holds ", cache.length(), " of ", cache.capacity());
  KVC_CHECK(cache.on_device(), "forward: the CUDA model needs a cache on the device, not ",
            cache.describe(), " (make_cuda_kv_cache)");
  for (int t = 0; t < count; ++t) {
    KVC_CHECK(tokens[t] >= 0 && tokens[t] < config_.vocab_size, "forward: token ", t, " = ",
              tokens[t], " must be in [0, vocab_size = ", config_.vocab_size, ")");
  }
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
  m.ensure_rope(pos0 + T, c);

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

  KVC_CUDA_THROW(cuda::embed(m.embd.get(), d_tokens, T, D, x, nullptr));
  for (int l = 0; l < c.num_layers; ++l) {
    const Impl::Layer& L = m.layers[static_cast<std::size_t>(l)];
    KVC_CUDA_THROW(cuda::rms_norm(x, L.attn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    gemm(m.blas, xn, T, D, L.qkv.get(), qkv_ld, D, qkv, qkv_ld, false);
    KVC_CUDA_THROW(cuda::split_qkv_rope(qkv, m.rope.get(), qs, T, pos0, q, k, v, nullptr));
    cache.append_device(l, pos0, T, k, v);
    cache.attend_device(l, pos0, T, q, att);
    gemm(m.blas, att, T, qd, L.wo.get(), D, qd, x, D, true);  // x += attention output

    KVC_CUDA_THROW(cuda::rms_norm(x, L.ffn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    gemm(m.blas, xn, T, D, L.gate_up.get(), 2 * c.d_ff, D, gu, 2 * c.d_ff, false);
    KVC_CUDA_THROW(cuda::silu_mul(gu, h, T, c.d_ff, nullptr));
    gemm(m.blas, h, T, c.d_ff, L.down.get(), D, c.d_ff, x, D, true);  // x += feed-forward
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
  gemm(m.blas, xn, rows, D, m.lm_head, c.vocab_size, D, d_logits, c.vocab_size, false);
  // Synchronous on the legacy default stream: returns once every launch above has finished.
  KVC_CUDA_THROW(cudaMemcpy(logits, d_logits,
                            static_cast<std::size_t>(rows) * vocab * sizeof(float),
                            cudaMemcpyDeviceToHost));
}

}  // namespace mini_decoder
}  // namespace kvc
