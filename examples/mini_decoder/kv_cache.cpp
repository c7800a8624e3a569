// KV cache options and the dense f32 cache.
#include "kv_cache.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernels.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc_cache.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Query rows (token x head of a GQA group) per attention task: four GEMM row tiles.
constexpr int kQueryRows = 4 * kTileRows;

}  // namespace

const std::vector<std::string>& KvOptions::modes() {
  static const std::vector<std::string> m = {
      "dense",         "dense_recent_only",  "recent_only",
      "block_summary", "block_select_lossy", "block_select_exact"};
  return m;
}

const std::vector<std::string>& KvOptions::formats() {
  static const std::vector<std::string> f = {"f32", "f16", "q8", "fp16k_q4v"};
  return f;
}

const std::vector<std::string>& KvOptions::policies() {
  static const std::vector<std::string> p = {"topk",
                                             "neighbors",
                                             "threshold",
                                             "anchor",
                                             "anchor_neighbors",
                                             "score_cluster",
                                             "score_cluster_adaptive",
                                             "top_p"};
  return p;
}

const std::vector<std::string>& KvOptions::scorings() {
  static const std::vector<std::string> v = {"mean_k", "quest", "token_max", "token_mass"};
  return v;
}

const std::vector<std::string>& KvOptions::token_key_sources() {
  static const std::vector<std::string> v = {"mxfp4", "fp8", "old_blocks"};
  return v;
}

const std::vector<std::string>& KvOptions::summary_dtypes() {
  static const std::vector<std::string> v = {"f32", "f16"};
  return v;
}

void KvOptions::validate() const {
  KVC_CHECK(contains(modes(), mode), "--kv-mode = '", mode, "' is not one of: ", join(modes()));
  KVC_CHECK(format.empty() || contains(formats(), format), "--kv-format = '", format,
            "' is not one of: ", join(formats()));
  KVC_CHECK(block_size == 16 || block_size == 32 || block_size == 64 || block_size == 128,
            "--block-size = ", block_size, " must be 16, 32, 64 or 128");
  KVC_CHECK(top_blocks >= 1 && top_blocks <= 4096, "--top-blocks = ", top_blocks,
            " must be in [1, 4096]");
  KVC_CHECK(
      recent_window >= block_size && recent_window <= (1 << 20) && recent_window % block_size == 0,
      "--recent-window = ", recent_window, " must be a multiple of --block-size = ", block_size,
      " in [", block_size, ", 1048576]");
  KVC_CHECK(!(mode != "dense" && format == "f32"),
            "--kv-format = f32 is only for --kv-mode = "
            "dense; the kvc modes store f16, q8 or fp16k_q4v");
  KVC_CHECK(contains(policies(), policy), "--kv-policy = '", policy,
            "' is not one of: ", join(policies()));
  KVC_CHECK(contains(scorings(), scoring), "--kv-scoring = '", scoring,
            "' is not one of: ", join(scorings()));
  KVC_CHECK(contains(token_key_sources(), token_keys), "--kv-token-keys = '", token_keys,
            "' is not one of: ", join(token_key_sources()));
  KVC_CHECK(candidates >= 0 && candidates <= kMaxCandidates, "--kv-candidates = ", candidates,
            " must be in [0, ", kMaxCandidates, "]");
  KVC_CHECK(candidates == 0 || scoring == "token_mass", "--kv-candidates = ", candidates,
            " (two stages) needs --kv-scoring = token_mass, not ", scoring);
  KVC_CHECK(candidate_scoring == "mean_k" || candidate_scoring == "quest",
            "--kv-candidate-scoring = '", candidate_scoring, "' is not one of: mean_k, quest");
  KVC_CHECK(contains(summary_dtypes(), summary_dtype), "--kv-summary-dtype = '", summary_dtype,
            "' is not one of: ", join(summary_dtypes()));
  KVC_CHECK(delta >= 0.0f, "--kv-delta = ", delta, " must be >= 0");
  KVC_CHECK(max_blocks == 0 || (max_blocks >= top_blocks && max_blocks <= 1 << 20),
            "--kv-max-blocks = ", max_blocks,
            " must be 0 (2 x --top-blocks) or in [--top-blocks = ", top_blocks, ", 1048576]");
  KVC_CHECK(p > 0.0f && p <= 1.0f, "--kv-p = ", p, " must be in (0, 1]");
  KVC_CHECK(representatives >= 0 && representatives <= block_size,
            "--kv-representatives = ", representatives,
            " must be in [0, --block-size = ", block_size, "]");
  KVC_CHECK(prefill == "dense" || prefill == "compressed", "--prefill = '", prefill,
            "' is not one of: dense, compressed");
  KVC_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--kv-device = '", device,
            "' is not one of: auto, cpu, cuda");
  KVC_CHECK(dense_layers >= 0 && dense_layers <= 4096, "--kv-dense-layers = ", dense_layers,
            " must be in [0, 4096]");
}

