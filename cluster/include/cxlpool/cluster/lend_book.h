// LendBook: a lender's record of the memory it lent to other hosts, and the
// AccessCheck (ucx_transfer.h) that answers their checked accesses.
//
// Each lent lease gets a fresh 128-bit capability (getrandom) that the
// borrower must present with every access; an access is granted only inside
// the lease, and only while it is lent. Revoke stops new accesses at once
// and calls back when the accesses in flight have finished, so the memory
// is recycled only after the last byte moved: a revoked capability, like a
// forged one, reaches nothing. What is lent is counted per borrowing host
// and tenant.
//
// Thread safety: every method from any thread (the check runs on the UCX
// worker's thread, Lend and Revoke on the daemon's); callbacks run without
// the lock held, on the thread that finished the last access or revoked.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "cxlpool/cluster/ucx_transfer.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool::ucx {

class LendBook {
 public:
  struct Usage {
    uint64_t bytes = 0;
    uint32_t leases = 0;
  };
  using Borrower = std::pair<std::string, uint32_t>;  // host, tenant uid

  // Lends [memory, memory + length) to `host`'s tenant `uid`: the LeaseRef
  // to hand to the borrower (over the authenticated control channel).
  Result<LeaseRef> Lend(void* memory, uint64_t length, const std::string& host, uint32_t uid);
  // No access to `lease` from now on; `drained` runs once those in flight
  // have finished (at once when none). NOT_FOUND when it is not lent.
  Status Revoke(uint64_t lease, std::function<void()> drained);
  // Revokes every lease of `host` (its session expired, it went away);
  // `drained(lease)` for each. How many.
  size_t RevokeHost(const std::string& host, const std::function<void(uint64_t)>& drained);

  // The check for Worker::Serve.
  Result<Grant> Check(const Access& a);
  AccessCheck Checker() {
    return [this](const Access& a) { return Check(a); };
  }

  std::map<Borrower, Usage> Lent() const;
  // Accesses granted and not finished, over all leases.
  uint64_t in_flight() const;

 private:
  struct Lease {
    uint8_t* memory = nullptr;
    uint64_t length = 0;
    uint64_t token[2] = {0, 0};
    Borrower borrower;
    uint64_t in_flight = 0;
    bool revoked = false;
    std::function<void()> drained;
  };
  // Done with one access of `id`: the drained callback when it was the last
  // of a revoked lease (returned, to be run without the lock).
  std::function<void()> Finish(uint64_t id);
  std::function<void()> RevokeLocked(uint64_t id, std::function<void()> drained) REQUIRES(mu_);

  mutable Mutex mu_;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  uint64_t in_flight_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Lease> leases_ GUARDED_BY(mu_);
};

}  // namespace cxlpool::ucx
