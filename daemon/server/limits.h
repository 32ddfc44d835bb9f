// ServerLimits: every bound the server puts on what its clients may make the
// daemon hold (connections, requests in flight, queued reply bytes, fds,
// request size, time), and FairShare, the per-uid accounting that enforces a
// whole-daemon limit, a per-uid limit and a reserve for uids holding none.
//
// Each limit has a config key, `limits.<name>` (docs/daemon.md has the
// table); the server names that key in every refusal, log line and metric
// (cxlpool_limit_hits_total{limit="<name>"}).
//
// Thread safety: ServerLimits is a value. FairShare is single-owner (the
// server's event-loop thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "cxlpool/common/status.h"

namespace cxlpool {

struct ServerLimits {
  // Connections. A uid with none may use the last `reserved_connections`
  // slots; a uid that has some may not.
  uint64_t max_connections = 1024;
  uint64_t max_connections_per_uid = 256;
  uint64_t reserved_connections = 64;

  // Requests handed to the handler and not answered yet. One counts against
  // its uid until the daemon answers it, also after its connection closed
  // (an ALLOC's build runs on). Per connection: backpressure (the server
  // stops reading it); per uid and in all: refused with RESOURCE_EXHAUSTED.
  uint64_t max_requests = 1024;
  uint64_t max_requests_per_uid = 256;
  uint64_t max_requests_per_connection = 64;

  // Reply bytes the daemon holds because a client does not read its socket
  // (each queued frame costs its size plus kFrameOverhead). A connection
  // whose replies are queued is not read from until they drain. Beyond a
  // limit the connection with the largest queue (of that uid, or of the
  // daemon) is dropped with an error that names the limit.
  uint64_t max_queued_bytes = 64ull << 20;
  uint64_t max_queued_bytes_per_uid = 16ull << 20;
  uint64_t max_queued_bytes_per_connection = 4ull << 20;

  // Fds the server holds for clients: fds that arrived with a request not
  // yet handled (a frame still being read included) and reply fds waiting
  // in send queues. An fd over a limit is closed as it arrives; its frame is
  // refused and the connection dropped.
  uint64_t max_fds = 2048;
  uint64_t max_fds_per_uid = 512;
  uint64_t max_fds_per_frame = 64;  // RECLAIM only; <= wire::kHardMaxFdsPerFrame

  // Largest request payload (replies may be up to max_frame_bytes).
  uint64_t max_request_bytes = 64ull << 10;

  // Time. hello: from accept to a successful HELLO. idle: after HELLO, with
  // no lease held, nothing in flight and nothing queued (0: never). frame: a
  // frame's first byte to its last. send: queued replies not taken by the
  // client (0: never).
  std::chrono::milliseconds hello_timeout{30000};
  std::chrono::milliseconds idle_timeout{600000};
  std::chrono::milliseconds frame_timeout{5000};
  std::chrono::milliseconds send_timeout{30000};

  // CPU. Daemon time (loop and workers) a uid's requests may take per
  // second while a uid with less than half its recent busy time is active
  // (server/busy_budget.h): beyond it that uid's sockets are not read and
  // its builds wait, until its bucket refills (0: never throttled).
  std::chrono::milliseconds max_busy_per_uid{250};

  // Defaults for a daemon whose RLIMIT_NOFILE is `nofile`: connections (2
  // fds each: socket and pidfd) take at most 1/8 of the fd table and fds in
  // transit 1/8, leaving 3/4 for leases. max_connections =
  // clamp(nofile/16, 16, 4096), max_fds = clamp(nofile/8, 64, 65536); the
  // per-uid limits are a quarter of those, the reserves 1/16.
  static ServerLimits ForFdLimit(uint64_t nofile);

  // Fds (of RLIMIT_NOFILE) these limits let connections and fds in transit
  // take: 2 * max_connections + max_fds.
  uint64_t FdsReserved() const;

  // INVALID_ARGUMENT naming the `limits.` key: a zero where a limit is
  // required, a per-uid limit above the whole-daemon one, a reserve not
  // below it, a per-connection queue smaller than one frame of
  // `max_frame_bytes`.
  Status Validate(uint64_t max_frame_bytes) const;
};

// Usage of one resource by uid against `total` (whole daemon), `per_uid` and
// `reserved`: the last `reserved` units of `total` go only to uids that hold
// none, so one heavy user never shuts a newcomer out.
class FairShare {
 public:
  enum class Verdict {
    kOk,
    kPerUid,   // the uid would hold more than per_uid
    kTotal,    // the daemon would hold more than total
    kReserve,  // only the reserve is left, and the uid already holds some
  };

  FairShare() = default;
  FairShare(uint64_t total, uint64_t per_uid, uint64_t reserved)
      : total_(total), per_uid_(per_uid), reserved_(reserved) {}

  Verdict Check(uid_t uid, uint64_t n) const;
  // The most `uid` may take now (Check(uid, n) is kOk for every n up to it).
  uint64_t Available(uid_t uid) const;
  void Add(uid_t uid, uint64_t n);
  void Sub(uid_t uid, uint64_t n);  // a broken count is a crash (CHECK)

  uint64_t used(uid_t uid) const;
  uint64_t used() const { return used_; }
  uint64_t total() const { return total_; }
  uint64_t per_uid() const { return per_uid_; }
  uint64_t reserved() const { return reserved_; }

 private:
  uint64_t total_ = UINT64_MAX, per_uid_ = UINT64_MAX, reserved_ = 0;
  uint64_t used_ = 0;
  std::unordered_map<uid_t, uint64_t> by_uid_;
};

// "limits.max_connections_per_uid" style names of a FairShare's limits, and
// the sentence a refused client reads, e.g. "uid 1000 holds 256 connections;
// limits.max_connections_per_uid is 256".
struct ShareNames {
  const char* total;     // "max_connections"
  const char* per_uid;   // "max_connections_per_uid"
  const char* reserved;  // "reserved_connections" (or the total's name)
  const char* unit;      // "connections"
};
// The limit's key (without "limits.") a verdict other than kOk names.
const char* LimitName(const ShareNames& names, FairShare::Verdict v);
std::string Explain(const FairShare& share, const ShareNames& names, FairShare::Verdict v,
                    uid_t uid, uint64_t n);

// What one queued frame costs against the queued-bytes limits beyond its
// bytes (the frame's own bookkeeping), so that many tiny frames count too.
inline constexpr uint64_t kFrameOverhead = 128;

}  // namespace cxlpool
