// The planner: bytes of a model's KV cache by layer and component (kvc/planner/planner.h).
#include "kvc/planner/planner.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace planner {
namespace {

constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
/// Largest batch: KvStoreConfig::max_slots.
constexpr int kMaxBatch = 65536;

/// a * b, or kvc::Error when the product does not fit 64 bits.
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  KVC_CHECK(!__builtin_mul_overflow(a, b, &r), "footprint: ", a, " * ", b,
            " bytes does not fit 64 bits (max ", std::numeric_limits<std::uint64_t>::max(), ")");
  return r;
}

/// a + b, or kvc::Error when the sum does not fit 64 bits.
std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  KVC_CHECK(!__builtin_add_overflow(a, b, &r), "footprint: ", a, " + ", b,
            " bytes does not fit 64 bits");
  return r;
}

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

bool is_16bit(DType t) { return t == DType::kF16 || t == DType::kBF16; }

bool is_compressed_kind(LayerKind k) {
  return k == LayerKind::kSlidingWindow || k == LayerKind::kCsa || k == LayerKind::kHca;
}

/// "model 'X': layers[i] (layer n, kind)": where a layer spec sits, for error messages.
std::string where_of(const std::string& who, std::size_t index, std::int64_t first_layer,
                     LayerKind kind) {
  return who + "layers[" + std::to_string(index) + "] (layer " + std::to_string(first_layer) +
         ", " + to_string(kind) + ")";
}

std::string summaries_label(std::uint32_t s) {
  std::string out;
  if (s & kSummaryMeanK) out += "meanK";
  if (s & kSummaryMeanV) out += out.empty() ? "meanV" : "+meanV";
  if (s & kSummaryMinMaxK) out += out.empty() ? "minmaxK" : "+minmaxK";
  return out;
}

std::string label_of(const LayerSpec& l) {
  std::ostringstream os;
  os << to_string(l.kind);
  const CompressedParams& c = l.compressed;
  switch (l.kind) {
    case LayerKind::kDense:
      break;
    case LayerKind::kBlockSelect:
      os << ' ' << to_string(l.block.old_format) << " W" << l.block.recent_window << " B"
         << l.block.block_size << ' ' << summaries_label(l.block.summaries);
      if (l.block.summaries & kSummaryIndexKeys)
        os << "+indexK:" << to_string(l.block.index_format);
      if (l.block.summary_dtype != DType::kF32) os << ':' << to_string(l.block.summary_dtype);
      break;
    case LayerKind::kSlidingWindow:
      os << " w" << c.window << ' ' << to_string(c.entry_format);
      break;
    case LayerKind::kCsa:
      os << " r" << c.ratio << " w" << c.window << ' ' << to_string(c.entry_format);
      if (c.indexer_dim > 0) os << " idx " << to_string(c.indexer_format) << 'x' << c.indexer_dim;
      break;
    case LayerKind::kHca:
      os << " r" << c.ratio << " w" << c.window << ' ' << to_string(c.entry_format);
      break;
  }
  return os.str();
}

