// cxlpool-bench: measures cxlpool against its baselines in the same run and
// prints each figure as a ratio with its goal (issue 5, docs/benchmarks.md).
//
//   cxlpool-bench [--only P1,P3] [--quick] [--json] [--node N]
//                 [--max-size BYTES] [--mix-count N]
//                 [--daemon PATH | --socket PATH]
//
// By default every figure spawns its own cxlpoold (the one next to this
// binary in the build tree) on a temp socket with a temp config; --socket
// uses a running daemon instead (figures that need a particular daemon
// configuration say so and are skipped or measured as configured).
//
// Exit: 0 when the run completed (goals met or not; see the verdicts),
// 1 when it cannot run on this machine (no such node), 2 on a usage error
// (the same table as cxlpoolctl's).
#include <signal.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "bench.h"
#include "cxlpool/common/version.h"

namespace {

using cxlpool::bench::Options;
using cxlpool::bench::Report;

void OnSignal(int sig) {
  cxlpool::bench::KillAllChildren();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::string DefaultDaemon() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "cxlpoold";
  std::filesystem::path dir = self.parent_path();
  for (const auto& cand : {dir / "cxlpoold", dir / ".." / ".." / "daemon" / "cxlpoold"}) {
    if (::access(cand.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(cand, ec);
  }
  return (dir / ".." / ".." / "daemon" / "cxlpoold").lexically_normal();
}

std::string MachineLine(int node) {
  auto mi = cxlpool::bench::NodeMeminfo(node);
  std::string total = mi.ok() && mi->count("MemTotal")
                          ? cxlpool::bench::HumanSize(mi->at("MemTotal") / (1 << 20) << 20)
                          : "?";
  return "machine: " + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " CPUs, node " +
         std::to_string(node) + " MemTotal " + total + ", shmem THP " +
         cxlpool::bench::ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled") +
         ", free 2 MiB hugepages " +
         cxlpool::bench::ReadFirstLine("/sys/devices/system/node/node" + std::to_string(node) +
                                       "/hugepages/hugepages-2048kB/free_hugepages") +
         ", vm.max_map_count " + cxlpool::bench::ReadFirstLine("/proc/sys/vm/max_map_count") +
         ", loadavg at start " + cxlpool::bench::ReadFirstLine("/proc/loadavg") +
         " (other work on the CPUs, even at nice 19, delays wake-ups by up to a scheduler slice "
         "and skews the latency ratios)";
}

struct Fig {
  const char* id;
  void (*run)(const Options&, Report*);
};
// The figures, in the order they run; one a line.
// clang-format off
const Fig kFigs[] = {{"P1", cxlpool::bench::RunP1},
                    {"P1u", cxlpool::bench::RunP1u},
                    {"P2", cxlpool::bench::RunP2},
                    {"P2any", cxlpool::bench::RunP2Any},
                    {"P2_4k", cxlpool::bench::RunP2Small},
                    {"P2cold", cxlpool::bench::RunP2Cold},
                    {"P3", cxlpool::bench::RunP3},
                    {"P4", cxlpool::bench::RunP4},
                    {"P5", cxlpool::bench::RunP5},
                    {"P6", cxlpool::bench::RunP6},
                    {"P7", cxlpool::bench::RunP7},
                    {"ladder", cxlpool::bench::RunLadder},
                    {"recycle", cxlpool::bench::RunRecycle},
                    {"recycled", cxlpool::bench::RunRecycled},
                    {"tier", cxlpool::bench::RunTier},
                    {"C1", cxlpool::bench::RunC1},
                    {"C2", cxlpool::bench::RunC2},
                    {"C3", cxlpool::bench::RunC3},
                    {"C4", cxlpool::bench::RunC4},
                    {"R", cxlpool::bench::RunRemote}};
// clang-format on

// Fills o->only from --only's comma-separated figure ids (any case); false,
// after saying why, on an unknown one.
bool SelectFigures(const std::string& only, Options* o) {
  std::string known;
  for (const Fig& f : kFigs) known += std::string(known.empty() ? "" : ", ") + f.id;
  if (only.empty()) return true;
  size_t start = 0;
  while (start <= only.size()) {
    size_t comma = only.find(',', start);
    std::string p =
        only.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const Fig* hit = nullptr;
    for (const Fig& f : kFigs) {
      if (::strcasecmp(f.id, p.c_str()) == 0) hit = &f;
    }
    if (hit == nullptr) {
      std::fprintf(stderr, "cxlpool-bench: --only: unknown figure '%s' (%s)\n", p.c_str(),
                   known.c_str());
      return false;
    }
    o->only.push_back(hit->id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The UCX seam (R1, R2) brings libucm, which patches mmap, munmap and
  // madvise as the process loads it unless UCX_MEM_MMAP_HOOK_MODE=none
  // (read at load, so set here and started again): no figure should time
  // its memory calls through those hooks. ucx_perftest, the R baselines,
  // inherits the same setting.
  if (std::getenv("UCX_MEM_MMAP_HOOK_MODE") == nullptr) {
    ::setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
    ::execv("/proc/self/exe", argv);
    std::perror("cxlpool-bench: re-exec with UCX_MEM_MMAP_HOOK_MODE=none");  // and go on
  }
  Options o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  std::string only;
  CLI::App app{"cxlpool-bench: cxlpool against its baselines, as ratios with goals"};
  app.set_version_flag("--version", cxlpool::VersionLine("cxlpool-bench"),
                       "Print the version and exit");
  app.add_option("--only", only,
                 "comma-separated figures to run (P1, P1u, P2, P2any, P2_4k, P2cold, P3..P7, "
                 "ladder, recycle, recycled, tier, C1..C4, R; any case); default all");
  app.add_flag("--quick", o.quick, "small sizes and few samples (smoke test)");
  app.add_flag("--json", o.json, "print one JSON document instead of the table");
  app.add_option("--node", o.node, "NUMA node to lease from and bind baselines to")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-size", o.max_size,
                 "largest request of the P2any/P2_4k/P2cold mixes in bytes (default 2 GiB, "
                 "--quick 256 MiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--mix-count", o.mix_count,
                 "number of requests in those mixes (default 200, --quick 24)")
      ->check(CLI::PositiveNumber);
  auto* d = app.add_option("--daemon", o.daemon_path, "cxlpoold binary to spawn");
  app.add_option("--socket", o.socket, "use the daemon running on this socket")->excludes(d);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!SelectFigures(only, &o)) return 2;
  if (o.spawn() && o.daemon_path.empty()) o.daemon_path = DefaultDaemon();
  rlimit ml{};
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_MEMLOCK, &ml) == 0 && ml.rlim_max != RLIM_INFINITY &&
      ml.rlim_max < (2ull << 30)) {
    o.pin = false;
  }
  if (::access(("/sys/devices/system/node/node" + std::to_string(o.node)).c_str(), F_OK) != 0) {
    std::fprintf(stderr, "cxlpool-bench: no NUMA node %d on this machine\n", o.node);
    return 1;
  }
  std::atexit(cxlpool::bench::KillAllChildren);
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGPIPE, SIG_IGN);

  Report report;
  report.notes.push_back(MachineLine(o.node));
  if (o.spawn()) report.notes.push_back("daemon: " + o.daemon_path);
  if (o.spawn() && !o.pin) {
    report.notes.push_back(
        "spawned daemons run with pools.pin = false: not root and "
        "RLIMIT_MEMLOCK is too small to pin leases");
  }
  for (const Fig& f : kFigs) {
    if (!o.Wants(f.id)) continue;
    std::fprintf(stderr, "cxlpool-bench: running %s ...\n", f.id);
    uint64_t t0 = cxlpool::bench::NowNs();
    f.run(o, &report);
    std::fprintf(stderr, "cxlpool-bench: %s took %.1f s\n", f.id,
                 static_cast<double>(cxlpool::bench::NowNs() - t0) / 1e9);
  }
  if (o.json) {
    std::cout << report.Json(o) << std::endl;
  } else {
    std::cout << report.Table();
  }
  return 0;
}
