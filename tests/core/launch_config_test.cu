// kvc::detail::LaunchConfig (src/cuda/launch.h): the attributes each LaunchOptions asks for, in
// the order the launchers rely on, owned by each copy. Host code only: no device needed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/launch.h"

namespace kvc {
namespace {

using detail::LaunchConfig;
using detail::LaunchOptions;

std::vector<cudaLaunchAttributeID> ids(const LaunchConfig& c) {
  std::vector<cudaLaunchAttributeID> out;
  for (unsigned i = 0; i < c.config.numAttrs; ++i) out.push_back(c.config.attrs[i].id);
  return out;
}

cudaStream_t fake_stream() { return reinterpret_cast<cudaStream_t>(0x1234); }

TEST(LaunchConfig_Attributes, PlainLaunchHasNone) {
  const LaunchConfig c(dim3(7, 2, 1), dim3(256), 4096, fake_stream());
  EXPECT_EQ(c.config.gridDim.x, 7u);
  EXPECT_EQ(c.config.gridDim.y, 2u);
  EXPECT_EQ(c.config.blockDim.x, 256u);
  EXPECT_EQ(c.config.dynamicSmemBytes, 4096u);
  EXPECT_EQ(c.config.stream, fake_stream());
  EXPECT_EQ(c.config.numAttrs, 0u);
  EXPECT_FALSE(c.programmatic());
}

TEST(LaunchConfig_Attributes, ClusterOfOneIsStillAClusterLaunch) {
  for (unsigned x : {1u, 4u, 16u}) {
    LaunchOptions o;
    o.cluster = dim3(x, 1, 1);
    const LaunchConfig c(dim3(x * 3), dim3(512), 0, nullptr, o);
    ASSERT_EQ(ids(c), std::vector<cudaLaunchAttributeID>{cudaLaunchAttributeClusterDimension});
    EXPECT_EQ(c.config.attrs[0].val.clusterDim.x, x);
    EXPECT_EQ(c.config.attrs[0].val.clusterDim.y, 1u);
    EXPECT_EQ(c.config.attrs[0].val.clusterDim.z, 1u);
  }
  LaunchOptions y;  // the attention's chunks of a row: a cluster along y
  y.cluster = dim3(1, 8, 1);
  const LaunchConfig c(dim3(64, 8), dim3(128), 0, nullptr, y);
  ASSERT_EQ(c.config.numAttrs, 1u);
  EXPECT_EQ(c.config.attrs[0].val.clusterDim.x, 1u);
  EXPECT_EQ(c.config.attrs[0].val.clusterDim.y, 8u);
}

TEST(LaunchConfig_Attributes, ProgrammaticComesLastAndDropsAlone) {
  LaunchOptions o;
  o.cluster = dim3(8, 1, 1);
  o.programmatic = true;
  const LaunchConfig c(dim3(16), dim3(1024), 1 << 16, nullptr, o);
  EXPECT_EQ(ids(c), (std::vector<cudaLaunchAttributeID>{
                        cudaLaunchAttributeClusterDimension,
                        cudaLaunchAttributeProgrammaticStreamSerialization}));
  EXPECT_EQ(c.config.attrs[1].val.programmaticStreamSerializationAllowed, 1);
  EXPECT_TRUE(c.programmatic());
  const LaunchConfig plain = c.without_programmatic();
  EXPECT_EQ(ids(plain), std::vector<cudaLaunchAttributeID>{cudaLaunchAttributeClusterDimension});
  EXPECT_FALSE(plain.programmatic());
  EXPECT_EQ(plain.config.attrs[0].val.clusterDim.x, 8u);
  EXPECT_EQ(ids(plain.without_programmatic()), ids(plain));  // nothing more to drop
  EXPECT_TRUE(c.programmatic());                              // the original keeps it
}

TEST(LaunchConfig_Attributes, CooperativeGrid) {
  LaunchOptions o;
  o.cooperative = true;
  const LaunchConfig c(dim3(132), dim3(1024), 0, nullptr, o);
  ASSERT_EQ(ids(c), std::vector<cudaLaunchAttributeID>{cudaLaunchAttributeCooperative});
  EXPECT_EQ(c.config.attrs[0].val.cooperative, 1);
}

TEST(LaunchConfig_Attributes, CopiesOwnTheirAttributes) {
  LaunchOptions o;
  o.cluster = dim3(2, 1, 1);
  o.programmatic = true;
  const LaunchConfig a(dim3(4), dim3(32), 0, nullptr, o);
  const LaunchConfig b(a);
  EXPECT_EQ(b.config.attrs, b.attrs);  // not a's array
  EXPECT_EQ(ids(b), ids(a));
  LaunchConfig c(dim3(1), dim3(1), 0, nullptr);
  c = a;
  EXPECT_EQ(c.config.attrs, c.attrs);
  EXPECT_EQ(ids(c), ids(a));
  EXPECT_EQ(c.config.gridDim.x, 4u);
}

}  // namespace
}  // namespace kvc