/// Checks one layer spec; `where` names it ("layers[3] (layer 5, csa)").
void validate_layer(const ModelSpec& m, const LayerSpec& l, const std::string& where) {
  KVC_CHECK(l.count >= 1, where, ".count = ", l.count, " must be >= 1");
  switch (l.kind) {
    case LayerKind::kDense:
      return;
    case LayerKind::kBlockSelect: {
      const BlockSelectParams& p = l.block;
      KVC_CHECK(p.recent_window >= 1, where, ".block.recent_window = ", p.recent_window,
                " must be >= 1");
      KVC_CHECK(p.block_size >= 1 && p.block_size <= 1024, where,
                ".block.block_size = ", p.block_size, " must be in [1, 1024]");
      KVC_CHECK(formats::is_kv_format(p.old_format), where,
                ".block.old_format = ", to_string(p.old_format),
                " must be one of f16, bf16, q8, fp16k_q4v");
      KVC_CHECK((p.summaries & kSummaryMeanK) != 0u && (p.summaries & ~kSummaryAllBits) == 0u,
                where, ".block.summaries = ", p.summaries,
                " must include kSummaryMeanK (1) and only SummaryBits (mask ", kSummaryAllBits,
                ")");
      KVC_CHECK(p.index_format == Format::kMxfp4 || p.index_format == Format::kFp8E4m3, where,
                ".block.index_format = ", to_string(p.index_format), " must be mxfp4 or fp8_e4m3");
      KVC_CHECK(p.summary_dtype == DType::kF32 || p.summary_dtype == m.kv_dtype, where,
                ".block.summary_dtype = ", to_string(p.summary_dtype),
                " must be f32 or the model's kv_dtype (", to_string(m.kv_dtype), ")");
      return;
    }
    case LayerKind::kSlidingWindow:
    case LayerKind::kCsa:
    case LayerKind::kHca: {
      const CompressedParams& c = l.compressed;
      KVC_CHECK(c.window >= 1, where, ".compressed.window = ", c.window, " must be >= 1");
      if (l.kind != LayerKind::kSlidingWindow) {
        KVC_CHECK(c.ratio >= 1, where, ".compressed.ratio = ", c.ratio, " must be >= 1");
      }
      KVC_CHECK(
          c.entry_format != EntryFormat::kDsv4Fp8 || m.head_dim == 512, where,
          ".compressed.entry_format = dsv4_fp8 needs head_dim = 512, got head_dim = ", m.head_dim);
      KVC_CHECK(c.compressor_state_bytes >= 0 && c.compressor_state_bytes <= 8, where,
                ".compressed.compressor_state_bytes = ", c.compressor_state_bytes,
                " must be in [0, 8]");
      if (l.kind == LayerKind::kCsa && c.indexer_dim != 0) {
        KVC_CHECK(c.indexer_dim >= 1 && c.indexer_dim <= 65536, where,
                  ".compressed.indexer_dim = ", c.indexer_dim, " must be in [0, 65536]");
        indexer_key_bytes(c.indexer_format, c.indexer_dim);  // throws for a bad format or dim
      }
      return;
    }
  }
  KVC_CHECK(false, where, ".kind = ", static_cast<int>(l.kind), " is not a LayerKind");
}

/// Bytes of one layer of spec `l` for `batch` sequences of `context` tokens.
LayerFootprint layer_footprint(const ModelSpec& m, const LayerSpec& l, std::int64_t context,
                               int batch) {
  LayerFootprint f;
  f.kind = l.kind;
  f.label = label_of(l);
  const std::uint64_t n = u64(context), bsz = u64(batch), hkv = u64(m.num_kv_heads);
  const std::uint64_t d = u64(m.head_dim), e16 = size_of(m.kv_dtype);
  const std::uint64_t token_vectors = mul(mul(n, bsz), hkv);  // one vector per token per head
  ComponentBytes& b = f.bytes;
  switch (l.kind) {
    case LayerKind::kDense:
      b.old_k = mul(mul(token_vectors, d), e16);
      b.old_v = b.old_k;
      f.dense_equivalent = mul(mul(mul(token_vectors, d), e16), 2);
      break;
    case LayerKind::kBlockSelect: {
      // The store's own sizing (kv_store.h); the ring is its one product that can pass 64 bits.
      const KvStoreConfig c = store_config(m, l.block, context, batch);
      (void)mul(mul(mul(mul(bsz, hkv), u64(c.recent_window)), d), 2 * e16);
      const Footprint s = compute_footprint(c, {});
      b.ring = s.ring;
      b.old_k = s.old_k;
      b.old_v = s.old_v;
      b.scales = s.scales;
      b.summaries = s.summaries;
      b.indexer_keys = s.index_keys;
      b.tables = s.tables;
      f.dense_equivalent = mul(mul(mul(token_vectors, d), e16), 2);
      break;
    }
    case LayerKind::kSlidingWindow:
    case LayerKind::kCsa:
    case LayerKind::kHca: {
      const CompressedParams& c = l.compressed;
      const std::uint64_t eb = entry_bytes(c.entry_format, m.head_dim, static_cast<int>(e16));
      b.ring = mul(mul(mul(bsz, hkv), u64(c.window)), eb);
      if (l.kind != LayerKind::kSlidingWindow) {
        // Entry j covers tokens [j*ratio, (j+1)*ratio) and exists once they are complete; the
        // tokens of an incomplete group live in the compressor state.
        const std::uint64_t entries = n / u64(c.ratio);
        b.entries = mul(mul(mul(entries, bsz), hkv), eb);
        const std::uint64_t coff = l.kind == LayerKind::kCsa ? 2 : 1;  // overlap doubles both
        const std::uint64_t sb = u64(c.compressor_state_bytes);
        // kv and gate planes, coff*ratio rows, coff*d columns, per kv head and sequence
        b.compressor_state =
            mul(mul(mul(mul(mul(mul(2, coff), u64(c.ratio)), coff), d), sb), mul(bsz, hkv));
        if (l.kind == LayerKind::kCsa && c.indexer_dim > 0) {
          const std::uint64_t kb = indexer_key_bytes(c.indexer_format, c.indexer_dim);
          b.indexer_keys = mul(mul(entries, bsz), kb);
          // The indexer's own overlapping compressor (ratio m, coff 2, width indexer_dim).
          b.compressor_state =
              add(b.compressor_state,
                  mul(mul(mul(mul(mul(2, 2), u64(c.ratio)), 2), u64(c.indexer_dim)), mul(sb, bsz)));
        }
      }
      f.dense_equivalent = mul(mul(token_vectors, d), e16);  // one entry is K and V
      break;
    }
  }
  return f;
}

std::string pad_left(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}
std::string pad_right(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

}  // namespace

// --- names and sizes ----------------------------------------------------------------------------

const char* to_string(LayerKind k) {
  switch (k) {
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kBlockSelect:
      return "block_select";
    case LayerKind::kSlidingWindow:
      return "sliding_window";
    case LayerKind::kCsa:
      return "csa";
    case LayerKind::kHca:
      return "hca";
  }
  return "?";
}

std::int64_t max_context(LayerKind k) {
  return is_compressed_kind(k) ? dsv4::kMaxContext : kMaxInt32;
}

const char* to_string(EntryFormat f) {
  switch (f) {
    case EntryFormat::k16Bit:
      return "16bit";
    case EntryFormat::kDsv4Fp8:
      return "dsv4_fp8";
  }
  return "?";
}

std::uint64_t entry_bytes(EntryFormat f, int head_dim, int kv_dtype_bytes) {
  KVC_CHECK(head_dim >= 1, "head_dim = ", head_dim, " must be >= 1");
  if (f == EntryFormat::k16Bit) {
    KVC_CHECK(kv_dtype_bytes == 2, "kv_dtype_bytes = ", kv_dtype_bytes, " must be 2 (f16/bf16)");
    return 2u * u64(head_dim);
  }
  KVC_CHECK(f == EntryFormat::kDsv4Fp8, "entry_format = ", static_cast<int>(f),
            " is not an EntryFormat");
  KVC_CHECK(head_dim == 512,
            "entry_format = dsv4_fp8 needs head_dim = 512, got head_dim = ", head_dim);
  constexpr std::uint64_t kRopeDims = 64, kScaleGroup = 64;
  const std::uint64_t nope = 512 - kRopeDims;           // 448 e4m3 bytes
  const std::uint64_t rope = kRopeDims * 2;             // 128 bytes of bf16
  const std::uint64_t scales = nope / kScaleGroup;      // 7 ue8m0 bytes
  const std::uint64_t unpadded = nope + rope + scales;  // 583
  return (unpadded + 7) / 8 * 8;                        // 584: entries stay 8-byte aligned
}

