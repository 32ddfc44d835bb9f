#include "netns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "test_support.h"

namespace cxlpool::testsupport {

namespace {

// Runs `cmd` (sh), UNSUPPORTED with its output when it fails.
Status Sh(const std::string& cmd) {
  auto [rc, out] = RunShell(cmd + " 2>&1");
  if (rc != 0) return Status(Code::kUnsupported, cmd + ": exit " + std::to_string(rc) + ": " + out);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<NetnsHost>> NetnsHost::Create(int index) {
  if (index < 0 || index > 63) return Status(Code::kInvalidArgument, "netns index 0..63");
  for (const char* tool : {"ip", "nsenter"}) {
    if (RunShell(std::string("command -v ") + tool + " >/dev/null").first != 0)
      return Status(Code::kUnsupported, std::string("no `") + tool + "` in $PATH");
  }
  std::unique_ptr<NetnsHost> h(new NetnsHost());
  CXLPOOL_RETURN_IF_ERROR(h->SetUp(index));
  return h;
}

Status NetnsHost::SetUp(int index) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe2");
  std::fflush(nullptr);
  holder_ = ::fork();
  if (holder_ < 0) return Status::FromErrno(errno, "fork");
  if (holder_ == 0) {
    ::close(p[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int err = ::unshare(CLONE_NEWNET) == 0 ? 0 : errno;
    (void)!::write(p[1], &err, sizeof err);
    ::close(p[1]);
    if (err != 0) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(p[1]);
  int err = -1;
  ssize_t n = ::read(p[0], &err, sizeof err);
  ::close(p[0]);
  if (n != sizeof err || err != 0) {
    return Status(Code::kUnsupported,
                  std::string("unshare(CLONE_NEWNET): ") +
                      (n == sizeof err ? std::strerror(err) : "the holder died"));
  }
  const std::string tag = std::to_string(::getpid() % 100000) + "-" + std::to_string(index);
  outer_ = "cxp" + tag + "a";
  inner_ = "cxp" + tag + "b";
  const std::string net = "10.231." + std::to_string(index) + ".";
  outer_ip_ = net + "1";
  inner_ip_ = net + "2";
  const std::string pid = std::to_string(holder_);
  CXLPOOL_RETURN_IF_ERROR(Sh("ip link add " + outer_ + " type veth peer name " + inner_));
  CXLPOOL_RETURN_IF_ERROR(Sh("ip link set " + inner_ + " netns " + pid));
  CXLPOOL_RETURN_IF_ERROR(Sh("ip addr add " + outer_ip_ + "/30 dev " + outer_));
  CXLPOOL_RETURN_IF_ERROR(Sh("ip link set " + outer_ + " up"));
  const std::string in = "nsenter -t " + pid + " -n ";
  CXLPOOL_RETURN_IF_ERROR(Sh(in + "ip link set lo up"));
  CXLPOOL_RETURN_IF_ERROR(Sh(in + "ip addr add " + inner_ip_ + "/30 dev " + inner_));
  CXLPOOL_RETURN_IF_ERROR(Sh(in + "ip link set " + inner_ + " up"));
  return Status::Ok();
}

NetnsHost::~NetnsHost() {
  if (!outer_.empty()) RunShell("ip link del " + outer_ + " >/dev/null 2>&1");
  if (holder_ > 0) {
    ::kill(holder_, SIGKILL);
    ::waitpid(holder_, nullptr, 0);
  }
}

std::vector<std::string> NetnsHost::Prefix() const {
  return {"nsenter", "-t", std::to_string(holder_), "-n", "--"};
}

Status NetnsHost::Partition() { return Sh("ip link set " + outer_ + " down"); }
Status NetnsHost::Heal() { return Sh("ip link set " + outer_ + " up"); }

std::pair<int, std::string> NetnsHost::RunInside(const std::string& cmd) const {
  return RunShell("nsenter -t " + std::to_string(holder_) + " -n sh -c '" + cmd + "' 2>&1");
}

}  // namespace cxlpool::testsupport
