// kvc_soak's CUDA pipeline: one decode step of every slot (append -> score -> select -> attend)
// as kernels::decode_step, captured once in a CUDA graph and replayed every step, as an engine
// does (tests/pipeline/decode_step_test.cu checks that replay against the objects). The live
// store's host mirror goes stale under replays, so it is refreshed before every host-side store
// call. The fresh recomputation at checkpoints runs the same kernels (decode_step, uncaptured, no
// append) over the fresh store, so equal inputs must give equal bytes.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/core/tensor.h"
#include "kvc/kernels/decode_step.h"
#include "soak.h"

namespace kvc {
namespace soak {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(std::string("kvc_soak: ") + what + ": " + cudaGetErrorString(e));
  }
}

// One cudaMalloc'd array, freed on destruction.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    check(cudaMalloc(reinterpret_cast<void**>(&p_), (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Device buffers of one step's results.
struct ResultBuffers {
  ResultBuffers(std::size_t rows, std::size_t maxb, std::size_t sel, std::size_t heads,
                std::size_t d)
      : scores(rows * maxb),
        num_valid(rows),
        ids(rows * sel),
        counts(rows),
        out(heads * d),
        lse(heads) {}
  DeviceArray<float> scores;
  DeviceArray<std::int32_t> num_valid, ids, counts;
  DeviceArray<float> out, lse;
};

class GraphPipeline : public Pipeline {
 public:
  explicit GraphPipeline(const Shape& s)
      : shape_(s),
        rows_(static_cast<std::size_t>(s.rows())),
        maxb_(static_cast<std::size_t>(s.store_config().max_blocks_per_slot())),
        sel_(static_cast<std::size_t>(s.max_selected())),
        heads_(static_cast<std::size_t>(s.slots) * s.q_heads),
        token_(static_cast<std::size_t>(s.kv_heads) * s.head_dim),
        store_(KvStore::create(s.store_config(), Device::cuda(0))),
        slots_(static_cast<std::size_t>(s.slots)),
        k_(static_cast<std::size_t>(s.slots) * token_),
        v_(static_cast<std::size_t>(s.slots) * token_),
        q_(heads_ * s.head_dim),
        stage_k_(static_cast<std::size_t>(s.max_context) * token_),
        stage_v_(static_cast<std::size_t>(s.max_context) * token_),
        live_(rows_, maxb_, sel_, heads_, s.head_dim),
        fresh_(rows_, maxb_, sel_, heads_, s.head_dim),
        objects_(rows_, maxb_, sel_, heads_, s.head_dim) {
    // The objects validate the configuration the kernels trust.
    s.index_config().validate();
    s.attention_config().validate();
    const SelectPolicy policy = SelectPolicy::topk(s.top_k);
    policy.validate();

    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    store_->set_stream(stream_);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(s.slots));
    for (int i = 0; i < s.slots; ++i) ids[static_cast<std::size_t>(i)] = i;
    check(cudaMemcpy(slots_.get(), ids.data(), slots_.bytes(), cudaMemcpyHostToDevice),
          "cudaMemcpy slots");

    std::size_t select_bytes = 0;
    check(kernels::select_workspace_bound(select_bytes, static_cast<int>(rows_),
                                          static_cast<int>(maxb_), static_cast<int>(sel_)),
          "select_workspace_bound");
    select_ws_ = std::make_unique<DeviceArray<std::uint8_t>>(select_bytes + 256);
    const std::size_t attn_bytes =
        kernels::attention_workspace_upper_bound(s.q_heads, s.kv_heads, s.head_dim);
    KVC_CHECK(attn_bytes > 0, "attention_workspace_upper_bound(", s.q_heads, ", ", s.kv_heads, ", ",
              s.head_dim, ") = 0: shape not supported");
    attn_ws_ = std::make_unique<DeviceArray<std::uint8_t>>(attn_bytes + 256);

