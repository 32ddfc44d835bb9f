// `cxlpoolctl alloc --size SIZE [--node N | --near-gpu G] [--tier KINDS]
//      [--strict] [--hugetlb] [--long-term-pin] [--label L] [--name NAME] [--hold]
//      [--json]`:
// an operator's test of a node. It leases memory through libcxlpool, writes
// every page, then asks the kernel (move_pages) where the pages really are.
// With --long-term-pin the lease is asked for as one that will be pinned
// long-term (never placed where a pin would move it), and the library's own
// check (Lease::Verify) runs too, so a move is reported to the daemon.
// With --hold it keeps the lease until SIGINT/SIGTERM.
#include <numaif.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

struct AllocCliOptions {
  ConnOptions conn;
  std::string size;
  int node = -1;
  std::string gpu;
  std::string tiers;
  bool strict = false;
  bool hugetlb = false;
  bool long_term_pin = false;
  bool hold = false;
  std::string label = "cxlpoolctl";
  std::string name;
};

// Node id -> page count, from move_pages(2) in query mode.
std::map<int, uint64_t> PagesByNode(void* data, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t n = size / page;
  const uint64_t step = n > 65536 ? n / 65536 : 1;  // sample big leases
  std::vector<void*> pages;
  for (uint64_t i = 0; i < n; i += step) pages.push_back(static_cast<char*>(data) + i * page);
  std::vector<int> status(pages.size(), -1);
  std::map<int, uint64_t> out;
  if (::move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0) return out;
  for (int s : status) out[s] += step;
  return out;
}

nlohmann::ordered_json VerifyJson(const std::optional<ClientResult<Placement>>& v) {
  if (!v) return nullptr;
  if (!v->ok()) return {{"error", v->status().ToString()}};
  const Placement& p = **v;
  return {{"numa_node", p.numa_node},
          {"placed_numa_node", p.placed_numa_node},
          {"moved", p.moved},
          {"pages_sampled", p.pages_sampled},
          {"pages_on_node", p.pages_on_node},
          {"pages_absent", p.pages_absent}};
}

std::string VerifyText(const ClientResult<Placement>& v) {
  if (!v.ok()) return "failed: " + v.status().ToString();
  const Placement& p = *v;
  std::string s = std::to_string(p.pages_on_node) + " of " + std::to_string(p.pages_sampled) +
                  " sampled pages on node " + std::to_string(p.numa_node);
  if (p.moved) {
    s += ", moved off node " + std::to_string(p.placed_numa_node) + " (the daemon was told)";
  }
  return s;
}

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int RunAlloc(const AllocCliOptions& o) {
  auto size = ParseByteSize(o.size);
  if (!size.ok() || *size == 0) {
    std::cerr << "cxlpoolctl alloc: --size: "
              << (size.ok() ? std::string("must be > 0") : size.status().message()) << "\n";
    return kExitUsage;
  }
  auto client = Client::Connect(ResolveSocketPath(o.conn.socket));
  if (!client.ok()) {
    std::cerr << "cxlpoolctl alloc: " << client.status().ToString() << "\n";
    std::string advice =
        ConnectAdvice(static_cast<Code>(client.status().code()), ResolveSocketPath(o.conn.socket));
    if (!advice.empty()) std::cerr << "  " << advice << "\n";
    return kExitUnavailable;
  }
  AllocOptions opts;
  opts.size_bytes = *size;
  opts.numa_node = o.node;
  if (!o.gpu.empty()) {
    auto idx = ParseI64(o.gpu);
    if (idx)
      opts.near_gpu = static_cast<int>(*idx);
    else
      opts.gpu = o.gpu;
  }
  if (!o.tiers.empty()) opts.tier_preference = Split(o.tiers, ',');
  opts.strict = o.strict;
  opts.hugetlb = o.hugetlb;
  opts.long_term_pin = o.long_term_pin;
  opts.label = o.label;
  opts.name = o.name;
  auto lease = client->Allocate(opts);
  if (!lease.ok()) {
    std::cerr << "cxlpoolctl alloc: " << lease.status().ToString() << "\n";
    return kExitFailure;
  }
  // Touch every page through the client's own mapping, then ask the kernel.
  std::memset(lease->data(), 0xa5, lease->size());
  auto where = PagesByNode(lease->data(), lease->size());
  std::optional<ClientResult<Placement>> verified;
  if (o.long_term_pin) verified = lease->Verify();
  const LeaseInfo& info = lease->info();
  if (o.conn.json) {
    nlohmann::ordered_json pages;
    for (auto [node, count] : where) pages[std::to_string(node)] = count;
    std::cout << JsonText(nlohmann::ordered_json{{"id", info.id},
                                                 {"size_bytes", info.size_bytes},
                                                 {"requested_bytes", info.requested_bytes},
                                                 {"numa_node", info.numa_node},
                                                 {"kind", info.kind},
                                                 {"pool", info.pool},
                                                 {"backing", info.backing},
                                                 {"page_size", info.page_size},
                                                 {"placement_reason", info.placement_reason},
                                                 {"pages_by_node", pages},
                                                 {"long_term_pin", info.long_term_pin},
                                                 {"verify", VerifyJson(verified)}},
                          -1)
              << std::endl;
  } else {
    std::cout << "lease " << info.id << ": " << HumanBytes(info.size_bytes) << " on node "
              << info.numa_node << " (" << info.kind << ", " << info.backing << ")\n"
              << "  why: " << info.placement_reason << "\n  pages (move_pages):";
    for (auto [node, count] : where) {
      std::cout << " "
                << (node < 0 ? "error " + std::to_string(node) : "node" + std::to_string(node))
                << "=" << count;
    }
    std::cout << std::endl;
    if (verified) std::cout << "  verify: " << VerifyText(*verified) << std::endl;
  }
  if (o.hold) {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    if (!o.conn.json) std::cout << "holding; send SIGINT or SIGTERM to release" << std::endl;
    while (!g_stop) {
      ::pause();
      (void)client->ProcessEvents();
      if (lease->revoked()) {
        std::cerr << "cxlpoolctl alloc: lease " << info.id << " was revoked\n";
        return kExitFailure;
      }
    }
  }
  ClientStatus rs = lease->Release();
  if (!rs.ok()) {
    std::cerr << "cxlpoolctl alloc: release: " << rs.ToString() << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command MakeAllocCommand() {
  return {"alloc", "Lease memory to test a node, and show where the kernel put its pages",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<AllocCliOptions>();
            app->add_option("--size", o->size, "Bytes, e.g. 1G, 64M")->required();
            auto* node = app->add_option("--node", o->node, "NUMA node");
            app->add_option("--near-gpu", o->gpu, "GPU index, uuid or PCI bus id")->excludes(node);
            app->add_option("--tier", o->tiers, "Node kinds in order, e.g. cxl,dram");
            app->add_flag("--strict", o->strict, "Refuse rather than fall back");
            app->add_flag("--hugetlb", o->hugetlb, "Ask for hugetlb backing");
            app->add_flag("--long-term-pin", o->long_term_pin,
                          "It will be pinned long-term (RDMA, io_uring, CUDA): never place it "
                          "where a pin moves it; verify its pages afterwards");
            app->add_option("--label", o->label, "Label shown by `cxlpoolctl leases`");
            app->add_option("--name", o->name, "Make it a shared named lease");
            app->add_flag("--hold", o->hold, "Keep the lease until SIGINT/SIGTERM");
            AddConnOptions(app, &o->conn);
            return [o] { return RunAlloc(*o); };
          }};
}

}  // namespace cxlpool::ctl
