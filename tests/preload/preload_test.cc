// libcxlpool_preload.so against a real daemon and fake CUDA libraries: a
// program linked against the fake libcudart.so.12 (versioned symbols) and
// libcuda.so.1 runs with LD_PRELOAD; its pinned allocations must come from
// registered, exact-size leases, small and write-combined ones and foreign
// pointers must reach the real calls, and every fallback cause (no daemon,
// quota, failed registration) must give the real call's memory with one log
// line per cause. Also checks the symbol versions themselves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::RunShell;

std::string Env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

struct ProbeRun {
  int rc = -1;
  std::string out;
  std::map<std::string, std::string> kv;
  std::string Get(const std::string& k) const {
    auto it = kv.find(k);
    return it == kv.end() ? "<missing " + k + ">" : it->second;
  }
  long Num(const std::string& k) const { return std::strtol(Get(k).c_str(), nullptr, 10); }
  int Count(const std::string& needle) const {
    int n = 0;
    for (size_t p = out.find(needle); p != std::string::npos; p = out.find(needle, p + 1)) ++n;
    return n;
  }
};

class PreloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testsupport::SkipWithoutDaemon();
    for (const char* k : {"CXLPOOL_PRELOAD_LIB", "CXLPOOL_PROBE"}) {
      if (::access(Env(k).c_str(), R_OK) != 0) testsupport::Skip(std::string("no ") + k);
    }
  }

  void StartDaemon(const std::string& extra = "") {
    Status st = daemon_.Start(R"(
[daemon]
socket_mode = "0600"
log_level = "warning"
[pools]
capacity = "128M"
)" + extra);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  ProbeRun Run(const std::string& args, const std::string& env = "",
               const std::string& probe = Env("CXLPOOL_PROBE")) {
    std::string sock = daemon_.started() ? daemon_.socket() : "/nonexistent/cxlpool.sock";
    std::string cmd = "env CXLPOOL_SOCKET=" + sock + " CXLPOOL_CUDA_LIBRARY=libcuda.so.1 " +
                      "PROBE_LEASES_CMD='" + testsupport::CtlBinary() + " leases --json --socket " +
                      sock + "' " + env + " LD_PRELOAD=" + Env("CXLPOOL_PRELOAD_LIB") + " " +
                      probe + " " + args + " 2>&1";
    ProbeRun r;
    auto [rc, out] = RunShell(cmd);
    r.rc = rc;
    r.out = out;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      size_t eq = line.find('=');
      if (eq != std::string::npos && line.rfind("cxlpool-preload:", 0) != 0) {
        r.kv[line.substr(0, eq)] = line.substr(eq + 1);
      }
    }
    return r;
  }

  nlohmann::json Leases(const ProbeRun& r) {
    return nlohmann::json::parse(r.Get("leases"), nullptr, /*allow_exceptions=*/false);
  }

  uint64_t LiveLeases() {
    auto [rc, out] =
        RunShell(testsupport::CtlBinary() + " leases --json --socket " + daemon_.socket());
    auto j = nlohmann::json::parse(out, nullptr, false);
    return rc == 0 && j.is_array() ? j.size() : 999;
  }

  testsupport::Daemon daemon_;
};

constexpr long kBig = (4l << 20) + 100;

TEST_F(PreloadTest, RuntimeAllocationsComeFromRegisteredExactLeases) {
  StartDaemon();
  ProbeRun r = Run("runtime");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.Get("preloaded"), "1") << r.out;
  EXPECT_EQ(r.Get("big_rc"), "0") << r.out;
  EXPECT_EQ(r.Get("live_after_big"), "0") << "the runtime served the 4 MiB request:\n" << r.out;
  EXPECT_GE(r.Num("registered"), kBig) << "the lease was not registered with CUDA:\n" << r.out;
  // 64 KiB is under the 1 MiB threshold, write-combined is never served.
  EXPECT_EQ(r.Get("small_rc"), "0");
  EXPECT_EQ(r.Get("wc_rc"), "0");
  EXPECT_EQ(r.Get("live_after_all"), "2") << r.out;
  nlohmann::json leases = Leases(r);
  ASSERT_TRUE(leases.is_array()) << r.out;
  ASSERT_EQ(leases.size(), 1u) << leases.dump();
  EXPECT_EQ(leases[0]["label"], "preload:cudaHostAlloc");
  EXPECT_EQ(leases[0]["requested_bytes"].get<long>(), kBig);
  EXPECT_LE(leases[0]["size_bytes"].get<long>(), kBig + 4096) << "exact size, page rounded";
  EXPECT_EQ(r.Get("free_big"), "0");
  EXPECT_EQ(r.Get("free_small"), "0");
  EXPECT_EQ(r.Get("free_wc"), "0");
  // A pointer it did not hand out reaches the real cudaFreeHost untouched.
  EXPECT_EQ(r.Get("free_foreign"), "1");
  EXPECT_EQ(r.Get("foreign_frees"), "1");
  EXPECT_EQ(r.Get("live_end"), "0");
  EXPECT_EQ(r.Get("registered_end"), "0") << "cudaFreeHost must unregister the lease";
  EXPECT_EQ(r.Get("served"), "1");
  EXPECT_EQ(r.Get("freed"), "1");
  EXPECT_EQ(r.Get("touch_failed"), "<missing touch_failed>");
  EXPECT_EQ(r.Count("falls back"), 0) << r.out;
  EXPECT_TRUE(testsupport::PollUntil([&] { return LiveLeases() == 0; }, 5000, 20));
}

