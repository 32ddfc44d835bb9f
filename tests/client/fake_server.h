// FakeServer: a tiny in-test cxlpoold that speaks the wire protocol on one
// connection (a socketpair end, or the first client of a temp Unix socket),
// so the client library can be tested without the daemon.
//
// It answers hello, alloc (a fresh memfd of the page-rounded size), attach
// (a memfd per shared name), release and stat, and can be told to misbehave
// (wrong fd size, no fd, error replies, wrong request ids, another version)
// and to push LeaseEvents. It records every request it decodes.
//
// Thread safety: runs its own thread; the knobs and the record are guarded
// by a mutex, so the test may set and read them while the client runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool::testing {

class FakeServer {
 public:
  enum class Misbehave {
    kNone,
    kWrongFdSize,     // the alloc reply's memfd is one page short
    kNoFd,            // the alloc reply carries no fd
    kWrongRequestId,  // the next reply echoes another request id
    kCloseOnAlloc,    // hang up instead of answering an alloc
    kExtentFdShort,   // (with SetExtents) the last EXTENT_FDS frame lacks one fd
  };

  FakeServer() = default;
  ~FakeServer();

  // Serves one end of a socketpair; returns the client's end.
  UniqueFd StartPair();
  // Listens on `path` and serves the first client that connects.
  Status StartListening(const std::string& path);
  // Waits for the serving thread to end (the client hung up).
  void Join();
  // Like a daemon that died: closes the connection and the listening
  // socket (its path stays, so a reconnect is refused), and waits for the
  // serving thread.
  void HangUp();

  // Knobs.
  void SetHelloVersion(uint32_t v);
  // Allocs are answered as multi-extent leases (wire version 2): extents of
  // `granule` bytes plus a tail, at most `fds_per_frame` fds per frame.
  void SetExtents(uint64_t granule, size_t fds_per_frame);
  // The server's own fds of a lease's extents (valid while it lives).
  std::vector<int> extent_fds(uint64_t lease_id);
  void SetMisbehave(Misbehave m);
  // The next alloc is answered with this error.
  void FailNextAlloc(Code code, const std::string& message);
  // Pushes a LeaseEvent before the next reply.
  void PushBeforeNextReply(uint64_t lease_id, const std::string& event);
  // Pushes a LeaseEvent now.
  void PushNow(uint64_t lease_id, const std::string& event);

  // Record.
  std::vector<proto::AllocRequest> allocs();
  std::vector<uint64_t> releases();
  // Waits until a release came in; false when none did within `timeout`.
  bool WaitForRelease(std::chrono::milliseconds timeout);
  // Lease ids handed back with RECLAIM (each accepted, as a fresh holder).
  std::vector<uint64_t> reclaims();
  int live_leases();
  std::string hello_client_name();

 private:
  void Serve();
  void Handle(const proto::MsgType type, uint64_t request_id, const std::string& payload);
  void SendError(uint64_t request_id, Code code, const std::string& message);
  void Send(proto::MsgType type, uint64_t request_id, const std::string& payload,
            std::vector<int> fds = {});
  proto::LeaseInfo NewLease(uint64_t size, const std::string& name, int* fd_out);
  void SendExtentLease(uint64_t request_id, proto::LeaseInfo info);

  std::mutex mu_;
  std::condition_variable handled_;  // a request was handled
  UniqueFd listen_;
  UniqueFd sock_;
  std::thread thread_;
  uint32_t hello_version_ = 1;
  Misbehave misbehave_ = Misbehave::kNone;
  Code fail_code_ = Code::kOk;
  std::string fail_message_;
  std::vector<std::pair<uint64_t, std::string>> pending_events_;
  std::vector<proto::AllocRequest> allocs_;
  std::vector<uint64_t> releases_;
  std::vector<uint64_t> reclaims_;
  std::vector<UniqueFd> incoming_fds_;  // the fds of the frame being handled
  std::string hello_client_name_;
  uint64_t next_id_ = 100;
  uint64_t extent_granule_ = 0;
  size_t extent_fds_per_frame_ = 0;
  std::map<uint64_t, std::vector<UniqueFd>> extents_;  // multi-extent leases, by id
  std::map<uint64_t, UniqueFd> leases_;                // live, by id
  std::map<uint64_t, int> holders_;                    // holders per live lease
  std::map<std::string, uint64_t> names_;              // shared name -> lease id
};

}  // namespace cxlpool::testing