std::string KvOptions::effective_format() const {
  if (!format.empty()) return format;
  return mode == "dense" ? "f32" : "fp16k_q4v";
}

std::unique_ptr<KvCache> make_kv_cache(const KvOptions& options, const KvShape& shape) {
  options.validate();
  if (options.is_reference()) return std::make_unique<DenseKvCache>(shape);
  return std::make_unique<KvcKvCache>(options, shape, pick_kv_device(options));
}

void KvCache::append_device(int /*layer*/, int /*pos0*/, int /*count*/, const float* /*d_k*/,
                            const float* /*d_v*/) {
  KVC_CHECK(false, "kv cache: ", describe(), " is a host cache; append_device() needs a cache ",
            "on the CUDA device (--device cuda runs the model with one)");
}

void KvCache::attend_device(int /*layer*/, int /*pos0*/, int /*count*/, const float* /*d_q*/,
                            float* /*d_out*/) {
  KVC_CHECK(false, "kv cache: ", describe(), " is a host cache; attend_device() needs a cache ",
            "on the CUDA device (--device cuda runs the model with one)");
}

void copy_prefix(const DenseKvCache& src, int count, KvCache& dst) {
  KVC_CHECK(count >= 0 && count <= src.length(), "copy_prefix: count = ", count,
            " must be in [0, source length = ", src.length(), "]");
  KVC_CHECK(dst.length() == 0, "copy_prefix: the destination holds ", dst.length(),
            " tokens; it must be empty");
  if (count == 0) return;
  std::vector<float> k, v;
  // Layers one at a time: the staging holds count tokens of one layer.
  const std::size_t n = static_cast<std::size_t>(count) * src.token_floats();
  k.resize(n);
  v.resize(n);
  for (int layer = 0; layer < src.num_layers(); ++layer) {
    src.read(layer, 0, count, k.data(), v.data());
    dst.append(layer, 0, count, k.data(), v.data());
  }
  dst.advance(count);
}

DenseKvCache::DenseKvCache(const KvShape& shape) : shape_(shape) {
  KVC_CHECK(shape.num_layers >= 1 && shape.num_kv_heads >= 1 && shape.head_dim >= 1 &&
                shape.num_q_heads >= shape.num_kv_heads &&
                shape.num_q_heads % shape.num_kv_heads == 0,
            "kv cache: layers = ", shape.num_layers, ", q heads = ", shape.num_q_heads,
            ", kv heads = ", shape.num_kv_heads, ", head_dim = ", shape.head_dim,
            " (q heads must be a multiple of kv heads)");
  KVC_CHECK(shape.capacity >= 1 && shape.capacity <= (1 << 24),
            "kv cache: capacity = ", shape.capacity, " must be in [1, 2^24]");
  cap_pad_ = (shape.capacity + kPanel - 1) / kPanel * kPanel;
  v_stride_ = (shape.head_dim + kPanel - 1) / kPanel * kPanel;
  const std::size_t heads = static_cast<std::size_t>(shape.num_layers) * shape.num_kv_heads;
  // Zero so that the padding the GEMM reads (key columns past the length, value columns past
  // head_dim) is finite.
  k_.assign(heads * shape.head_dim * cap_pad_, 0.0f);
  v_.assign(heads * v_stride_ * cap_pad_, 0.0f);
}

