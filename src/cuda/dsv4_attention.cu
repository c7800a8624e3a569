// SparseAttention on CUDA: the dsv4_sparse_attention launcher (two-phase workspace, the split
// rule, the kernel choice) and the object, which allocates the workspace bound at construction.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
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

/// Which variant runs (set_sparse_attention_variant): the split rule (variant % 100: 0 automatic,
/// 10 + k at least k chunks per split) and the kernel (variant / 100: 0 the library's choice,
/// 1 the 8-warp kernel, 2 the 16-warp kernel, 3 the 16-warp kernel with P in one bf16).
std::atomic<int> g_variant{0};

/// How a call splits: chunks per query row at most, splits and chunks per split.
struct Split {
  int chunks = 0, splits = 1, cps = 1;
};

/// One more chunk per CTA costs about as much as this many CTAs' partials written and read
/// back. D = 512 (both sides scale with D): a chunk is 64 heads x 64 rows x 512 x 2 x 3 FLOP
/// (S, P_hi V, P_lo V) = 12.6 MFLOP = 3072 mma.m16n8k16 per SM, ~3 us at mma.sync's ~2/3 of the
/// H200's tensor rate (its next chunk's gather is hidden behind it); a CTA's partials are
/// 64 x 512 x 4 B = 128 KB written and 128 KB read back, and one wave of them moves at the L2's
/// rate (~5 TB/s), ~0.05 us per CTA. 3 / 0.05 = 60. An estimate; the H200 (2026-12-04, HCA B1,
/// 130 chunks) measured the rule's 65 splits of 2 at 30.2 us, 130 of 1 (variant 11) 30.8, 33 of
/// 4 (14) 47.9, 17 of 8 (18) 85.3: a chunk costs nearer 10 us than 3, but the choice stands.
constexpr long long kChunkCostInPartials = 60;

/// The split of a call: of the chunks-per-split counts cps that keep the grid in one wave
/// (splits x rows x head groups <= SMs; one split when rows x head groups alone exceed the SMs),
/// the one of least cost(cps) = cps x kChunkCostInPartials + splits x rows x head groups (the
/// second term 0 for one split), fewest splits on ties. At 64 heads, 1M tokens: HCA B1 130
/// chunks -> 2 per split, 65 splits (cost 185; 1 per split: 190); HCA B8 -> 9 per split, 15
/// splits x 8 rows (the fewest that fit); CSA B1 / B8 10 chunks -> 1 per split, 10 splits. With
/// min_cps > 0 (a benchmark variant): the fewest chunks per split in one wave, at least min_cps.
/// Either way there are several splits only where splits x rows x head groups <= SMs, the bound
/// the object's workspace is sized by.
Split make_split(int max_rows, long long rows, int head_groups, int sms, int min_cps) {
  Split s;
  s.chunks = std::max(1, (max_rows + kAttnRows - 1) / kAttnRows);
  const long long ctas = std::max<long long>(1, rows * head_groups);
  const long long fill = std::max<long long>(1, sms / ctas);  // splits that fit in one wave
  const int most = static_cast<int>(std::min<long long>(s.chunks, fill));
  const auto with_splits = [&](int want) {
    Split r = s;
    r.cps = (s.chunks + want - 1) / want;
    r.splits = (s.chunks + r.cps - 1) / r.cps;  // <= want
    return r;
  };
  if (min_cps > 0) {
    Split r = with_splits(most);
    if (r.cps < min_cps) r = with_splits(std::max(1, (s.chunks + min_cps - 1) / min_cps));
    return r;
  }
  Split best = with_splits(1);
  long long best_cost = best.cps * kChunkCostInPartials;
  for (int want = 2; want <= most; ++want) {
    const Split r = with_splits(want);
    const long long cost = r.cps * kChunkCostInPartials + (r.splits > 1 ? r.splits * ctas : 0);
    if (cost < best_cost) {
      best = r;
      best_cost = cost;
    }
  }
  return best;
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

/// Workspace bytes of a split call (0 for one split).
std::size_t part_bytes(const Split& s, long long rows, int H, int D) {
  if (s.splits <= 1) return 0;
  const std::size_t n = static_cast<std::size_t>(s.splits) * static_cast<std::size_t>(rows) * H;
  return align256(n * D * 4) + 2 * align256(n * 4);
}

/// The pipelined kernel with kWarps warps (P in two bf16 halves, or one where !kSplitP), grid
/// (rows, splits, head groups), then (several splits) the combine as its programmatic dependent,
/// grid (D / 128, H, rows).
template <int D, bool kStaged, int kWarps, bool kSplitP = true>
cudaError_t run(const AttnParams& p, const Split& s, int rows, int head_groups,
                cudaStream_t stream) {
  constexpr int smem = AttnSmem<D, kStaged, kWarps / 4>::kBytes;
  const auto kernel = attention_kernel<D, kStaged, kWarps, kSplitP>;
  KVC_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(s.splits),
                static_cast<unsigned>(head_groups)),
           32 * kWarps, static_cast<std::size_t>(smem), stream>>>(p);
  KVC_CUDA_CALL(cudaGetLastError());
  if (s.splits > 1) {
    KVC_CUDA_CALL(kvc::detail::launch_kernel(
        combine_kernel<D>,
        dim3(D / kCombineDims, static_cast<unsigned>(p.H), static_cast<unsigned>(rows)),
        dim3(kCombineThreads), static_cast<std::size_t>(combine_smem_bytes(s.splits)), true, stream,
        p));
  }
  return cudaSuccess;
}

