// vm.shared-pair: two QEMU guests share one memory-backend file as a devdax
// device and each runs a cxlpoold of one etcd cluster (issue 39). This test
// starts the etcd cluster (3 members on loopback, TLS; the certificates also
// name 10.0.2.2, where the guests reach them through QEMU user networking),
// runs tests/vm/run-pair-vm.sh, which boots both guests and judges their
// checks (topologies/shared-pair.sh), then reads the cluster back: both hosts
// left cleanly, so every slice is free and nothing is quarantined.
//
// Exits 77 (ctest: skipped) when etcd, QEMU, the kernel package or a binary
// is missing, or with CXLPOOL_VM_SKIP=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "etcd_cluster.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::EtcdCluster;
using testsupport::EtcdClusterOptions;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

TEST(VmSharedPair, TwoGuestsShareOneDeviceBySlices) {
  if (Env("CXLPOOL_VM_SKIP") == "1") testsupport::Skip("CXLPOOL_VM_SKIP=1");
  const std::string src = Env("CXLPOOL_SOURCE_DIR");
  const std::string bin = Env("CXLPOOL_BINARY_DIR");
  ASSERT_FALSE(src.empty() || bin.empty()) << "CXLPOOL_SOURCE_DIR and CXLPOOL_BINARY_DIR";

  EtcdClusterOptions o;
  o.extra_cert_ips = {"10.0.2.2"};
  // Two TCG guests take both of a small machine's cores: slower raft timing
  // keeps the leader where it is.
  o.heartbeat_ms = 250;
  o.election_ms = 2500;
  o.start_timeout_ms = 60000;
  auto etcd = EtcdCluster::Start(o);
  if (!etcd.ok() && etcd.status().code() == Code::kUnsupported)
    testsupport::Skip(etcd.status().message());
  ASSERT_TRUE(etcd.ok()) << etcd.status().message();
  const EtcdCluster& e = **etcd;

  const std::string certs = e.dir() + "/certs";
  const std::string cmd = src + "/tests/vm/run-pair-vm.sh --build-dir " + bin + " --etcd " +
                          e.endpoints_csv() + " --etcd-certs " + certs + " 2>&1";
  auto [rc, out] = testsupport::RunShell(cmd);
  std::cout << out;
  if (rc == 77) testsupport::Skip("run-pair-vm.sh: prerequisites missing (see above)");
  ASSERT_EQ(rc, 0) << "run-pair-vm.sh failed; etcd logs:\n" << e.LogTails(10);

  // Both guests' daemons exited cleanly: their records are gone and every
  // slice went back (released, never quarantined).
  auto [ctl_rc, view_text] = testsupport::RunShell(
      testsupport::CtlBinary() + " cluster --json --etcd " + e.endpoints_csv() + " --etcd-ca " +
      e.ca_file() + " --etcd-cert " + e.client_cert_file() + " --etcd-key " + e.client_key_file());
  ASSERT_EQ(ctl_rc, 0) << view_text;
  auto view = nlohmann::json::parse(view_text, nullptr, false);
  ASSERT_FALSE(view.is_discarded()) << view_text;
  EXPECT_TRUE(view["hosts"].empty()) << view_text;
  EXPECT_TRUE(view["quarantined"].empty()) << view_text;
  EXPECT_TRUE(view["invalid_records"].empty()) << view_text;
  ASSERT_EQ(view["shared_devices"].size(), 1u) << view_text;
  const auto& dev = view["shared_devices"][0];
  EXPECT_EQ(dev["id"], "vm-pair");
  EXPECT_EQ(dev["owned"], 0) << view_text;
  EXPECT_EQ(dev["free"], dev["slices"]) << view_text;
}

}  // namespace
}  // namespace cxlpool