std::uint64_t indexer_key_bytes(Format f, int dim) {
  KVC_CHECK(dim >= 1, "indexer_dim = ", dim, " must be >= 1");
  switch (f) {
    case Format::kMxfp4:
      KVC_CHECK(dim % formats::kMxfp4Group == 0, "indexer_dim = ", dim, " must be a multiple of ",
                formats::kMxfp4Group, " for mxfp4");
      return formats::indexer_key_bytes(f, dim);
    case Format::kFp8E4m3:
      return formats::indexer_key_bytes(f, dim);
    case Format::kF16:
    case Format::kBF16:
      return 2u * u64(dim);
    default:
      break;
  }
  KVC_CHECK(false, "indexer_format = ", to_string(f), " must be one of mxfp4, fp8_e4m3, f16, bf16");
  return 0;
}

// --- specs --------------------------------------------------------------------------------------

LayerSpec LayerSpec::dense(int count) {
  LayerSpec l;
  l.kind = LayerKind::kDense;
  l.count = count;
  return l;
}

LayerSpec LayerSpec::block_select(int count, const BlockSelectParams& params) {
  LayerSpec l;
  l.kind = LayerKind::kBlockSelect;
  l.count = count;
  l.block = params;
  return l;
}

LayerSpec LayerSpec::sliding_window(int count, EntryFormat format, int window) {
  LayerSpec l;
  l.kind = LayerKind::kSlidingWindow;
  l.count = count;
  l.compressed.entry_format = format;
  l.compressed.window = window;
  l.compressed.indexer_dim = 0;
  return l;
}

LayerSpec LayerSpec::csa(int count, EntryFormat format, Format indexer_format, int indexer_dim,
                         int ratio, int window) {
  LayerSpec l;
  l.kind = LayerKind::kCsa;
  l.count = count;
  l.compressed.entry_format = format;
  l.compressed.indexer_format = indexer_format;
  l.compressed.indexer_dim = indexer_dim;
  l.compressed.ratio = ratio;
  l.compressed.window = window;
  return l;
}

LayerSpec LayerSpec::hca(int count, EntryFormat format, int ratio, int window) {
  LayerSpec l;
  l.kind = LayerKind::kHca;
  l.count = count;
  l.compressed.entry_format = format;
  l.compressed.ratio = ratio;
  l.compressed.window = window;
  l.compressed.indexer_dim = 0;
  return l;
}

int ModelSpec::num_layers() const {
  std::int64_t n = 0;
  for (const LayerSpec& l : layers) n += std::max(0, l.count);
  return static_cast<int>(std::min<std::int64_t>(n, kMaxInt32));
}

void ModelSpec::validate() const {
  const std::string who = "model '" + name + "': ";
  KVC_CHECK(num_kv_heads >= 1 && num_kv_heads <= 256, who, "num_kv_heads = ", num_kv_heads,
            " must be in [1, 256]");
  KVC_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512, who,
            "head_dim = ", head_dim, " must be 64, 128, 256 or 512");
  KVC_CHECK(is_16bit(kv_dtype), who, "kv_dtype = ", to_string(kv_dtype), " must be f16 or bf16");
  KVC_CHECK(max_context >= 0, who, "max_context = ", max_context, " must be >= 0 (0: no limit)");
  KVC_CHECK(!layers.empty(), who, "layers is empty; a model needs at least one layer");
  std::int64_t first = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string where = where_of(who, i, first, layers[i].kind);
    validate_layer(*this, layers[i], where);
    first += layers[i].count;
    KVC_CHECK(first <= 1000000, who, "number of layers = ", first, " must be <= 1000000");
  }
}

KvStoreConfig store_config(const ModelSpec& spec, const BlockSelectParams& params,
                           std::int64_t context, int batch) {
  KVC_CHECK(context >= 1 && context <= kMaxInt32, "context = ", context, " must be in [1, ",
            kMaxInt32, "] for a block_select layer");
  KVC_CHECK(batch >= 1 && batch <= kMaxBatch, "batch = ", batch, " must be in [1, ", kMaxBatch,
            "]");
  KvStoreConfig c;
  c.num_kv_heads = spec.num_kv_heads;
  c.head_dim = spec.head_dim;
  c.max_slots = batch;
  c.max_context = static_cast<int>(context);
  // A store's ring never exceeds its context: for context < W it holds every token exactly.
  c.recent_window = static_cast<int>(std::min<std::int64_t>(params.recent_window, context));
  c.block_size = params.block_size;
  c.dtype = spec.kv_dtype;
  c.old_format = params.old_format;
  c.num_pool_blocks = 0;
  c.summaries = params.summaries;
  c.index_format = params.index_format;
  c.summary_dtype = params.summary_dtype;
  return c;
}

