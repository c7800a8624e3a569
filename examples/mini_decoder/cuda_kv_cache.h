/*! \file examples/mini_decoder/cuda_kv_cache.h
 *  \brief The dense f32 reference cache on a CUDA device (CUDA builds only): what DenseKvCache is
 *  for the CPU model, for the CUDA model of cuda_model.h. K and V of every layer stay on the
 *  device, token-major ([layer][capacity][Hkv][head_dim] f32, so that a step's append is one
 *  contiguous copy), and attention is the exact causal f32 kernel of cuda_kernels.h.
 *
 *  make_cuda_kv_cache() builds the cache the kvc flags describe for the CUDA model: this one for
 *  the reference (dense f32), kvc's stores on the CUDA device otherwise.
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "device_array.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

/// Dense exact f32 attention with K/V on the current CUDA device. All device memory is allocated
/// at construction. Work is ordered on the legacy default stream.
class CudaDenseKvCache final : public KvCache {
 public:
  /// @param[in] shape geometry; capacity in [1, 2^24]
  explicit CudaDenseKvCache(const KvShape& shape);
  ~CudaDenseKvCache() override;
  CudaDenseKvCache(const CudaDenseKvCache&) = delete;
  CudaDenseKvCache& operator=(const CudaDenseKvCache&) = delete;

  int length() const override { return length_; }
  int capacity() const override { return shape_.capacity; }
  /// Host K/V: copied to the device, then append_device() (for tests and host models).
  void append(int layer, int pos0, int count, const float* k, const float* v) override;
  /// Host q and out: copied through the device around attend_device() (synchronises).
  void attend(int layer, int pos0, int count, const float* q, float* out,
              ThreadPool& pool) override;
  bool on_device() const override { return true; }
  void append_device(int layer, int pos0, int count, const float* d_k, const float* d_v) override;
  void attend_device(int layer, int pos0, int count, const float* d_q, float* d_out) override;
  void advance(int count) override;
  std::size_t footprint_bytes() const override;
  std::size_t reserved_bytes() const override;
  std::string describe() const override;

  /// Layers of the cache.
  int num_layers() const { return shape_.num_layers; }
  /// Device pointer to K of `layer`: [capacity][Hkv][head_dim] f32 (positions < length() hold
  /// committed tokens).
  const float* k_device(int layer) const;
  /// Device pointer to V of `layer`, same layout.
  const float* v_device(int layer) const;

 private:
  void check_range(int layer, int pos0, int count) const;
  std::size_t token_floats() const;
  std::size_t layer_floats() const;

  KvShape shape_;
  int length_ = 0;
  DeviceArray<float> k_;        // [layer][capacity][Hkv][head_dim]
  DeviceArray<float> v_;        // same
  DeviceArray<float> staging_;  // host-interface copies (grown on first use)
};

/// "Dense prefill, compressed decode" on the device: appends the first `count` committed tokens
/// of `src` to `dst` (every layer, then advance) with append_device(), so K/V never leave the
/// device. dst must be empty and on_device().
void copy_prefix(const CudaDenseKvCache& src, int count, KvCache& dst);

/// The cache `options` describe, for the CUDA model: CudaDenseKvCache for the reference (dense
/// f32), otherwise a KvcKvCache on cuda:0. Throws kvc::Error for invalid options, for
/// options.device == "cpu" (the CUDA model needs kvc on the device) and when kvc's parts cannot
/// run on cuda:0.
/// @param[in] options the kvc flags
/// @param[in] shape   geometry
/// @param[out] note   for a kvc cache, why it runs where it runs (pick_kv_device), or null
std::unique_ptr<KvCache> make_cuda_kv_cache(const KvOptions& options, const KvShape& shape,
                                            std::string* note = nullptr);

}  // namespace mini_decoder
}  // namespace kvc
