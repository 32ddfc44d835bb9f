#include "cxlpool/common/page_census.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace cxlpool {

uint64_t PageCensus::resident() const {
  uint64_t n = 0;
  for (const auto& [node, pages] : on_node) n += pages;
  return n;
}

std::optional<int> PageCensus::MajorityNode() const {
  std::optional<int> best;
  uint64_t best_pages = 0;
  for (const auto& [node, pages] : on_node) {  // ascending ids: ties keep the lowest
    if (pages > best_pages) {
      best = node;
      best_pages = pages;
    }
  }
  return best;
}

std::string PageCensus::ToString() const {
  std::string s;
  for (const auto& [node, pages] : on_node) {
    s += (s.empty() ? "" : ", ") + ("node " + std::to_string(node)) + ": " + std::to_string(pages);
  }
  if (s.empty()) s = "no resident page";
  s += " of " + std::to_string(sampled) + " pages sampled";
  if (absent > 0) s += " (" + std::to_string(absent) + " absent)";
  if (errors > 0) s += " (" + std::to_string(errors) + " unreadable)";
  return s;
}

Result<PageCensus> CensusPages(const void* addr, uint64_t len, uint64_t page_size,
                               uint64_t max_samples) {
  if (len == 0 || page_size == 0 || max_samples == 0) {
    return Status(Code::kInvalidArgument, "empty range or page size 0");
  }
  const uint64_t pages = (len + page_size - 1) / page_size;
  const uint64_t samples = pages < max_samples ? pages : max_samples;
  const auto base = reinterpret_cast<uintptr_t>(addr);
  PageCensus c;
  constexpr uint64_t kBatch = 4096;
  std::vector<void*> batch;
  std::vector<int> status;
  batch.reserve(kBatch);
  status.resize(kBatch);
  for (uint64_t i = 0; i < samples;) {
    batch.clear();
    for (; i < samples && batch.size() < kBatch; ++i) {
      // Spread evenly; with samples == pages this is every page.
      const uint64_t page = samples == 1 ? 0 : i * (pages - 1) / (samples - 1);
      batch.push_back(reinterpret_cast<void*>(base + page * page_size));
    }
    long rc = ::syscall(SYS_move_pages, 0, static_cast<unsigned long>(batch.size()), batch.data(),
                        nullptr, status.data(), 0);
    if (rc < 0) {
      int e = errno;
      if (e == ENOSYS) return Status(Code::kUnsupported, "move_pages: kernel without NUMA");
      return Status::FromErrno(e, "move_pages");
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      if (status[k] >= 0) {
        ++c.on_node[status[k]];
      } else if (status[k] == -ENOENT || status[k] == -EFAULT) {
        ++c.absent;
      } else {
        ++c.errors;
      }
    }
    c.sampled += batch.size();
  }
  return c;
}

}  // namespace cxlpool
