// CUDA registration through the loader seam, against the fake libcuda
// (fake_cuda.cc): chunk math, the call sequence, rollback, contiguity, and
// the errors for a missing driver or GPU. Nothing here touches real memory
// beyond PROT_NONE address-space reservations.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_driver.h"

namespace cxlpool::cuda {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

// The fake's control functions, reached through dlsym on the same library
// the loader opens (dlopen of one path yields one instance).
class FakeCuda {
 public:
  FakeCuda() {
    const char* path = std::getenv("CXLPOOL_FAKE_CUDA");
    if (path == nullptr) return;
    path_ = path;
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  ~FakeCuda() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  bool ok() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  template <typename F>
  F* Fn(const char* name) const {
    return reinterpret_cast<F*>(dlsym(handle_, name));
  }
  void Reset() const { Fn<void()>("fake_cuda_reset")(); }
  std::vector<std::string> Calls(const std::string& prefix) const {
    std::vector<std::string> out;
    int n = Fn<int()>("fake_cuda_call_count")();
    for (int i = 0; i < n; ++i) {
      std::string c = Fn<const char*(int)>("fake_cuda_call")(i);
      if (c.rfind(prefix, 0) == 0) out.push_back(c);
    }
    return out;
  }
  uint64_t RegisteredBytes() const { return Fn<uint64_t()>("fake_cuda_registered_bytes")(); }
  int Retained() const { return Fn<int()>("fake_cuda_retained_contexts")(); }
  int Depth() const { return Fn<int()>("fake_cuda_context_depth")(); }

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// A PROT_NONE reservation: address space only, no memory.
class Reservation {
 public:
  explicit Reservation(uint64_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    addr_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Reservation() {
    if (addr_ != nullptr) munmap(addr_, size_);
  }
  void* get() const { return addr_; }

 private:
  void* addr_;
  uint64_t size_;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok()) << "CXLPOOL_FAKE_CUDA must name the fake libcuda";
    fake_.Reset();
  }
  std::unique_ptr<CudaDriver> LoadFake() {
    auto d = CudaDriver::Load(fake_.path());
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(*d) : nullptr;
  }
  FakeCuda fake_;
};

TEST(PlanChunksTest, SplitsAt64GiB) {
  auto c = PlanChunks(130 * kGiB, kMaxRegisterChunkBytes);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].offset, 0u);
  EXPECT_EQ(c[0].length, 64 * kGiB);
  EXPECT_EQ(c[1].offset, 64 * kGiB);
  EXPECT_EQ(c[1].length, 64 * kGiB);
  EXPECT_EQ(c[2].offset, 128 * kGiB);
  EXPECT_EQ(c[2].length, 2 * kGiB);
  EXPECT_EQ(PlanChunks(128 * kGiB, 64 * kGiB).size(), 2u);
  ASSERT_EQ(PlanChunks(4096, 64 * kGiB).size(), 1u);
  EXPECT_EQ(PlanChunks(4096, 64 * kGiB)[0].length, 4096u);
  EXPECT_TRUE(PlanChunks(0, 64 * kGiB).empty());
  EXPECT_TRUE(PlanChunks(4096, 0).empty());
}

TEST(CudaLoadTest, MissingLibraryIsUnsupported) {
  auto d = CudaDriver::Load("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnsupported);
  EXPECT_NE(d.status().message().find("/nonexistent/libcuda.so.1"), std::string::npos);
}

TEST(CudaLoadTest, MissingRequiredEntryPointIsUnsupported) {
  CudaApi api;  // all null
  auto d = CudaDriver::FromApi(api);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnsupported);
  EXPECT_NE(d.status().message().find("cuInit"), std::string::npos);
}

TEST_F(CudaTest, InitFailureIsUnavailable) {
  fake_.Fn<void(int)>("fake_cuda_set_init_result")(100);  // CUDA_ERROR_NO_DEVICE
  auto d = CudaDriver::Load(fake_.path());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnavailable);
  EXPECT_NE(d.status().message().find("no CUDA"), std::string::npos) << d.status().message();
}