// --- footprint ----------------------------------------------------------------------------------

std::uint64_t ComponentBytes::total() const {
  std::uint64_t t = 0;
  for (std::uint64_t v :
       {ring, old_k, old_v, scales, summaries, tables, entries, indexer_keys, compressor_state}) {
    t = add(t, v);
  }
  return t;
}

ComponentBytes& ComponentBytes::operator+=(const ComponentBytes& o) {
  ring = add(ring, o.ring);
  old_k = add(old_k, o.old_k);
  old_v = add(old_v, o.old_v);
  scales = add(scales, o.scales);
  summaries = add(summaries, o.summaries);
  tables = add(tables, o.tables);
  entries = add(entries, o.entries);
  indexer_keys = add(indexer_keys, o.indexer_keys);
  compressor_state = add(compressor_state, o.compressor_state);
  return *this;
}

bool ComponentBytes::operator==(const ComponentBytes& o) const {
  return ring == o.ring && old_k == o.old_k && old_v == o.old_v && scales == o.scales &&
         summaries == o.summaries && tables == o.tables && entries == o.entries &&
         indexer_keys == o.indexer_keys && compressor_state == o.compressor_state;
}

double ModelFootprint::compression_ratio() const {
  return total == 0 ? 0.0 : static_cast<double>(dense_equivalent) / static_cast<double>(total);
}

bool ModelFootprint::fits(std::uint64_t budget_bytes) const { return total <= budget_bytes; }

ModelFootprint footprint(const ModelSpec& spec, std::int64_t context, int batch) {
  spec.validate();
  const std::string who = "model '" + spec.name + "': ";
  KVC_CHECK(context >= 1, who, "context = ", context, " must be >= 1");
  KVC_CHECK(batch >= 1 && batch <= kMaxBatch, who, "batch = ", batch, " must be in [1, ", kMaxBatch,
            "]");
  KVC_CHECK(spec.max_context == 0 || context <= spec.max_context, who, "context = ", context,
            " exceeds the model's max_context = ", spec.max_context);
  std::int64_t first = 0;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerKind k = spec.layers[i].kind;
    KVC_CHECK(context <= max_context(k), who, "context = ", context,
              " exceeds max_context = ", max_context(k), " of layer kind ", to_string(k),
              " (layers[", i, "], layer ", first, ")");
    if (k == LayerKind::kBlockSelect) {
      // The store's own rules (format vs dtype, pool size), with the layer named.
      try {
        store_config(spec, spec.layers[i].block, context, batch).validate();
      } catch (const Error& e) {
        throw Error(where_of(who, i, first, k) + ": " + e.what());
      }
    }
    first += spec.layers[i].count;
  }

  ModelFootprint out;
  out.model = spec.name;
  out.context = context;
  out.batch = batch;
  out.layers.reserve(static_cast<std::size_t>(spec.num_layers()));
  int layer = 0;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerFootprint f = layer_footprint(spec, spec.layers[i], context, batch);
    for (int j = 0; j < spec.layers[i].count; ++j) {
      out.layers.push_back(f);
      out.layers.back().layer = layer++;
      out.layers.back().spec_index = static_cast<int>(i);
      out.components += f.bytes;
      out.dense_equivalent = add(out.dense_equivalent, f.dense_equivalent);
    }
  }
  out.total = out.components.total();
  return out;
}

// --- printing -----------------------------------------------------------------------------------

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string ModelFootprint::table(bool exact_bytes) const {
  const auto fmt = [exact_bytes](std::uint64_t b) {
    return exact_bytes ? std::to_string(b) : format_bytes(b);
  };
  struct Column {
    const char* name;
    std::uint64_t ComponentBytes::*field;
  };
  const Column all[] = {{"ring/window", &ComponentBytes::ring},
                        {"K (old/all)", &ComponentBytes::old_k},
                        {"V (old/all)", &ComponentBytes::old_v},
                        {"scales", &ComponentBytes::scales},
                        {"summaries", &ComponentBytes::summaries},
                        {"tables", &ComponentBytes::tables},
                        {"entries", &ComponentBytes::entries},
                        {"indexer keys", &ComponentBytes::indexer_keys},
                        {"compressor", &ComponentBytes::compressor_state}};
  std::vector<Column> cols;
  for (const Column& c : all) {
    if (components.*(c.field) != 0) cols.push_back(c);
  }
  // Group layers by label, in order of first appearance.
  struct Group {
    std::string label;
    int count = 0;
    ComponentBytes per_layer;
  };
  std::vector<Group> groups;
  for (const LayerFootprint& l : layers) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.label == l.label; });
    if (it == groups.end()) {
      groups.push_back(Group{l.label, 0, l.bytes});
      it = groups.end() - 1;
    }
    ++it->count;
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"layer kind", "layers"};
  for (const Column& c : cols) head.push_back(c.name);
  head.push_back("per layer");
  head.push_back("all layers");
  rows.push_back(head);
  for (const Group& g : groups) {
    std::vector<std::string> r = {g.label, std::to_string(g.count)};
    for (const Column& c : cols) r.push_back(fmt(g.per_layer.*(c.field)));
    r.push_back(fmt(g.per_layer.total()));
    r.push_back(fmt(mul(g.per_layer.total(), u64(g.count))));
    rows.push_back(r);
  }
  std::vector<std::string> sum = {"all layers", std::to_string(layers.size())};
  for (const Column& c : cols) sum.push_back(fmt(components.*(c.field)));
  sum.push_back("");
  sum.push_back(fmt(total));
  rows.push_back(sum);

  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::ostringstream os;
  os << "model " << model << ", context " << context << " tokens, batch " << batch << "\n";
  for (std::size_t ri = 0; ri < rows.size(); ++ri) {
    if (ri + 1 == rows.size()) {
      std::size_t line = 0;
      for (std::size_t w : width) line += w + 2;
      os << std::string(line - 2, '-') << "\n";
    }
    for (std::size_t i = 0; i < rows[ri].size(); ++i) {
      os << (i == 0 ? pad_right(rows[ri][i], width[i]) : pad_left(rows[ri][i], width[i]));
      os << (i + 1 < rows[ri].size() ? "  " : "\n");
    }
  }
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", compression_ratio());
  os << "total " << fmt(total) << "; dense 16-bit equivalent " << fmt(dense_equivalent)
     << "; compression " << ratio << "\n";
  return os.str();
}

// --- model transforms ------------------------------------------------------------------------

ModelSpec with_block_select(ModelSpec spec, const BlockSelectParams& params) {
  for (LayerSpec& l : spec.layers) {
    if (l.kind == LayerKind::kDense) l = LayerSpec::block_select(l.count, params);
  }
  spec.name += std::string(" block_select ") + to_string(params.old_format);
  return spec;
}

// --- the DeepSeek-V4 layers as kvc's stores hold them -------------------------------------------

