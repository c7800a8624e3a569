/*! \file kvc/telemetry/telemetry.h
 *  \brief Optional per-call statistics of AttentionBackend::decode: what each row attended,
 *  how many bytes that read in each component's format, and how the store compares with a
 *  dense 16-bit cache.
 *
 *  Pass a Telemetry* to decode() to fill it; pass null to skip all of it. The CPU backend fills
 *  every field. The CUDA backend never synchronises the device for telemetry unless
 *  `wait_for_device` is set: without it, the fields that need device data (the selection copy
 *  and anything that depends on selection counts) stay empty and `complete` is false.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/store/kv_store.h"

namespace kvc {

/// Attended entries of one kv-head row, by component.
struct AttendedTokens {
  std::int64_t recent = 0;           ///< ring tokens (exact, the store's dtype)
  std::int64_t old_exact = 0;        ///< old tokens read exactly: open block + selected/all closed
  std::int64_t summaries = 0;        ///< block summary entries (mean K, mean V)
  std::int64_t representatives = 0;  ///< exact representative tokens of summarised blocks
  /// All attended entries.
  std::int64_t total() const { return recent + old_exact + summaries + representatives; }
};

/// Bytes read for the attended entries, by component, each in its stored format.
struct AttendedBytes {
  std::uint64_t recent = 0;           ///< ring K+V, 2 * d * sizeof(dtype) per token
  std::uint64_t old_exact = 0;        ///< old K+V payload and scales per token
  std::uint64_t summaries = 0;        ///< mean K + mean V, 2 * d * 4 per entry
  std::uint64_t representatives = 0;  ///< like old_exact
  /// All bytes.
  std::uint64_t total() const { return recent + old_exact + summaries + representatives; }
};

/// Statistics of one decode call.
struct Telemetry {
  // --- request ---
  /// CUDA: synchronise the stream to fill the device-dependent fields. Ignored on the CPU.
  bool wait_for_device = false;

  // --- results ---
  bool complete = false;                                  ///< every field below is filled
  AttentionMode mode = AttentionMode::kBlockSelectExact;  ///< mode of the call
  int batch = 0;                                          ///< sequences
  int num_query_tokens = 0;                               ///< T
  int num_kv_heads = 0;                                   ///< Hkv
  /// Rows of `tokens`: batch * T * Hkv, row = (b * T + t) * Hkv + h (always per kv head).
  int rows = 0;

  /// Copy of the selection (select modes; empty otherwise): selection_rows x max_selected ids
  /// (-1 past each row's count) and the counts, rows as in the SelectionView.
  std::vector<std::int32_t> selected_ids;
  std::vector<std::int32_t> selected_counts;   ///< [selection_rows]
  int selection_rows = 0;                      ///< rows of the selection copy
  int max_selected = 0;                        ///< pitch of selected_ids
  bool selection_shared_across_heads = false;  ///< selection rows are (b, t)

  std::vector<AttendedTokens> tokens;  ///< [rows] attended entries per (b, t, kv head)
  AttendedTokens total_tokens;         ///< sum over rows
  /// Bytes of K/V read, summed over rows (each kv-head row read once for its G query heads).
  AttendedBytes attended_bytes;
  /// Bytes a dense 16-bit cache would read for the same rows: visible tokens * 2 * d * 2.
  std::uint64_t dense_equivalent_bytes = 0;
  /// dense_equivalent_bytes / attended_bytes.total(): the read reduction of this call.
  double attended_ratio = 0.0;

  /// The store's bytes by component (KvStore::footprint(), host-side bookkeeping).
  Footprint store;
  /// store.dense_equivalent_bytes / store.in_use: the memory compression of the store's content.
  double compression_ratio = 0.0;
};

}  // namespace kvc
