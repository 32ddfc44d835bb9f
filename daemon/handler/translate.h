// Translation between the wire's protobuf messages and the daemon core's
// types. This is the only file that knows both sides.
//
// Thread safety: pure functions.
#pragma once

#include "config/config.h"
#include "cxlpool.pb.h"
#include "lease/lease_manager.h"

namespace cxlpool {

void ToProto(const LeaseSnapshot& s, proto::LeaseInfo* out);
void ToProto(const PoolSnapshot& s, proto::PoolInfo* out);
void ToProto(const QuotaUsage& q, proto::Quota* out);

// The request's fields as core parameters. INVALID_ARGUMENT for values out
// of range (negative node, ...).
Result<AllocParams> FromProto(const proto::AllocRequest& req);
// A quota from QUOTA_SET: scope "uid"/"gid", subject a number or a name.
Result<QuotaRule> FromProto(const proto::Quota& q);

}  // namespace cxlpool
