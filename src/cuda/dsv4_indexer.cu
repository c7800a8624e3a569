// Indexer on CUDA: the dsv4_index_score launcher and the object.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "device_buffer.h"
#include "dsv4/index.cuh"
#include "dsv4/index_stream.cuh"
#include "dsv4/index_wgmma.cuh"
#include "dsv4_internal.h"
#include "kvc/config.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/kernels/dsv4_kernels.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace {

using namespace dsv4_detail;

/// The largest mxfp4 score-kernel variant (Dsv4IndexArgs::variant).
constexpr int kIndexVariants = 11;

/// Whether variants 9 and 11 (warpgroup mma, sm_90a) can run here: this build has sm_90a code and
/// no plain sm_90 code that the runtime could pick instead (KVC_CUDA_SM90A, set by CMake), and the
/// device is compute capability 9.0.
bool wgmma_available() {
#if KVC_CUDA_SM90A
  bool sm90 = false;
  return kvc::detail::device_is_sm90(sm90) == cudaSuccess && sm90;
#else
  return false;
#endif
}

/// Whether variants 9 and 11 take these keys: mxfp4, 64 heads of dim 128, pages of 8, 16, 32 or 64
/// entries (a unit of 64 entries is whole pages).
bool wgmma_fits(const dsv4::EntryStoreView& keys, const dsv4::IndexerConfig& c) {
  const int pe = keys.layout.page_entries;
  return c.key_format == dsv4::EntryFormat::kMxfp4 && c.num_heads == 64 && c.head_dim == 128 &&
         pe >= 8 && pe <= kWgUnit && kWgUnit % pe == 0 &&
         keys.layout.page_bytes * static_cast<std::size_t>(kWgUnit / pe) <=
             static_cast<std::size_t>(kMaxStagedPageBytes);
}

int sm_count() {
  int n = 0;
  return kvc::detail::sm_count(n) == cudaSuccess ? n : 132;
}

/// Launches a score kernel as a programmatic dependent of the preparation kernel before it.
template <class Kernel>
cudaError_t launch(Kernel kernel, dim3 grid, int smem, const IndexParams& p, cudaStream_t stream) {
  if (smem > 48 * 1024) {
    KVC_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  return kvc::detail::launch_kernel(kernel, grid, dim3(kIndexThreads),
                                    static_cast<std::size_t>(smem), true, stream, p);
}

/// Resident CTAs per SM of a score kernel with `smem` dynamic bytes (2 when the query fails).
template <class Kernel>
int ctas_per_sm(Kernel kernel, int smem) {
  int n = 0;
  return kvc::detail::resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), kIndexThreads,
                                           static_cast<std::size_t>(smem), n) == cudaSuccess
             ? n
             : 2;
}

/// Calls pick(std::integral_constant<int, MT>) for MT = 1..4 (heads / 16), the kernels'
/// compile-time tile count; cudaErrorInvalidValue for any other MT.
template <class Pick>
cudaError_t by_tiles(int MT, Pick&& pick) {
  switch (MT) {
    case 1:
      return pick(std::integral_constant<int, 1>{});
    case 2:
      return pick(std::integral_constant<int, 2>{});
    case 3:
      return pick(std::integral_constant<int, 3>{});
    case 4:
      return pick(std::integral_constant<int, 4>{});
    default:
      return cudaErrorInvalidValue;
  }
}

/// A staged score kernel with dynamic shared memory: launches it, or with `occupancy` set only
/// reports its resident CTAs per SM there.
template <class Kernel>
cudaError_t launch_or_measure(Kernel kernel, int smem, dim3 grid, const IndexParams& p,
                              cudaStream_t stream, int* occupancy) {
  if (occupancy != nullptr) {
    *occupancy = ctas_per_sm(kernel, smem);
    return cudaSuccess;
  }
  return launch(kernel, grid, smem, p, stream);
}