TEST_F(PreloadTest, DriverAllocationsAndEntryPointLookupsAreServed) {
  StartDaemon();
  ProbeRun r = Run("driver");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.Get("hostalloc_rc"), "0") << r.out;
  EXPECT_EQ(r.Get("allochost_rc"), "0");
  EXPECT_EQ(r.Get("getproc_rc"), "0");
  EXPECT_EQ(r.Get("getproc_is_export"), "1") << "cuGetProcAddress_v2 must hand out the shim's";
  EXPECT_EQ(r.Get("getproc_alloc_rc"), "0");
  EXPECT_EQ(r.Get("entry_rc"), "0");
  EXPECT_EQ(r.Get("entry_alloc_rc"), "0");
  EXPECT_EQ(r.Get("small_rc"), "0");
  // Only the 4 KiB one came from the driver itself.
  EXPECT_EQ(r.Get("driver_allocs"), "1") << r.out;
  nlohmann::json leases = Leases(r);
  ASSERT_TRUE(leases.is_array()) << r.out;
  EXPECT_EQ(leases.size(), 4u) << leases.dump();
  EXPECT_EQ(r.Get("frees_ok"), "5");
  EXPECT_EQ(r.Get("free_foreign"), "1") << "a foreign pointer reaches the real cuMemFreeHost";
  EXPECT_EQ(r.Get("driver_allocs_end"), "0");
  EXPECT_EQ(r.Get("registered_end"), "0");
  EXPECT_EQ(r.Get("served"), "4");
  EXPECT_TRUE(testsupport::PollUntil([&] { return LiveLeases() == 0; }, 5000, 20));
}

TEST_F(PreloadTest, NoDaemonFallsBackToTheRuntimeAndSaysSoOnce) {
  ProbeRun r = Run("repeat 3");  // no daemon started: the socket does not exist
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* k : {"alloc0_rc", "alloc1_rc", "alloc2_rc"}) EXPECT_EQ(r.Get(k), "0") << r.out;
  EXPECT_EQ(r.Get("live"), "3") << "every request must be served by the real runtime";
  EXPECT_EQ(r.Get("frees_ok"), "3");
  EXPECT_EQ(r.Get("live_end"), "0");
  EXPECT_EQ(r.Get("served"), "0");
  EXPECT_EQ(r.Get("fallbacks"), "3");
  EXPECT_EQ(r.Count("falls back to CUDA: no daemon"), 1) << r.out;
}

TEST_F(PreloadTest, QuotaReachedFallsBackOncePerCause) {
  StartDaemon(R"(
[[quota]]
uid = )" + std::to_string(::getuid()) +
              R"(
max_bytes = "10M"
)");
  ProbeRun r = Run("repeat 4");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* k : {"alloc0_rc", "alloc1_rc", "alloc2_rc", "alloc3_rc"}) {
    EXPECT_EQ(r.Get(k), "0") << r.out;
  }
  EXPECT_EQ(r.Get("served"), "2") << r.out;
  EXPECT_EQ(r.Get("live"), "2") << "the two over the quota come from the runtime";
  nlohmann::json leases = Leases(r);
  ASSERT_TRUE(leases.is_array()) << r.out;
  EXPECT_EQ(leases.size(), 2u);
  EXPECT_EQ(r.Count("falls back to CUDA: the pool or quota is exhausted"), 1) << r.out;
  EXPECT_EQ(r.Get("frees_ok"), "4");
  EXPECT_EQ(r.Get("live_end"), "0");
}

