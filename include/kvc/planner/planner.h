/*! \file kvc/planner/planner.h
 *  \brief The planner: bytes of a model's whole KV cache, by layer and by component, for a given
 *  context and batch, computed from a ModelSpec before anything is allocated ("does 1M tokens
 *  fit?"). docs/planner.md works the examples line by line.
 *
 *  Every figure is a capacity: what a cache sized for `batch` sequences of `context` tokens holds
 *  once allocated, counted exactly in bytes (no rounding to pages or allocator granules). Layer
 *  kinds:
 *  - dense: every token's K and V in the model's 16-bit kv dtype;
 *  - block_select: a kvc::KvStore (recent ring of W tokens, old blocks of B tokens in a compact
 *    format, block summaries, block tables), sized by kvc::compute_footprint itself;
 *  - sliding_window, csa, hca: DeepSeek-V4 style layers. One *main entry* per kv head (K and V
 *    share it, as in DeepSeek-V4's MQA over a 512-dim latent) in 16-bit or the DeepSeek-V4 FP8
 *    layout; a window of the last `window` tokens' entries; csa/hca add one compressed entry per
 *    `ratio` tokens; csa adds one indexer key per compressed entry (shared by all index heads),
 *    and both keep a compressor state (see CompressedParams::compressor_state_bytes).
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvc/core/types.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace planner {

/// How a layer keeps its KV cache.
enum class LayerKind : std::uint8_t {
  kDense,          ///< every token's K and V, 16-bit
  kBlockSelect,    ///< a kvc::KvStore: ring + old blocks + summaries + tables
  kSlidingWindow,  ///< DeepSeek-V4 window-only layer: the last `window` main entries
  kCsa,            ///< DeepSeek-V4 compressed sparse attention: ratio-4 entries + indexer + window
  kHca,            ///< DeepSeek-V4 heavily compressed attention: ratio-128 entries + window
};

/// Lower-case name of `k` ("dense", "block_select", "sliding_window", "csa", "hca").
const char* to_string(LayerKind k);

/// Largest context a layer of kind `k` supports: 2^31 - 1 tokens for dense and block_select
/// (int32 positions, KvStoreConfig::max_context), 2^20 = 1048576 tokens for the DeepSeek-V4
/// kinds (their entry stores are sized per kind up to 1M tokens).
std::int64_t max_context(LayerKind k);

/// Byte layout of one DeepSeek-V4 main entry (one kv head, one token or compressed group).
enum class EntryFormat : std::uint8_t {
  k16Bit,    ///< head_dim elements in the model's kv dtype (f16 or bf16): 2 * head_dim bytes
  kDsv4Fp8,  ///< DeepSeek-V4 FP8 layout (head_dim 512 only): 448 e4m3 + 64 bf16 RoPE dims
             ///< + 7 ue8m0 scales (one per 64 e4m3) + 1 pad byte = 584 bytes
};

/// Lower-case name of `f` ("16bit", "dsv4_fp8").
const char* to_string(EntryFormat f);

/// Bytes of one main entry of `head_dim` elements in format `f` with a 16-bit kv dtype of
/// `kv_dtype_bytes` bytes. Throws kvc::Error for kDsv4Fp8 with head_dim != 512.
/// @param[in] f               entry layout
/// @param[in] head_dim        elements of the entry
/// @param[in] kv_dtype_bytes  bytes per element of the 16-bit layout (2)
std::uint64_t entry_bytes(EntryFormat f, int head_dim, int kv_dtype_bytes);

/// Bytes of one indexer key of `dim` elements stored as `f`: mxfp4 dim/2 + dim/32 (68 for 128),
/// fp8_e4m3 dim + 4 (132 for 128), f16/bf16 2 * dim (the uncompressed case, for comparison).
/// Throws kvc::Error for q8, fp16k_q4v, or a dim mxfp4 cannot hold (not a multiple of 32).
/// @param[in] f    key format: mxfp4, fp8_e4m3, f16 or bf16
/// @param[in] dim  elements of one key
std::uint64_t indexer_key_bytes(Format f, int dim);

/// Parameters of a block_select layer: the KvStoreConfig fields that are not the model's.
struct BlockSelectParams {
  int recent_window = 1024;                 ///< W: exact tokens in the ring, ≥ 1
  int block_size = 32;                      ///< B: tokens per old block, 1..1024
  Format old_format = Format::kFp16kQ4v;    ///< f16, bf16, q8 or fp16k_q4v
  std::uint32_t summaries = kSummaryMeanK;  ///< kvc::SummaryBits kept per closed block
  /// Format of the index copy of old K when `summaries` has kSummaryIndexKeys (mxfp4 or
  /// fp8_e4m3; KvStoreConfig::index_format); counted under ComponentBytes::indexer_keys.
  Format index_format = Format::kMxfp4;
  /// Element type of the summaries: f32, or the model's kv dtype (KvStoreConfig::summary_dtype).
  DType summary_dtype = DType::kF32;
};

/// Parameters of the DeepSeek-V4 kinds (sliding_window, csa, hca).
struct CompressedParams {
  /// Tokens per compressed entry (csa 4, hca 128); ≥ 1. Ignored by sliding_window.
  int ratio = 4;
  /// Main entries of the window (the last `window` tokens, uncompressed), ≥ 1.
  int window = 128;
  /// Layout of main entries, window and compressed alike.
  EntryFormat entry_format = EntryFormat::k16Bit;
  /// Elements of one indexer key (csa only; one key per compressed entry, shared by all index
  /// heads). 0: no indexer.
  int indexer_dim = 128;
  /// Format of the indexer keys: mxfp4 (primary), fp8_e4m3, or f16/bf16 (uncompressed).
  Format indexer_format = Format::kMxfp4;
  /// Bytes per element of the compressor's state (4: fp32 as in DeepSeek-V4's reference code;
  /// 0: not counted, the engine keeps it). The state of one kv head of one sequence is two
  /// planes (projected kv and gate logits) of coff*ratio rows by coff*head_dim columns, with
  /// coff = 2 for csa (overlapping windows of 2*ratio tokens) and 1 for hca; a csa indexer's
  /// own compressor adds two planes of 2*ratio rows by 2*indexer_dim columns (one per sequence).
  int compressor_state_bytes = 4;
};

/// One run of `count` consecutive layers of one kind (count 1 gives per-layer specs).
struct LayerSpec {
  LayerKind kind = LayerKind::kDense;  ///< how these layers keep their cache
  int count = 1;                       ///< consecutive layers of this spec, ≥ 1
  BlockSelectParams block;             ///< read when kind == kBlockSelect
  CompressedParams compressed;         ///< read when kind is sliding_window, csa or hca

  /// `count` dense layers.
  static LayerSpec dense(int count);
  /// `count` block_select layers with `params`.
  static LayerSpec block_select(int count, const BlockSelectParams& params = BlockSelectParams{});
  /// `count` window-only layers of `window` main entries in `format`.
  static LayerSpec sliding_window(int count, EntryFormat format = EntryFormat::k16Bit,
                                  int window = 128);
  /// `count` csa layers: ratio-4 entries, one `indexer_dim` key per entry, a window of 128.
  static LayerSpec csa(int count, EntryFormat format = EntryFormat::k16Bit,
                       Format indexer_format = Format::kMxfp4, int indexer_dim = 128, int ratio = 4,
                       int window = 128);
  /// `count` hca layers: ratio-128 entries, no indexer, a window of 128.
  static LayerSpec hca(int count, EntryFormat format = EntryFormat::k16Bit, int ratio = 128,
                       int window = 128);
};

/// What the planner needs to know about a model's attention layers.
struct ModelSpec {
  std::string name;               ///< shown in tables and error messages
  int num_kv_heads = 8;           ///< Hkv, 1..256 (DeepSeek-V4: 1, its latent is MQA)
  int head_dim = 128;             ///< d: 64, 128, 256 or 512
  DType kv_dtype = DType::kF16;   ///< 16-bit dtype of K/V and main entries: f16 or bf16
  std::int64_t max_context = 0;   ///< the model's longest context; 0: only the kinds' limits
  std::vector<LayerSpec> layers;  ///< in layer order; counts expand to consecutive layers

  /// Sum of the layers' counts.
  int num_layers() const;
  /// Throws kvc::Error naming the first field out of range (layer index included).
  void validate() const;
};

/// Bytes by component. Components a kind does not have stay 0.
struct ComponentBytes {
  std::uint64_t ring = 0;       ///< recent ring (block_select) or sliding window (DeepSeek kinds)
  std::uint64_t old_k = 0;      ///< K payload outside the ring: old blocks, or every token (dense)
  std::uint64_t old_v = 0;      ///< V payload outside the ring: old blocks, or every token (dense)
  std::uint64_t scales = 0;     ///< per-token fp32 scales of old K and V
  std::uint64_t summaries = 0;  ///< block summaries (mean K, mean V, min/max K; f32 or 16-bit)
  std::uint64_t tables = 0;     ///< lengths, block tables, the pool's free list
  std::uint64_t entries = 0;    ///< compressed main entries (csa, hca)
  std::uint64_t indexer_keys = 0;      ///< indexer keys (csa), index copy of old K (block_select)
  std::uint64_t compressor_state = 0;  ///< compressor state (csa, hca)

  /// Sum of all components.
  std::uint64_t total() const;
  /// Adds `o` component by component.
  ComponentBytes& operator+=(const ComponentBytes& o);
  /// Component-wise equality.
  bool operator==(const ComponentBytes& o) const;
  /// Not equal.
  bool operator!=(const ComponentBytes& o) const { return !(*this == o); }
};

/// Bytes of one layer (for the whole batch).
struct LayerFootprint {
  int layer = 0;                       ///< 0-based layer index
  int spec_index = 0;                  ///< index of its LayerSpec in ModelSpec::layers
  LayerKind kind = LayerKind::kDense;  ///< its kind
  std::string label;                   ///< kind and parameters, e.g. "csa r4 16bit idx mxfp4x128"
  ComponentBytes bytes;                ///< capacity by component
  /// What a dense 16-bit cache of the same tokens would take: context * batch * Hkv * d * dtype
  /// bytes, times 2 (K and V) for dense and block_select, times 1 for the DeepSeek-V4 kinds
  /// (their entry is K and V at once).
  std::uint64_t dense_equivalent = 0;
};

/// Bytes of a model's KV cache: per layer, per component, in total.
struct ModelFootprint {
  std::string model;                   ///< ModelSpec::name
  std::int64_t context = 0;            ///< tokens per sequence
  int batch = 0;                       ///< sequences
  std::vector<LayerFootprint> layers;  ///< one per layer, in order
  ComponentBytes components;           ///< sum over layers
  std::uint64_t total = 0;             ///< components.total()
  std::uint64_t dense_equivalent = 0;  ///< sum over layers

  /// dense_equivalent / total (0 when total is 0).
  double compression_ratio() const;
  /// True when total ≤ budget_bytes.
  /// @param[in] budget_bytes  bytes available for the KV cache
  bool fits(std::uint64_t budget_bytes) const;
  /// Layers grouped by label (first appearance order): per-layer bytes of each component that
  /// is non-zero somewhere, per-layer and all-layer totals, then the model's totals, dense
  /// equivalent and compression ratio.
  /// @param[in] exact_bytes  print exact byte counts instead of KiB/MiB/GiB with 2 decimals
  std::string table(bool exact_bytes = false) const;
};

/// Bytes of the KV cache of `spec` for `batch` sequences of `context` tokens each.
/// Throws kvc::Error (naming the field, its value and the bound) for a bad spec, context < 1,
/// context past the model's or any layer kind's max_context, batch outside 1..65536, or a
/// size that does not fit 64 bits.
/// @param[in] spec     the model
/// @param[in] context  tokens per sequence
/// @param[in] batch    sequences
ModelFootprint footprint(const ModelSpec& spec, std::int64_t context, int batch);

/// The KvStoreConfig a block_select layer of `spec` uses for `batch` sequences of `context`
/// tokens: max_slots = batch, max_context = context, recent_window = min(W, context) (a store's
/// ring never exceeds its context), num_pool_blocks = 0 (the pool never runs out). Not
/// validated here; KvStoreConfig::validate() applies the store's rules.
/// @param[in] spec     the model (num_kv_heads, head_dim, kv_dtype)
/// @param[in] params   the layer's block_select parameters
/// @param[in] context  tokens per sequence
/// @param[in] batch    sequences
KvStoreConfig store_config(const ModelSpec& spec, const BlockSelectParams& params,
                           std::int64_t context, int batch);

/// "1.50 GiB"-style size with binary units and 2 decimals ("512 B" below 1 KiB).
/// @param[in] bytes  the size
std::string format_bytes(std::uint64_t bytes);

// --- the models of the worked examples (docs/planner.md) ------------------------------------

/// Llama-3.1-8B: 32 dense layers, 8 kv heads, head_dim 128, bf16, max_context 131072.
ModelSpec llama31_8b();
/// SmolLM2-135M: 30 dense layers, 3 kv heads, head_dim 64, bf16, max_context 8192.
ModelSpec smollm2_135m();
/// `spec` with every dense layer replaced by a block_select layer with `params`; the name gets
/// " block_select <format>" appended.
/// @param[in] spec    the model
/// @param[in] params  block_select parameters
ModelSpec with_block_select(ModelSpec spec, const BlockSelectParams& params);

/// Options of deepseek_v4_flash().
struct Dsv4Options {
  EntryFormat entry_format = EntryFormat::k16Bit;  ///< main entries: bf16 or the 584 B layout
  Format indexer_format = Format::kMxfp4;          ///< indexer keys: mxfp4 or fp8_e4m3
  /// Elements of one stored indexer key: 128 (the real one). 8192 = 64 heads x 128 with bf16
  /// reproduces the audit's mistake (it sized the key like the indexer *query*).
  int indexer_dim = 128;
  int compressor_state_bytes = 4;  ///< see CompressedParams::compressor_state_bytes
};

/// DeepSeek-V4-Flash: 43 layers = 2 sliding_window, then csa and hca alternating starting with
/// csa (21 csa, 20 hca); one kv head (MQA latent), head_dim 512, bf16, window 128, csa ratio 4
/// with one 128-dim indexer key per entry, hca ratio 128; max_context 1048576.
/// @param[in] options  formats of main entries and indexer keys
ModelSpec deepseek_v4_flash(const Dsv4Options& options = Dsv4Options{});

/// DeepSeek-V4-Pro: 61 layers = 2 hca, then csa and hca alternating starting with csa (30 csa,
/// 31 hca in all); one kv head (MQA latent), head_dim 512, bf16, window 128, csa ratio 4 with one
/// 128-dim indexer key per entry, hca ratio 128; max_context 1048576. The layer mix is the
/// compress_ratios of V4-Pro's config.json as third-party copies give it (DeepSeek's own V4-Pro
/// files were not readable here; docs/dsv4.md).
/// @param[in] options  formats of main entries and indexer keys
ModelSpec deepseek_v4_pro(const Dsv4Options& options = Dsv4Options{});

// --- the DeepSeek-V4 layers as kvc's stores hold them (kvc/dsv4) --------------------------------

/// The kvc DeepSeek-V4 objects one sliding_window, csa or hca layer of a model allocates for
/// `batch` sequences of `context` tokens: its window ring, its compressed entries and indexer
/// keys (kvc::dsv4::EntryStore, pages of 64), and its compressors (kvc::dsv4::Compressor).
struct Dsv4LayerStores {
  dsv4::EntryStoreConfig window;              ///< the window ring (every DeepSeek-V4 kind)
  bool has_entries = false;                   ///< csa / hca: compressed main entries
  dsv4::EntryStoreConfig entries;             ///< the compressed main entries
  bool has_indexer = false;                   ///< csa with an indexer
  dsv4::EntryStoreConfig indexer_keys;        ///< one key per entry
  bool has_compressors = false;               ///< csa / hca with compressor_state_bytes != 0
  dsv4::CompressorConfig compressor;          ///< the main entries' compressor
  dsv4::CompressorConfig indexer_compressor;  ///< the indexer keys' compressor (has_indexer)
};

/// The stores and compressors of `layer` (a sliding_window, csa or hca spec of `spec`). Main
/// entries are kBf16 (the model's 16-bit dtype: f16 is sized like bf16) or kModel1Fp8; indexer
/// keys kMxfp4, kFp8Scaled, or kBf16 for f16/bf16 keys. Throws kvc::Error for what kvc's stores
/// do not hold: num_kv_heads != 1, a ratio other than 4 or 128, an entry or key width the store
/// formats reject, another layer kind.
/// @param[in] spec     the model (num_kv_heads, head_dim, kv_dtype)
/// @param[in] layer    one of its DeepSeek-V4 layer specs
/// @param[in] context  tokens per sequence
/// @param[in] batch    sequences
Dsv4LayerStores dsv4_layer_stores(const ModelSpec& spec, const LayerSpec& layer,
                                  std::int64_t context, int batch);

/// Bytes those objects allocate, by component: ring, entries and indexer_keys the stores' page
/// pools (MODEL1 pages padded to 576-byte multiples), tables their counts, block tables and free
/// stacks, compressor_state the compressors' fp32 kv and score planes and device lengths
/// (dsv4::compute_footprint; Compressor::state_bytes of the CUDA implementation).
/// @param[in] stores  a layer's stores
ComponentBytes dsv4_store_bytes(const Dsv4LayerStores& stores);

/// footprint(), with every sliding_window, csa and hca layer sized by dsv4_store_bytes (what
/// kvc's objects allocate, page granularity and tables included) instead of the exact per-entry
/// arithmetic; other layer kinds as footprint() sizes them. Throws like footprint() and
/// dsv4_layer_stores().
/// @param[in] spec     the model
/// @param[in] context  tokens per sequence
/// @param[in] batch    sequences
ModelFootprint dsv4_store_footprint(const ModelSpec& spec, std::int64_t context, int batch);

}  // namespace planner
}  // namespace kvc
