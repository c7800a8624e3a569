// hello_kvc: the demo of scripts/demo.sh. One layer's decode loop over kvc's pipeline:
//   KvStore.append -> BlockIndex.score -> Selector (top 8) -> AttentionBackend (block_select_exact)
// on kvc::default_device() (CUDA when a device and the CUDA parts are present, the CPU otherwise;
// the same code either way). Each step prints what was selected and attended, and how far the
// output is from dense attention over the same store; the end prints the store's footprint next
// to a dense f16 cache of the same tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/planner/planner.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>
#endif

namespace {

// --- the demo's shape: small enough to run in seconds on two CPU cores -----------------------
constexpr int kKvHeads = 2;
constexpr int kQHeads = 8;  // GQA group of 4
constexpr int kHeadDim = 128;
constexpr int kWindow = 256;    // W: exact recent tokens
constexpr int kBlock = 32;      // B: tokens per old block
constexpr int kTopBlocks = 8;   // selected old blocks per kv head
constexpr int kPrefill = 4096;  // tokens ingested before decoding
constexpr int kSteps = 8;       // decode steps
// Old tokens the queries attend strongly (a fact the model looks up); each lies in its own block.
constexpr int kSalient[] = {700, 1900, 3300};

// Memory on the pipeline's device: host memory on the CPU, cudaMalloc'd memory on a GPU.
template <class T>
class Buffer {
 public:
  Buffer(std::size_t n, kvc::Device device) : n_(n), device_(device) {
    if (device.is_cpu()) {
      host_.assign(n, T{});
      data_ = host_.data();
      return;
    }
#if KVC_CUDA_ENABLED
    check(cudaSetDevice(device.index), "cudaSetDevice");
    check(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)), "cudaMalloc");
#endif
  }
  ~Buffer() {
#if KVC_CUDA_ENABLED
    if (device_.is_cuda() && data_ != nullptr) cudaFree(data_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() const { return data_; }
  void upload(const std::vector<T>& src) {
    if (device_.is_cpu()) {
      std::memcpy(data_, src.data(), n_ * sizeof(T));
      return;
    }
#if KVC_CUDA_ENABLED
    check(cudaMemcpy(data_, src.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  }
  std::vector<T> download() const {
    std::vector<T> dst(n_);
    if (device_.is_cpu()) {
      std::memcpy(dst.data(), data_, n_ * sizeof(T));
      return dst;
    }
#if KVC_CUDA_ENABLED
    check(cudaMemcpy(dst.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
    return dst;
  }

 private:
#if KVC_CUDA_ENABLED
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw kvc::Error(std::string(what) + ": " + cudaGetErrorString(e));
  }
#endif
  std::size_t n_;
  kvc::Device device_;
  std::vector<T> host_;
  T* data_ = nullptr;
};

kvc::AttentionConfig attention_config(kvc::AttentionMode mode) {
  kvc::AttentionConfig c;
  c.num_q_heads = kQHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.dtype = kvc::DType::kF16;
  c.mode = mode;
  return c;
}

// The one place that decides where the pipeline runs: kvc::default_device(), unless one of the
// parts has no implementation there yet, in which case the whole demo runs on the CPU.
kvc::Device pick_device(std::string* note) {
  const kvc::Device d = kvc::default_device();
  if (d.is_cpu()) {
    *note = KVC_CUDA_ENABLED ? " (no CUDA device found)" : " (kvc built without CUDA)";
    return d;
  }
  try {
    kvc::AttentionBackend::create(attention_config(kvc::AttentionMode::kBlockSelectExact), d);
    kvc::Selector::create(d);
  } catch (const kvc::Error&) {
    *note = " (" + kvc::to_string(d) +
            " is present, but not every part runs there yet; the whole demo uses the CPU)";
    return kvc::Device::cpu();
  }
  return d;
}

// Random f16 values: normal(0, 1) plus `pull` times `direction` (a unit vector) * sqrt(d).
void fill_token(std::mt19937& rng, const std::vector<float>& direction, float pull,
                std::uint16_t* out) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float root_d = std::sqrt(static_cast<float>(kHeadDim));
  for (int i = 0; i < kHeadDim; ++i) {
    out[i] = kvc::float_to_half_bits(nd(rng) + pull * root_d * direction[i]);
  }
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::string join_ids(const std::int32_t* ids, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

int run() {
  std::string device_note;
  const kvc::Device dev = pick_device(&device_note);
  const kvc::AttentionMode mode = kvc::AttentionMode::kBlockSelectExact;
  std::printf("kvc %s demo: one layer, %d kv heads x d %d, %d query heads (GQA %d), on %s%s\n",
              KVC_VERSION_STRING, kKvHeads, kHeadDim, kQHeads, kQHeads / kKvHeads,
              kvc::to_string(dev).c_str(), device_note.c_str());

  // --- the pipeline's parts, all on `dev` ----------------------------------------------------
  kvc::KvStoreConfig sc;
  sc.num_kv_heads = kKvHeads;
  sc.head_dim = kHeadDim;
  sc.max_context = kPrefill + kSteps;
  sc.recent_window = kWindow;
  sc.block_size = kBlock;
  sc.dtype = kvc::DType::kF16;
  sc.old_format = kvc::Format::kFp16kQ4v;
  auto store = kvc::KvStore::create(sc, dev);

  kvc::BlockIndexConfig ic;
  ic.num_q_heads = kQHeads;
  ic.num_kv_heads = kKvHeads;
  ic.head_dim = kHeadDim;
  auto index = kvc::BlockIndex::create(ic, dev);
  auto selector = kvc::Selector::create(dev);
  const kvc::SelectPolicy policy = kvc::SelectPolicy::topk(kTopBlocks);
  auto attention = kvc::AttentionBackend::create(attention_config(mode), dev);
  auto dense = kvc::AttentionBackend::create(attention_config(kvc::AttentionMode::kDense), dev);

  std::printf(
      "store: last %d tokens exact (f16); older ones in blocks of %d, K f16 + V int4 (%s)\n",
      kWindow, kBlock, kvc::to_string(sc.old_format));
  std::printf("step:  append -> BlockIndex.score (mean K) -> Selector top %d -> attention %s\n",
              kTopBlocks, kvc::to_string(mode));

  // --- synthetic activations: random K/V; the queries of kv head h lean towards a direction
  // u_h, and a few old "salient" tokens have keys along u_h, so attention is peaked like a
  // model's looking up a fact (random data alone would spread attention evenly) --------------
  std::mt19937 rng(2024);
  std::vector<std::vector<float>> direction(kKvHeads, std::vector<float>(kHeadDim));
  {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& u : direction) {
      double norm = 0.0;
      for (float& x : u) norm += (x = nd(rng)) * static_cast<double>(x);
      for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
    }
  }
  const std::vector<float> none(kHeadDim, 0.0f);
  const std::size_t token = static_cast<std::size_t>(kKvHeads) * kHeadDim;
  std::vector<std::uint16_t> k(kPrefill * token), v(kPrefill * token);
  for (int p = 0; p < kPrefill; ++p) {
    bool salient = false;
    for (int s : kSalient) salient = salient || s == p;
    for (int h = 0; h < kKvHeads; ++h) {
      fill_token(rng, salient ? direction[h] : none, salient ? 3.0f : 0.0f,
                 &k[p * token + h * kHeadDim]);
      fill_token(rng, none, 0.0f, &v[p * token + h * kHeadDim]);
    }
  }
  const int slot = store->open_slot();
  {
    Buffer<std::uint16_t> dk(k.size(), dev), dv(v.size(), dev);
    dk.upload(k);
    dv.upload(v);
    store->ingest(slot,
                  kvc::TensorView::contiguous(dk.data(), kvc::DType::kF16,
                                              {kPrefill, kKvHeads, kHeadDim}, dev),
                  kvc::TensorView::contiguous(dv.data(), kvc::DType::kF16,
                                              {kPrefill, kKvHeads, kHeadDim}, dev));
  }
  std::printf("prefill: %d tokens ingested; salient tokens at positions", kPrefill);
  for (int s : kSalient) std::printf(" %d", s);
  std::printf(" = old blocks");
  for (int s : kSalient) std::printf(" %d", s / kBlock);
  std::printf("\n\n");

  // --- per-step buffers on `dev` -------------------------------------------------------------
  const int rows = ic.rows(1, 1);  // one score/selection row per kv head
  const int max_blocks = sc.max_blocks_per_slot();
  const int max_selected = policy.max_output(max_blocks);
  const std::vector<int> slots = {slot};
  Buffer<std::uint16_t> q(static_cast<std::size_t>(kQHeads) * kHeadDim, dev);
  Buffer<std::uint16_t> new_k(token, dev), new_v(token, dev);
  Buffer<float> scores(static_cast<std::size_t>(rows) * max_blocks, dev);
  Buffer<std::int32_t> num_valid(rows, dev);
  Buffer<std::int32_t> ids(static_cast<std::size_t>(rows) * max_selected, dev);
  Buffer<std::int32_t> counts(rows, dev);
  Buffer<float> out(static_cast<std::size_t>(kQHeads) * kHeadDim, dev);
  Buffer<float> out_dense(static_cast<std::size_t>(kQHeads) * kHeadDim, dev);

  const kvc::ScoresView score_view{scores.data(), num_valid.data(), rows, max_blocks};
  kvc::SelectionView selection{ids.data(), counts.data(), rows, max_selected, false};
  const auto view = [&](void* p, kvc::DType t, std::initializer_list<std::int64_t> shape) {
    return kvc::TensorView::contiguous(p, t, shape, dev);
  };
  kvc::DecodeArgs args;
  args.slots = slots;
  args.q = view(q.data(), kvc::DType::kF16, {1, 1, kQHeads, kHeadDim});
  args.selection = selection;
  args.out = view(out.data(), kvc::DType::kF32, {1, 1, kQHeads, kHeadDim});
  kvc::DecodeArgs dense_args = args;
  dense_args.selection = kvc::SelectionView{};
  dense_args.out = view(out_dense.data(), kvc::DType::kF32, {1, 1, kQHeads, kHeadDim});

  std::printf("%4s %6s  %-32s %6s %4s %22s %9s\n", "step", "length", "selected blocks (kv head 0)",
              "recent", "old", "attended bytes", "vs dense");
  double worst = 0.0;
  std::vector<std::uint16_t> host_q(static_cast<std::size_t>(kQHeads) * kHeadDim);
  std::vector<std::uint16_t> host_k(token), host_v(token);
  for (int step = 1; step <= kSteps; ++step) {
    for (int h = 0; h < kKvHeads; ++h) {
      fill_token(rng, none, 0.0f, &host_k[h * kHeadDim]);
      fill_token(rng, none, 0.0f, &host_v[h * kHeadDim]);
    }
    for (int hq = 0; hq < kQHeads; ++hq) {
      fill_token(rng, direction[hq / (kQHeads / kKvHeads)], 0.5f, &host_q[hq * kHeadDim]);
    }
    new_k.upload(host_k);
    new_v.upload(host_v);
    q.upload(host_q);

    store->append(slots, view(new_k.data(), kvc::DType::kF16, {1, kKvHeads, kHeadDim}),
                  view(new_v.data(), kvc::DType::kF16, {1, kKvHeads, kHeadDim}));
    index->score(*store, slots, args.q, score_view);
    selector->select(score_view, policy, selection);
    kvc::Telemetry tm;
    tm.wait_for_device = true;
    attention->decode(*store, args, &tm);
    dense->decode(*store, dense_args);

    const double diff = relative_l2(out.download(), out_dense.download());
    worst = std::max(worst, diff);
    // The selection straight from the selector's output (device memory on a GPU).
    const std::vector<std::int32_t> selected = ids.download();
    const std::vector<std::int32_t> selected_count = counts.download();
    const kvc::AttendedTokens t0 = tm.tokens.empty() ? kvc::AttendedTokens{} : tm.tokens[0];
    char bytes[64];
    std::snprintf(bytes, sizeof bytes, "%s (1/%.1f)",
                  kvc::planner::format_bytes(tm.attended_bytes.total()).c_str(), tm.attended_ratio);
    std::printf("%4d %6d  %-32s %6lld %4lld %22s %8.2f%%\n", step, store->length(slot),
                join_ids(selected.data(), selected_count[0]).c_str(),
                static_cast<long long>(t0.recent), static_cast<long long>(t0.old_exact),
                tm.complete ? bytes : "-", 100.0 * diff);
  }
  std::printf(
      "(recent, old: tokens kv head 0 attended from the ring and from old blocks; attended bytes:\n"
      " K+V read for all kv heads, 1/x of a dense read; vs dense: relative L2 distance of the\n"
      " output from mode dense over the same store)\n\n");

  // --- footprint ---------------------------------------------------------------------------
  const kvc::Footprint f = store->footprint();
  const auto fmt = [](std::size_t b) { return kvc::planner::format_bytes(b); };
  std::printf("footprint of the store (%lld tokens, %d closed blocks):\n",
              static_cast<long long>(f.tokens), store->num_closed_blocks(slot));
  std::printf("  ring (f16 K+V)   %12s\n", fmt(f.ring).c_str());
  std::printf("  old K (f16)      %12s\n", fmt(f.old_k).c_str());
  std::printf("  old V (int4)     %12s\n", fmt(f.old_v).c_str());
  std::printf("  scales (fp32)    %12s\n", fmt(f.scales).c_str());
  std::printf("  summaries        %12s\n", fmt(f.summaries).c_str());
  std::printf("  tables           %12s\n", fmt(f.tables).c_str());
  std::printf("  in use           %12s   dense f16 cache of the same tokens: %s -> %.2fx smaller\n",
              fmt(f.in_use).c_str(), fmt(f.dense_equivalent_bytes).c_str(),
              static_cast<double>(f.dense_equivalent_bytes) / static_cast<double>(f.in_use));
  std::printf("output vs dense over all steps: at most %.2f%% (relative L2)\n", 100.0 * worst);
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const kvc::Error& e) {
    std::fprintf(stderr, "hello_kvc: %s\n", e.what());
    return 1;
  }
}
