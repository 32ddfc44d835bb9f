// NvmlLibrary against the fake NVML builds: loading, missing library,
// missing entry points, init failures, and NVML's error codes.
#include "nvml_loader.h"

#include <gtest/gtest.h>

#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using testing_gpu::Board;
using testing_gpu::ScopedEnv;
using testing_gpu::WriteTemp;

TEST(NvmlLoader, LoadsFakeAndCountsGpus) {
  ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", Board("dgx-h100-8gpu-nvswitch"));
  auto lib = NvmlLibrary::Open(FAKE_NVML_LIB);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  ASSERT_NE((*lib)->nvmlDeviceGetNvLinkState, nullptr);
  ASSERT_NE((*lib)->nvmlDeviceGetNumaNodeId, nullptr);
  unsigned int count = 0;
  EXPECT_EQ((*lib)->nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 8u);
  EXPECT_EQ((*lib)->path(), FAKE_NVML_LIB);
}

TEST(NvmlLoader, MissingLibraryIsNotFound) {
  auto lib = NvmlLibrary::Open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), Code::kNotFound);
  EXPECT_NE(lib.status().message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos);
  EXPECT_EQ(NvmlLibrary::Open("").status().code(), Code::kInvalidArgument);
}

TEST(NvmlLoader, MissingRequiredEntryPointIsRefused) {
  ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", Board("2gpu-nvlink-bridge"));
  auto lib = NvmlLibrary::Open(FAKE_NVML_NOCOUNT_LIB);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), Code::kUnsupported);
  EXPECT_NE(lib.status().message().find("nvmlDeviceGetCount_v2"), std::string::npos);
}

TEST(NvmlLoader, MissingOptionalEntryPointsStayNull) {
  ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", Board("2gpu-nvlink-bridge"));
  auto lib = NvmlLibrary::Open(FAKE_NVML_MINIMAL_LIB);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_EQ((*lib)->nvmlDeviceGetNvLinkState, nullptr);
  EXPECT_EQ((*lib)->nvmlDeviceGetNvLinkRemotePciInfo_v2, nullptr);
  EXPECT_EQ((*lib)->nvmlDeviceGetNumaNodeId, nullptr);
  EXPECT_EQ((*lib)->nvmlDeviceGetMemoryAffinity, nullptr);
  EXPECT_NE((*lib)->nvmlDeviceGetCpuAffinity, nullptr);
  EXPECT_NE((*lib)->nvmlDeviceGetUUID, nullptr);
}

TEST(NvmlLoader, InitFailureIsUnavailable) {
  {
    ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", std::nullopt);
    auto lib = NvmlLibrary::Open(FAKE_NVML_LIB);
    ASSERT_FALSE(lib.ok());
    EXPECT_EQ(lib.status().code(), Code::kUnavailable);
    EXPECT_NE(lib.status().message().find("Driver Not Loaded"), std::string::npos);
  }
  {
    ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD",
                    WriteTemp("mismatch.json", R"({"init_error": "lib_rm_version_mismatch"})"));
    auto lib = NvmlLibrary::Open(FAKE_NVML_LIB);
    ASSERT_FALSE(lib.ok());
    EXPECT_EQ(lib.status().code(), Code::kUnavailable);
    EXPECT_NE(lib.status().message().find("mismatch"), std::string::npos);
  }
  {
    ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", WriteTemp("garbled.json", "{\"gpus\": [ {\x01"));
    EXPECT_EQ(NvmlLibrary::Open(FAKE_NVML_LIB).status().code(), Code::kUnavailable);
  }
}

TEST(NvmlLoader, FakeAnswersWithNvmlErrorCodes) {
  ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", Board("dgx-h100-8gpu-nvswitch"));
  auto opened = NvmlLibrary::Open(FAKE_NVML_LIB);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  NvmlLibrary& lib = **opened;
  nvmlDevice_t dev = nullptr;
  EXPECT_EQ(lib.nvmlDeviceGetHandleByIndex_v2(8, &dev), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lib.nvmlDeviceGetHandleByIndex_v2(0, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(lib.nvmlDeviceGetHandleByIndex_v2(7, &dev), NVML_SUCCESS);

  char small[8];
  EXPECT_EQ(lib.nvmlDeviceGetUUID(dev, small, sizeof small), NVML_ERROR_INSUFFICIENT_SIZE);
  int not_a_device = 0;
  char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  EXPECT_EQ(lib.nvmlDeviceGetUUID(reinterpret_cast<nvmlDevice_t>(&not_a_device), buf, sizeof buf),
            NVML_ERROR_INVALID_ARGUMENT);

  nvmlEnableState_t state;
  EXPECT_EQ(lib.nvmlDeviceGetNvLinkState(dev, NVML_NVLINK_MAX_LINKS, &state),
            NVML_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(lib.nvmlDeviceGetNvLinkState(dev, 17, &state), NVML_SUCCESS);
  EXPECT_EQ(state, NVML_FEATURE_DISABLED);  // the board's trained-down link
  nvmlPciInfo_t pci;
  EXPECT_EQ(lib.nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, 17, &pci), NVML_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(lib.nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, 0, &pci), NVML_SUCCESS);
  EXPECT_STREQ(pci.busId, "00000000:05:00.0");
  unsigned int node = 0;
  EXPECT_EQ(lib.nvmlDeviceGetNumaNodeId(dev, &node), NVML_ERROR_NOT_SUPPORTED);
  EXPECT_NE(lib.ErrorString(NVML_ERROR_NOT_SUPPORTED).find("Not Supported"), std::string::npos);
}

TEST(NvmlLoader, ErrorStringWithoutEntryPoint) {
  ScopedEnv board("CXLPOOL_FAKE_NVML_BOARD", Board("2gpu-nvlink-bridge"));
  auto lib = NvmlLibrary::Open(FAKE_NVML_LIB);
  ASSERT_TRUE(lib.ok());
  (*lib)->nvmlErrorString = nullptr;  // the test hook: entry points are plain pointers
  EXPECT_EQ((*lib)->ErrorString(NVML_ERROR_UNKNOWN), "NVML error 999");
}

TEST(NvmlLoader, CodesMapToCxlpoolCodes) {
  EXPECT_EQ(NvmlCodeToCode(NVML_SUCCESS), Code::kOk);
  EXPECT_EQ(NvmlCodeToCode(NVML_ERROR_NOT_SUPPORTED), Code::kUnsupported);
  EXPECT_EQ(NvmlCodeToCode(NVML_ERROR_NO_PERMISSION), Code::kPermissionDenied);
  EXPECT_EQ(NvmlCodeToCode(NVML_ERROR_DRIVER_NOT_LOADED), Code::kUnavailable);
  EXPECT_EQ(NvmlCodeToCode(NVML_ERROR_UNKNOWN), Code::kIo);
}

TEST(NormalizePciBusId, AcceptsNvmlAndSysfsForms) {
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0").value(), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:3b:00.0").value(), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("00000009:01:00.0").value(), "0009:01:00.0");
  EXPECT_EQ(NormalizePciBusId("3B:00.1").value(), "0000:3b:00.1");
  EXPECT_EQ(NormalizePciBusId("10000:01:00.0").value(), "10000:01:00.0");  // VMD domain
  EXPECT_EQ(NormalizePciBusId(" 0000:17:00.0\n").value(), "0000:17:00.0");
}

TEST(NormalizePciBusId, RejectsGarbage) {
  for (const char* bad : {"", "garbage", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8",
                          "000000000:3b:00.0", "0000:3bb:00.0", "0000:+3:00.0", "a:b:c:d.0"}) {
    auto r = NormalizePciBusId(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace cxlpool
