// `cxlpoolctl topology [--json] [--sysfs-root DIR] [--no-nvml]`: discovers the
// node's memory topology (no daemon needed) and prints the human view or the
// stable JSON of docs/topology-json.md.
#include <sys/stat.h>

#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/topology/discover.h"
#include "cxlpool/topology/json.h"
#include "cxlpool/topology/render.h"
#include "daemon_client.h"

namespace cxlpool::ctl {
namespace {

struct TopologyOptions {
  ConnOptions conn;  // only --json: topology needs no daemon
  bool no_nvml = false;
  std::string sysfs_root;
};

int RunTopology(const TopologyOptions& o) {
  std::string root = o.sysfs_root.empty() ? FsRootFromEnv("/") : o.sysfs_root;
  struct stat st;
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::cerr << "cxlpoolctl topology: sysfs root '" << root << "' is not a directory\n";
    return kExitFailure;
  }
  auto fs = MakeRootedFileSystem(root);
  DiscoverOptions options;
  options.use_nvml = !o.no_nvml;
  Topology topo = DiscoverTopology(*fs, options);
  std::cout << (o.conn.json ? TopologyToJsonString(topo) : RenderTopologyText(topo));
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "cxlpoolctl topology: cannot write the output\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command MakeTopologyCommand() {
  return {"topology",
          "Show NUMA nodes, tiers, DAX/CXL devices, GPUs and the GPU x memory-node preference",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<TopologyOptions>();
            AddConnOptions(app, &o->conn);  // --json: the stable JSON (docs/topology-json.md)
            app->add_option("--sysfs-root", o->sysfs_root,
                            "Read /sys and /proc under DIR, a captured tree (default: "
                            "$CXLPOOL_FSROOT, else /). A foreign root never loads the "
                            "system NVML, only $CXLPOOL_NVML_LIBRARY.")
                ->type_name("DIR");
            app->add_flag("--no-nvml", o->no_nvml, "Do not load NVML; find GPUs by PCI scan");
            return [o] { return RunTopology(*o); };
          }};
}

}  // namespace cxlpool::ctl
