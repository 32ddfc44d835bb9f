#include "lifecycle.h"

#include <utility>

#include "cxlpool/common/log.h"

namespace cxlpool {

void Lifecycle::Started(std::string name, Hooks hooks) {
  CXLPOOL_LOG(kDebug) << "started: " << name;
  components_.push_back(Component{std::move(name), std::move(hooks)});
}

void Lifecycle::StopAll() {
  if (stop_done_) return;
  stop_done_ = true;
  for (auto it = components_.rbegin(); it != components_.rend(); ++it) {
    CXLPOOL_LOG(kDebug) << "stopping: " << it->name;
    if (it->hooks.stop) it->hooks.stop();
    stopped_.push_back(it->name);
  }
}

void Lifecycle::JoinAll() {
  if (join_done_) return;
  join_done_ = true;
  for (auto it = components_.rbegin(); it != components_.rend(); ++it) {
    if (it->hooks.join) it->hooks.join();
  }
}

std::vector<std::string> Lifecycle::started() const {
  std::vector<std::string> names;
  for (const auto& c : components_) names.push_back(c.name);
  return names;
}

}  // namespace cxlpool