float* DenseKvCache::k_t(int layer, int head) {
  return k_.data() + (static_cast<std::size_t>(layer) * shape_.num_kv_heads + head) *
                         shape_.head_dim * cap_pad_;
}

const float* DenseKvCache::k_t(int layer, int head) const {
  return const_cast<DenseKvCache*>(this)->k_t(layer, head);
}

float* DenseKvCache::v(int layer, int head) {
  return v_.data() +
         (static_cast<std::size_t>(layer) * shape_.num_kv_heads + head) * v_stride_ * cap_pad_;
}

const float* DenseKvCache::v(int layer, int head) const {
  return const_cast<DenseKvCache*>(this)->v(layer, head);
}

void DenseKvCache::read(int layer, int pos0, int count, float* k, float* v_out) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "kv cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  KVC_CHECK(pos0 >= 0 && count >= 0 && count <= length_ - pos0, "kv cache: read [", pos0, ", ",
            pos0 + count, ") past the ", length_, " committed tokens");
  const int hd = shape_.head_dim;
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    const float* kt = k_t(layer, h);
    const float* vv = v(layer, h);
    for (int t = 0; t < count; ++t) {
      const int pos = pos0 + t;
      const std::size_t dst = (static_cast<std::size_t>(t) * shape_.num_kv_heads + h) * hd;
      const float* panel = kt + static_cast<std::size_t>(pos / kPanel) * hd * kPanel + pos % kPanel;
      for (int d = 0; d < hd; ++d) k[dst + d] = panel[static_cast<std::size_t>(d) * kPanel];
      const float* row = vv + static_cast<std::size_t>(pos) * v_stride_;
      std::copy(row, row + hd, v_out + dst);
    }
  }
}

void DenseKvCache::check_range(int layer, int pos0, int count) const {
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers, "kv cache: layer = ", layer,
            " must be in [0, ", shape_.num_layers, ")");
  KVC_CHECK(pos0 == length_, "kv cache: pos0 = ", pos0, " must equal length = ", length_);
  KVC_CHECK(count >= 1 && count <= shape_.capacity - pos0, "kv cache: count = ", count,
            " must be in [1, capacity - pos0 = ", shape_.capacity - pos0, "]");
}

void DenseKvCache::append(int layer, int pos0, int count, const float* k, const float* v_in) {
  check_range(layer, pos0, count);
  const int hd = shape_.head_dim;
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    float* kt = k_t(layer, h);
    float* vv = v(layer, h);
    for (int t = 0; t < count; ++t) {
      const std::size_t src = (static_cast<std::size_t>(t) * shape_.num_kv_heads + h) * hd;
      const int pos = pos0 + t;
      // Keys in panels of 16 positions: [pos / 16][dim][pos % 16].
      float* panel = kt + static_cast<std::size_t>(pos / kPanel) * hd * kPanel + pos % kPanel;
      for (int d = 0; d < hd; ++d) panel[static_cast<std::size_t>(d) * kPanel] = k[src + d];
      std::copy(v_in + src, v_in + src + hd, vv + static_cast<std::size_t>(pos) * v_stride_);
    }
  }
}

