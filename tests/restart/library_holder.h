// The libcxlpool side of a restart test's helper process (restart_util.h's
// Helper): a client connected to the daemon, reconnecting for up to 20 s
// after a restart, and one lease it filled with a pattern.
//
// Thread safety: none; one per helper process.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "cxlpool/client.hpp"
#include "kill_loop.h"

namespace cxlpool::restart {

struct LibraryHolder {
  std::optional<cxlpool::Client> client;
  std::optional<cxlpool::Lease> lease;

  // Connects to `socket`, allocates `size` bytes and fills them with
  // `pattern`: the lease's id, 0 when any step failed.
  uint64_t Allocate(const std::string& socket, uint64_t size, uint64_t pattern) {
    ::setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "20000", 1);
    auto c = cxlpool::Client::Connect(socket);
    if (!c.ok()) return 0;
    client.emplace(std::move(*c));
    cxlpool::AllocOptions o;
    o.size_bytes = size;
    auto l = client->Allocate(o);
    if (!l.ok()) return 0;
    lease.emplace(std::move(*l));
    testsupport::Fill(lease->data(), lease->size(), pattern);
    return lease->id();
  }
  // Whether every byte still holds `pattern` and the lease is not revoked.
  bool Intact(uint64_t pattern) const {
    return lease && testsupport::Intact(lease->data(), lease->size(), pattern) && !lease->revoked();
  }
};

}  // namespace cxlpool::restart
