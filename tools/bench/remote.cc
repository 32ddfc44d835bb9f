// Remote access figures (issue 40) on the UCX seam, against UCX's own
// ucx_perftest (Debian's ucx-utils) on the same transport in the same run:
//
//   R1: checked write and read bandwidth of 1, 16 and 64 MiB (each access a
//       request the lender's check answers, rendezvous into or out of the
//       lent memory; one access at a time) against ucx_perftest's ucp_put_bw
//       and ucp_get bandwidth for the same size.
//   R2: a 4 KiB checked read's p50 against ucx_perftest ucp_get's p50.
// (R3, a remote lease's request to first byte, needs the daemons to lend;
// it is not measured yet.)
//
// Transports: UCX's environment; unset, tcp on loopback (UCX_TLS=tcp,
// UCX_NET_DEVICES=lo), the transport of a rack without RDMA. The lender is
// a thread of this process progressing its own worker, as ucx_perftest's
// server is a process progressing its own.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "bench.h"
#include "cxlpool/cluster/ucx_transfer.h"

namespace cxlpool::bench {

namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{30000};

std::string Transports() {
  if (std::getenv("UCX_TLS") == nullptr) {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);
  }
  const char* d = std::getenv("UCX_NET_DEVICES");
  return std::string("UCX_TLS=") + std::getenv("UCX_TLS") +
         (d ? std::string(" UCX_NET_DEVICES=") + d : "");
}

// A loopback TCP port free now (ucx_perftest's rendezvous port).
int FreePort() {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (s >= 0) ::close(s);
  return port;
}

struct PerftestResult {
  double p50_us = 0;
  double mbps = 0;  // overall bandwidth, MB/s (10^6)
};

// One ucx_perftest run: a server child, then the client; parses the
// client's "Final:" line (iterations, overhead p50/avg/overall in us,
// bandwidth avg/overall in MB/s, message rate avg/overall).
Result<PerftestResult> Perftest(const std::string& test, uint64_t size, int iters, int warmup) {
  const int port = FreePort();
  if (port < 0) return Status(Code::kIo, "no free loopback port");
  const std::string p = std::to_string(port);
  pid_t server = ::fork();
  if (server < 0) return Status::FromErrno(errno, "fork");
  if (server == 0) {
    int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execlp("ucx_perftest", "ucx_perftest", "-p", p.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string cmd = "ucx_perftest 127.0.0.1 -p " + p + " -t " + test + " -s " +
                    std::to_string(size) + " -n " + std::to_string(iters) + " -w " +
                    std::to_string(warmup) + " 2>&1";
  std::string out;
  for (int attempt = 0; attempt < 50 && out.find("Final:") == std::string::npos; ++attempt) {
    ::usleep(100000);  // the server listens
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) break;
    out.clear();
    char buf[512];
    while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
    ::pclose(f);
    if (out.find("Final:") == std::string::npos && out.find("onnect") == std::string::npos) break;
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  size_t at = out.find("Final:");
  if (at == std::string::npos) {
    return Status(Code::kUnavailable, "ucx_perftest " + test + " gave no result: " +
                                          out.substr(0, std::min<size_t>(out.size(), 300)));
  }
  std::istringstream in(out.substr(at + 6));
  double n, p50, avg, overall, bw_avg, bw_overall;
  if (!(in >> n >> p50 >> avg >> overall >> bw_avg >> bw_overall)) {
    return Status(Code::kProtocol, "cannot parse ucx_perftest's Final line");
  }
  return PerftestResult{p50, bw_overall};
}

// The lender: a worker serving one lease of `bytes`, progressed by a thread.
class Lender {
 public:
  Status Start(uint64_t bytes) {
    auto w = ucx::Worker::Create();
    if (!w.ok()) return w.status();
    worker_ = std::move(w.value());
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap");
    mem_ = static_cast<uint8_t*>(p);
    bytes_ = bytes;
    CXLPOOL_RETURN_IF_ERROR(worker_->Serve([this](const ucx::Access& a) -> Result<ucx::Grant> {
      if (a.lease != 1 || a.token[0] != kToken || a.offset > bytes_ || a.length > bytes_ - a.offset)
        return Status(Code::kPermissionDenied, "refused");
      return ucx::Grant{mem_ + a.offset, nullptr};
    }));
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) worker_->Progress();
    });
    return Status::Ok();
  }
  ~Lender() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    worker_.reset();
    if (mem_ != nullptr) ::munmap(mem_, bytes_);
  }
  ucx::LeaseRef Ref() const {
    ucx::LeaseRef r;
    r.lease = 1;
    r.length = bytes_;
    r.token[0] = kToken;
    return r;
  }
  const std::string& address() const { return worker_->address(); }

 private:
  static constexpr uint64_t kToken = 0x5eed;
  std::unique_ptr<ucx::Worker> worker_;
  uint8_t* mem_ = nullptr;
  uint64_t bytes_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string SizeName(uint64_t s) { return std::to_string(s >> 20) + " MiB"; }

}  // namespace

void RunRemote(const Options& o, Report* r) {
  const std::string tls = Transports();
  const std::vector<uint64_t> sizes = o.quick
                                          ? std::vector<uint64_t>{1u << 20}
                                          : std::vector<uint64_t>{1u << 20, 16u << 20, 64u << 20};
  const char* r2_metric = "4 KiB checked read p50";
  if (::system("command -v ucx_perftest > /dev/null 2>&1") != 0) {
    r->Skip("R1", "checked write bandwidth", "ucx_perftest not installed (ucx-utils)");
    r->Skip("R2", r2_metric, "ucx_perftest not installed (ucx-utils)");
    return;
  }
  auto iters_for = [&](uint64_t size) {
    return std::max<int>(4, static_cast<int>((o.quick ? (64u << 20) : (1024u << 20)) / size));
  };
  const int n = o.quick ? 500 : 10000;
  // The baselines first, alone on the CPUs (the lender below spins one).
  struct Base {
    Result<PerftestResult> put, get, am;
  };
  std::map<uint64_t, Base> base;
  for (uint64_t size : sizes) {
    const int iters = iters_for(size);
    base.emplace(size,
                 Base{Perftest("ucp_put_bw", size, iters, 2), Perftest("ucp_get", size, iters, 2),
                      Perftest("ucp_am_bw", size, iters, 2)});
  }
  auto base_lat = Perftest("ucp_get", 4096, n, 100);
  auto base_am_lat = Perftest("ucp_am_lat", 4096, n, 100);

  Lender lender;
  Status st = lender.Start(64u << 20);
  std::unique_ptr<ucx::Worker> borrower;
  std::unique_ptr<ucx::Endpoint> ep;
  if (st.ok()) {
    auto w = ucx::Worker::Create();
    if (w.ok()) {
      borrower = std::move(w.value());
      auto e = borrower->Connect(lender.address(), "bench-lender");
      if (e.ok()) {
        ep = std::move(e.value());
      } else {
        st = e.status();
      }
    } else {
      st = w.status();
    }
  }
  if (!st.ok()) {
    r->Skip("R1", "checked write bandwidth", st.ToString());
    r->Skip("R2", r2_metric, st.ToString());
    return;
  }
  std::vector<uint8_t> buf(64u << 20, 0x5a);
  auto access = [&](bool write, uint64_t size, uint64_t offset) {
    return write ? ep->WriteChecked(buf.data(), size, lender.Ref(), offset, kTimeout)
                 : ep->ReadChecked(buf.data(), size, lender.Ref(), offset, kTimeout);
  };

  for (uint64_t size : sizes) {
    const int iters = iters_for(size);
    for (bool write : {true, false}) {
      const std::string metric =
          std::string("checked ") + (write ? "write " : "read ") + SizeName(size) + " bandwidth";
      const Result<PerftestResult>& b = write ? base.at(size).put : base.at(size).get;
      Status w = access(write, size, 0);  // warm: rendezvous, pages
      const uint64_t t0 = NowNs();
      for (int i = 0; i < iters && w.ok(); ++i) w = access(write, size, 0);
      const double secs = static_cast<double>(NowNs() - t0) / 1e9;
      if (!w.ok()) {
        r->Skip("R1", metric, w.ToString());
        continue;
      }
      if (!b.ok()) {
        r->Skip("R1", metric, b.status().ToString());
        continue;
      }
      const double mbps = static_cast<double>(size) * iters / secs / 1e6;
      const char* test = write ? "ucp_put_bw" : "ucp_get";
      r->Add(MeasuredRow("R1", metric, mbps, b->mbps, "MB/s", "ge", 0.9,
                         "n=" + std::to_string(iters) +
                             ", one access at a time; baseline: " + "ucx_perftest -t " + test +
                             " -s " + std::to_string(size) + " (overall, its RMA); " + tls));
      if (write && base.at(size).am.ok()) {
        r->Add(MeasuredRow("R1", "checked write " + SizeName(size) + " vs UCX active messages",
                           mbps, base.at(size).am->mbps, "MB/s", "", 0,
                           "baseline: ucx_perftest -t ucp_am_bw, the mechanism checked access "
                           "rides on"));
      }
    }
  }

  // R2: 4 KiB reads, one at a time; the first 100 warm up.
  Stats lat;
  Status rs;
  for (int i = 0; i < n + 100 && rs.ok(); ++i) {
    const uint64_t t0 = NowNs();
    rs = access(false, 4096, 8192);
    if (i >= 100) lat.Add(NowNs() - t0);
  }
  if (!rs.ok()) {
    r->Skip("R2", r2_metric, rs.ToString());
  } else if (!base_lat.ok()) {
    r->Skip("R2", r2_metric, base_lat.status().ToString());
  } else {
    r->Add(MeasuredRow(
        "R2", r2_metric, lat.MedianUs(), base_lat->p50_us, "us", "le", 1.2,
        "n=" + std::to_string(n) + "; baseline: ucx_perftest -t ucp_get -s 4096, p50; " + tls));
  }
  if (rs.ok() && base_am_lat.ok()) {
    // ucx_perftest's latency tests report half a round trip.
    r->Add(MeasuredRow("R2", "4 KiB checked read p50 vs an active-message round trip",
                       lat.MedianUs(), 2 * base_am_lat->p50_us, "us", "", 0,
                       "baseline: 2 x ucx_perftest -t ucp_am_lat -s 4096 p50 (a request and "
                       "its reply, what a checked read is)"));
  }
}

}  // namespace cxlpool::bench
