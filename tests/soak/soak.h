// kvc_soak: the pieces shared by the soak driver (soak.cpp) and its CUDA-graph pipeline
// (soak_cuda.cu). docs/soak.md describes the program.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace soak {

/// Shape of the soaked layer and of its decode batch (every slot of the store decodes every
/// step). Outputs are f32.
struct Shape {
  int slots = 4;                                          ///< store slots = batch
  int kv_heads = 2;                                       ///< Hkv
  int q_heads = 4;                                        ///< Hq
  int head_dim = 64;                                      ///< d
  int block_size = 16;                                    ///< B
  int window = 64;                                        ///< W
  int max_context = 1024;                                 ///< tokens per slot
  DType dtype = DType::kF16;                              ///< K, V and q: f16 or bf16
  Format format = Format::kFp16kQ4v;                      ///< old-block format
  AttentionMode mode = AttentionMode::kBlockSelectExact;  ///< attention mode
  int top_k = 4;                                          ///< blocks selected per row

  /// The store's configuration.
  KvStoreConfig store_config() const;
  /// The block index's configuration (batch = slots).
  BlockIndexConfig index_config() const;
  /// The attention configuration (batch = slots).
  AttentionConfig attention_config() const;
  /// Score / selection rows of one step.
  int rows() const { return index_config().rows(slots, 1); }
  /// Selection pitch: the policy's bound for a full row.
  int max_selected() const;
};

/// What one decode step produced, copied to the host.
struct StepResult {
  std::vector<float> scores;            ///< [rows, max_blocks] (entries < num_valid are valid)
  std::vector<std::int32_t> num_valid;  ///< [rows]
  std::vector<std::int32_t> ids;        ///< [rows, max_selected]
  std::vector<std::int32_t> counts;     ///< [rows]
  std::vector<float> out;               ///< [slots, Hq, d]
  std::vector<float> lse;               ///< [slots, Hq]
};

/// One layer's decode path on one device: a live store that every step appends to, and the
/// score → select → attend chain, which can also be run over another store of the same shape
/// (the fresh recomputation at checkpoints).
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  /// The live store (its slots are the batch, 0..slots-1).
  virtual KvStore& store() = 0;
  /// Brings the live store's host mirror up to date before host-side store calls (open, reset,
  /// free, ingest, snapshot). No-op on the CPU.
  virtual void sync_host_state() = 0;
  /// Ingests `tokens` tokens ([tokens, Hkv, d] f16 bits on the host) into `slot` of `store`, a
  /// store on this pipeline's device.
  virtual void ingest(KvStore& store, int slot, const std::vector<std::uint16_t>& k,
                      const std::vector<std::uint16_t>& v, int tokens) = 0;
  /// One decode step of every slot: appends k, v ([slots, Hkv, d]) and attends with q
  /// ([slots, Hq, d]).
  virtual void step(const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
                    const std::vector<std::uint16_t>& q) = 0;
  /// The last step's results (synchronises).
  virtual void last_result(StepResult& r) = 0;
  /// Score → select → attend over `fresh` with the last step's queries, nothing appended.
  virtual void recompute(KvStore& fresh, StepResult& r) = 0;
  /// A second recomputation over `fresh` through the device's objects (BlockIndex, Selector,
  /// AttentionBackend) where the main path does not use them (CUDA). Returns false when there
  /// is none; `note` says why when the objects could not be used.
  virtual bool recompute_objects(KvStore& fresh, StepResult& r, std::string* note) {
    (void)fresh;
    (void)r;
    (void)note;
    return false;
  }
  /// Free device memory in bytes (cudaMemGetInfo), or -1 on the CPU.
  virtual std::int64_t device_free_bytes() = 0;
  /// One line saying how steps run.
  virtual std::string describe() const = 0;
};

#if KVC_CUDA_ENABLED
/// The CUDA pipeline: kernels::decode_step captured once in a CUDA graph and replayed each step.
std::unique_ptr<Pipeline> make_cuda_graph_pipeline(const Shape& shape);
#endif

}  // namespace soak
}  // namespace kvc