    args_.store = store_->view();
    args_.slots = slots_.get();
    args_.batch = s.slots;
    args_.k_new = k_.get();
    args_.v_new = v_.get();
    args_.index = s.index_config();
    args_.policy = policy;
    args_.select_workspace = select_ws_->get();
    args_.select_workspace_bytes = select_bytes;
    args_.attention.q = q_.get();
    args_.attention.num_q_heads = s.q_heads;
    args_.attention.num_kv_heads = s.kv_heads;
    args_.attention.group_size = s.q_heads / s.kv_heads;
    args_.attention.head_dim = s.head_dim;
    args_.attention.scale = s.attention_config().effective_scale();
    args_.attention.mode = s.mode;
    args_.attention.q_dtype = s.dtype;
    args_.attention.out_dtype = DType::kF32;
    args_.attention_workspace = attn_ws_->get();
    args_.attention_workspace_bytes = attn_bytes;
    point_at(args_, live_);

    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "BeginCapture");
    const cudaError_t launched = kernels::decode_step(args_, stream_);
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    check(launched, "decode_step (capture)");
    check(ended, "EndCapture");
    check(cudaGraphInstantiate(&exec_, graph, 0), "cudaGraphInstantiate");
    check(cudaGraphDestroy(graph), "cudaGraphDestroy");

    // The objects, for the cross-check of recompute_objects(); created (and their device memory
    // allocated) here, before any memory sample. A failure only disables that check.
    try {
      index_ = BlockIndex::create(s.index_config(), Device::cuda(0));
      selector_ = Selector::create(
          Device::cuda(0),
          SelectorLimits{static_cast<int>(rows_), static_cast<int>(maxb_), static_cast<int>(sel_)});
      backend_ = AttentionBackend::create(s.attention_config(), Device::cuda(0));
      index_->set_stream(stream_);
      selector_->set_stream(stream_);
      backend_->set_stream(stream_);
      slot_list_.resize(static_cast<std::size_t>(s.slots));
      for (int i = 0; i < s.slots; ++i) slot_list_[static_cast<std::size_t>(i)] = i;
    } catch (const std::exception& e) {
      objects_note_ = e.what();
      index_.reset();
    }
  }

  ~GraphPipeline() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    backend_.reset();
    selector_.reset();
    index_.reset();
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      store_->set_stream(nullptr);
      cudaStreamDestroy(stream_);
    }
  }

  KvStore& store() override { return *store_; }

  void sync_host_state() override { store_->refresh_host_state(); }

  void ingest(KvStore& st, int slot, const std::vector<std::uint16_t>& k,
              const std::vector<std::uint16_t>& v, int tokens) override {
    const std::size_t bytes = static_cast<std::size_t>(tokens) * token_ * 2;
    KVC_CHECK(bytes <= stage_k_.bytes(), "ingest of ", tokens, " tokens exceeds the staging");
    st.set_stream(stream_);
    // Pageable copies on the stream: ordered after the previous ingest has read the staging.
    check(cudaMemcpyAsync(stage_k_.get(), k.data(), bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync k");
    check(cudaMemcpyAsync(stage_v_.get(), v.data(), bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync v");
    const std::int64_t t = tokens;
    st.ingest(slot,
              TensorView::contiguous(stage_k_.get(), shape_.dtype,
                                     {t, shape_.kv_heads, shape_.head_dim}, Device::cuda(0)),
              TensorView::contiguous(stage_v_.get(), shape_.dtype,
                                     {t, shape_.kv_heads, shape_.head_dim}, Device::cuda(0)));
  }

  void step(const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
            const std::vector<std::uint16_t>& q) override {
    check(cudaMemcpyAsync(k_.get(), k.data(), k_.bytes(), cudaMemcpyHostToDevice, stream_), "k");
    check(cudaMemcpyAsync(v_.get(), v.data(), v_.bytes(), cudaMemcpyHostToDevice, stream_), "v");
    check(cudaMemcpyAsync(q_.get(), q.data(), q_.bytes(), cudaMemcpyHostToDevice, stream_), "q");
    poison(live_);
    check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  }

  void last_result(StepResult& r) override { download(live_, r); }

  void recompute(KvStore& fresh, StepResult& r) override {
    fresh.set_stream(stream_);
    kernels::DecodeStepArgs a = args_;
    a.store = fresh.view();
    a.k_new = nullptr;
    a.v_new = nullptr;
    point_at(a, fresh_);
    poison(fresh_);
    check(kernels::decode_step(a, stream_), "decode_step (fresh)");
    download(fresh_, r);
    fresh.set_stream(nullptr);
  }

  bool recompute_objects(KvStore& fresh, StepResult& r, std::string* note) override {
    if (!index_) {
      *note = objects_note_;
      return false;
    }
    try {
      fresh.set_stream(stream_);
      poison(objects_);
      const std::int64_t n = shape_.slots;
      const Device dev = Device::cuda(0);
      DecodeArgs d;
      d.slots = slot_list_;
      d.q = TensorView::contiguous(q_.get(), shape_.dtype, {n, 1, shape_.q_heads, shape_.head_dim},
                                   dev);
      if (uses_selection(shape_.mode)) {
        const ScoresView sv{objects_.scores.get(), objects_.num_valid.get(),
                            static_cast<int>(rows_), static_cast<int>(maxb_)};
        index_->score(fresh, slot_list_, d.q, sv);
        d.selection = SelectionView{objects_.ids.get(), objects_.counts.get(),
                                    static_cast<int>(rows_), static_cast<int>(sel_), false};
        selector_->select(sv, SelectPolicy::topk(shape_.top_k), d.selection);
      }
      d.out = TensorView::contiguous(objects_.out.get(), DType::kF32,
                                     {n, 1, shape_.q_heads, shape_.head_dim}, dev);
      d.lse = TensorView::contiguous(objects_.lse.get(), DType::kF32, {n, 1, shape_.q_heads}, dev);
      backend_->decode(fresh, d);
      download(objects_, r);
      fresh.set_stream(nullptr);
      return true;
    } catch (const std::exception& e) {
      *note = e.what();
      fresh.set_stream(nullptr);
      return false;
    }
  }

  std::int64_t device_free_bytes() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    std::size_t free_bytes = 0, total = 0;
    check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return static_cast<std::int64_t>(free_bytes);
  }

  std::string describe() const override {
    return "CUDA graph: kernels::decode_step (store_update, block_scores, select, "
           "attention_decode) captured once, replayed every step; fresh recomputation through "
           "the same kernels";
  }

 private:
  void point_at(kernels::DecodeStepArgs& a, ResultBuffers& b) const {
    a.scores = ScoresView{b.scores.get(), b.num_valid.get(), static_cast<int>(rows_),
                          static_cast<int>(maxb_)};
    a.selection = SelectionView{b.ids.get(), b.counts.get(), static_cast<int>(rows_),
                                static_cast<int>(sel_), false};
    a.attention.out = b.out.get();
    a.attention.lse = b.lse.get();
  }

  // Outputs filled with 0xFF (NaN floats, -1 ids) before they are computed.
  void poison(ResultBuffers& b) {
    check(cudaMemsetAsync(b.out.get(), 0xff, b.out.bytes(), stream_), "poison out");
    check(cudaMemsetAsync(b.lse.get(), 0xff, b.lse.bytes(), stream_), "poison lse");
    check(cudaMemsetAsync(b.counts.get(), 0xff, b.counts.bytes(), stream_), "poison counts");
  }

  template <class T>
  void copy_down(std::vector<T>& dst, const DeviceArray<T>& src) {
    dst.resize(src.size());
    check(cudaMemcpyAsync(dst.data(), src.get(), src.bytes(), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync down");
  }

  void download(ResultBuffers& b, StepResult& r) {
    copy_down(r.scores, b.scores);
    copy_down(r.num_valid, b.num_valid);
    copy_down(r.ids, b.ids);
    copy_down(r.counts, b.counts);
    copy_down(r.out, b.out);
    copy_down(r.lse, b.lse);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Shape shape_;
  std::size_t rows_, maxb_, sel_, heads_, token_;
  std::unique_ptr<KvStore> store_;
  DeviceArray<std::int32_t> slots_;
  DeviceArray<std::uint16_t> k_, v_, q_;
  DeviceArray<std::uint16_t> stage_k_, stage_v_;
  ResultBuffers live_, fresh_, objects_;
  std::unique_ptr<DeviceArray<std::uint8_t>> select_ws_, attn_ws_;
  kernels::DecodeStepArgs args_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<Selector> selector_;
  std::unique_ptr<AttentionBackend> backend_;
  std::vector<int> slot_list_;
  std::string objects_note_;
};

}  // namespace

std::unique_ptr<Pipeline> make_cuda_graph_pipeline(const Shape& shape) {
  return std::make_unique<GraphPipeline>(shape);
}

}  // namespace soak
}  // namespace kvc