TEST_F(CudaTest, Registers130GiBInThreeChunks) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(130 * kGiB);
  ASSERT_NE(r.get(), nullptr);
  auto reg = RegisterHostMemory(*d, 0, r.get(), 130 * kGiB);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  auto calls = fake_.Calls("cuMemHostRegister_v2");
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_NE(calls[0].find(" 68719476736 3"), std::string::npos)
      << calls[0];  // 64 GiB, DEVICEMAP|PORTABLE
  EXPECT_NE(calls[1].find(" 68719476736 3"), std::string::npos) << calls[1];
  EXPECT_NE(calls[2].find(" 2147483648 3"), std::string::npos) << calls[2];
  EXPECT_EQ(fake_.RegisteredBytes(), 130 * kGiB);
  EXPECT_EQ(fake_.Depth(), 0) << "context left pushed";
  EXPECT_EQ(fake_.Retained(), 1) << "primary context must stay retained while registered";
  ASSERT_EQ(reg->chunks().size(), 3u);
  EXPECT_TRUE(reg->contiguous());
  EXPECT_EQ(reg->chunks()[0].device_ptr, reinterpret_cast<uint64_t>(r.get()));
  EXPECT_EQ(reg->chunks()[2].offset, 128 * kGiB);

  ASSERT_TRUE(reg->Unregister().ok());
  EXPECT_EQ(fake_.Calls("cuMemHostUnregister").size(), 3u);
  EXPECT_EQ(fake_.RegisteredBytes(), 0u);
  EXPECT_EQ(fake_.Retained(), 0);
  EXPECT_EQ(fake_.Depth(), 0);
}

TEST_F(CudaTest, ChunkingAvoidsTheDriverLimitOnHugeRanges) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(600 * kGiB);
  ASSERT_NE(r.get(), nullptr);
  // One 600 GiB call is what recent drivers refuse (the fake does too) ...
  auto single = RegisterHostMemory(*d, 0, r.get(), 600 * kGiB, 1024 * kGiB);
  ASSERT_FALSE(single.ok());
  EXPECT_EQ(single.status().code(), Code::kIo);
  EXPECT_NE(single.status().message().find("cuMemHostRegister_v2"), std::string::npos);
  EXPECT_EQ(fake_.Retained(), 0);
  // ... 64 GiB chunks are not.
  auto chunked = RegisterHostMemory(*d, 0, r.get(), 600 * kGiB);
  ASSERT_TRUE(chunked.ok()) << chunked.status().ToString();
  EXPECT_EQ(chunked->chunks().size(), 10u);
  EXPECT_EQ(fake_.RegisteredBytes(), 600 * kGiB);
}

TEST_F(CudaTest, FailedChunkRollsBackTheOthers) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(130 * kGiB);
  fake_.Fn<void(int)>("fake_cuda_fail_register_at")(2);
  auto reg = RegisterHostMemory(*d, 0, r.get(), 130 * kGiB);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), Code::kIo);
  EXPECT_NE(reg.status().message().find("chunk 2 of 3"), std::string::npos)
      << reg.status().message();
  EXPECT_EQ(fake_.Calls("cuMemHostUnregister").size(), 2u);
  EXPECT_EQ(fake_.RegisteredBytes(), 0u);
  EXPECT_EQ(fake_.Retained(), 0);
  EXPECT_EQ(fake_.Depth(), 0);
}

TEST_F(CudaTest, NonContiguousDevicePointersAreDetected) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  fake_.Fn<void(int)>("fake_cuda_set_noncontiguous")(1);
  Reservation r(130 * kGiB);
  auto reg = RegisterHostMemory(*d, 0, r.get(), 130 * kGiB);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_FALSE(reg->contiguous());
  EXPECT_NE(reg->chunks()[0].device_ptr, reg->chunks()[1].device_ptr);
}

TEST_F(CudaTest, MissingDeviceIsUnavailable) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(1 << 20);
  auto reg = RegisterHostMemory(*d, 3, r.get(), 1 << 20);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), Code::kUnavailable);
  fake_.Fn<void(int)>("fake_cuda_set_device_count")(0);
  reg = RegisterHostMemory(*d, 0, r.get(), 1 << 20);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), Code::kUnavailable);
  EXPECT_EQ(fake_.Retained(), 0);
}

TEST_F(CudaTest, BadArguments) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(1 << 20);
  EXPECT_EQ(RegisterHostMemory(*d, 0, r.get(), 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RegisterHostMemory(*d, -1, r.get(), 4096).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RegisterHostMemory(*d, 0, r.get(), 4096, 1000).status().code(), Code::kInvalidArgument);
}

TEST_F(CudaTest, DestroyingARegistrationUnregisters) {
  auto d = LoadFake();
  ASSERT_NE(d, nullptr);
  Reservation r(1 << 20);
  {
    auto reg = RegisterHostMemory(*d, 0, r.get(), 1 << 20);
    ASSERT_TRUE(reg.ok());
    CudaRegistration moved = std::move(*reg);
    EXPECT_FALSE(reg->registered());
    EXPECT_TRUE(moved.registered());
    EXPECT_EQ(fake_.RegisteredBytes(), 1u << 20);
  }
  EXPECT_EQ(fake_.RegisteredBytes(), 0u);
  EXPECT_EQ(fake_.Retained(), 0);
}

}  // namespace
}  // namespace cxlpool::cuda
