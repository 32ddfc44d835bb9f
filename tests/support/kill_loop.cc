#include "kill_loop.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace cxlpool::testsupport {

void Fill(void* m, uint64_t size, uint64_t tag) {
  auto* p = static_cast<uint8_t*>(m);
  for (uint64_t off = 0; off + sizeof tag <= size; off += 4096)
    std::memcpy(p + off, &tag, sizeof tag);
}

bool Intact(const void* m, uint64_t size, uint64_t tag) {
  auto* p = static_cast<const uint8_t*>(m);
  for (uint64_t off = 0; off + sizeof tag <= size; off += 4096) {
    if (std::memcmp(p + off, &tag, sizeof tag) != 0) return false;
  }
  return true;
}

pid_t Workers::Fork(const std::function<void()>& main) {
  std::fflush(nullptr);
  pid_t p = ::fork();
  if (p == 0) {
    main();
    std::_Exit(0);
  }
  pids_.push_back(p);
  return p;
}

std::string Workers::Exited(const std::function<std::string(int)>& describe) {
  for (int i = 0; i < size(); ++i) {
    pid_t& p = pids_[static_cast<size_t>(i)];
    int status = 0;
    if (p > 0 && ::waitpid(p, &status, WNOHANG) == p) {
      p = -1;
      return "worker exited: " + describe(i);
    }
  }
  return "";
}

std::string Workers::WaitAll(const std::function<bool(int)>& ready,
                             const std::function<std::string(int)>& describe, int limit_ms,
                             const std::string& timeout_message) {
  std::string exited;
  bool all = PollUntil(
      [&] {
        if (!(exited = Exited(describe)).empty()) return true;
        for (int i = 0; i < size(); ++i) {
          if (!ready(i)) return false;
        }
        return true;
      },
      limit_ms, 2);
  if (!exited.empty()) return exited;
  return all ? "" : timeout_message;
}

void Workers::KillAll() {
  for (pid_t& p : pids_) {
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      p = -1;
    }
  }
}

bool PollUntilAccountingAgrees(const std::string& socket, const std::string& name,
                               const std::function<void(const Accounting&, std::ostream&)>& check,
                               int limit_ms, std::string* last) {
  return PollUntil(
      [&] {
        auto admin = RawClient::Connect(socket, name);
        if (!admin.ok()) {
          *last = admin.status().ToString();
          return false;
        }
        if (admin->hello().in_grace_period()) {
          *last = "still in grace period";
          return false;
        }
        auto a = ReadAccounting(*admin);
        if (!a.ok()) {
          *last = a.status().ToString();
          return false;
        }
        std::ostringstream d;
        d << a->Inconsistencies();
        check(*a, d);
        *last = d.str();
        return last->empty();
      },
      limit_ms, 5);
}

void CompareLeases(const Accounting& a, const std::set<uint64_t>& held, std::ostream& out) {
  for (uint64_t id : held) {
    if (!a.leases.count(id)) out << "lease " << id << " lost; ";
  }
  for (const auto& [id, l] : a.leases) {
    if (!held.count(id)) out << "lease " << id << " listed but held by no worker; ";
  }
}

}  // namespace cxlpool::testsupport
