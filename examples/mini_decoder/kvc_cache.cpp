// The mini-decoder's KV cache over kvc's KvStore, BlockIndex, Selector and AttentionBackend.
#include "kvc_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>

#include "cuda_kernels.h"
#endif

namespace kvc {
namespace mini_decoder {
namespace {

// Query tokens per attend() call (kvc's multi-token verify); the chunk of a compressed prefill.
constexpr int kMaxQueryTokens = 64;

AttentionMode mode_of(const KvOptions& o) { return parse_attention_mode(o.mode); }

KvStoreConfig store_config(const KvOptions& o, const KvShape& s) {
  KvStoreConfig c;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.max_slots = 1;
  c.max_context = s.capacity;
  c.recent_window = std::min(o.recent_window, s.capacity);
  c.block_size = o.block_size;
  c.dtype = DType::kF16;
  c.old_format = parse_format(o.effective_format());
  c.summaries = uses_summaries(mode_of(o)) ? (kSummaryMeanK | kSummaryMeanV) : kSummaryMeanK;
  if (o.scoring == "quest" || (o.candidates > 0 && o.candidate_scoring == "quest"))
    c.summaries |= kSummaryMinMaxK;
  c.summary_dtype = o.summary_dtype == "f16" ? DType::kF16 : DType::kF32;
  if (uses_selection(mode_of(o)) && o.token_scoring() && o.token_keys != "old_blocks") {
    c.summaries |= kSummaryIndexKeys;
    c.index_format = o.token_keys == "fp8" ? Format::kFp8E4m3 : Format::kMxfp4;
  }
  return c;
}

BlockIndexConfig index_config(const KvOptions& o, const KvShape& s, int max_query_tokens) {
  BlockIndexConfig c;
  c.num_q_heads = s.num_q_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.dtype = DType::kF16;
  c.score = o.scoring == "quest"        ? SummaryScore::kQuestMinMax
            : o.scoring == "token_max"  ? SummaryScore::kTokenMax
            : o.scoring == "token_mass" ? SummaryScore::kTokenMass
                                        : SummaryScore::kMeanK;
  c.token_keys = o.token_keys == "old_blocks" ? TokenKeys::kOldBlocks : TokenKeys::kIndexCopy;
  c.candidates = o.candidates;
  c.candidate_score =
      o.candidate_scoring == "quest" ? SummaryScore::kQuestMinMax : SummaryScore::kMeanK;
  c.max_blocks_per_slot = store_config(o, s).max_blocks_per_slot();
  c.aggregate = GqaAggregate::kSum;
  c.max_query_tokens = max_query_tokens;
  c.max_batch = 1;
  return c;
}

AttentionConfig attention_config(const KvOptions& o, const KvShape& s, int max_query_tokens) {
  AttentionConfig c;
  c.num_q_heads = s.num_q_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.dtype = DType::kF16;
  c.mode = mode_of(o);
  c.num_representatives = o.representatives;
  c.max_query_tokens = max_query_tokens;
  c.max_batch = 1;
  return c;
}

int query_tokens_for(const KvOptions& o, const KvShape& s) {
  return std::max(1, std::min({kMaxQueryTokens, o.recent_window, s.capacity}));
}

#if KVC_CUDA_ENABLED
void cuda_check(cudaError_t e, const char* what) {
  KVC_CHECK(e == cudaSuccess, "mini_decoder kv cache: ", what, ": ", cudaGetErrorString(e));
}
#endif

// A host array and, for a CUDA device, its device copy. On the CPU both are the host vector.
template <class T>
class Mirror {
 public:
  explicit Mirror(Device d) : device_(d) {}
  ~Mirror() {
#if KVC_CUDA_ENABLED
    if (dev_ != nullptr) cudaFree(dev_);
#endif
  }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  // Host memory for n elements (at least one, so views never see null).
  T* host(std::size_t n) {
    if (host_.size() < std::max<std::size_t>(n, 1)) host_.resize(std::max<std::size_t>(n, 1));
    return host_.data();
  }
  // Memory on the device for n elements.
  T* device(std::size_t n) {
    if (device_.is_cpu()) return host(n);
#if KVC_CUDA_ENABLED
    n = std::max<std::size_t>(n, 1);
    if (dev_cap_ < n) {
      if (dev_ != nullptr) cuda_check(cudaFree(dev_), "cudaFree");
      dev_ = nullptr;
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&dev_), n * sizeof(T)), "cudaMalloc");
      dev_cap_ = n;
    }
    return dev_;
#else
    return host(n);
#endif
  }
  // Copies host[0, n) to the device; returns the device pointer.
  T* push(std::size_t n) {
    T* d = device(n);
#if KVC_CUDA_ENABLED
    if (device_.is_cuda()) {
      cuda_check(cudaMemcpy(d, host(n), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
#endif
    return d;
  }
  // Copies the device's [0, n) to the host; returns the host pointer.
  T* pull(std::size_t n) {
#if KVC_CUDA_ENABLED
    if (device_.is_cuda()) {
      cuda_check(cudaMemcpy(host(n), device(n), n * sizeof(T), cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
    }
#endif
    return host(n);
  }

 private:
  Device device_;
  std::vector<T> host_;
  T* dev_ = nullptr;
  std::size_t dev_cap_ = 0;
};

void to_f16(const float* src, std::size_t n, std::uint16_t* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}

void add(AttendedTokens& a, const AttendedTokens& b) {
  a.recent += b.recent;
  a.old_exact += b.old_exact;
  a.summaries += b.summaries;
  a.representatives += b.representatives;
}

void add(AttendedBytes& a, const AttendedBytes& b) {
  a.recent += b.recent;
  a.old_exact += b.old_exact;
  a.summaries += b.summaries;
  a.representatives += b.representatives;
}

}  // namespace

struct KvcKvCache::Staging {
  explicit Staging(Device d)
      : k(d),
        v(d),
        q(d),
        out(d),
        scores(d),
        lse(d),
        dense_out(d),
        dense_lse(d),
        num_valid(d),
        ids(d),
        counts(d) {}
  Mirror<std::uint16_t> k, v, q;
  Mirror<float> out, scores, lse, dense_out, dense_lse;
  Mirror<std::int32_t> num_valid, ids, counts;
  HostSelectionReport report;
};

Device pick_kv_device(const KvOptions& options, std::string* note) {
  options.validate();
  std::string why;
  Device want = Device::cpu();
  if (options.device == "cpu") {
    why = "--kv-device cpu";
  } else {
    const Device d = default_device();
    if (d.is_cpu()) {
      why = KVC_CUDA_ENABLED ? "no CUDA device found" : "kvc built without CUDA";
      KVC_CHECK(options.device != "cuda", "--kv-device = cuda, but ", why);
    } else {
      // Create each part once on the device: any of them may not have a CUDA implementation
      // for this shape yet.
      try {
        KvShape s{1, 9, 3, 64, 256};
        KvOptions o = options;
        o.recent_window = std::min(o.recent_window, 128);
        o.block_size = std::min(o.block_size, 32);
        o.max_blocks = 0;
        KvStore::create(store_config(o, s), d);
        BlockIndex::create(index_config(o, s, query_tokens_for(o, s)), d);
        Selector::create(d);
        AttentionBackend::create(attention_config(o, s, query_tokens_for(o, s)), d);
        want = d;
        why = "every kvc part runs on " + to_string(d);
      } catch (const Error& e) {
        KVC_CHECK(options.device != "cuda", "--kv-device = cuda, but ", e.what());
        why = to_string(d) + " is present, but not every kvc part runs there yet (" + e.what() +
              "); kvc runs on the CPU";
      }
    }
  }
  if (note != nullptr) *note = why;
  return want;
}

SelectPolicy make_select_policy(const KvOptions& o) {
  const int k = o.top_blocks;
  const int cap = o.effective_max_blocks();
  SelectPolicy p;
  if (o.policy == "topk") {
    p = SelectPolicy::topk(k);
  } else if (o.policy == "neighbors") {
    p = SelectPolicy::neighbors(k, 1);
  } else if (o.policy == "threshold") {
    p = SelectPolicy::threshold(o.delta, k, cap);
  } else if (o.policy == "anchor") {
    p = SelectPolicy::anchor(k, {0});
  } else if (o.policy == "anchor_neighbors") {
    p = SelectPolicy::anchor_neighbors(k, 1, {0});
  } else if (o.policy == "score_cluster") {
    p = SelectPolicy::score_cluster(k, o.delta, cap);
  } else if (o.policy == "score_cluster_adaptive") {
    p = SelectPolicy::score_cluster_adaptive(k, cap, o.delta);
  } else {
    KVC_CHECK(o.policy == "top_p", "--kv-policy = '", o.policy, "' is unknown");
    p = SelectPolicy::top_p(o.p, k, cap);
  }
  p.validate();
  return p;
}

KvcKvCache::KvcKvCache(const KvOptions& options, const KvShape& shape, Device device)
    : options_(options),
      shape_(shape),
      device_(device),
      mode_(mode_of(options)),
      old_format_(parse_format(options.effective_format())),
      policy_(make_select_policy(options)) {
  options.validate();
  KVC_CHECK(!options.is_reference(),
            "kvc cache: --kv-mode dense --kv-format f32 is the dense reference (DenseKvCache)");
  KVC_CHECK(shape.num_layers >= 1, "kvc cache: layers = ", shape.num_layers, " must be >= 1");
  KVC_CHECK(shape.capacity >= 1, "kvc cache: capacity = ", shape.capacity, " must be >= 1");
  const KvStoreConfig sc = store_config(options, shape);
  window_ = sc.recent_window;
  dense_layers_ = std::min(options.dense_layers, shape.num_layers);
  max_query_tokens_ = query_tokens_for(options, shape);
  stores_.reserve(static_cast<std::size_t>(shape.num_layers));
  for (int l = 0; l < shape.num_layers; ++l) {
    stores_.push_back(KvStore::create(sc, device));
    slot_ = stores_.back()->open_slot();
  }
  max_blocks_ = std::max(1, sc.max_blocks_per_slot());
  max_selected_ = std::max(1, policy_.max_output(max_blocks_));
  index_ = BlockIndex::create(index_config(options, shape, max_query_tokens_), device);
  SelectorLimits limits;
  limits.max_rows = max_query_tokens_ * shape.num_kv_heads;
  limits.max_blocks = max_blocks_;
  limits.max_selected = max_selected_;
  selector_ = Selector::create(device, limits);
  attention_ =
      AttentionBackend::create(attention_config(options, shape, max_query_tokens_), device);
  if (dense_layers_ > 0 || mode_ != AttentionMode::kDense) {  // dense layers; recall's reference
    AttentionConfig dc = attention_config(options, shape, max_query_tokens_);
    dc.mode = AttentionMode::kDense;
    dense_attention_ = AttentionBackend::create(dc, device);
  }
  staging_ = std::make_unique<Staging>(device);
}

KvcKvCache::~KvcKvCache() = default;

void KvcKvCache::check_range(int layer, int pos0, int count) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "kvc cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  KVC_CHECK(pos0 == length_, "kvc cache: pos0 = ", pos0, " must equal length = ", length_);
  KVC_CHECK(count >= 1 && count <= shape_.capacity - pos0, "kvc cache: count = ", count,
            " must be in [1, capacity - pos0 = ", shape_.capacity - pos0, "]");
}

void KvcKvCache::check_device(const char* what) const {
  KVC_CHECK(device_.is_cuda(), "kvc cache: ", what,
            "() takes CUDA device pointers, but kvc runs on ", to_string(device_),
            " (the CUDA model needs --kv-device cuda or auto)");
}

void KvcKvCache::store_append(int layer, int count, std::uint16_t* k16, std::uint16_t* v16) {
  KvStore& store = *stores_[static_cast<std::size_t>(layer)];
  const auto view = [&](std::uint16_t* p) {
    return TensorView::contiguous(p, DType::kF16, {count, shape_.num_kv_heads, shape_.head_dim},
                                  device_);
  };
  if (count == 1) {
    store.append({slot_}, view(k16), view(v16));
  } else {
    store.ingest(slot_, view(k16), view(v16));
  }
}

void KvcKvCache::append(int layer, int pos0, int count, const float* k, const float* v) {
  check_range(layer, pos0, count);
  const KvStore& store = *stores_[static_cast<std::size_t>(layer)];
  KVC_CHECK(store.length(slot_) == pos0, "kvc cache: layer ", layer, " holds ", store.length(slot_),
            " tokens; append at ", pos0, " (append each layer once per step)");
  const std::size_t n = static_cast<std::size_t>(count) * shape_.num_kv_heads * shape_.head_dim;
  to_f16(k, n, staging_->k.host(n));
  to_f16(v, n, staging_->v.host(n));
  store_append(layer, count, staging_->k.push(n), staging_->v.push(n));
}

void KvcKvCache::append_device(int layer, int pos0, int count, const float* d_k, const float* d_v) {
  check_device("append_device");
  check_range(layer, pos0, count);
  const KvStore& store = *stores_[static_cast<std::size_t>(layer)];
  KVC_CHECK(store.length(slot_) == pos0, "kvc cache: layer ", layer, " holds ", store.length(slot_),
            " tokens; append at ", pos0, " (append each layer once per step)");
#if KVC_CUDA_ENABLED
  const std::size_t n = static_cast<std::size_t>(count) * shape_.num_kv_heads * shape_.head_dim;
  std::uint16_t* k16 = staging_->k.device(n);
  std::uint16_t* v16 = staging_->v.device(n);
  cuda_check(cuda::f32_to_f16(d_k, k16, n, nullptr), "f32_to_f16 (K)");
  cuda_check(cuda::f32_to_f16(d_v, v16, n, nullptr), "f32_to_f16 (V)");
  store_append(layer, count, k16, v16);
#else
  (void)d_k;
  (void)d_v;
#endif
}

void KvcKvCache::attend(int layer, int pos0, int count, const float* q, float* out,
                        ThreadPool& /*pool*/) {
  check_range(layer, pos0, count);
  const std::size_t nq = static_cast<std::size_t>(count) * shape_.num_q_heads * shape_.head_dim;
  Staging& s = *staging_;
  to_f16(q, nq, s.q.host(nq));
  attend_f16(layer, pos0, count, s.q.push(nq), s.out.device(nq));
  std::memcpy(out, s.out.pull(nq), nq * sizeof(float));
}

void KvcKvCache::attend_device(int layer, int pos0, int count, const float* d_q, float* d_out) {
  check_device("attend_device");
  check_range(layer, pos0, count);
#if KVC_CUDA_ENABLED
  const std::size_t nq = static_cast<std::size_t>(count) * shape_.num_q_heads * shape_.head_dim;
  std::uint16_t* q16 = staging_->q.device(nq);
  cuda_check(cuda::f32_to_f16(d_q, q16, nq, nullptr), "f32_to_f16 (q)");
  attend_f16(layer, pos0, count, q16, d_out);
#else
  (void)d_q;
  (void)d_out;
#endif
}

void KvcKvCache::attend_f16(int layer, int pos0, int count, std::uint16_t* q16, float* out) {
  KVC_CHECK(count <= max_query_tokens_, "kvc cache: ", count, " query tokens in one step; at most ",
            max_query_tokens_, " (prefill densely, or with --chunk <= ", max_query_tokens_, ")");
  const KvStore& store = *stores_[static_cast<std::size_t>(layer)];
  KVC_CHECK(store.length(slot_) == pos0 + count, "kvc cache: layer ", layer, " holds ",
            store.length(slot_), " tokens; attend() needs the step's ", count,
            " tokens appended first");
  Staging& s = *staging_;
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, hd = shape_.head_dim;
  DecodeArgs args;
  args.slots = {slot_};
  args.q = TensorView::contiguous(q16, DType::kF16, {1, count, hq, hd}, device_);
  args.out = TensorView::contiguous(out, DType::kF32, {1, count, hq, hd}, device_);
  HostSelectionReport* report = nullptr;
  const bool dense_layer = layer < dense_layers_;
  AttentionBackend& backend = dense_layer ? *dense_attention_ : *attention_;
  if (uses_selection(mode_) && !dense_layer) {
    const int rows = count * hkv;
    const ScoresView scores{s.scores.device(static_cast<std::size_t>(rows) * max_blocks_),
                            s.num_valid.device(rows), rows, max_blocks_};
    if (scorer_ && count == 1) {
      const std::size_t n = static_cast<std::size_t>(rows) * max_blocks_;
      const ScoresView host{s.scores.host(n), s.num_valid.host(rows), rows, max_blocks_};
      scorer_(layer, pos0, host);
      const int closed = store.num_closed_blocks(slot_);
      for (int r = 0; r < rows; ++r) {
        KVC_CHECK(host.num_valid[r] == closed, "kvc cache: the block scorer set num_valid[", r,
                  "] = ", host.num_valid[r], "; the layer has ", closed, " closed blocks");
      }
      s.scores.push(n);
      s.num_valid.push(rows);
    } else {
      index_->score(store, args.slots, args.q, scores);
    }
    SelectionView selection{s.ids.device(static_cast<std::size_t>(rows) * max_selected_),
                            s.counts.device(rows), rows, max_selected_, false};
    if (stats_on_ && count == 1 && device_.is_cpu()) {
      s.report.resize(rows, max_selected_);
      report = &s.report;
      SelectionReport rv = s.report.view();
      selector_->select(scores, policy_, selection, &rv);
    } else {
      selector_->select(scores, policy_, selection);
    }
    args.selection = selection;
  }
  if (stats_on_ && count == 1) {
    Telemetry tm;
    tm.wait_for_device = true;
    const bool recall = recall_on_ && !dense_layer && mode_ != AttentionMode::kDense;
    if (recall)
      args.lse = TensorView::contiguous(s.lse.device(hq), DType::kF32, {1, 1, hq}, device_);
    backend.decode(store, args, &tm);
    record(layer, pos0, tm, report);
    if (recall_on_) record_recall(layer, args, recall ? s.lse.device(hq) : nullptr);
  } else {
    backend.decode(store, args);
  }
}

void KvcKvCache::record(int layer, int pos, const Telemetry& tm,
                        const HostSelectionReport* report) {
  const int hkv = shape_.num_kv_heads;
  if (stats_.position != pos) {
    stats_ = KvcStepStats();
    stats_.position = pos;
    stats_.selected.assign(static_cast<std::size_t>(shape_.num_layers) * hkv, {});
    stats_.cutoff_margin.assign(static_cast<std::size_t>(shape_.num_layers) * hkv,
                                std::numeric_limits<float>::quiet_NaN());
  }
  ++stats_.layers;
  stats_.closed_blocks = stores_[static_cast<std::size_t>(layer)]->num_closed_blocks(slot_);
  add(stats_.tokens, tm.total_tokens);
  add(stats_.bytes, tm.attended_bytes);
  stats_.dense_equivalent_bytes += tm.dense_equivalent_bytes;
  if (tm.selection_rows == hkv) {
    for (int h = 0; h < hkv; ++h) {
      const std::int32_t* ids =
          tm.selected_ids.data() + static_cast<std::size_t>(h) * tm.max_selected;
      stats_.selected[static_cast<std::size_t>(layer) * hkv + h].assign(
          ids, ids + tm.selected_counts[static_cast<std::size_t>(h)]);
    }
  }
  if (report != nullptr) {
    for (int h = 0; h < hkv; ++h) {
      stats_.cutoff_margin[static_cast<std::size_t>(layer) * hkv + h] =
          report->cutoff_margin[static_cast<std::size_t>(h)];
    }
  }
}

void KvcKvCache::record_recall(int layer, const DecodeArgs& args, const float* lse) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, g = hq / hkv;
  if (stats_.mass_recall.size() != static_cast<std::size_t>(shape_.num_layers) * hkv) {
    stats_.mass_recall.assign(static_cast<std::size_t>(shape_.num_layers) * hkv,
                              std::numeric_limits<double>::quiet_NaN());
  }
  double* row = stats_.mass_recall.data() + static_cast<std::size_t>(layer) * hkv;
  if (lse == nullptr) {  // a dense layer, or the dense mode: every token was attended
    std::fill(row, row + hkv, 1.0);
    return;
  }
  if (uses_summaries(mode_)) {  // summaries are not tokens: no attended set of tokens
    std::fill(row, row + hkv, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  Staging& s = *staging_;
  const std::size_t nq = static_cast<std::size_t>(hq) * shape_.head_dim;
  DecodeArgs dense;
  dense.slots = args.slots;
  dense.q = args.q;
  dense.out = TensorView::contiguous(s.dense_out.device(nq), DType::kF32,
                                     {1, 1, hq, shape_.head_dim}, device_);
  dense.lse = TensorView::contiguous(s.dense_lse.device(hq), DType::kF32, {1, 1, hq}, device_);
  dense_attention_->decode(*stores_[static_cast<std::size_t>(layer)], dense);
  const float* att = s.lse.pull(hq);
  const float* ref = s.dense_lse.pull(hq);
  for (int h = 0; h < hkv; ++h) {
    double sum = 0.0;
    for (int i = h * g; i < (h + 1) * g; ++i) {
      sum += std::exp(static_cast<double>(att[i]) - static_cast<double>(ref[i]));
    }
    row[h] = sum / g;
  }
}

void KvcKvCache::advance(int count) {
  KVC_CHECK(count >= 0 && count <= shape_.capacity - length_, "kvc cache: advance(", count,
            ") past capacity ", shape_.capacity, " from length ", length_);
  for (int l = 0; l < shape_.num_layers; ++l) {
    KVC_CHECK(stores_[static_cast<std::size_t>(l)]->length(slot_) == length_ + count,
              "kvc cache: advance(", count, ") but layer ", l, " holds ",
              stores_[static_cast<std::size_t>(l)]->length(slot_), " tokens, not ",
              length_ + count);
  }
  length_ += count;
}

Footprint KvcKvCache::footprint() const {
  Footprint sum;
  for (const auto& st : stores_) {
    const Footprint f = st->footprint();
    sum.ring += f.ring;
    sum.old_k += f.old_k;
    sum.old_v += f.old_v;
    sum.scales += f.scales;
    sum.summaries += f.summaries;
    sum.index_keys += f.index_keys;
    sum.tables += f.tables;
    sum.tokens += f.tokens;
    sum.dense_equivalent_bytes += f.dense_equivalent_bytes;
    sum.dense_equivalent_capacity += f.dense_equivalent_capacity;
    sum.in_use += f.in_use;
  }
  return sum;
}

std::size_t KvcKvCache::footprint_bytes() const { return footprint().in_use; }

std::size_t KvcKvCache::reserved_bytes() const { return footprint().total(); }

std::string KvcKvCache::describe() const {
  std::ostringstream os;
  os << "kvc " << to_string(mode_) << " (" << shape_.num_layers << " layers x "
     << shape_.num_kv_heads << " kv heads x " << shape_.head_dim << " dims, capacity "
     << shape_.capacity << "; ring " << window_ << " f16, old blocks of " << options_.block_size
     << " in " << to_string(old_format_);
  if (uses_selection(mode_)) {
    os << ", " << to_string(policy_.kind) << " " << options_.top_blocks;
    if (options_.scoring != "mean_k") os << " by " << options_.scoring;
    if (options_.token_scoring()) os << " over " << options_.token_keys << " keys";
    if (options_.candidates > 0)
      os << " of the " << options_.candidates << " best blocks by " << options_.candidate_scoring
         << " (two stages)";
  }
  if (options_.summary_dtype != "f32") os << "; " << options_.summary_dtype << " summaries";
  if (dense_layers_ > 0) os << "; first " << dense_layers_ << " layers dense";
  if (uses_summaries(mode_) && options_.representatives > 0) {
    os << ", " << options_.representatives << " representatives";
  }
  os << "; kvc on " << to_string(device_) << ")";
  return os.str();
}

}  // namespace mini_decoder
}  // namespace kvc
