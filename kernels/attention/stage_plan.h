// The host-testable arithmetic of the staged tensor-core kernel (staged.cuh): which 16-row tiles
// of a chunk it stages (the walk), and where a 16-byte piece of a staged K / V row lies in
// shared memory (the swizzle). Plain C++ with KVC_HD, so the CPU can check both against brute
// force (tests/attention/attention_test.cu, Cuda_AttentionStaged.*, which need no GPU).
#pragma once

#include "kvc/attention/attention.h"
#include "kvc/core/macros.h"

namespace kvc {
namespace kernels {
namespace attention_detail {

/// What decides which tiles of a row's virtual list (mma.cuh's layout) hold an attended row.
/// Uniform over a CTA; filled from RowCtx once the row's length is known.
struct StageWalk {
  bool plain = false;      // a plain cache: rows [0, N) valid in [begin, pos]
  bool owns_ring = true;   // a store that attends its ring (shard 0)
  int mode = 0;            // AttentionMode of a store row
  int W16 = 0, B16 = 0;    // padded ring and block lengths of the list
  int O = 0;               // old tokens
  int wb = 0;              // first position of the window (kDenseRecentOnly)
  int open_tokens = 0;     // tokens of the open block
  int selected_rows = 0;   // sel_count * B (kBlockSelectExact)
  int begin = 0, pos = 0;  // plain: visible positions [begin, pos]
  int end = 0;             // the chunk's end c1
};

/// The first tile start >= v (v a multiple of 16) whose 16 rows may hold an attended row, or
/// w.end when none is left. Ring tiles are never skipped (the mask decides; their rows are read
/// before the length is known), so the ring part of the walk does not depend on the length.
KVC_HD int next_stage_tile(const StageWalk& w, int v) {
  if (v >= w.end) return w.end;
  int r = v;
  if (w.plain) {
    const int lo = w.begin / 16 * 16;
    if (r < lo) r = lo;
    if (r > w.pos) r = w.end;
  } else {
    if (r < w.W16) {
      if (w.owns_ring) return r;
      r = w.W16;
    }
    const int v2 = r - w.W16;
    const AttentionMode mode = static_cast<AttentionMode>(w.mode);
    if (mode == AttentionMode::kDense) {
      if (v2 >= w.O) r = w.end;
    } else if (mode == AttentionMode::kDenseRecentOnly) {
      if (w.wb + v2 >= w.O) r = w.end;
    } else if (mode == AttentionMode::kBlockSelectExact) {
      int u2 = v2;
      if (u2 < w.B16) {
        if (u2 >= w.open_tokens) {
          r = w.W16 + w.B16;
          u2 = w.B16;
        }
      }
      if (u2 >= w.B16 && u2 - w.B16 >= w.selected_rows) r = w.end;
    } else {
      r = w.end;  // kRecentOnly: the ring only
    }
  }
  return r < w.end ? r : w.end;
}

/// Physical 16-byte chunk of logical chunk `ch` of staged row `row` (row of the stage, 0..), for
/// a K row (`is_v` false; `q8_k`: int8 codes, else 16-bit) or a V row of `row_chunks` chunks.
/// An XOR of the chunk's low bits (never past the row's own chunks), chosen so that the
/// tensor-core lane pattern of mma.cuh reads without bank conflicts: 16-bit K (lanes of a
/// quarter warp: rows g, g + 1 at chunks 4j + c) flips bit 2 on odd rows; q8 K (half warps:
/// rows 4p..4p + 3 at chunk 2j + c / 2) XORs 2 (row % 4); V (rows 2c + r0 at chunk 8h + g or
/// its q8 / int4 part) XORs 2 ((row / 2) % 4).
KVC_HD int stage_chunk(bool is_v, bool q8_k, int row_chunks, int row, int ch) {
  const int mask = (row_chunks < 8 ? row_chunks : 8) - 1;
  const int f = is_v ? 2 * ((row >> 1) & 3) : q8_k ? 2 * (row & 3) : 4 * (row & 1);
  return ch ^ (f & mask);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc
