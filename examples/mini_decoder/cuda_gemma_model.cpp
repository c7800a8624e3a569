// The Gemma 3 decoder forward on a CUDA device (see cuda_gemma_model.h).
#include "cuda_gemma_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_kernels.h"
#include "cuda_model_util.h"
#include "device_array.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "model.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {

// The rings of one sequence's sliding-window layers on the device.
struct CudaGemmaModel::Rings {
  DeviceArray<float> k;  // [local layer][slots][Hkv][head_dim]
  DeviceArray<float> v;  // same
  std::size_t floats = 0;
  int positions = 0;
  int length() const { return positions; }
  void reset() { positions = 0; }
};

struct CudaGemmaModel::Impl {
  struct Layer {
    DeviceArray<float> attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // [d_model]
    DeviceArray<float> q_norm, k_norm;                                      // [head_dim]
    DeviceArray<float> qkv;      // [q_dim + 2 kv_dim][d_model]
    DeviceArray<float> wo;       // [d_model][q_dim]
    DeviceArray<float> gate_up;  // [2 d_ff][d_model] (gate rows, then up rows)
    DeviceArray<float> down;     // [d_model][d_ff]
  };

  explicit Impl(const GemmaConfig& c)
      : rope_local(rope_inv_freq(c.rope_base_local, c.rope_dim)),
        rope_global(rope_inv_freq(c.rope_base_global, c.rope_dim)),
        slots(SlidingWindowCache::slots_for(c.sliding_window)),
        rings(
            [floats = static_cast<std::size_t>(std::max(1, c.num_local_layers())) *
                      SlidingWindowCache::slots_for(c.sliding_window) * c.num_kv_heads *
                      c.head_dim] {
              auto r = std::make_unique<Rings>();
              r->floats = floats;
              r->k.ensure(floats);
              r->v.ensure(floats);
              return r;
            },
            [](const Rings& from, Rings& to) {
              KVC_CUDA_THROW(cudaMemcpy(to.k.get(), from.k.get(), from.floats * sizeof(float),
                                        cudaMemcpyDeviceToDevice));
              KVC_CUDA_THROW(cudaMemcpy(to.v.get(), from.v.get(), from.floats * sizeof(float),
                                        cudaMemcpyDeviceToDevice));
              to.positions = from.positions;
            }) {}

  cuda::Blas blas;
  std::vector<Layer> layers;
  DeviceArray<float> embd;         // [vocab][d_model]
  DeviceArray<float> output_norm;  // [d_model]
  DeviceArray<float> output;       // [vocab][d_model] when output.weight is present
  const float* lm_head = nullptr;  // output or embd
  cuda::RopeTable rope_local, rope_global;
  int slots = 0;                 // ring rows per local layer
  SequenceWindows<Rings> rings;  // per sequence (KvCache object)

  // Per-step scratch (grown to the largest step).
  std::vector<std::int32_t> host_tokens;
  DeviceArray<std::int32_t> tokens;
  DeviceArray<float> x, xn, qkv, q, k, v, att, o, gu, h, logits;
};

