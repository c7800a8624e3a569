// Shared pieces of the DeepSeek-V4 GPU tests: device copies, and the byte-level comparison of a
// CPU and a CUDA EntryStore.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cuda_test_util.h"
#include "dsv4_testbed.h"
#include "kvc/dsv4/dsv4.h"

namespace kvc {
namespace dsv4 {
namespace testing {

using kvc::testing::DeviceArray;

/// A device copy of a host vector, viewed as a contiguous tensor of `shape` on cuda:0.
template <class T>
struct DeviceTensor {
  DeviceArray<T> a;
  TensorView v;
  DeviceTensor(const std::vector<T>& host, DType t, std::initializer_list<std::int64_t> shape)
      : a(host) {
    v = TensorView::contiguous(a.get(), t, shape, Device::cuda(0));
  }
};

/// Every byte a slot holds, in logical row order (payload + scale record per row), from a
/// store's host view: equal for two stores that hold the same entries, whatever their pages.
inline std::vector<std::uint8_t> slot_bytes(const EntryStore& s, int slot) {
  std::vector<std::uint8_t> buf;
  const EntryStoreView v = s.host_view(buf);
  const EntryStoreConfig& c = s.config();
  const int n = s.count(slot);
  std::vector<std::uint8_t> out;
  for (int e = c.ring ? std::max(0, n - c.max_entries) : 0; e < n; ++e) {
    const int row = entry_row(v, e);
    const std::uint8_t* page = page_of(v, slot, row);
    EXPECT_NE(page, nullptr);
    if (page == nullptr) return out;
    const std::uint8_t* p = entry_payload(v.layout, page, row % c.page_entries);
    const std::uint8_t* q = entry_scales(v.layout, page, row % c.page_entries);
    out.insert(out.end(), p, p + v.layout.payload_bytes);
    out.insert(out.end(), q, q + v.layout.scale_bytes);
  }
  return out;
}

/// The block tables, counts and free stack of two kvc-owned stores are the same.
inline void expect_same_tables(const EntryStore& cpu, const EntryStore& gpu) {
  std::vector<std::uint8_t> b1, b2;
  const EntryStoreView a = cpu.host_view(b1), b = gpu.host_view(b2);
  const std::size_t cols = static_cast<std::size_t>(cpu.config().max_slots) * a.block_table_pitch;
  for (std::size_t i = 0; i < cols; ++i)
    EXPECT_EQ(a.block_table[i], b.block_table[i]) << "table " << i;
  for (int s = 0; s < cpu.config().max_slots; ++s)
    EXPECT_EQ(a.counts[s], b.counts[s]) << "count " << s;
  EXPECT_EQ(cpu.free_pages(), gpu.free_pages());
}

}  // namespace testing
}  // namespace dsv4
}  // namespace kvc
