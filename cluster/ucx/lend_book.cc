// See cxlpool/cluster/lend_book.h.
#include "cxlpool/cluster/lend_book.h"

#include <sys/random.h>

#include <cerrno>

namespace cxlpool::ucx {

namespace {

Status RandomToken(uint64_t out[2]) {
  uint8_t* p = reinterpret_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < 2 * sizeof(uint64_t)) {
    ssize_t n = ::getrandom(p + got, 2 * sizeof(uint64_t) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Compares capabilities without an early exit.
bool SameToken(const uint64_t a[2], const uint64_t b[2]) {
  return ((a[0] ^ b[0]) | (a[1] ^ b[1])) == 0;
}

}  // namespace

Result<LeaseRef> LendBook::Lend(void* memory, uint64_t length, const std::string& host,
                                uint32_t uid) {
  if (memory == nullptr || length == 0) {
    return Status(Code::kInvalidArgument, "cannot lend an empty range");
  }
  Lease l;
  l.memory = static_cast<uint8_t*>(memory);
  l.length = length;
  l.borrower = {host, uid};
  CXLPOOL_RETURN_IF_ERROR(RandomToken(l.token));
  LeaseRef ref;
  ref.length = length;
  ref.token[0] = l.token[0];
  ref.token[1] = l.token[1];
  MutexLock lock(mu_);
  ref.lease = next_id_++;
  leases_.emplace(ref.lease, std::move(l));
  return ref;
}

std::function<void()> LendBook::RevokeLocked(uint64_t id, std::function<void()> drained) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.revoked) return nullptr;
  if (it->second.in_flight == 0) {
    leases_.erase(it);
    return drained ? std::move(drained) : [] {};
  }
  it->second.revoked = true;
  it->second.drained = std::move(drained);
  return nullptr;
}

Status LendBook::Revoke(uint64_t lease, std::function<void()> drained) {
  std::function<void()> now;
  {
    MutexLock lock(mu_);
    auto it = leases_.find(lease);
    if (it == leases_.end() || it->second.revoked) {
      return Status(Code::kNotFound, "lease " + std::to_string(lease) + " is not lent");
    }
    now = RevokeLocked(lease, std::move(drained));
  }
  if (now) now();
  return Status::Ok();
}

size_t LendBook::RevokeHost(const std::string& host, const std::function<void(uint64_t)>& drained) {
  std::vector<std::function<void()>> now;
  size_t n = 0;
  {
    MutexLock lock(mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, l] : leases_) {
      if (l.borrower.first == host && !l.revoked) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      auto f = RevokeLocked(id, drained ? std::function<void()>([drained, id] { drained(id); })
                                        : std::function<void()>());
      if (f) now.push_back(std::move(f));
      ++n;
    }
  }
  for (auto& f : now) f();
  return n;
}

Result<Grant> LendBook::Check(const Access& a) {
  MutexLock lock(mu_);
  auto it = leases_.find(a.lease);
  // A revoked lease answers as one never lent: nothing tells a stale
  // capability from a forged one.
  if (it == leases_.end() || it->second.revoked) {
    return Status(Code::kNotFound, "lease " + std::to_string(a.lease) + " is not lent");
  }
  Lease& l = it->second;
  if (!SameToken(a.token, l.token)) {
    return Status(Code::kPermissionDenied, "wrong capability for lease " + std::to_string(a.lease));
  }
  if (a.length == 0 || a.offset > l.length || a.length > l.length - a.offset) {
    return Status(Code::kInvalidArgument, "range outside lease " + std::to_string(a.lease));
  }
  ++l.in_flight;
  ++in_flight_;
  const uint64_t id = a.lease;
  return Grant{l.memory + a.offset, [this, id] {
                 if (auto f = Finish(id)) f();
               }};
}

std::function<void()> LendBook::Finish(uint64_t id) {
  MutexLock lock(mu_);
  --in_flight_;
  auto it = leases_.find(id);
  if (it == leases_.end()) return nullptr;
  if (--it->second.in_flight > 0 || !it->second.revoked) return nullptr;
  std::function<void()> drained = std::move(it->second.drained);
  leases_.erase(it);
  return drained ? drained : [] {};
}

std::map<LendBook::Borrower, LendBook::Usage> LendBook::Lent() const {
  MutexLock lock(mu_);
  std::map<Borrower, Usage> out;
  for (const auto& [id, l] : leases_) {
    if (l.revoked) continue;
    Usage& u = out[l.borrower];
    u.bytes += l.length;
    ++u.leases;
  }
  return out;
}

uint64_t LendBook::in_flight() const {
  MutexLock lock(mu_);
  return in_flight_;
}

}  // namespace cxlpool::ucx
