// Translation between the wire's protobuf messages and the daemon's types:
// each request's payload decoded into core values, each answer encoded as a
// reply frame. With translate_tiering.h, the only code that knows both
// sides; the handlers work on the values.
//
// Every Decode* answers PROTOCOL, prefixed with the message's name, when the
// payload is not a valid message of the request's type.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "lease/lease_manager.h"
#include "server/handler.h"

namespace cxlpool {

// ---- requests ----

// A request with no fields of its own (POOLS, TOPOLOGY, STATS, QUOTAS,
// METRICS): only checked to be valid.
Status DecodeEmpty(const Request& req);
// RELEASE, STAT and REVOKE: the lease they name.
Status DecodeLeaseId(const Request& req, uint64_t* id);
// LIST_LEASES: whether every tenant's leases are asked for.
Status DecodeListAll(const Request& req, bool* all);

struct HelloAsk {
  uint32_t min_version = 0;
  uint32_t max_version = 0;
  uint32_t max_fds_per_frame = 0;  // 0: the default
};
Status DecodeHello(const Request& req, HelloAsk* out);

// ALLOC: the request's fields as core parameters, numa_node as sent (see
// CheckAllocParams).
Status DecodeAlloc(const Request& req, AllocParams* out);
// INVALID_ARGUMENT for values out of range (a negative node).
Status CheckAllocParams(const AllocParams& p);

struct AttachAsk {
  std::string name;
  std::optional<uid_t> owner;
};
Status DecodeAttach(const Request& req, AttachAsk* out);

// QUOTA_SET's quota as sent; ToQuotaRule judges it.
struct QuotaSpec {
  std::string scope;
  std::string subject;
  std::string tier;
  uint64_t max_bytes = 0;
  uint64_t max_leases = 0;
  int32_t priority = 0;
};
Status DecodeQuotaSet(const Request& req, QuotaSpec* out);
// Scope "uid"/"gid"/"cgroup", subject a number or a name (looked up), a
// known tier and a priority in range.
Result<QuotaRule> ToQuotaRule(const QuotaSpec& q);

// LEASE_MOVED: what the holder saw.
struct MovedReport {
  uint64_t lease_id = 0;
  int32_t numa_node = 0;
  uint64_t pages_sampled = 0;
  uint64_t pages_on_node = 0;
  std::string cause;
};
Status DecodeLeaseMoved(const Request& req, MovedReport* out);

// RECLAIM: the leases kept across a restart, with their fds (duplicated) in
// the same order: one per extent of each (none listed: one). INVALID_ARGUMENT
// for too many extents, extents that do not add up to the lease's size, or
// an fd count that does not match (the pairing would be guesswork).
Status DecodeReclaim(const Request& req, std::vector<LeaseManager::ReclaimItem>* out);

// ---- replies ----

struct HelloAnswer {
  uint32_t version = 0;
  std::string server_version;
  std::string instance_id;
  bool in_grace_period = false;
  uint64_t max_frame_bytes = 0;
  uint32_t max_fds_per_frame = 0;
  uint64_t max_request_bytes = 0;
  bool is_admin = false;
};
Reply EncodeHelloReply(const HelloAnswer& a);

// An ALLOC_REPLY or ATTACH_REPLY for `g`: its extents listed (when it has
// several) and their fds on as many frames as the client takes per frame.
enum class GrantReply { kAlloc, kAttach };
Reply EncodeGrantReply(GrantReply kind, const Granted& g, size_t fds_per_frame,
                       uint32_t max_frame_bytes);

// Counters and gauges in the order they are set (a later key overrides).
struct StatsAnswer {
  std::vector<std::pair<std::string, uint64_t>> counters;
  std::vector<std::pair<std::string, uint64_t>> gauges;
};
Reply EncodeStatsReply(const StatsAnswer& a);

Reply EncodeReleaseReply();
Reply EncodeRevokeReply();
Reply EncodeQuotaSetReply();
Reply EncodeListLeasesReply(const std::vector<LeaseSnapshot>& leases);
Reply EncodeStatReply(const LeaseSnapshot& lease);
Reply EncodePoolsReply(const std::vector<PoolSnapshot>& pools);
Reply EncodeTopologyReply(const std::string& json);
Reply EncodeQuotasReply(const std::vector<QuotaUsage>& quotas);
Reply EncodeMetricsReply(const std::string& text);
Reply EncodeLeaseMovedReply(const LeaseSnapshot& lease, bool moved);
Reply EncodeReclaimReply(const LeaseManager::ReclaimOutcome& outcome);

// ---- events (server-initiated frames) ----

// LEASE_EVENT "revoked".
Reply EncodeRevokedEvent(uint64_t lease_id);
// LEASE_EVENT "moved": its pages are on `numa_node`, accounted to `pool`.
Reply EncodeMovedEvent(uint64_t lease_id, int numa_node, const std::string& pool);

}  // namespace cxlpool
