// PageCensus: where the kernel says a range of this process's memory is,
// asked with move_pages(2) and no target nodes (which only reports, never
// moves). The daemon takes one after moving a lease into a node's kernel
// zones and when a client reports that a lease moved; the client library
// takes one after it pinned a lease.
//
// Thread safety: CensusPages is reentrant; PageCensus is a value.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "cxlpool/common/status.h"

namespace cxlpool {

struct PageCensus {
  uint64_t sampled = 0;             // pages asked about
  std::map<int, uint64_t> on_node;  // node -> resident pages seen there
  uint64_t absent = 0;              // not resident (ENOENT) or not mapped (EFAULT)
  uint64_t errors = 0;              // any other per-page error

  uint64_t resident() const;
  // The node holding the most sampled pages (lowest id on ties); nullopt
  // when none is resident.
  std::optional<int> MajorityNode() const;
  // "node 0: 2048, node 1: 12 of 2060 pages" (absent pages named when any).
  std::string ToString() const;
};

// Asks where the pages of [addr, addr + len) are, one address per
// `page_size`: every page when there are at most `max_samples`, else
// `max_samples` addresses spread evenly from the first page to the last.
// Errors: INVALID_ARGUMENT (len or page_size 0), UNSUPPORTED (a kernel
// without NUMA: ENOSYS), IO (any other move_pages failure).
Result<PageCensus> CensusPages(const void* addr, uint64_t len, uint64_t page_size,
                               uint64_t max_samples = uint64_t{1} << 18);

}  // namespace cxlpool
