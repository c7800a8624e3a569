// Streaming token-kernel instantiations for head_dim 128 (every block size and chunk loop).
#include "index_launch.cuh"

namespace kvc {
namespace kernels {
namespace index_detail {

cudaError_t launch_token_stream_d128(int loop, int block_size, dim3 grid, const TokenScoreParams& p,
                                     cudaStream_t stream) {
  return launch_token_stream<128>(loop, block_size, grid, p, stream);
}

cudaError_t rows_resident_ctas_d128(int block_size, int& out) {
  return rows_resident_ctas<128>(block_size, out);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc
