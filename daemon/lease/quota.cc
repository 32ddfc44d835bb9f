#include "lease/quota.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "cxlpool/common/strings.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

namespace {

bool IsEmptyRule(const QuotaRule& r) {
  return r.max_bytes == 0 && r.max_leases == 0 && r.priority == 0;
}

std::string Describe(QuotaScope scope, const std::string& subject, const std::string& tier) {
  return std::string(QuotaScopeName(scope)) + " " + subject +
         (tier.empty() ? " (all tiers)" : " tier " + tier);
}

// "/a/b" -> {"/", "/a", "/a/b"}; "" -> {}.
std::vector<std::string> CgroupChain(const std::string& path) {
  std::vector<std::string> out;
  if (path.empty() || path[0] != '/') return out;
  out.push_back("/");
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (i > 1) out.push_back(path.substr(0, i));
    }
  }
  return out;
}

Status WriteAll(int fd, const std::string& text, const std::string& what) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + what);
    }
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return Status::Ok();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Status(Code::kInvalidArgument, dir + " is not a directory");
    return Status::Ok();
  }
  auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    CXLPOOL_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "create directory " + dir);
  }
  return Status::Ok();
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  CXLPOOL_RETURN_IF_ERROR(MakeDirs(dir));
  std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return Status::FromErrno(errno, "create " + tmp);
  Status st = WriteAll(fd.get(), text, tmp);
  if (st.ok() && ::fsync(fd.get()) != 0) st = Status::FromErrno(errno, "fsync " + tmp);
  fd.Reset();
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::FromErrno(errno, "rename " + tmp + " to " + path);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d || ::fsync(d.get()) != 0) return Status::FromErrno(errno, "fsync directory " + dir);
  return Status::Ok();
}

QuotaTable::QuotaTable(std::vector<QuotaRule> config_rules) {
  SetConfigRules(std::move(config_rules));
}

QuotaTable::Key QuotaTable::KeyOf(const QuotaRule& r) {
  std::string subject = r.scope == QuotaScope::kCgroup ? r.subject : std::to_string(r.id);
  return Key{static_cast<int>(r.scope), subject, r.tier};
}

void QuotaTable::SetConfigRules(std::vector<QuotaRule> rules) {
  config_.clear();
  for (auto& r : rules) {
    if (!IsEmptyRule(r)) config_[KeyOf(r)] = std::move(r);
  }
  Rebuild();
}

void QuotaTable::Rebuild() {
  rules_ = config_;
  for (const auto& [k, r] : live_) {
    if (IsEmptyRule(r)) {
      rules_.erase(k);
    } else {
      rules_[k] = r;
    }
  }
  priorities_.clear();
  for (const auto& [k, r] : rules_) {
    auto& p = priorities_[{std::get<0>(k), std::get<1>(k)}];
    p = std::max(p, r.priority);
  }
}

std::vector<QuotaRule> QuotaTable::LiveRules() const {
  std::vector<QuotaRule> out;
  for (const auto& [k, r] : live_) out.push_back(r);
  return out;
}

Status QuotaTable::OpenStore(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno != ENOENT) return Status::FromErrno(errno, "quota store " + path);
    store_path_ = path;
    live_.clear();
    Rebuild();
    return Status::Ok();
  }
  std::ostringstream os;
  os << in.rdbuf();
  auto rules = ParseQuotaRules(os.str(), path);
  if (!rules.ok()) return rules.status();
  store_path_ = path;
  live_.clear();
  for (auto& r : *rules) live_[KeyOf(r)] = std::move(r);
  Rebuild();
  return Status::Ok();
}

Status QuotaTable::SetLiveRule(const QuotaRule& rule) {
  if (rule.priority < 0 || rule.priority > kMaxPriority) {
    return Status(Code::kInvalidArgument, "priority " + std::to_string(rule.priority) +
                                              " out of range (0.." + std::to_string(kMaxPriority) +
                                              ")");
  }
  if (rule.scope == QuotaScope::kCgroup) {
    auto norm = NormalizeCgroupPath(rule.subject);
    if (!norm.ok()) return norm.status();
    if (*norm != rule.subject) {
      QuotaRule r = rule;
      r.subject = *norm;
      return SetLiveRule(r);
    }
  }
  std::map<Key, QuotaRule> next = live_;
  Key k = KeyOf(rule);
  // Deleting a rule that only exists live needs no tombstone.
  if (IsEmptyRule(rule) && !config_.count(k)) {
    next.erase(k);
  } else {
    next[k] = rule;
  }
  if (!store_path_.empty()) {
    std::vector<QuotaRule> list;
    for (const auto& [kk, r] : next) list.push_back(r);
    std::string text =
        "# Live quota changes (cxlpoolctl quota set), applied over the config file's\n"
        "# [[quota]] rules at start and on SIGHUP. Written by cxlpoold; delete this\n"
        "# file (and send SIGHUP) to drop them.\n" +
        QuotaRulesToToml(list);
    CXLPOOL_RETURN_IF_ERROR(WriteFileAtomically(store_path_, text));
  }
  live_ = std::move(next);
  Rebuild();
  return Status::Ok();
}

std::vector<std::pair<QuotaScope, std::string>> QuotaTable::Subjects(const Tenant& t) {
  std::vector<std::pair<QuotaScope, std::string>> out;
  out.emplace_back(QuotaScope::kUid, std::to_string(t.uid));
  out.emplace_back(QuotaScope::kGid, std::to_string(t.gid));
  for (auto& c : CgroupChain(t.cgroup)) out.emplace_back(QuotaScope::kCgroup, std::move(c));
  return out;
}

Status QuotaTable::CheckOne(QuotaScope scope, const std::string& subject, const std::string& tier,
                            uint64_t bytes) const {
  auto it = rules_.find(Key{static_cast<int>(scope), subject, tier});
  if (it == rules_.end()) return Status::Ok();
  const QuotaRule& r = it->second;
  auto [used_bytes, used_leases] = Usage(scope, subject, tier);
  std::string who = Describe(scope, r.subject, tier);
  if (r.max_bytes != 0 && used_bytes + bytes > r.max_bytes) {
    return Status(Code::kResourceExhausted,
                  "quota exceeded: " + who + " max_bytes " + HumanBytes(r.max_bytes) + ", used " +
                      HumanBytes(used_bytes) + ", requested " + HumanBytes(bytes));
  }
  if (r.max_leases != 0 && used_leases + 1 > r.max_leases) {
    return Status(Code::kResourceExhausted, "quota exceeded: " + who + " max_leases " +
                                                std::to_string(r.max_leases) + ", used " +
                                                std::to_string(used_leases));
  }
  return Status::Ok();
}

Status QuotaTable::Check(const Tenant& t, const std::string& tier, uint64_t bytes) const {
  if (rules_.empty()) return Status::Ok();
  auto subjects = Subjects(t);
  for (const std::string& tr : {tier, std::string()}) {
    for (const auto& [scope, subject] : subjects) {
      CXLPOOL_RETURN_IF_ERROR(CheckOne(scope, subject, tr, bytes));
    }
    if (tier.empty()) break;
  }
  return Status::Ok();
}

void QuotaTable::Add(QuotaScope scope, const std::string& subject, const std::string& tier,
                     uint64_t bytes, int sign, bool in_tier, bool in_total) {
  for (const std::string& t : {tier, std::string()}) {
    Key k{static_cast<int>(scope), subject, t};
    Used& u = used_[k];
    const uint64_t n = (t.empty() ? in_total : in_tier) ? 1 : 0;
    if (sign > 0) {
      u.bytes += bytes;
      u.leases += n;
    } else {
      CXLPOOL_CHECK(u.bytes >= bytes && u.leases >= n);
      u.bytes -= bytes;
      u.leases -= n;
      if (u.leases == 0 && u.bytes == 0) used_.erase(k);
    }
    if (tier.empty()) break;  // "" is both the tier and the total
  }
}

void QuotaTable::Charge(const Tenant& t, const std::string& tier, uint64_t bytes) {
  for (const auto& [scope, subject] : Subjects(t)) Add(scope, subject, tier, bytes, +1);
}

void QuotaTable::Uncharge(const Tenant& t, const std::string& tier, uint64_t bytes) {
  for (const auto& [scope, subject] : Subjects(t)) Add(scope, subject, tier, bytes, -1);
}

void QuotaTable::ChargePart(const Tenant& t, const std::string& tier, uint64_t bytes, bool in_tier,
                            bool in_total) {
  for (const auto& [scope, subject] : Subjects(t)) {
    Add(scope, subject, tier, bytes, +1, in_tier, in_total);
  }
}

void QuotaTable::UnchargePart(const Tenant& t, const std::string& tier, uint64_t bytes,
                              bool in_tier, bool in_total) {
  for (const auto& [scope, subject] : Subjects(t)) {
    Add(scope, subject, tier, bytes, -1, in_tier, in_total);
  }
}

int32_t QuotaTable::PriorityOf(const Tenant& t) const {
  int32_t best = 0;
  if (priorities_.empty()) return best;
  for (const auto& [scope, subject] : Subjects(t)) {
    auto it = priorities_.find({static_cast<int>(scope), subject});
    if (it != priorities_.end()) best = std::max(best, it->second);
  }
  return best;
}

void QuotaTable::SetReserves(std::map<int32_t, CapacitySpec> reserves) {
  reserves_ = std::move(reserves);
}

uint64_t QuotaTable::ReserveFor(int32_t priority, uint64_t capacity) const {
  uint64_t r = 0;
  for (auto it = reserves_.lower_bound(priority); it != reserves_.end(); ++it) {
    r = std::max(r, it->second.Resolve(capacity));
  }
  return r;
}

Status QuotaTable::CheckReserve(const Tenant& t, const std::string& pool, uint64_t capacity,
                                uint64_t committed, uint64_t bytes) const {
  if (reserves_.empty()) return Status::Ok();
  int32_t cls = PriorityOf(t);
  uint64_t reserve = ReserveFor(cls, capacity);
  if (reserve == 0) return Status::Ok();
  uint64_t room = capacity > committed ? capacity - committed : 0;
  uint64_t left = room > bytes ? room - bytes : 0;
  if (room >= bytes && left >= reserve) return Status::Ok();
  return Status(Code::kResourceExhausted, "priority: " + pool + " keeps " + HumanBytes(reserve) +
                                              " free for classes above " + std::to_string(cls) +
                                              " (uid " + std::to_string(t.uid) + " is class " +
                                              std::to_string(cls) + "); " + HumanBytes(room) +
                                              " uncommitted, requested " + HumanBytes(bytes));
}

std::pair<uint64_t, uint64_t> QuotaTable::Usage(QuotaScope scope, const std::string& subject,
                                                const std::string& tier) const {
  auto it = used_.find(Key{static_cast<int>(scope), subject, tier});
  if (it == used_.end()) return {0, 0};
  return {it->second.bytes, it->second.leases};
}

std::vector<QuotaUsage> QuotaTable::Rules() const {
  std::vector<QuotaUsage> out;
  for (const auto& [k, r] : rules_) {
    auto [b, n] = Usage(r.scope, std::get<1>(k), r.tier);
    out.push_back({r, b, n});
  }
  return out;
}

}  // namespace cxlpool