/// The lean staged kernel, R pages at a time (variants 3 and 4), the shared-unpack kernel (R = 0,
/// variant 5), the page-stream kernel (R = -1, variant 6; R = -3, variant 8: its octet loop
/// unrolled; R = -4, variant 10: octets in pairs) or the page-stream kernel with shared unpacking
/// (R = -2, variant 7 at tp = 2, 4 or 8): launches it, or with `occupancy` set only reports its
/// resident CTAs per SM there.
template <int D, int R>
cudaError_t launch_mxfp4_lean(int MT, dim3 grid, const IndexParams& p, cudaStream_t stream,
                              int* occupancy = nullptr) {
  return by_tiles(MT, [&](auto tiles) {
    constexpr int M = decltype(tiles)::value;
    if constexpr (R == -4) {
      // Built for DeepSeek-V4's index heads only (64 of dim 128), like variant 9: the callers
      // reject other shapes before anything runs.
      if constexpr (M == 4 && D == 128) {
        return launch_or_measure(mxfp4_score_stream_kernel<M, D, kStreamPairs>,
                                 stream_smem_bytes<M, D>(), grid, p, stream, occupancy);
      } else {
        return cudaErrorInvalidValue;
      }
    } else if constexpr (R == -3) {
      return launch_or_measure(mxfp4_score_stream_kernel<M, D, kStreamZero>,
                               stream_smem_bytes<M, D>(), grid, p, stream, occupancy);
    } else if constexpr (R == -2) {
      return launch_or_measure(mxfp4_score_stream_shared_kernel<M, D>,
                               stream_shared_smem_bytes<M, D>(), grid, p, stream, occupancy);
    } else if constexpr (R == -1) {
      return launch_or_measure(mxfp4_score_stream_kernel<M, D>, stream_smem_bytes<M, D>(), grid, p,
                               stream, occupancy);
    } else if constexpr (R == 0) {
      return launch_or_measure(mxfp4_score_shared_kernel<M, D>, shared_smem_bytes<M, D>(), grid, p,
                               stream, occupancy);
    } else {
      return launch_or_measure(mxfp4_score_lean_kernel<M, D, R>, lean_smem_bytes<M, D>(), grid, p,
                               stream, occupancy);
    }
  });
}

/// The lean-family kernel of `variant` (3 lean, 4 lean in pairs of pages, 5 shared unpacking,
/// 6 page streams, 7 page streams with shared unpacking: variant 6's kernel when a pass has one
/// token, p.tp == 1, which has nothing to share; 8 page streams with the octet loop unrolled; 10
/// that loop over pairs of octets with the fragments loaded per k step).
template <int D>
cudaError_t launch_lean_variant(int variant, int MT, dim3 grid, const IndexParams& p,
                                cudaStream_t stream, int* occupancy = nullptr) {
  if (variant == 3) return launch_mxfp4_lean<D, 1>(MT, grid, p, stream, occupancy);
  if (variant == 4) return launch_mxfp4_lean<D, 2>(MT, grid, p, stream, occupancy);
  if (variant == 6 || (variant == 7 && p.tp == 1)) {
    return launch_mxfp4_lean<D, -1>(MT, grid, p, stream, occupancy);
  }
  if (variant == 7) return launch_mxfp4_lean<D, -2>(MT, grid, p, stream, occupancy);
  if (variant == 8) return launch_mxfp4_lean<D, -3>(MT, grid, p, stream, occupancy);
  if (variant == 10) return launch_mxfp4_lean<D, -4>(MT, grid, p, stream, occupancy);
  return launch_mxfp4_lean<D, 0>(MT, grid, p, stream, occupancy);
}

/// Resident CTAs per SM of the mxfp4 score kernel of `variant` at `tp` tokens per pass (2 for the
/// staged and register kernels, whose launch bounds ask for 2).
int mxfp4_ctas_per_sm(int D, int MT, int variant, int tp) {
  if (variant < 3) return 2;
  if (variant == 9) return ctas_per_sm(mxfp4_score_wgmma_kernel<false>, WgSmem(tp).bytes);
  if (variant == 11) return ctas_per_sm(mxfp4_score_wgmma_kernel<true>, WgSmem(tp).bytes);
  int n = 2;
  const IndexParams unused{};
  if (D == 128) {
    launch_lean_variant<128>(variant, MT, dim3(), unused, nullptr, &n);
  } else {
    launch_lean_variant<64>(variant, MT, dim3(), unused, nullptr, &n);
  }
  return n;
}

