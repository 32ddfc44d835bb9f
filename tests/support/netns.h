// NetnsHost: a network namespace joined to this one by a veth pair, so a
// test can run a daemon as a "host" of its own and partition it by taking
// the link down (issue 39's partitions).
//
// Create(i) forks a holder process that unshares its network namespace and
// waits; the namespace lives as long as the holder. The veth's outer end
// (here) gets 10.231.<i>.1/30 and its inner end (in the namespace)
// 10.231.<i>.2/30; loopback is brought up inside. Commands run inside with
// Prefix() (nsenter -t <holder> -n --), which execs the command itself, so a
// daemon started that way keeps its pid.
//
// UNSUPPORTED (with the reason) when namespaces or veths cannot be made
// here: no CAP_SYS_ADMIN/CAP_NET_ADMIN, no `ip` or `nsenter`. Tests exit 77
// on it.
//
// The destructor deletes the veth (both ends go) and SIGKILLs the holder.
//
// Thread safety: none; one owner.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool::testsupport {

class NetnsHost {
 public:
  // `index` 0..63: the subnet and the interface names ("cxp<pid>-<i>").
  static Result<std::unique_ptr<NetnsHost>> Create(int index);
  ~NetnsHost();
  NetnsHost(const NetnsHost&) = delete;
  NetnsHost& operator=(const NetnsHost&) = delete;

  const std::string& outer_ip() const { return outer_ip_; }  // this namespace's end
  const std::string& inner_ip() const { return inner_ip_; }
  pid_t holder() const { return holder_; }
  // Prepended to a command to run it inside the namespace.
  std::vector<std::string> Prefix() const;

  // The link down (a partition: nothing crosses) / up again.
  Status Partition();
  Status Heal();

  // `sh -c cmd` inside the namespace; its exit code and output (2>&1).
  std::pair<int, std::string> RunInside(const std::string& cmd) const;

 private:
  NetnsHost() = default;
  Status SetUp(int index);
  pid_t holder_ = -1;
  std::string outer_;  // veth end here
  std::string inner_;  // veth end inside
  std::string outer_ip_, inner_ip_;
};

}  // namespace cxlpool::testsupport