/// D = 512: the 16-warp kernel (wide) or the 8-warp one; `one_bf16_p`: the 16-warp kernel with
/// P in one bf16 (variant kernel 3, for benchmarks).
template <bool kStaged>
cudaError_t run512(const AttnParams& p, const Split& s, int rows, int head_groups, bool wide,
                   bool one_bf16_p, cudaStream_t stream) {
  if (one_bf16_p) return run<512, kStaged, kWideWarps, false>(p, s, rows, head_groups, stream);
  return wide ? run<512, kStaged, kWideWarps>(p, s, rows, head_groups, stream)
              : run<512, kStaged, kNarrowWarps>(p, s, rows, head_groups, stream);
}

}  // namespace

cudaError_t dsv4_sparse_attention(void* d_temp, std::size_t& temp_bytes,
                                  const dsv4::EntryStoreView& ring,
                                  const dsv4::EntryStoreView& entries,
                                  const dsv4::SparseAttentionConfig& c, const Dsv4AttentionArgs& a,
                                  cudaStream_t stream) {
  const int D = c.head_dim;
  const auto usable = [D](const dsv4::EntryStoreView& v) {
    return v.layout.dim == D && (v.layout.format == dsv4::EntryFormat::kBf16 ||
                                 (v.layout.format == dsv4::EntryFormat::kModel1Fp8 && D == 512));
  };
  if ((D != 128 && D != 512) || a.batch < 0 || a.T < 0 || c.num_heads < 1 || c.num_heads > 128 ||
      !usable(ring) || !usable(entries) || !ring.ring || ring.max_entries != c.window ||
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
  const int variant = g_variant.load(std::memory_order_relaxed);
  const int split_rule = variant % 100, kernel = variant / 100;
  const Split s = make_split(max_rows, rows, head_groups, attn_sm_count(),
                             split_rule >= 10 ? split_rule - 10 : 0);
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
  const int r = static_cast<int>(rows);
  if (D == 128) return run<128, false, kNarrowWarps>(p, s, r, head_groups, stream);
  const bool model1 = ring.layout.format == dsv4::EntryFormat::kModel1Fp8 ||
                      entries.layout.format == dsv4::EntryFormat::kModel1Fp8;
  // The library's choice (kernel 0): 16 warps for MODEL1 rows, 8 for bf16 ones. Measured on the
  // H200 (2026-12-04, docs/dsv4.md; 1M tokens, 16 vs 8 warps): MODEL1 CSA B1 17.3 vs 18.2 us,
  // B8 22.4 vs 23.3, HCA B1 27.9 vs 30.2, B8 92.2 vs 102; bf16 slower with 16 (CSA B1 16.3 vs
  // 15.6, HCA B8 81.9 vs 76.4): its rows need no dequantisation, the 16-warp form's main saving.
  const bool wide = kernel == 2 || (kernel == 0 && model1);
  const bool one_bf16_p = kernel == 3;
  return model1 ? run512<true>(p, s, r, head_groups, wide, one_bf16_p, stream)
                : run512<false>(p, s, r, head_groups, wide, one_bf16_p, stream);
}

namespace dsv4_detail {

void set_sparse_attention_variant(int variant) {
  g_variant.store(variant, std::memory_order_relaxed);
}

}  // namespace dsv4_detail

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
    // The workspace of the largest split call: with more than one split, splits * rows * head
    // groups never exceeds the SM count (make_split keeps the grid in one wave: splits <=
    // SMs / (rows * head groups)), so splits * rows * H <= SMs * H, whatever the store or the
    // variant.
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