Dsv4LayerStores dsv4_layer_stores(const ModelSpec& spec, const LayerSpec& layer,
                                  std::int64_t context, int batch) {
  KVC_CHECK(is_compressed_kind(layer.kind), "layer kind = ", to_string(layer.kind),
            " is not a DeepSeek-V4 kind (sliding_window, csa, hca)");
  KVC_CHECK(spec.num_kv_heads == 1, "model '", spec.name, "': num_kv_heads = ", spec.num_kv_heads,
            " must be 1 for kvc's DeepSeek-V4 stores (one MQA latent per row)");
  const CompressedParams& c = layer.compressed;
  const dsv4::EntryFormat main = c.entry_format == EntryFormat::kDsv4Fp8
                                     ? dsv4::EntryFormat::kModel1Fp8
                                     : dsv4::EntryFormat::kBf16;
  Dsv4LayerStores s;
  s.window = dsv4::EntryStoreConfig::window_ring(main, spec.head_dim, c.window, batch);
  if (layer.kind == LayerKind::kSlidingWindow) return s;
  s.has_entries = true;
  s.entries = dsv4::EntryStoreConfig::compressed(main, spec.head_dim, c.ratio, context, batch);
  s.has_compressors = c.compressor_state_bytes != 0;
  auto compressor = [&](int dim, bool hadamard) {
    dsv4::CompressorConfig cc;
    cc.ratio = c.ratio;
    cc.head_dim = dim;
    cc.max_slots = batch;
    cc.max_context = context;
    cc.max_batch = batch;
    cc.hadamard = hadamard;
    cc.validate();
    return cc;
  };
  if (s.has_compressors) s.compressor = compressor(spec.head_dim, false);
  if (layer.kind == LayerKind::kCsa && c.indexer_dim > 0) {
    s.has_indexer = true;
    const dsv4::EntryFormat kf = c.indexer_format == Format::kMxfp4 ? dsv4::EntryFormat::kMxfp4
                                 : c.indexer_format == Format::kFp8E4m3
                                     ? dsv4::EntryFormat::kFp8Scaled
                                     : dsv4::EntryFormat::kBf16;
    s.indexer_keys = dsv4::EntryStoreConfig::compressed(kf, c.indexer_dim, c.ratio, context, batch);
    if (s.has_compressors)
      s.indexer_compressor = compressor(c.indexer_dim, c.indexer_dim == 64 || c.indexer_dim == 128);
  }
  return s;
}

ComponentBytes dsv4_store_bytes(const Dsv4LayerStores& s) {
  ComponentBytes b;
  const dsv4::EntryStoreFootprint w = dsv4::compute_footprint(s.window);
  b.ring = w.pool;
  b.tables = w.tables;
  if (s.has_entries) {
    const dsv4::EntryStoreFootprint e = dsv4::compute_footprint(s.entries);
    b.entries = e.pool;
    b.tables = add(b.tables, e.tables);
  }
  if (s.has_indexer) {
    const dsv4::EntryStoreFootprint k = dsv4::compute_footprint(s.indexer_keys);
    b.indexer_keys = k.pool;
    b.tables = add(b.tables, k.tables);
  }
  auto state = [](const dsv4::CompressorConfig& c) {
    // kv and score planes in fp32, and the device lengths (int32).
    return add(mul(mul(mul(2, u64(c.state_rows())), mul(u64(c.width()), 4)), u64(c.max_slots)),
               mul(4, u64(c.max_slots)));
  };
  if (s.has_compressors) {
    b.compressor_state = state(s.compressor);
    if (s.has_indexer) b.compressor_state = add(b.compressor_state, state(s.indexer_compressor));
  }
  return b;
}

ModelFootprint dsv4_store_footprint(const ModelSpec& spec, std::int64_t context, int batch) {
  ModelFootprint out = footprint(spec, context, batch);  // checks and the other kinds
  const std::string who = "model '" + spec.name + "': ";
  out.components = ComponentBytes{};
  std::int64_t first = 0;
  std::size_t k = 0;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    ComponentBytes b;
    if (is_compressed_kind(l.kind)) {
      try {
        b = dsv4_store_bytes(dsv4_layer_stores(spec, l, context, batch));
      } catch (const Error& e) {
        throw Error(where_of(who, i, first, l.kind) + ": " + e.what());
      }
    }
    for (int j = 0; j < l.count; ++j, ++k) {
      if (is_compressed_kind(l.kind)) out.layers[k].bytes = b;
      out.components += out.layers[k].bytes;
    }
    first += l.count;
  }
  out.total = out.components.total();
  return out;
}

}  // namespace planner
}  // namespace kvc
