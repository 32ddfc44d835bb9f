// `cxlpoolctl revoke ID [--json]` (admin): truncates a lease's memory. The
// holder's next access to the mapping gets SIGBUS (docs/daemon.md).
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

struct RevokeOptions {
  ConnOptions conn;
  uint64_t id = 0;
};

int RunRevoke(const RevokeOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("revoke", o.conn, &rc);
  if (!conn.ok()) return rc;
  proto::RevokeRequest req;
  req.set_lease_id(o.id);
  proto::RevokeReply rep;
  if (Status s = conn->Call(req, &rep); !s.ok()) return ReportError("revoke", s, false);
  if (o.conn.json) {
    std::cout << JsonText(nlohmann::ordered_json{{"revoked", o.id}}, -1) << "\n";
  } else {
    std::cout << "lease " << o.id << " revoked\n";
  }
  return kExitOk;
}

}  // namespace

Command MakeRevokeCommand() {
  return {"revoke", "Revoke a lease (admin): its memory is taken back at once",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<RevokeOptions>();
            // Checked as text first: CLI11 alone would read "-1" as 2^64-1.
            app->add_option("ID", o->id, "Lease id (see `cxlpoolctl leases`)")
                ->required()
                ->check(CLI::Validator(
                    [](std::string& text) -> std::string {
                      auto v = ParseU64(text);
                      if (v && *v > 0) return "";
                      return "lease id '" + text +
                             "' is not a whole number from 1 to 18446744073709551615";
                    },
                    "LEASE_ID"));
            AddConnOptions(app, &o->conn);
            return [o] { return RunRevoke(*o); };
          }};
}

}  // namespace cxlpool::ctl
