#include "pool/node_memory_watch.h"

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

namespace {

constexpr const char* kNodeDir = "/sys/devices/system/node";

bool IsMemfd(const Pool& pool) { return std::string(pool.backing()) == "memfd"; }

std::string Change(uint64_t from, uint64_t to) {
  return HumanBytes(from) + " -> " + HumanBytes(to);
}

}  // namespace

NodeMemoryWatch::NodeMemoryWatch(const FileSystem* fs, const Topology& topo) : fs_(fs) {
  for (const auto& node : topo.numa_nodes) {
    if (node.memory_bytes) nodes_[node.id].applied_total = *node.memory_bytes;
  }
}

Result<uint64_t> NodeMemoryWatch::ReadMemTotal(int node) const {
  std::string path = std::string(kNodeDir) + "/node" + std::to_string(node) + "/meminfo";
  // CONFIG_NUMA=n: topology discovery made node 0 of /proc/meminfo.
  if (node == 0 && !fs_->IsDir(kNodeDir)) path = "/proc/meminfo";
  auto text = fs_->ReadFile(path);
  if (!text.ok()) return text.status();
  auto info = ParseMeminfo(*text);
  auto total = info.find("MemTotal");
  if (total == info.end()) {
    return Status(Code::kInvalidArgument, path + ": no parsable MemTotal line");
  }
  return total->second;
}

std::optional<uint64_t> NodeMemoryWatch::applied_total(int node) const {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.applied_total;
}

MemoryWatchReport NodeMemoryWatch::Check(const PoolsConfig& config,
                                         const std::vector<Pool*>& pools) {
  MemoryWatchReport r;
  for (Pool* pool : pools) {
    if (!IsMemfd(*pool)) continue;
    int id = pool->numa_node();
    NodeState& st = nodes_[id];
    auto now = ReadMemTotal(id);
    if (!now.ok()) {
      if (!st.unreadable_warned) {
        r.warnings.push_back(pool->name() + ": cannot read MemTotal (" + now.status().ToString() +
                             "); capacity kept at " + HumanBytes(pool->capacity()));
        st.unreadable_warned = true;
      }
      continue;
    }
    st.unreadable_warned = false;
    if (st.applied_total == *now) continue;  // unchanged (or the change was applied)

    uint64_t was_total = st.applied_total.value_or(*now);
    uint64_t old_cap = pool->capacity();
    uint64_t cap = config.ForNode(id).capacity.Resolve(*now);
    std::string what = pool->name() + ": MemTotal " + Change(was_total, *now) + ", capacity ";
    if (cap == old_cap) {
      st.applied_total = *now;
      st.refusal_warned.reset();
      r.applied.push_back(what + HumanBytes(cap) + " unchanged");
    } else if (pool->SetCapacity(cap)) {
      st.applied_total = *now;
      st.refusal_warned.reset();
      r.applied.push_back(what + Change(old_cap, cap));
      r.resized = true;
      if (cap > old_cap) r.grew = true;
    } else if (st.refusal_warned != *now) {
      st.refusal_warned = *now;
      r.warnings.push_back(what + Change(old_cap, cap) +
                           " refused: " + HumanBytes(pool->used_bytes()) + " in use; kept " +
                           HumanBytes(old_cap) + " (retried on every check)");
    }
  }
  for (const auto& a : r.applied) CXLPOOL_LOG(kInfo) << a;
  for (const auto& w : r.warnings) CXLPOOL_LOG(kWarning) << w;
  return r;
}

bool NodeMemoryWatch::ApplyForReload(Pool* pool, const CapacitySpec& spec,
                                     std::vector<std::string>* applied,
                                     std::vector<std::string>* kept) {
  if (!IsMemfd(*pool)) return false;
  int id = pool->numa_node();
  NodeState& st = nodes_[id];
  std::optional<uint64_t> total = st.applied_total;
  auto now = ReadMemTotal(id);
  if (now.ok()) {
    total = *now;
  } else {
    kept->push_back(pool->name() + ": cannot read MemTotal (" + now.status().ToString() + ")" +
                    (total ? "; capacity resolved against the last known " + HumanBytes(*total)
                           : std::string("; capacity kept")));
  }
  if (!total) return false;
  std::string mem;
  if (st.applied_total && *st.applied_total != *total) {
    mem = " (MemTotal " + Change(*st.applied_total, *total) + ")";
  }
  uint64_t old_cap = pool->capacity();
  uint64_t cap = spec.Resolve(*total);
  if (cap == old_cap) {
    st.applied_total = *total;
    return false;
  }
  if (!pool->SetCapacity(cap)) {
    // A MemTotal change stays pending: the next Check retries it.
    kept->push_back(pool->name() + " capacity " + HumanBytes(cap) + " refused: " +
                    HumanBytes(pool->used_bytes()) + " in use; kept " + HumanBytes(old_cap) + mem);
    return false;
  }
  st.applied_total = *total;
  st.refusal_warned.reset();
  applied->push_back(pool->name() + " capacity " + Change(old_cap, cap) + mem);
  return true;
}

}  // namespace cxlpool
