// ShardCommunicator over NCCL (compiled when kvc is built with NCCL, KVC_WITH_NCCL): the
// all-gather of the context-parallel decoder is one ncclAllGather of bytes on the caller's
// stream; begin_group / end_group are ncclGroupStart / ncclGroupEnd for one thread driving
// several ranks (ncclCommInitAll).
#ifndef KVC_NCCL_ENABLED
#define KVC_NCCL_ENABLED 0
#endif

#if KVC_NCCL_ENABLED

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "device_buffer.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/parallel/context_parallel.h"

/// Evaluates an NCCL call and throws kvc::Error naming it and NCCL's error string on failure.
#define KVC_NCCL_THROW(expr)                                                                       \
  do {                                                                                             \
    const ncclResult_t kvc_nccl_err_ = (expr);                                                     \
    KVC_CHECK(kvc_nccl_err_ == ncclSuccess, #expr, " failed: ", ncclGetErrorString(kvc_nccl_err_), \
              " (ncclResult_t ", static_cast<int>(kvc_nccl_err_), ")");                            \
  } while (0)

namespace kvc {
namespace {

class NcclCommunicator final : public ShardCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    KVC_NCCL_THROW(ncclCommCount(comm_, &size_));
    KVC_NCCL_THROW(ncclCommUserRank(comm_, &rank_));
    KVC_NCCL_THROW(ncclCommCuDevice(comm_, &device_));
  }
  ~NcclCommunicator() override {
    if (owned_) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int num_shards() const override { return size_; }
  int shard_index() const override { return rank_; }

  void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    KVC_CHECK(send != nullptr && recv != nullptr, "all_gather: send and recv must be non-null");
    detail::DeviceGuard guard(device_);
    KVC_NCCL_THROW(
        ncclAllGather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)));
  }

  void begin_group() override { KVC_NCCL_THROW(ncclGroupStart()); }
  void end_group() override { KVC_NCCL_THROW(ncclGroupEnd()); }

 private:
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  int size_ = 0, rank_ = 0, device_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<ShardCommunicator> make_nccl_communicator(ncclComm_t comm) {
  KVC_CHECK(comm != nullptr, "make_nccl_communicator: comm = null");
  return std::make_unique<NcclCommunicator>(comm, false);
}

std::vector<std::unique_ptr<ShardCommunicator>> create_nccl_communicators(
    const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  const int present = cuda_device_count();
  KVC_CHECK(n >= 1, "create_nccl_communicators: devices is empty");
  for (int i = 0; i < n; ++i) {
    KVC_CHECK(
        devices[static_cast<std::size_t>(i)] >= 0 && devices[static_cast<std::size_t>(i)] < present,
        "create_nccl_communicators: devices[", i, "] = ", devices[static_cast<std::size_t>(i)],
        " is not present (CUDA devices: ", present, ")");
    for (int j = 0; j < i; ++j) {
      KVC_CHECK(devices[static_cast<std::size_t>(i)] != devices[static_cast<std::size_t>(j)],
                "create_nccl_communicators: device ", devices[static_cast<std::size_t>(i)],
                " appears twice (one shard per device)");
    }
  }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  KVC_NCCL_THROW(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<ShardCommunicator>> out;
  for (ncclComm_t c : comms) out.push_back(std::make_unique<NcclCommunicator>(c, true));
  return out;
}

}  // namespace kvc

#endif  // KVC_NCCL_ENABLED
