// Launches of the LayeredCache's truncate / fork kernels (store/layered.cuh), for the CUDA
// object (src/cuda/layered_cache.cu). One translation unit (layered_kernels.cu) holds the
// kernels; this header keeps the object's file free of them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvc/store/layered_cache.h"
#include "layered_cache_impl.h"

namespace kvc {
namespace detail {

/// Ring rows of positions [from, to) of `slot` back from the spill, in every layer.
cudaError_t launch_restore(const LayeredView& v, int slot, int from, int to, cudaStream_t stream);

/// truncate's table edits: pushes `n` released pages (kvc-owned), clears blocks [b0, b1) of
/// `slot`, sets its length.
cudaError_t launch_truncate_tables(const LayeredView& v, int slot, const std::int32_t* d_released,
                                   int n, int b0, int b1, int length, cudaStream_t stream);

/// fork's page copies of blocks [0, used) from src's pages to dst's where they differ, in every
/// layer (engine pages checked; a shared open block raises kSharedOpenBlock), and the length.
cudaError_t launch_fork_pages(const LayeredView& v, const LayeredLayout& z, void* pool, int src,
                              int dst, int used, int open_block, cudaStream_t stream);

}  // namespace detail
}  // namespace kvc
