// AttentionBackend: configuration, names, the factory, and the argument checks and telemetry
// shared by the CPU and CUDA backends. Every check runs before any work.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_internal.h"
#include "kvc/core/error.h"

namespace kvc {

namespace {

constexpr AttentionMode kAllModes[] = {
    AttentionMode::kDense,
    AttentionMode::kDenseRecentOnly,
    AttentionMode::kRecentOnly,
    AttentionMode::kBlockSummary,
    AttentionMode::kBlockSelectLossy,
    AttentionMode::kBlockSelectExact,
};

bool is_head_dim_supported(int d) { return d == 64 || d == 128 || d == 256 || d == 512; }
bool is_16bit(DType t) { return t == DType::kF16 || t == DType::kBF16; }

}  // namespace

const char* to_string(AttentionMode m) {
  switch (m) {
    case AttentionMode::kDense:
      return "dense";
    case AttentionMode::kDenseRecentOnly:
      return "dense_recent_only";
    case AttentionMode::kRecentOnly:
      return "recent_only";
    case AttentionMode::kBlockSummary:
      return "block_summary";
    case AttentionMode::kBlockSelectLossy:
      return "block_select_lossy";
    case AttentionMode::kBlockSelectExact:
      return "block_select_exact";
  }
  return "?";
}

AttentionMode parse_attention_mode(const std::string& name) {
  for (AttentionMode m : kAllModes) {
    if (name == to_string(m)) return m;
  }
  KVC_CHECK(false, "mode = '", name,
            "' is not one of dense, dense_recent_only, recent_only, block_summary, "
            "block_select_lossy, block_select_exact");
  return AttentionMode::kBlockSelectExact;
}

const char* to_string(RepresentativePolicy p) {
  switch (p) {
    case RepresentativePolicy::kLast:
      return "last";
    case RepresentativePolicy::kStride:
      return "stride";
  }
  return "?";
}

float AttentionConfig::effective_scale() const {
  if (softmax_scale != 0.0f) return softmax_scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

void AttentionConfig::validate() const {
  KVC_CHECK(num_kv_heads >= 1 && num_kv_heads <= 256, "num_kv_heads = ", num_kv_heads,
            " must be in [1, 256]");
  KVC_CHECK(num_q_heads >= 1, "num_q_heads = ", num_q_heads, " must be >= 1");
  KVC_CHECK(num_q_heads % num_kv_heads == 0, "num_q_heads = ", num_q_heads,
            " must be a multiple of num_kv_heads = ", num_kv_heads);
  KVC_CHECK(group_size() >= 1 && group_size() <= 128,
            "group size num_q_heads / num_kv_heads = ", group_size(), " must be in [1, 128]");
  KVC_CHECK(is_head_dim_supported(head_dim), "head_dim = ", head_dim,
            " must be 64, 128, 256 or 512");
  KVC_CHECK(is_16bit(dtype), "dtype = ", to_string(dtype), " must be f16 or bf16");
  KVC_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
            "softmax_scale = ", softmax_scale, " must be finite and >= 0 (0: 1/sqrt(head_dim))");
  bool mode_known = false;
  for (AttentionMode m : kAllModes) mode_known = mode_known || m == mode;
  KVC_CHECK(mode_known, "mode = ", static_cast<int>(mode), " is not an AttentionMode");
  KVC_CHECK(representative_policy == RepresentativePolicy::kLast ||
                representative_policy == RepresentativePolicy::kStride,
            "representative_policy = ", static_cast<int>(representative_policy),
            " is not a RepresentativePolicy");
  KVC_CHECK(num_representatives >= 0 && num_representatives <= 1024,
            "num_representatives = ", num_representatives, " must be in [0, 1024]");
  KVC_CHECK(max_query_tokens >= 1 && max_query_tokens <= 1024,
            "max_query_tokens = ", max_query_tokens, " must be in [1, 1024]");
  KVC_CHECK(max_batch >= 1 && max_batch <= (1 << 24), "max_batch = ", max_batch,
            " must be in [1, 2^24]");
  KVC_CHECK(max_splits >= 0, "max_splits = ", max_splits, " must be >= 0 (0: automatic)");
}

std::unique_ptr<AttentionBackend> AttentionBackend::create(const AttentionConfig& config,
                                                           Device device) {
  config.validate();
  if (device.is_cpu()) return attention::create_cpu_backend(config);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return attention::create_cuda_backend(config, device);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

namespace attention {

namespace {

// out: config dtype or f32; q: config dtype. Both [batch, T, Hq, d].
void check_q_out_lse(const AttentionConfig& c, Device device, const TensorView& q,
                     const TensorView& out, const TensorView& lse, std::int64_t batch) {
  check_view(q, "q", c.dtype, {batch, -1, c.num_q_heads, c.head_dim}, device);
  const std::int64_t T = q.shape[1];
  KVC_CHECK(T >= 1 && T <= c.max_query_tokens, "q.shape[1] = T = ", T,
            " must be in [1, max_query_tokens = ", c.max_query_tokens, "]");
  KVC_CHECK(out.dtype == c.dtype || out.dtype == DType::kF32, "out.dtype = ", to_string(out.dtype),
            " must be the config dtype ", to_string(c.dtype), " or f32");
  check_view(out, "out", out.dtype, {batch, T, c.num_q_heads, c.head_dim}, device);
  if (lse.data != nullptr) {
    check_view(lse, "lse", DType::kF32, {batch, T, c.num_q_heads}, device, 4);
  }
}

}  // namespace

AttentionParams check_decode(const AttentionConfig& c, Device device, const KvStore& store,
                             const DecodeArgs& args, bool host_readable) {
  const KvStoreConfig& sc = store.config();
  KVC_CHECK(store.device() == device, "store.device = ", to_string(store.device()),
            " must be the backend's device ", to_string(device));
  KVC_CHECK(sc.num_kv_heads == c.num_kv_heads, "store num_kv_heads = ", sc.num_kv_heads,
            " must equal config num_kv_heads = ", c.num_kv_heads);
  KVC_CHECK(sc.head_dim == c.head_dim, "store head_dim = ", sc.head_dim,
            " must equal config head_dim = ", c.head_dim);
  const std::int64_t batch = static_cast<std::int64_t>(args.slots.size());
  check_q_out_lse(c, device, args.q, args.out, args.lse, batch);
  const int T = static_cast<int>(args.q.shape[1]);
  KVC_CHECK(T <= sc.recent_window, "q.shape[1] = T = ", T,
            " must be <= recent_window = ", sc.recent_window,
            " (verify tokens must all be in the ring)");
  for (std::size_t b = 0; b < args.slots.size(); ++b) {
    const int s = args.slots[b];
    KVC_CHECK(s >= 0 && s < sc.max_slots, "slots[", b, "] = ", s,
              " must be in [0, max_slots = ", sc.max_slots, ")");
    KVC_CHECK(store.is_open(s), "slots[", b, "] = ", s, " is not an open slot");
    KVC_CHECK(store.length(s) >= T, "slots[", b, "] = ", s, " holds ", store.length(s),
              " tokens, fewer than the T = ", T, " query tokens");
  }
  if (uses_summaries(c.mode)) {
    KVC_CHECK((sc.summaries & kSummaryMeanV) != 0, "mode = ", to_string(c.mode),
              " needs store summaries with kSummaryMeanV (summaries = ", sc.summaries, ")");
    KVC_CHECK(c.num_representatives <= sc.block_size,
              "num_representatives = ", c.num_representatives,
              " must be <= the store's block_size = ", sc.block_size);
  }
  const StoreView sv = store.view();
  AttentionParams p;
  if (uses_selection(c.mode)) {
    const SelectionView& sel = args.selection;
    const std::int64_t rows =
        sel.shared_across_heads ? batch * T : batch * T * static_cast<std::int64_t>(c.num_kv_heads);
    KVC_CHECK(sel.rows == rows, "selection.rows = ", sel.rows, " must be ", rows,
              sel.shared_across_heads ? " (batch * T, shared across heads)"
                                      : " (batch * T * num_kv_heads)",
              " for mode ", to_string(c.mode));
    KVC_CHECK(sel.max_selected >= 0, "selection.max_selected = ", sel.max_selected,
              " must be >= 0");
    KVC_CHECK(rows == 0 || sel.counts != nullptr, "selection.counts = null; mode ",
              to_string(c.mode), " needs a selection");
    KVC_CHECK(rows == 0 || sel.max_selected == 0 || sel.ids != nullptr,
              "selection.ids = null with max_selected = ", sel.max_selected);
    if (host_readable) {
      // Ids must be in [0, closed blocks of the row's slot) and distinct within a row.
      std::vector<unsigned char> seen(static_cast<std::size_t>(sc.max_blocks_per_slot()) + 1, 0);
      const int rows_per_b = static_cast<int>(rows / (batch > 0 ? batch : 1));
      for (std::int64_t r = 0; r < rows; ++r) {
        const int b = static_cast<int>(r / rows_per_b);
        const int slot = args.slots[b];
        const int closed = store.num_closed_blocks(slot);
        const int n = sel.counts[r];
        KVC_CHECK(n >= 0 && n <= sel.max_selected, "selection.counts[", r, "] = ", n,
                  " must be in [0, max_selected = ", sel.max_selected, "]");
        const std::int32_t* ids = sel.ids + r * sel.max_selected;
        for (int i = 0; i < n; ++i) {
          KVC_CHECK(ids[i] >= 0 && ids[i] < closed, "selection.ids[", r, "][", i, "] = ", ids[i],
                    " must be in [0, closed blocks = ", closed, ") of slot ", slot);
          KVC_CHECK(!seen[ids[i]], "selection.ids[", r, "][", i, "] = ", ids[i],
                    " is selected twice in row ", r);
          seen[ids[i]] = 1;
        }
        for (int i = 0; i < n; ++i) seen[ids[i]] = 0;
      }
    }
    p.selection = sel;
  }
  p.store = sv;
  p.q = args.q.data;
  p.out = args.out.data;
  p.lse = static_cast<float*>(args.lse.data);
  p.sink = args.sink;
  p.batch = static_cast<int>(batch);
  p.num_query_tokens = T;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.group_size = c.group_size();
  p.head_dim = c.head_dim;
  p.scale = c.effective_scale();
  p.mode = c.mode;
  p.num_representatives = uses_summaries(c.mode) ? c.num_representatives : 0;
  p.representative_policy = c.representative_policy;
  p.q_dtype = args.q.dtype;
  p.out_dtype = args.out.dtype;
  return p;
}

DenseParams check_dense_decode(const AttentionConfig& c, Device device,
                               const DenseDecodeArgs& args) {
  const std::int64_t batch = static_cast<std::int64_t>(args.lengths.size());
  check_q_out_lse(c, device, args.q, args.out, args.lse, batch);
  const int T = static_cast<int>(args.q.shape[1]);
  KVC_CHECK(is_16bit(args.k.dtype), "k.dtype = ", to_string(args.k.dtype), " must be f16 or bf16");
  check_view(args.k, "k", args.k.dtype, {batch, c.num_kv_heads, -1, c.head_dim}, device);
  const std::int64_t N = args.k.shape[2];
  check_view(args.v, "v", args.k.dtype, {batch, c.num_kv_heads, N, c.head_dim}, device);
  KVC_CHECK(N <= INT32_MAX, "k.shape[2] = N = ", N, " must be < 2^31");
  KVC_CHECK(args.window >= 0, "window = ", args.window, " must be >= 0 (0: all positions)");
  for (std::size_t b = 0; b < args.lengths.size(); ++b) {
    KVC_CHECK(args.lengths[b] >= T && args.lengths[b] <= N, "lengths[", b, "] = ", args.lengths[b],
              " must be in [T = ", T, ", N = ", N, "]");
  }
  DenseParams p;
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  p.out = args.out.data;
  p.lse = static_cast<float*>(args.lse.data);
  p.sink = args.sink;
  p.batch = static_cast<int>(batch);
  p.num_query_tokens = T;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.group_size = c.group_size();
  p.head_dim = c.head_dim;
  p.capacity = static_cast<int>(N);
  p.window = args.window;
  p.scale = c.effective_scale();
  p.q_dtype = args.q.dtype;
  p.kv_dtype = args.k.dtype;
  p.out_dtype = args.out.dtype;
  return p;
}

void fill_telemetry(const AttentionConfig& c, const KvStore& store, const DecodeArgs& args,
                    const SelectionView* sel_or_null, Telemetry* tm) {
  const KvStoreConfig& sc = store.config();
  const StoreView sv = store.view();
  const int batch = static_cast<int>(args.slots.size());
  const int T = static_cast<int>(args.q.shape[1]);
  const int Hkv = c.num_kv_heads;
  const int B = sc.block_size;
  const int R = uses_summaries(c.mode) ? c.num_representatives : 0;
  tm->complete = false;
  tm->mode = c.mode;
  tm->batch = batch;
  tm->num_query_tokens = T;
  tm->num_kv_heads = Hkv;
  tm->rows = batch * T * Hkv;
  tm->selection_rows = 0;
  tm->max_selected = 0;
  tm->selection_shared_across_heads = false;
  tm->selected_ids.clear();
  tm->selected_counts.clear();
  tm->tokens.clear();
  tm->total_tokens = AttendedTokens{};
  tm->attended_bytes = AttendedBytes{};
  tm->attended_ratio = 0.0;
  tm->dense_equivalent_bytes = 0;
  tm->store = store.footprint();
  tm->compression_ratio = tm->store.in_use > 0
                              ? static_cast<double>(tm->store.dense_equivalent_bytes) /
                                    static_cast<double>(tm->store.in_use)
                              : 0.0;
  if (uses_selection(c.mode) && sel_or_null == nullptr) {
    // The selection lives on the device and was not copied: what depends on it stays empty.
    for (int b = 0; b < batch; ++b) {
      const int L = store.length(args.slots[b]);
      for (int t = 0; t < T; ++t) {
        const RowRange rr = row_range(L, T, t, sc.recent_window, B);
        tm->dense_equivalent_bytes +=
            static_cast<std::uint64_t>(rr.position + 1) * 4ull * c.head_dim * Hkv;
      }
    }
    return;
  }
  const SelectionView sel = sel_or_null != nullptr ? *sel_or_null : SelectionView{};
  // Count of row r clamped to [0, max_selected], as the CUDA kernels read it.
  auto count_of = [&](int r) { return std::min(std::max(sel.counts[r], 0), sel.max_selected); };
  if (uses_selection(c.mode)) {
    tm->selection_rows = sel.rows;
    tm->max_selected = sel.max_selected;
    tm->selection_shared_across_heads = sel.shared_across_heads;
    tm->selected_counts.assign(sel.counts, sel.counts + sel.rows);
    tm->selected_ids.assign(static_cast<std::size_t>(sel.rows) * sel.max_selected, -1);
    for (int r = 0; r < sel.rows; ++r) {
      for (int i = 0; i < count_of(r); ++i) {
        tm->selected_ids[static_cast<std::size_t>(r) * sel.max_selected + i] =
            sel.ids[static_cast<std::size_t>(r) * sel.max_selected + i];
      }
    }
  }
  tm->tokens.assign(static_cast<std::size_t>(tm->rows), AttendedTokens{});
  const std::uint64_t dense_token = 2ull * c.head_dim * 2ull;
  // A shard store counts what it attends: its own blocks, and the ring on shard 0 (attention.h);
  // the counts of all shards add up to those of one unsharded store.
  const bool own_ring = sc.num_shards <= 1 || sc.shard_index == 0;
  auto owned_positions = [&](int begin, int end) -> std::int64_t {  // old positions [begin, end)
    if (begin >= end) return 0;
    if (sc.num_shards <= 1) return end - begin;
    std::int64_t n = 0;
    for (int blk = begin / B; blk * B < end; ++blk) {
      if (sc.owns_block(blk)) n += std::min(end, (blk + 1) * B) - std::max(begin, blk * B);
    }
    return n;
  };
  for (int b = 0; b < batch; ++b) {
    const int L = store.length(args.slots[b]);
    for (int t = 0; t < T; ++t) {
      const RowRange rr = row_range(L, T, t, sc.recent_window, B);
      const int closed = sc.owned_blocks(rr.num_closed);
      const int open = sc.owns_block(rr.num_closed) ? rr.open_tokens : 0;
      for (int h = 0; h < Hkv; ++h) {
        const int row = (b * T + t) * Hkv + h;
        AttendedTokens& a = tm->tokens[row];
        a.recent = own_ring ? rr.position - rr.old_tokens + 1 : 0;
        int selected = 0;
        if (uses_selection(c.mode)) {
          const int sel_row = sel.shared_across_heads ? b * T + t : row;
          const std::int32_t* ids = sel.ids + static_cast<std::size_t>(sel_row) * sel.max_selected;
          // Ids outside [0, closed blocks) are skipped by the CUDA kernels (the CPU rejects them).
          for (int i = 0; i < count_of(sel_row); ++i) {
            selected += ids[i] >= 0 && ids[i] < rr.num_closed && sc.owns_block(ids[i]) ? 1 : 0;
          }
        }
        switch (c.mode) {
          case AttentionMode::kDense:
            a.old_exact = static_cast<std::int64_t>(closed) * B + open;
            break;
          case AttentionMode::kDenseRecentOnly:
            a.old_exact = owned_positions(rr.window_begin, rr.old_tokens);
            break;
          case AttentionMode::kRecentOnly:
            break;
          case AttentionMode::kBlockSummary:
            a.old_exact = open;
            a.summaries = closed;
            a.representatives = static_cast<std::int64_t>(closed) * R;
            break;
          case AttentionMode::kBlockSelectLossy:
            a.old_exact = open;
            a.summaries = selected;
            a.representatives = static_cast<std::int64_t>(selected) * R;
            break;
          case AttentionMode::kBlockSelectExact:
            a.old_exact = open + static_cast<std::int64_t>(selected) * B;
            break;
        }
        tm->total_tokens.recent += a.recent;
        tm->total_tokens.old_exact += a.old_exact;
        tm->total_tokens.summaries += a.summaries;
        tm->total_tokens.representatives += a.representatives;
        tm->dense_equivalent_bytes += static_cast<std::uint64_t>(rr.position + 1) * dense_token;
      }
    }
  }
  AttendedBytes& ab = tm->attended_bytes;
  ab.recent = static_cast<std::uint64_t>(tm->total_tokens.recent) * ring_token_bytes(sv);
  ab.old_exact = static_cast<std::uint64_t>(tm->total_tokens.old_exact) * old_token_bytes(sv);
  ab.summaries = static_cast<std::uint64_t>(tm->total_tokens.summaries) * summary_entry_bytes(sv);
  ab.representatives =
      static_cast<std::uint64_t>(tm->total_tokens.representatives) * old_token_bytes(sv);
  tm->attended_ratio = ab.total() > 0 ? static_cast<double>(tm->dense_equivalent_bytes) /
                                            static_cast<double>(ab.total())
                                      : 0.0;
  tm->complete = true;
}

}  // namespace attention
}  // namespace kvc
