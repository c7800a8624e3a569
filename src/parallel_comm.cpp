// Shard communicators: the in-process loopback, and the NCCL entry points when kvc is built
// without NCCL (the NCCL implementation is src/cuda/parallel_nccl.cu).
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/parallel/context_parallel.h"
#include "parallel_internal.h"

#ifndef KVC_NCCL_ENABLED
#define KVC_NCCL_ENABLED 0
#endif

namespace kvc {
namespace {

// The round of all_gather calls in progress among the loopback shards.
struct LoopbackHub {
  explicit LoopbackHub(int n)
      : sends(static_cast<std::size_t>(n)),
        recvs(static_cast<std::size_t>(n)),
        streams(static_cast<std::size_t>(n)),
        arrived(static_cast<std::size_t>(n), 0) {}
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  std::vector<void*> streams;
  std::vector<unsigned char> arrived;
  int count = 0;
  std::size_t bytes = 0;
};

class LoopbackCommunicator final : public ShardCommunicator {
 public:
  LoopbackCommunicator(std::shared_ptr<LoopbackHub> hub, int n, int index)
      : hub_(std::move(hub)), n_(n), index_(index) {}
  int num_shards() const override { return n_; }
  int shard_index() const override { return index_; }

  void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override {
    LoopbackHub& h = *hub_;
    const std::size_t me = static_cast<std::size_t>(index_);
    KVC_CHECK(!h.arrived[me], "all_gather: shard ", index_,
              " called twice before every shard of the round had called");
    KVC_CHECK(h.count == 0 || bytes == h.bytes, "all_gather: shard ", index_, " sends ", bytes,
              " bytes but this round's shards send ", h.bytes);
    KVC_CHECK(bytes == 0 || (send != nullptr && recv != nullptr), "all_gather: shard ", index_,
              ": send and recv must be non-null for ", bytes, " bytes");
    h.bytes = bytes;
    h.sends[me] = send;
    h.recvs[me] = recv;
    h.streams[me] = stream;
    h.arrived[me] = 1;
    if (++h.count < n_) return;
    // The last shard of the round: every contribution to every shard.
    h.count = 0;
    std::fill(h.arrived.begin(), h.arrived.end(), 0);
    if (bytes == 0) return;
#if KVC_CUDA_ENABLED
    if (parallel::is_device_pointer(h.sends[0])) {
      parallel::cuda_loopback_copy(h.sends, h.recvs, h.streams, bytes);
      return;
    }
#endif
    for (int dst = 0; dst < n_; ++dst) {
      for (int src = 0; src < n_; ++src) {
        std::memcpy(static_cast<unsigned char*>(h.recvs[static_cast<std::size_t>(dst)]) +
                        static_cast<std::size_t>(src) * bytes,
                    h.sends[static_cast<std::size_t>(src)], bytes);
      }
    }
  }

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int n_ = 1;
  int index_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<ShardCommunicator>> make_loopback_communicators(int num_shards) {
  KVC_CHECK(num_shards >= 1 && num_shards <= 65536, "num_shards = ", num_shards,
            " must be in [1, 65536]");
  auto hub = std::make_shared<LoopbackHub>(num_shards);
  std::vector<std::unique_ptr<ShardCommunicator>> out;
  for (int r = 0; r < num_shards; ++r) {
    out.push_back(std::make_unique<LoopbackCommunicator>(hub, num_shards, r));
  }
  return out;
}

#if !KVC_NCCL_ENABLED
bool nccl_available() { return false; }

std::unique_ptr<ShardCommunicator> make_nccl_communicator(ncclComm_t) {
  KVC_CHECK(false, "make_nccl_communicator: kvc was built without NCCL (KVC_WITH_NCCL)");
  return nullptr;
}

std::vector<std::unique_ptr<ShardCommunicator>> create_nccl_communicators(const std::vector<int>&) {
  KVC_CHECK(false, "create_nccl_communicators: kvc was built without NCCL (KVC_WITH_NCCL)");
  return {};
}
#endif

}  // namespace kvc