CudaGemmaModel::CudaGemmaModel(const gguf::File& f, ThreadPool& pool)
    : config_(GemmaConfig::from_gguf(f)),
      info_(model_info(config_)),
      cache_layer_(config_.cache_layers()),
      local_layer_(config_.window_layers()) {
  KVC_CHECK(cuda_device_count() > 0,
            "cuda model: no CUDA device (kvc::cuda_device_count() = 0); use --device cpu");
  const GemmaConfig& c = config_;
  KVC_CHECK(c.head_dim <= cuda::kMaxHeadDim, "cuda model: head_dim = ", c.head_dim,
            " must be <= ", cuda::kMaxHeadDim);
  // Every shape and type is checked before the (long) dequantisation starts.
  const GemmaTensors tensors = GemmaTensors::from_gguf(f, c);
  impl_ = std::make_unique<Impl>(c);
  Impl& m = *impl_;

  struct HostLayer {
    std::vector<float> attn_norm, post_attn_norm, ffn_norm, post_ffn_norm, q_norm, k_norm, qkv, wo,
        gate_up, down;
  };
  std::vector<HostLayer> host(static_cast<std::size_t>(c.num_layers));
  pool.parallel_for(c.num_layers, [&](int l, int) {
    const GemmaTensors::Block& p = tensors.blocks[static_cast<std::size_t>(l)];
    HostLayer& hl = host[static_cast<std::size_t>(l)];
    hl.attn_norm = f.dequantize_tensor(*p.attn_norm);
    hl.post_attn_norm = f.dequantize_tensor(*p.post_attn_norm);
    hl.ffn_norm = f.dequantize_tensor(*p.ffn_norm);
    hl.post_ffn_norm = f.dequantize_tensor(*p.post_ffn_norm);
    hl.q_norm = f.dequantize_tensor(*p.q_norm);
    hl.k_norm = f.dequantize_tensor(*p.k_norm);
    hl.qkv = dequantize_stacked(f, {p.q, p.k, p.v});
    hl.wo = f.dequantize_tensor(*p.o);
    hl.gate_up = dequantize_stacked(f, {p.gate, p.up});
    hl.down = f.dequantize_tensor(*p.down);
  });
  m.layers = std::vector<Impl::Layer>(static_cast<std::size_t>(c.num_layers));
  for (std::size_t l = 0; l < host.size(); ++l) {
    Impl::Layer& L = m.layers[l];
    HostLayer& hl = host[l];
    DeviceArray<float>* dst[] = {&L.attn_norm, &L.post_attn_norm,
                                 &L.ffn_norm,  &L.post_ffn_norm,
                                 &L.q_norm,    &L.k_norm,
                                 &L.qkv,       &L.wo,
                                 &L.gate_up,   &L.down};
    const std::vector<float>* src[] = {&hl.attn_norm, &hl.post_attn_norm,
                                       &hl.ffn_norm,  &hl.post_ffn_norm,
                                       &hl.q_norm,    &hl.k_norm,
                                       &hl.qkv,       &hl.wo,
                                       &hl.gate_up,   &hl.down};
    for (std::size_t i = 0; i < sizeof(dst) / sizeof(dst[0]); ++i) {
      dst[i]->upload(*src[i]);
      weight_bytes_ += dst[i]->bytes();
    }
    hl = HostLayer();
  }
  m.embd.upload(f.dequantize_tensor(*tensors.embd));
  m.output_norm.upload(f.dequantize_tensor(*tensors.output_norm));
  weight_bytes_ += m.embd.bytes() + m.output_norm.bytes();
  if (tensors.output != nullptr) {
    m.output.upload(f.dequantize_tensor(*tensors.output));
    weight_bytes_ += m.output.bytes();
    m.lm_head = m.output.get();
  } else {
    m.lm_head = m.embd.get();  // tied
  }
  KVC_CUDA_THROW(cudaDeviceSynchronize());
}

CudaGemmaModel::~CudaGemmaModel() = default;

KvShape CudaGemmaModel::kv_shape(int capacity) const {
  KvShape s;
  s.num_layers = config_.num_global_layers();
  s.num_q_heads = config_.num_heads;
  s.num_kv_heads = config_.num_kv_heads;
  s.head_dim = config_.head_dim;
  s.capacity = capacity;
  return s;
}

std::string CudaGemmaModel::device_name() const { return cuda::device_name(); }

void CudaGemmaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                             ThreadPool& /*pool*/, const ForwardOptions& options) {
  check_forward_args(tokens, count, cache, config_.vocab_size, options);
  KVC_CHECK(cache.on_device(), "forward: the CUDA model needs a cache on the device, not ",
            cache.describe(), " (make_cuda_kv_cache)");
  Rings& rings = impl_->rings.acquire(cache, cache.length());
  for (int t0 = 0; t0 < count; t0 += options.chunk) {
    const int n = std::min(options.chunk, count - t0);
    const bool last = t0 + n == count;
    float* out = nullptr;
    if (logits != nullptr && options.all_logits) {
      out = logits + static_cast<std::size_t>(t0) * config_.vocab_size;
    } else if (logits != nullptr && last) {
      out = logits;
    }
    step(tokens + t0, n, cache, rings, out, options.all_logits);
  }
}

void CudaGemmaModel::fork_sequence(const KvCache& from, const KvCache& to) {
  impl_->rings.fork(from, to);
}

