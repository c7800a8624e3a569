// Pieces of the context-parallel decoder shared by the CPU and CUDA implementations (internal):
// the step sequencing, validation and the index / selector / attention calls live in
// DecoderBase; a device implementation owns the buffers and the three data movements that are
// not calls of other kvc objects (packing candidates, building the global score rows, merging
// the gathered states).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/index/block_index.h"
#include "kvc/parallel/context_parallel.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace parallel {

/// Buffer sizes of a decoder, fixed at construction.
struct Sizes {
  int num_shards = 1;       ///< N
  int shard_index = 0;      ///< this shard
  int max_rows = 0;         ///< index rows for max_batch x max_query_tokens
  int max_q_rows = 0;       ///< query rows (b, t, hq) for max_batch x max_query_tokens
  int owned_blocks = 0;     ///< local score pitch: store.owned_blocks_per_slot()
  int global_blocks = 0;    ///< global score pitch: store.max_blocks_per_slot()
  int candidates = 0;       ///< M per row
  int global_selected = 0;  ///< global selection pitch: policy.max_output(global_blocks)
  int head_dim = 0;         ///< d
};

/// Sizes of a decoder for `config` and `store` (both validated).
Sizes sizes_of(const ContextParallelConfig& config, const KvStoreConfig& store);

/// Raw pointers to a decoder's buffers on its device.
struct Buffers {
  float* local_scores = nullptr;          ///< [max_rows, owned_blocks]
  std::int32_t* local_valid = nullptr;    ///< [max_rows]
  std::int32_t* local_ids = nullptr;      ///< [max_rows, candidates] local top-M (local ids)
  std::int32_t* local_counts = nullptr;   ///< [max_rows]
  BlockCandidate* cand_send = nullptr;    ///< [max_rows, candidates]
  BlockCandidate* cand_recv = nullptr;    ///< [N, rows, candidates] (rows of the step)
  float* global_scores = nullptr;         ///< [max_rows, global_blocks]
  std::int32_t* global_valid = nullptr;   ///< [max_rows]
  std::int32_t* global_ids = nullptr;     ///< [max_rows, global_selected]
  std::int32_t* global_counts = nullptr;  ///< [max_rows]
  float* state_send = nullptr;            ///< [max_q_rows * (d + 1)]: out then lse
  float* state_recv = nullptr;            ///< [N * q_rows * (d + 1)] (q_rows of the step)
};

/// The geometry of one step, passed to the device hooks.
struct StepShape {
  int batch = 0;                        ///< sequences
  int tokens = 0;                       ///< T
  int rows = 0;                         ///< index rows: batch * T * (Hkv or 1)
  int q_rows = 0;                       ///< batch * T * Hq
  bool shared = false;                  ///< rows are (b, t), one per sequence token
  const std::int32_t* slots = nullptr;  ///< [batch] the step's slots (host)
};

/// The steps of ContextParallelDecoder over device hooks.
class DecoderBase : public ContextParallelDecoder {
 public:
  DecoderBase(const ContextParallelConfig& config, const KvStoreConfig& store, Device device);

  const ContextParallelConfig& config() const override { return config_; }
  const KvStoreConfig& store_config() const override { return store_config_; }
  Device device() const override { return device_; }
  void set_stream(void* stream) override;
  int candidates_per_row() const override { return sizes_.candidates; }

  void select_local(const KvStore& store, const std::vector<int>& slots,
                    const TensorView& q) override;
  ExchangeBuffers candidate_exchange() override;
  void exchange_candidates(ShardCommunicator& comm) override;
  void select_global(const KvStore& store, SelectionReport* report) override;
  SelectionView selection() const override;
  ScoresView local_scores() const override;
  void attend(const KvStore& store, const float* sink, Telemetry* telemetry) override;
  ExchangeBuffers state_exchange() override;
  void exchange_states(ShardCommunicator& comm) override;
  void merge(const TensorView& out, const TensorView& lse) override;

 protected:
  /// Called by the device implementation's constructor once the buffers exist.
  void init(const Buffers& buffers);
  /// Makes the step's slots readable by the hooks (the CUDA version copies them to the device).
  virtual void upload_slots(const std::vector<int>& slots) = 0;
  /// cand_send[r, m] = (local score, logical id) of the r-th row's m-th local pick, padding
  /// (NaN, -1) past its count.
  virtual void pack_candidates(const StepShape& shape) = 0;
  /// global_valid[r] = closed blocks of the row's slot; global_scores[r, j] = NaN for
  /// j < global_valid[r], then the gathered candidates at their ids.
  virtual void build_global_rows(const StoreView& store, const StepShape& shape) = 0;
  /// The N gathered states merged in shard order into out (dtype of `out`) and lse (or null).
  virtual void merge_states(const StepShape& shape, const TensorView& out, float* lse) = 0;
  /// The stream of the device work (null on the CPU).
  void* stream() const { return stream_; }
  /// Buffer sizes.
  const Sizes& sizes() const { return sizes_; }
  /// The buffers.
  const Buffers& buffers() const { return buf_; }

 private:
  enum class Stage { kIdle, kLocal, kCandidates, kGlobal, kAttended, kStates };
  void expect_stage(Stage want, const char* step) const;
  void check_store(const KvStore& store, const char* step) const;

  ContextParallelConfig config_;
  KvStoreConfig store_config_;
  Device device_;
  Sizes sizes_;
  Buffers buf_;
  void* stream_ = nullptr;
  bool selects_ = false;  // the attention mode reads a selection
  SelectPolicy local_policy_;
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<Selector> selector_;
  std::unique_ptr<AttentionBackend> attention_;
  Stage stage_ = Stage::kIdle;
  std::vector<int> slots_;
  TensorView q_;
  StepShape shape_;
};

/// The CPU decoder.
std::unique_ptr<ContextParallelDecoder> make_cpu_decoder(const ContextParallelConfig& config,
                                                         const KvStoreConfig& store);
#if KVC_CUDA_ENABLED
/// The CUDA decoder.
std::unique_ptr<ContextParallelDecoder> make_cuda_decoder(const ContextParallelConfig& config,
                                                          const KvStoreConfig& store,
                                                          Device device);
/// Loopback all-gather of device memory: synchronises `streams`, then copies every send to
/// every recv (cudaMemcpy). Internal to the loopback communicator.
void cuda_loopback_copy(const std::vector<const void*>& sends, const std::vector<void*>& recvs,
                        const std::vector<void*>& streams, std::size_t bytes);
/// True when `p` is device memory.
bool is_device_pointer(const void* p);
#endif

}  // namespace parallel
}  // namespace kvc