void DenseKvCache::attend(int layer, int pos0, int count, const float* q, float* out,
                          ThreadPool& pool) {
  check_range(layer, pos0, count);
  const int hq = shape_.num_q_heads;
  const int hd = shape_.head_dim;
  const int group = hq / shape_.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One task: one kv head and a block of query tokens; its rows are (token, head of the group),
  // so the group's query heads share every read of K and V.
  const int tokens_per_task = std::max(1, kQueryRows / group);
  const int rows_max = tokens_per_task * group;
  const int blocks = (count + tokens_per_task - 1) / tokens_per_task;
  if (static_cast<int>(scratch_.size()) < pool.size()) scratch_.resize(pool.size());
  const int ld = hq * hd;  // stride between tokens in q and out
  pool.parallel_for(shape_.num_kv_heads * blocks, [&](int task, int thread) {
    const int kvh = task % shape_.num_kv_heads;
    const int t0 = task / shape_.num_kv_heads * tokens_per_task;
    const int tokens = std::min(tokens_per_task, count - t0);
    const int rows = tokens * group;
    const int kend = pos0 + t0 + tokens;  // keys [0, kend) cover every query of the task
    const int kend_pad = (kend + kPanel - 1) / kPanel * kPanel;
    std::vector<float>& buf = scratch_[static_cast<std::size_t>(thread)];
    const std::size_t need = static_cast<std::size_t>(rows_max) * (cap_pad_ + 2 * hd);
    if (buf.size() < need) buf.resize(need);
    float* qs = buf.data();                                    // [rows][hd]
    float* os = qs + static_cast<std::size_t>(rows_max) * hd;  // [rows][hd]
    float* s = os + static_cast<std::size_t>(rows_max) * hd;   // [rows][kend_pad]
    for (int r = 0; r < rows; ++r) {
      const int t = t0 + r / group, h = kvh * group + r % group;
      std::copy(q + static_cast<std::size_t>(t) * ld + h * hd,
                q + static_cast<std::size_t>(t) * ld + (h + 1) * hd,
                qs + static_cast<std::size_t>(r) * hd);
    }
    // Scores [rows][kend_pad] = Q . K^T, softmax over each row's causal prefix.
    gemm_nn(rows, kend_pad, hd, qs, hd, k_t(layer, kvh), kPanel,
            static_cast<std::ptrdiff_t>(hd) * kPanel, s, kend_pad);
    float inv_sum[kQueryRows];
    for (int r = 0; r < rows; ++r) {
      const int valid = pos0 + t0 + r / group + 1;
      inv_sum[r] =
          1.0f / softmax_row(s + static_cast<std::size_t>(r) * kend_pad, valid, kend, scale);
    }
    // Out = P . V, normalised, back to [token][head][dim].
    gemm_nn(rows, hd, kend, s, kend_pad, v(layer, kvh), v_stride_, kPanel, os, hd);
    for (int r = 0; r < rows; ++r) {
      const int t = t0 + r / group, h = kvh * group + r % group;
      const float* o = os + static_cast<std::size_t>(r) * hd;
      float* dst = out + static_cast<std::size_t>(t) * ld + h * hd;
      for (int d = 0; d < hd; ++d) dst[d] = o[d] * inv_sum[r];
    }
  });
}

void DenseKvCache::advance(int count) {
  KVC_CHECK(count >= 0 && count <= shape_.capacity - length_, "kv cache: advance(", count,
            ") past capacity ", shape_.capacity, " from length ", length_);
  length_ += count;
}

std::size_t DenseKvCache::footprint_bytes() const {
  return static_cast<std::size_t>(length_) * shape_.num_layers * shape_.num_kv_heads *
         shape_.head_dim * 2 * sizeof(float);
}

std::size_t DenseKvCache::reserved_bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

std::string DenseKvCache::describe() const {
  std::ostringstream os;
  os << "dense f32 (" << shape_.num_layers << " layers x " << shape_.num_kv_heads << " kv heads x "
     << shape_.head_dim << " dims, capacity " << shape_.capacity << ")";
  return os.str();
}

}  // namespace mini_decoder
}  // namespace kvc