/// The mxfp4 score kernel of `variant` (1 staged, 2 register prefetch, 3 lean, 4 lean in pairs
/// of pages, 5 shared unpacking, 6 page streams, 7 page streams with shared unpacking, 8 page
/// streams unrolled, 9 warpgroup mma, 10 page streams over octet pairs, 11 warpgroup mma with
/// two tokens' groups in flight).
template <int D>
cudaError_t launch_mxfp4(int MT, int variant, dim3 grid, const IndexParams& p,
                         cudaStream_t stream) {
  if (variant == 9) {
    return launch(mxfp4_score_wgmma_kernel<false>, grid, WgSmem(p.tp).bytes, p, stream);
  }
  if (variant == 11) {
    return launch(mxfp4_score_wgmma_kernel<true>, grid, WgSmem(p.tp).bytes, p, stream);
  }
  if (variant >= 3) return launch_lean_variant<D>(variant, MT, grid, p, stream);
  if (variant == 1) {
    switch (MT) {
      case 1:
        return launch(mxfp4_score_staged_kernel<1, D>, grid, staged_smem_bytes<1, D>(), p, stream);
      case 2:
        return launch(mxfp4_score_staged_kernel<2, D>, grid, staged_smem_bytes<2, D>(), p, stream);
      case 3:
        return launch(mxfp4_score_staged_kernel<3, D>, grid, staged_smem_bytes<3, D>(), p, stream);
      case 4:
        return launch(mxfp4_score_staged_kernel<4, D>, grid, staged_smem_bytes<4, D>(), p, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  switch (MT) {
    case 1:
      return launch(mxfp4_score_kernel<1, D>, grid, 0, p, stream);
    case 2:
      return launch(mxfp4_score_kernel<2, D>, grid, 0, p, stream);
    case 3:
      return launch(mxfp4_score_kernel<3, D>, grid, 0, p, stream);
    case 4:
      return launch(mxfp4_score_kernel<4, D>, grid, 0, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

/// Rows of one prepared launch for `batch` sequences of T tokens: all of them, or chunks of tokens
/// with at most kIndexLaunchRows rows.
constexpr long long kIndexLaunchRows = 4096;

int index_chunk_tokens(int batch, int T) {
  const long long per = std::max<long long>(1, kIndexLaunchRows / std::max(1, batch));
  return static_cast<int>(std::min<long long>(T, per));
}

std::size_t index_row_bytes(const dsv4::IndexerConfig& c) {
  return c.key_format == dsv4::EntryFormat::kMxfp4 ? Mxfp4Row(c.num_heads, c.head_dim).bytes
                                                   : Fp8Row(c.num_heads, c.head_dim).bytes;
}

}  // namespace

cudaError_t dsv4_index_score(void* d_temp, std::size_t& temp_bytes,
                             const dsv4::EntryStoreView& keys, const dsv4::IndexerConfig& c,
                             const Dsv4IndexArgs& a, cudaStream_t stream) {
  using dsv4::EntryFormat;
  if (a.batch < 0 || a.T < 0 || a.batch > 65535) return cudaErrorInvalidValue;
  if (keys.layout.format != c.key_format || keys.layout.dim != c.head_dim ||
      (c.head_dim != 64 && c.head_dim != 128) || c.num_heads % 16 != 0 || c.num_heads < 16 ||
      c.num_heads > 64) {
    return cudaErrorInvalidValue;
  }
  const int tc = index_chunk_tokens(a.batch, a.T);
  const std::size_t row_bytes = index_row_bytes(c);
  const std::size_t need = static_cast<std::size_t>(a.batch) * tc * row_bytes;
  if (d_temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.T == 0) return cudaSuccess;
  if (a.slots == nullptr || a.lengths == nullptr || a.q == nullptr || a.weights == nullptr ||
      a.out.scores == nullptr || a.out.num_valid == nullptr || a.out.rows != a.batch * a.T ||
      a.out.max_blocks < keys.max_entries ||
      (c.query_rope && (a.rope_cos == nullptr || a.rope_sin == nullptr))) {
    return cudaErrorInvalidValue;
  }
  IndexParams p = index_params(keys, c, a, static_cast<unsigned char*>(d_temp), row_bytes);
  const bool mx = c.key_format == EntryFormat::kMxfp4;
  const int octets = (keys.max_entries + 7) / 8;
  const bool fits = keys.layout.page_bytes <= static_cast<std::size_t>(kMaxStagedPageBytes) &&
                    keys.layout.page_entries % 8 == 0;
  const bool wgmma = mx && wgmma_fits(keys, c) && wgmma_available();
  if (a.variant < 0 || a.variant > kIndexVariants) return cudaErrorInvalidValue;
  if ((a.variant == 1 || a.variant >= 3) && !fits) return cudaErrorInvalidValue;
  if ((a.variant == 9 || a.variant == 11) && !wgmma) return cudaErrorInvalidValue;
  if (a.variant == 10 && !(mx && c.num_heads == 64 && c.head_dim == 128)) {
    return cudaErrorInvalidValue;
  }
  const bool staged = mx && a.variant != 2 && fits;
  // The kernel run: 0 picks, where a page fits, the page streams in the zero-start folded form
  // for one or two query tokens (over octet pairs, 10, for DeepSeek-V4's 64 heads of dim 128 on
  // pages of 64 entries; else one octet at a time, 8), the warpgroup-mma kernel with two tokens'
  // groups in flight (11) from three on where it runs, else the page streams with shared
  // unpacking (7) from 8 tokens on (prefill chunks) and 8 below; where a page does not fit,
  // register prefetch (2). Measured on the H200 (131072 entries, 64 heads, mxfp4;
  // docs/perf-data/2026-12-03-session14/final) and, 10 against 8 and 11 against 9, on an H100
  // (docs/perf-data/2026-12-07-session47) and 11's landed pair loop on an H200
  // (docs/perf-data/2026-12-07-session48): see docs/dsv4.md.
  const bool pairs = mx && c.num_heads == 64 && c.head_dim == 128 && keys.layout.page_entries == 64;
  const int variant = a.variant != 0                ? a.variant
                      : !staged                     ? 2
                      : wgmma && a.T >= 3           ? 11
                      : a.T >= kStreamPrefillTokens ? 7
                      : pairs && a.T <= 2           ? 10
                                                    : 8;
  const int pages = (keys.max_entries + keys.layout.page_entries - 1) / keys.layout.page_entries;
  for (int t0 = 0; t0 < a.T; t0 += tc) {
    p.t0 = t0;
    p.tc = std::min(tc, a.T - t0);
    // Tokens per CTA pass: 1, 2 or 4; variants 7, 9 and 11 take 8 when the launch has at least 8
    // (variant 7: one stream of 8 token warps per CTA; all three unpack each page once for 8
    // tokens, for prefills).
    p.tp = !mx         ? kIndexMaxTokens
           : p.tc == 1 ? 1
           : p.tc == 2 ? 2
           : (variant == 7 || variant == 9 || variant == 11) && p.tc >= kStreamPrefillTokens
               ? kStreamPrefillTokens
               : kIndexMaxTokens;
    const int resident = mx ? mxfp4_ctas_per_sm(c.head_dim, c.num_heads / 16, variant, p.tp)
                         : c.head_dim == 128
                             ? ctas_per_sm(fp8_score_kernel<128>, static_cast<int>(row_bytes))
                             : ctas_per_sm(fp8_score_kernel<64>, static_cast<int>(row_bytes));
    const int passes = (p.tc + p.tp - 1) / p.tp;
    if (passes > 65535) return cudaErrorInvalidValue;
    const dim3 prep_grid(static_cast<unsigned>(a.batch * p.tc), static_cast<unsigned>(c.num_heads));
    // Enough CTAs to fill every resident slot of the device once (twice over for the staged and
    // register kernels), never more than the longest row needs.
    // The staged kernels take a page per CTA and round, the page-stream kernels (6 to 8) one per
    // stream (stream_count(tp) of them per CTA), the fp8 kernel kFp8WarpKeys keys per warp.
    const int per_cta = mx ? kIndexWarps / p.tp : kIndexWarps;
    const int streams = stream_count(p.tp);
    const int units = (keys.max_entries + kWgUnit - 1) / kWgUnit;
    const int fp8_units = (keys.max_entries + kFp8WarpKeys - 1) / kFp8WarpKeys;
    const int needed = !mx       ? std::max(1, (fp8_units + per_cta - 1) / per_cta)
                       : !staged ? std::max(1, (octets + per_cta - 1) / per_cta)
                       : variant == 9 || variant == 11
                           ? std::max(1, (units + kWgGroups - 1) / kWgGroups)
                       : variant >= 6 ? std::max(1, (pages + streams - 1) / streams)
                                      : std::max(1, pages);
    const long long target = std::max<long long>(1, static_cast<long long>(resident) * sm_count() /
                                                        (static_cast<long long>(a.batch) * passes));
    const dim3 grid(static_cast<unsigned>(std::min<long long>(needed, target)),
                    static_cast<unsigned>(a.batch), static_cast<unsigned>(passes));
    if (mx) {
      if (c.head_dim == 128) {
        prep_mxfp4_kernel<128><<<prep_grid, 128, 0, stream>>>(p);
      } else {
        prep_mxfp4_kernel<64><<<prep_grid, 64, 0, stream>>>(p);
      }
      KVC_CUDA_CALL(cudaGetLastError());
      KVC_CUDA_CALL(c.head_dim == 128
                        ? launch_mxfp4<128>(c.num_heads / 16, variant, grid, p, stream)
                        : launch_mxfp4<64>(c.num_heads / 16, variant, grid, p, stream));
    } else {
      if (c.head_dim == 128) {
        prep_fp8_kernel<128><<<prep_grid, 128, 0, stream>>>(p);
      } else {
        prep_fp8_kernel<64><<<prep_grid, 64, 0, stream>>>(p);
      }
      KVC_CUDA_CALL(cudaGetLastError());
      const int smem = static_cast<int>(row_bytes);
      KVC_CUDA_CALL(c.head_dim == 128 ? launch(fp8_score_kernel<128>, grid, smem, p, stream)
                                      : launch(fp8_score_kernel<64>, grid, smem, p, stream));
    }
  }
  return cudaSuccess;
}

std::size_t dsv4_index_workspace_bound(const dsv4::IndexerConfig& c) {
  const long long rows =
      std::min<long long>(static_cast<long long>(c.max_batch) * c.max_query_tokens,
                          std::max<long long>(kIndexLaunchRows, c.max_batch));
  return static_cast<std::size_t>(rows) * index_row_bytes(c);
}

}  // namespace kernels

namespace dsv4 {
namespace detail {
namespace {

using kvc::detail::DeviceBuffer;
using kvc::detail::DeviceGuard;

class CudaIndexer final : public Indexer {
 public:
  CudaIndexer(const IndexerConfig& c, Device device) : config_(c), device_(device) {
    DeviceGuard guard(device_.index);
    staging_ = DeviceBuffer(8 * static_cast<std::size_t>(c.max_batch));
    temp_bytes_ = kernels::dsv4_index_workspace_bound(c);
    temp_ = DeviceBuffer(temp_bytes_);
  }
  const IndexerConfig& config() const override { return config_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void score(const EntryStore& keys, const IndexerArgs& a) override {
    const int T = check_indexer_score(config_, device_, keys, a);
    DeviceGuard guard(device_.index);
    const std::vector<std::int32_t> h = pack_slots_lengths(a.slots, a.lengths);
    KVC_CUDA_THROW(cudaMemcpyAsync(staging_.as<void>(), h.data(), h.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    kernels::Dsv4IndexArgs k;
    k.slots = staging_.as<std::int32_t>();
    k.lengths = k.slots + a.slots.size();
    k.batch = static_cast<int>(a.slots.size());
    k.T = T;
    k.q = a.q.ptr<const std::uint16_t>();
    k.weights = a.weights.ptr<const float>();
    k.rope_cos = config_.query_rope ? a.rope_cos.ptr<const float>() : nullptr;
    k.rope_sin = config_.query_rope ? a.rope_sin.ptr<const float>() : nullptr;
    k.out = a.out;
    std::size_t need = 0;
    const EntryStoreView kv = keys.view();
    KVC_CUDA_THROW(kernels::dsv4_index_score(nullptr, need, kv, config_, k, stream_));
    KVC_CHECK(need <= temp_bytes_, "internal: indexer workspace ", need, " > ", temp_bytes_);
    std::size_t have = temp_bytes_;
    KVC_CUDA_THROW(kernels::dsv4_index_score(temp_.as<void>(), have, kv, config_, k, stream_));
  }

 private:
  IndexerConfig config_;
  Device device_;
  DeviceBuffer staging_, temp_;
  std::size_t temp_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Indexer> make_cuda_indexer(const IndexerConfig& c, Device device) {
  return std::make_unique<CudaIndexer>(c, device);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc
