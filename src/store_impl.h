// Constructors of the KvStore implementations (internal).
#pragma once

#include <memory>

#include "kvc/config.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace detail {

std::unique_ptr<KvStore> make_cpu_kv_store(const KvStoreConfig& config);
#if KVC_CUDA_ENABLED
std::unique_ptr<KvStore> make_cuda_kv_store(const KvStoreConfig& config, Device device);
#endif

}  // namespace detail
}  // namespace kvc