TEST_F(PreloadTest, FailedRegistrationReleasesTheLeaseAndFallsBack) {
  StartDaemon();
  ProbeRun r = Run("repeat 2", "CXLPOOL_CUDA_LIBRARY=/nonexistent/libcuda.so.1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.Get("live"), "2") << r.out;
  EXPECT_EQ(r.Get("served"), "0");
  nlohmann::json leases = Leases(r);
  ASSERT_TRUE(leases.is_array()) << r.out;
  EXPECT_EQ(leases.size(), 0u) << "an unregistered lease must not be kept";
  EXPECT_EQ(r.Count("falls back to CUDA: CUDA registration failed"), 1) << r.out;
}

TEST_F(PreloadTest, EnvironmentSwitchAndThreshold) {
  StartDaemon();
  ProbeRun off = Run("repeat 2", "CXLPOOL_PRELOAD=0");
  ASSERT_EQ(off.rc, 0) << off.out;
  EXPECT_EQ(off.Get("live"), "2");
  EXPECT_EQ(off.Get("served"), "0");
  EXPECT_EQ(off.Get("fallbacks"), "0") << "switched off is not a fallback";
  EXPECT_EQ(off.Count("cxlpool-preload:"), 0) << off.out;
  // Threshold above 4 MiB: nothing served; below 64 KiB: the small one too.
  ProbeRun high = Run("repeat 1", "CXLPOOL_PRELOAD_MIN_BYTES=8M");
  EXPECT_EQ(high.Get("live"), "1") << high.out;
  ProbeRun low = Run("runtime", "CXLPOOL_PRELOAD_MIN_BYTES=32K");
  EXPECT_EQ(low.Get("live_after_all"), "1") << "64 KiB served, write-combined not:\n" << low.out;
  EXPECT_EQ(low.Get("served"), "2");
}

TEST_F(PreloadTest, RuntimeLoadedRtldLocalIsFoundAmongTheLoadedObjects) {
  // As under Python: the runtime sits in a dlopen(RTLD_LOCAL) library's
  // scope, so dlsym(RTLD_NEXT) from the shim finds nothing; the shim must
  // still serve the big request and hand the small one and the foreign free
  // to the real (versioned) functions.
  StartDaemon();
  // No libcuda.so.1 in this program's search path: the driver by its path.
  ProbeRun r =
      Run("", "CXLPOOL_CUDA_LIBRARY=" + Env("CXLPOOL_FAKE_LIBCUDA"), Env("CXLPOOL_LOCAL_PROBE"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.Get("runtime_global"), "0") << "the runtime must not be in the global scope";
  EXPECT_EQ(r.Get("big_rc"), "0") << r.out;
  EXPECT_EQ(r.Get("small_rc"), "0") << r.out;
  EXPECT_EQ(r.Get("live"), "1") << "only the 4 KiB request reaches the real runtime:\n" << r.out;
  EXPECT_EQ(r.Get("free_big"), "0");
  EXPECT_EQ(r.Get("free_small"), "0");
  EXPECT_EQ(r.Get("free_foreign"), "1");
  EXPECT_EQ(r.Get("foreign_frees"), "1");
  EXPECT_EQ(r.Get("live_end"), "0");
  EXPECT_EQ(r.Get("served"), "1");
  EXPECT_EQ(r.Get("freed"), "1");
}

TEST_F(PreloadTest, SymbolVersions) {
  // The probe binds to versioned runtime symbols, as PyTorch's libraries do...
  auto [rc, syms] = RunShell("readelf -W --dyn-syms " + Env("CXLPOOL_PROBE"));
  ASSERT_EQ(rc, 0);
  EXPECT_NE(syms.find("cudaHostAlloc@libcudart.so.12"), std::string::npos) << syms;
  EXPECT_NE(syms.find("cudaFreeHost@libcudart.so.12"), std::string::npos) << syms;
  // ... and the shim defines them unversioned, which satisfies any version,
  // exporting nothing of libcxlpool.
  auto [rc2, shim] = RunShell("readelf -W --dyn-syms " + Env("CXLPOOL_PRELOAD_LIB"));
  ASSERT_EQ(rc2, 0);
  EXPECT_EQ(shim.find("cudaHostAlloc@"), std::string::npos) << shim;
  EXPECT_NE(shim.find(" cudaHostAlloc"), std::string::npos) << shim;
  for (const char* hidden : {"cxlpool_connect", "_ZN7cxlpool6Client"}) {
    for (std::istringstream in(shim); !in.eof();) {
      std::string line;
      std::getline(in, line);
      if (line.find(hidden) != std::string::npos && line.find(" UND ") == std::string::npos) {
        ADD_FAILURE() << "the shim exports " << line;
      }
    }
  }
}

}  // namespace
}  // namespace cxlpool
