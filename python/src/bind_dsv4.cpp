// DeepSeek-V4 compressed attention (kvc/dsv4/): entry stores, the compressor, the lightning
// indexer with its top-k, and CSA / HCA sparse attention, as the submodule kvc._kvc.dsv4.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <utility>

#include "convert.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/select/selector.h"
#if KVC_CUDA_ENABLED
#include <cuda_runtime_api.h>

#include "kvc/kernels/dsv4_kernels.h"
#endif
#include "kwargs.h"

namespace kvc {
namespace python {

namespace {

using namespace dsv4;

// Rows of entry ids without counts (every column is read): a contiguous int32 [rows, k] array
// on `device`.
SelectionView id_rows(const InArray& ids, const char* name, Device device) {
  const TensorView v = view_of(ids, name);
  check_view(v, name, DType::kI32, {-1, -1}, device, 4);
  KVC_CHECK(v.shape[0] <= INT32_MAX && v.shape[1] <= INT32_MAX, name, ".shape = [", v.shape[0],
            ", ", v.shape[1], "] must be below 2^31 each");
  SelectionView s;
  s.ids = v.ptr<std::int32_t>();
  s.rows = static_cast<int>(v.shape[0]);
  s.max_selected = static_cast<int>(v.shape[1]);
  return s;
}

void bind_entry_store(nb::module_& m) {
  nb::enum_<EntryFormat>(m, "EntryFormat", "How one entry is stored (kvc/dsv4/entry_format.h).")
      .value("bf16", EntryFormat::kBf16)
      .value("model1_fp8", EntryFormat::kModel1Fp8)
      .value("mxfp4", EntryFormat::kMxfp4)
      .value("fp8_scaled", EntryFormat::kFp8Scaled);
  m.attr("MAX_CONTEXT") = kMaxContext;
  m.attr("MAX_ENTRIES_PER_SLOT") = kMaxEntriesPerSlot;

  nb::class_<PageLayout>(m, "PageLayout", "The byte layout of one page.")
      .def_ro("format", &PageLayout::format)
      .def_ro("dim", &PageLayout::dim)
      .def_ro("page_entries", &PageLayout::page_entries)
      .def_ro("payload_bytes", &PageLayout::payload_bytes)
      .def_ro("scale_bytes", &PageLayout::scale_bytes)
      .def_ro("scale_offset", &PageLayout::scale_offset)
      .def_ro("page_bytes", &PageLayout::page_bytes);

  auto config = nb::class_<EntryStoreConfig>(
      m, "EntryStoreConfig", "Geometry and format of one EntryStore (kvc/dsv4/entry_store.h).");
  def_kwargs_init<EntryStoreConfig>(config);
  config.def_rw("format", &EntryStoreConfig::format)
      .def_rw("dim", &EntryStoreConfig::dim)
      .def_rw("max_slots", &EntryStoreConfig::max_slots)
      .def_rw("max_entries", &EntryStoreConfig::max_entries)
      .def_rw("page_entries", &EntryStoreConfig::page_entries)
      .def_rw("num_pages", &EntryStoreConfig::num_pages)
      .def_rw("ring", &EntryStoreConfig::ring)
      .def("pages_per_slot", &EntryStoreConfig::pages_per_slot)
      .def("pool_pages", &EntryStoreConfig::pool_pages)
      .def("layout", &EntryStoreConfig::layout)
      .def("page_bytes", &EntryStoreConfig::page_bytes)
      .def("validate", &EntryStoreConfig::validate)
      .def_static("compressed", &EntryStoreConfig::compressed, nb::arg("format"), nb::arg("dim"),
                  nb::arg("ratio"), nb::arg("max_context"), nb::arg("max_slots"),
                  "The store of a compressed layer kind: ratio 4 (CSA) or 128 (HCA).")
      .def_static("window_ring", &EntryStoreConfig::window_ring, nb::arg("format"), nb::arg("dim"),
                  nb::arg("window"), nb::arg("max_slots"),
                  "The window ring of `window` tokens per slot.");

  nb::class_<EntryStoreFootprint>(m, "EntryStoreFootprint", "Bytes held by a store.")
      .def_ro("pool", &EntryStoreFootprint::pool)
      .def_ro("tables", &EntryStoreFootprint::tables)
      .def_ro("in_use", &EntryStoreFootprint::in_use)
      .def_ro("entries", &EntryStoreFootprint::entries)
      .def("total", &EntryStoreFootprint::total);
  m.def("compute_footprint", &dsv4::compute_footprint, nb::arg("config"),
        "Footprint of a kvc-owned store with `config`, before it is created.");

  nb::class_<EntryStore>(m, "EntryStore",
                         "A paged store of DeepSeek-V4 entries (kvc/dsv4/entry_store.h). Methods "
                         "that fail raise kvc.Error and leave the store unchanged.")
      .def(nb::new_([](const EntryStoreConfig& config, const std::string& device) {
             return EntryStore::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_static(
          "on_pages",
          [](const EntryStoreConfig& config, const std::string& device, const OutArray& pool,
             const OutArray& block_table) {
            const Device dev = parse_device(device);
            config.validate();
            const TensorView p = view_of(pool, "pool");
            check_view(p, "pool", DType::kU8, {-1}, dev, 16);
            const TensorView t = view_of(block_table, "block_table");
            check_view(t, "block_table", DType::kI32, {config.max_slots, -1}, dev, 4);
            KVC_CHECK(t.shape[1] <= INT32_MAX, "block_table.shape[1] = ", t.shape[1],
                      " must be <= ", INT32_MAX);
            const std::size_t page = config.page_bytes();
            const std::size_t pages = static_cast<std::size_t>(p.shape[0]) / page;
            KVC_CHECK(pages >= 1 && pages <= static_cast<std::size_t>(INT32_MAX),
                      "pool.shape[0] = ", p.shape[0], " bytes must hold 1 to ", INT32_MAX,
                      " pages of ", page, " bytes");
            return EntryStore::create_on_pages(config, dev, p.data, static_cast<int>(pages),
                                               t.ptr<std::int32_t>(), static_cast<int>(t.shape[1]));
          },
          nb::arg("config"), nb::arg("device"), nb::arg("pool"), nb::arg("block_table"),
          "A store over engine-owned pages: pool, a 1-D uint8 array whose whole page_bytes() "
          "pages are used, and block_table [max_slots, pitch] int32, both contiguous, on "
          "`device` and kept by the engine.")
      .def_prop_ro("config", &EntryStore::config)
      .def_prop_ro("device", [](const EntryStore& s) { return to_string(s.device()); })
      .def_prop_ro("engine_pages", &EntryStore::engine_pages)
      .def("count", &EntryStore::count, nb::arg("slot"))
      .def("free_pages", &EntryStore::free_pages)
      .def("reset", &EntryStore::reset, nb::arg("slot"))
      .def(
          "append",
          [](EntryStore& s, const std::vector<int>& slots, const InArray& x) {
            const TensorView xv = view_of(x, "x");
            nb::gil_scoped_release release;
            s.append(slots, xv);
          },
          nb::arg("slots"), nb::arg("x"),
          "Appends x [len(slots), T, dim] (f32 or bf16) to the slots, encoded in the format.")
      .def(
          "reserve",
          [](EntryStore& s, const std::vector<int>& slots, const std::vector<int>& targets) {
            nb::gil_scoped_release release;
            s.reserve(slots, targets);
          },
          nb::arg("slots"), nb::arg("targets"),
          "Advances the slots to `targets` entries, assigning pages, without writing the rows.")
      .def("footprint", &EntryStore::footprint)
      .def("read_entry", &EntryStore::read_entry, nb::arg("slot"), nb::arg("e"),
           "Entry (ring: token) e of `slot` decoded to floats (synchronises a CUDA store).")
      .def(
          "physical_entries",
          [](const EntryStore& s, const InArray& slots, int T, const InArray& ids,
             const OutArray& out) {
            const Device dev = s.device();
            const TensorView sv = view_of(slots, "slots");
            check_view(sv, "slots", DType::kI32, {-1}, dev, 4);
            const SelectionView in = id_rows(ids, "ids", dev);
            const TensorView ov = view_of(out, "out");
            check_view(ov, "out", DType::kI32, {in.rows, in.max_selected}, dev, 4);
            KVC_CHECK(T >= 1 && in.rows == sv.shape[0] * T, "ids.shape[0] = ", in.rows,
                      " must be len(slots) * T = ", sv.shape[0], " * ", T);
            const EntryStoreView v = s.view();
            if (dev.is_cpu()) {
              physical_entries(v, sv.ptr<const std::int32_t>(), T, in, ov.ptr<std::int32_t>(),
                               in.max_selected);
              return;
            }
#if KVC_CUDA_ENABLED
            // The device map: slots outside [0, max_slots) give -1 rows (they are not read back
            // to be checked on the host).
            const cudaError_t e = kernels::dsv4_physical_entries(
                v, sv.ptr<const std::int32_t>(), T, in, ov.ptr<std::int32_t>(), in.max_selected,
                static_cast<cudaStream_t>(s.stream()));
            KVC_CHECK(e == cudaSuccess, "physical_entries: ", cudaGetErrorString(e));
#else
            KVC_CHECK(false, "physical_entries: kvc was built without CUDA");
#endif
          },
          nb::arg("slots"), nb::arg("T"), nb::arg("ids"), nb::arg("out"),
          "out[r, i] = the pool row (page id x page_entries + row in page; -1 for none) of entry "
          "ids[r, i] of sequence r / T's slot: the index rows FlashMLA's sparse kernels take with "
          "kvc's pages. slots [batch], ids and out [batch * T, k], int32 on the store's device.")
      .def(
          "set_stream", [](EntryStore& s, std::uintptr_t h) { s.set_stream(stream_of(h)); },
          nb::arg("stream"))
      .def("stream",
           [](const EntryStore& s) { return reinterpret_cast<std::uintptr_t>(s.stream()); });
}

void bind_compressor(nb::module_& m) {
  auto config = nb::class_<CompressorConfig>(
      m, "CompressorConfig", "Geometry and epilogue of a Compressor (kvc/dsv4/compressor.h).");
  def_kwargs_init<CompressorConfig>(config);
  config.def_rw("ratio", &CompressorConfig::ratio)
      .def_rw("head_dim", &CompressorConfig::head_dim)
      .def_rw("max_slots", &CompressorConfig::max_slots)
      .def_rw("max_context", &CompressorConfig::max_context)
      .def_rw("max_tokens", &CompressorConfig::max_tokens)
      .def_rw("max_batch", &CompressorConfig::max_batch)
      .def_rw("rms_norm", &CompressorConfig::rms_norm)
      .def_rw("rms_eps", &CompressorConfig::rms_eps)
      .def_rw("rope", &CompressorConfig::rope)
      .def_rw("rope_dim", &CompressorConfig::rope_dim)
      .def_rw("hadamard", &CompressorConfig::hadamard)
      .def("coff", &CompressorConfig::coff)
      .def("width", &CompressorConfig::width)
      .def("state_rows", &CompressorConfig::state_rows)
      .def("validate", &CompressorConfig::validate);

  nb::class_<Compressor>(m, "Compressor",
                         "DeepSeek-V4's gated pooling of `ratio` tokens per entry, with its "
                         "incremental state per slot (kvc/dsv4/compressor.h).")
      .def(nb::new_([](const CompressorConfig& config, const std::string& device) {
             return Compressor::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &Compressor::config)
      .def_prop_ro("device", [](const Compressor& c) { return to_string(c.device()); })
      .def("length", &Compressor::length, nb::arg("slot"))
      .def("reset", &Compressor::reset, nb::arg("slot"))
      .def("state_bytes", &Compressor::state_bytes)
      .def(
          "append",
          [](Compressor& c, const std::vector<int>& slots, const InArray& kv, const InArray& score,
             const InArray& ape, std::optional<InArray> norm_weight,
             std::optional<InArray> rope_cos, std::optional<InArray> rope_sin, EntryStore* store,
             std::optional<OutArray> out) {
            CompressorInputs in;
            in.kv = view_of(kv, "kv");
            in.score = view_of(score, "score");
            in.ape = view_of(ape, "ape");
            in.norm_weight = optional_view(norm_weight, "norm_weight");
            in.rope_cos = optional_view(rope_cos, "rope_cos");
            in.rope_sin = optional_view(rope_sin, "rope_sin");
            const TensorView o = out ? view_of(*out, "out") : TensorView{};
            nb::gil_scoped_release release;
            c.append(slots, in, store, o);
          },
          nb::arg("slots"), nb::arg("kv"), nb::arg("score"), nb::arg("ape"),
          nb::arg("norm_weight") = nb::none(), nb::arg("rope_cos") = nb::none(),
          nb::arg("rope_sin") = nb::none(), nb::arg("store").none() = nb::none(),
          nb::arg("out") = nb::none(),
          "Appends T tokens (kv, score [len(slots), T, width] f32) to each slot and writes every "
          "entry they complete into `store` and / or `out` [len(slots), max_new, head_dim] f32.")
      .def(
          "state",
          [](const Compressor& c, int slot) {
            std::vector<float> kv, score;
            c.state(slot, kv, score);
            return std::make_pair(kv, score);
          },
          nb::arg("slot"),
          "The slot's state rows (kv, score + ape) as two flat lists of state_rows x width floats "
          "(DeepSeek's kv_state / score_state).")
      .def(
          "set_stream", [](Compressor& c, std::uintptr_t h) { c.set_stream(stream_of(h)); },
          nb::arg("stream"));
}

void bind_indexer(nb::module_& m) {
  auto config = nb::class_<IndexerConfig>(
      m, "IndexerConfig", "Shape and query preparation of an Indexer (kvc/dsv4/indexer.h).");
  def_kwargs_init<IndexerConfig>(config);
  config.def_rw("key_format", &IndexerConfig::key_format)
      .def_rw("num_heads", &IndexerConfig::num_heads)
      .def_rw("head_dim", &IndexerConfig::head_dim)
      .def_rw("ratio", &IndexerConfig::ratio)
      .def_rw("max_batch", &IndexerConfig::max_batch)
      .def_rw("max_query_tokens", &IndexerConfig::max_query_tokens)
      .def_rw("query_rope", &IndexerConfig::query_rope)
      .def_rw("rope_dim", &IndexerConfig::rope_dim)
      .def_rw("query_hadamard", &IndexerConfig::query_hadamard)
      .def("validate", &IndexerConfig::validate);

  nb::class_<Indexer>(m, "Indexer",
                      "The lightning indexer: I[t, j] = sum_h w_h ReLU(q_h . k_j) over mxfp4 or "
                      "fp8 keys (kvc/dsv4/indexer.h).")
      .def(nb::new_([](const IndexerConfig& config, const std::string& device) {
             return Indexer::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &Indexer::config)
      .def(
          "score",
          [](Indexer& x, const EntryStore& keys, const std::vector<int>& slots,
             const std::vector<std::int64_t>& lengths, const InArray& q, const InArray& weights,
             const OutArray& scores, const OutArray& num_valid, std::optional<InArray> rope_cos,
             std::optional<InArray> rope_sin) {
            IndexerArgs a;
            a.slots = slots;
            a.lengths = lengths;
            a.q = view_of(q, "q");
            a.weights = view_of(weights, "weights");
            a.rope_cos = optional_view(rope_cos, "rope_cos");
            a.rope_sin = optional_view(rope_sin, "rope_sin");
            a.out = scores_view(scores, num_valid, keys.device());
            nb::gil_scoped_release release;
            x.score(keys, a);
          },
          nb::arg("keys"), nb::arg("slots"), nb::arg("lengths"), nb::arg("q"), nb::arg("weights"),
          nb::arg("scores"), nb::arg("num_valid"), nb::arg("rope_cos") = nb::none(),
          nb::arg("rope_sin") = nb::none(),
          "Scores every visible entry of `keys`: q [batch, T, H, head_dim] bf16, weights "
          "[batch, T, H] f32, into scores [batch * T, >= max_entries] f32 and num_valid "
          "[batch * T] i32.")
      .def(
          "set_stream", [](Indexer& x, std::uintptr_t h) { x.set_stream(stream_of(h)); },
          nb::arg("stream"));

  m.def(
      "select_topk",
      [](Selector& selector, const InArray& scores, const InArray& num_valid, int k, bool sorted,
         const OutArray& ids, const OutArray& counts) {
        const ScoresView sv = scores_view(scores, num_valid, selector.device());
        SelectionView out = selection_view(ids, counts, false, selector.device());
        nb::gil_scoped_release release;
        select_topk(selector, sv, k, sorted, out);
      },
      nb::arg("selector"), nb::arg("scores"), nb::arg("num_valid"), nb::arg("k"), nb::arg("sorted"),
      nb::arg("ids"), nb::arg("counts"),
      "The top-k entries of each row (ties to the lower id, NaN last), -1 past the visible ones.");
}

void bind_sparse_attention(nb::module_& m) {
  auto config = nb::class_<SparseAttentionConfig>(
      m, "SparseAttentionConfig",
      "Shape and mode of a SparseAttention (kvc/dsv4/sparse_attention.h).");
  def_kwargs_init<SparseAttentionConfig>(config);
  config.def_rw("num_heads", &SparseAttentionConfig::num_heads)
      .def_rw("head_dim", &SparseAttentionConfig::head_dim)
      .def_rw("softmax_scale", &SparseAttentionConfig::softmax_scale)
      .def_rw("ratio", &SparseAttentionConfig::ratio)
      .def_rw("hca", &SparseAttentionConfig::hca)
      .def_rw("window", &SparseAttentionConfig::window)
      .def_rw("max_batch", &SparseAttentionConfig::max_batch)
      .def_rw("max_query_tokens", &SparseAttentionConfig::max_query_tokens)
      .def_rw("max_indices", &SparseAttentionConfig::max_indices)
      .def_rw("accumulate_f64", &SparseAttentionConfig::accumulate_f64)
      .def("scale", &SparseAttentionConfig::scale)
      .def("validate", &SparseAttentionConfig::validate);

  nb::class_<SparseAttention>(m, "SparseAttention",
                              "CSA / HCA attention over a window ring and an entry store "
                              "(kvc/dsv4/sparse_attention.h).")
      .def(nb::new_([](const SparseAttentionConfig& config, const std::string& device) {
             return SparseAttention::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &SparseAttention::config)
      .def(
          "forward",
          [](SparseAttention& s, const EntryStore& ring, const EntryStore& entries,
             const std::vector<int>& slots, const std::vector<std::int64_t>& lengths,
             const InArray& q, const OutArray& out, std::optional<OutArray> lse,
             std::optional<InArray> window_chunk, std::optional<InArray> indices,
             std::optional<InArray> sink) {
            SparseAttentionArgs a;
            a.slots = slots;
            a.lengths = lengths;
            a.q = view_of(q, "q");
            a.out = view_of(out, "out");
            a.lse = optional_view(lse, "lse");
            a.window_chunk = optional_view(window_chunk, "window_chunk");
            if (indices) a.indices = id_rows(*indices, "indices", entries.device());
            a.sink = optional_f32(sink, "sink", s.config().num_heads, entries.device());
            nb::gil_scoped_release release;
            s.forward(ring, entries, a);
          },
          nb::arg("ring"), nb::arg("entries"), nb::arg("slots"), nb::arg("lengths"), nb::arg("q"),
          nb::arg("out"), nb::arg("lse") = nb::none(), nb::arg("window_chunk") = nb::none(),
          nb::arg("indices") = nb::none(), nb::arg("sink") = nb::none(),
          "Attention of q [batch, T, H, d] bf16 over the ring and the entries (CSA: indices "
          "[batch * T, k] int32, -1 = skip; HCA: every visible entry) into out [batch, T, H, d] "
          "(bf16 or f32) and lse [batch, T, H] f32.")
      .def(
          "set_stream", [](SparseAttention& s, std::uintptr_t h) { s.set_stream(stream_of(h)); },
          nb::arg("stream"));
}

}  // namespace

void bind_dsv4(nb::module_& root) {
  nb::module_ m = root.def_submodule(
      "dsv4",
      "DeepSeek-V4 compressed attention: entry stores, compressor, indexer, sparse "
      "attention.");
  bind_entry_store(m);
  bind_compressor(m);
  bind_indexer(m);
  bind_sparse_attention(m);
}

}  // namespace python
}  // namespace kvc