void CudaGemmaModel::step(const int* tokens, int count, KvCache& cache, Rings& rings, float* logits,
                          bool all_logits) {
  const GemmaConfig& c = config_;
  Impl& m = *impl_;
  const int T = count;
  const int D = c.d_model;
  const int hd = c.head_dim;
  const int qd = c.num_heads * hd;
  const int kvd = c.num_kv_heads * hd;
  const int qkv_ld = qd + 2 * kvd;
  const int pos0 = cache.length();
  const std::size_t t = static_cast<std::size_t>(T);
  const float* rope_local = m.rope_local.ensure(pos0 + T);
  const float* rope_global = m.rope_global.ensure(pos0 + T);

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
  float* o = m.o.ensure(t * D);
  float* gu = m.gu.ensure(t * 2 * c.d_ff);
  float* h = m.h.ensure(t * c.d_ff);

  cuda::QkvShape qs;
  qs.num_q_heads = c.num_heads;
  qs.num_kv_heads = c.num_kv_heads;
  qs.head_dim = hd;
  qs.rope_dim = c.rope_dim;
  const float q_factor = static_cast<float>(static_cast<double>(c.attention_scale) *
                                            std::sqrt(static_cast<double>(hd)));
  const std::size_t ring_layer = static_cast<std::size_t>(m.slots) * kvd;

  KVC_CUDA_THROW(cuda::embed(m.embd.get(), d_tokens, T, D, c.embedding_scale, x, nullptr));
  for (int l = 0; l < c.num_layers; ++l) {
    const Impl::Layer& L = m.layers[static_cast<std::size_t>(l)];
    const bool local = c.local[static_cast<std::size_t>(l)];
    KVC_CUDA_THROW(cuda::rms_norm(x, L.attn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    m.blas.gemm(xn, T, D, L.qkv.get(), qkv_ld, D, qkv, qkv_ld, false);
    KVC_CUDA_THROW(cuda::split_qkv_norm_rope_halves(qkv, L.q_norm.get(), L.k_norm.get(),
                                                    local ? rope_local : rope_global, qs, T, pos0,
                                                    c.rms_eps, q_factor, q, k, v, nullptr));
    if (local) {
      const std::size_t r = static_cast<std::size_t>(local_layer_[static_cast<std::size_t>(l)]);
      float* rk = rings.k.get() + r * ring_layer;
      float* rv = rings.v.get() + r * ring_layer;
      for (int c0 = 0; c0 < T; c0 += SlidingWindowCache::kStep) {
        const int n = std::min(SlidingWindowCache::kStep, T - c0);
        // Positions pos0 + c0 .. + n - 1 into their rows (at most two runs around the ring end).
        for (int done = 0; done < n;) {
          const int slot = (pos0 + c0 + done) % m.slots;
          const int run = std::min(n - done, m.slots - slot);
          const std::size_t src = static_cast<std::size_t>(c0 + done) * kvd;
          const std::size_t bytes = static_cast<std::size_t>(run) * kvd * sizeof(float);
          KVC_CUDA_THROW(cudaMemcpyAsync(rk + static_cast<std::size_t>(slot) * kvd, k + src, bytes,
                                         cudaMemcpyDeviceToDevice, nullptr));
          KVC_CUDA_THROW(cudaMemcpyAsync(rv + static_cast<std::size_t>(slot) * kvd, v + src, bytes,
                                         cudaMemcpyDeviceToDevice, nullptr));
          done += run;
        }
        cuda::DenseAttentionParams ap;
        ap.q = q + static_cast<std::size_t>(c0) * qd;
        ap.k = rk;
        ap.v = rv;
        ap.out = att + static_cast<std::size_t>(c0) * qd;
        ap.count = n;
        ap.pos0 = pos0 + c0;
        ap.num_q_heads = c.num_heads;
        ap.num_kv_heads = c.num_kv_heads;
        ap.head_dim = hd;
        ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        ap.window = c.sliding_window;
        ap.ring = m.slots;
        KVC_CUDA_THROW(cuda::dense_attention(ap, nullptr));
      }
    } else {
      const int g = cache_layer_[static_cast<std::size_t>(l)];
      cache.append_device(g, pos0, T, k, v);
      cache.attend_device(g, pos0, T, q, att);
    }
    m.blas.gemm(att, T, qd, L.wo.get(), D, qd, o, D, false);
    KVC_CUDA_THROW(cuda::rms_norm_add(o, L.post_attn_norm.get(), x, T, D, c.rms_eps, nullptr));

    KVC_CUDA_THROW(cuda::rms_norm(x, L.ffn_norm.get(), xn, T, D, c.rms_eps, nullptr));
    m.blas.gemm(xn, T, D, L.gate_up.get(), 2 * c.d_ff, D, gu, 2 * c.d_ff, false);
    KVC_CUDA_THROW(cuda::gelu_tanh_mul(gu, h, T, c.d_ff, nullptr));
    m.blas.gemm(h, T, c.d_ff, L.down.get(), D, c.d_ff, o, D, false);
    KVC_CUDA_THROW(cuda::rms_norm_add(o, L.post_ffn_norm.get(), x, T, D, c.rms_eps, nullptr));
  }
  cache.advance(T);
  rings.positions = pos0 + T;

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
