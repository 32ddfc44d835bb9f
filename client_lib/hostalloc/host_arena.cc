// HostArena: see host_arena.h.
#include "host_arena.h"

#include <algorithm>
#include <utility>

namespace cxlpool::hostalloc {

namespace {

uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) / align * align; }

}  // namespace

HostArena::HostArena(Client client, ArenaOptions options)
    : options_([&] {
        ArenaOptions o = std::move(options);
        if (o.align == 0 || (o.align & (o.align - 1)) != 0) o.align = 512;
        if (o.slab_bytes < o.small_max) o.slab_bytes = o.small_max;
        if (o.keep_empty_slabs < 0) o.keep_empty_slabs = 0;
        return o;
      }()),
      client_(std::move(client)) {}

HostArena::~HostArena() {
  MutexLock l(mu_);
  large_.clear();
  small_.clear();
  slabs_.clear();
}

ClientResult<Lease> HostArena::NewLease(uint64_t size, int device, const char* what) {
  AllocOptions o;
  o.size_bytes = size;
  o.near_gpu = device;
  o.tier_preference = options_.tier_preference;
  o.label = options_.label + ":" + what;
  // Registered below: a long-term pin, never placed where it moves the pages.
  o.long_term_pin = options_.cuda_register;
  if (device >= 0 && device < kMaxDevices && unknown_gpu_[device].load()) o.near_gpu = -1;
  ClientResult<Lease> lease = client_.Allocate(o);
  if (!lease.ok() && lease.status().code() == ErrorCode::kNotFound && o.near_gpu >= 0) {
    // The daemon does not see this GPU (no NVML where it runs): place the
    // lease without the hint from now on; registration still uses `device`.
    if (device < kMaxDevices) unknown_gpu_[device].store(true);
    o.near_gpu = -1;
    lease = client_.Allocate(o);
  }
  if (!lease.ok()) return lease;
  if (options_.cuda_register && device >= 0) {
    ClientStatus reg = lease->CudaRegister(device);
    if (!reg.ok() && options_.require_registration) {
      (void)lease->Release();
      return ClientStatus(reg.code(), "CUDA registration on device " + std::to_string(device) +
                                          " failed: " + reg.message());
    }
  }
  return lease;
}

bool HostArena::TakeRange(Slab* s, uint64_t length, uint64_t* offset) {
  for (auto it = s->free.begin(); it != s->free.end(); ++it) {
    if (it->second < length) continue;
    *offset = it->first;
    uint64_t rest = it->second - length;
    uint64_t next = it->first + length;
    s->free.erase(it);
    if (rest > 0) s->free.emplace(next, rest);
    s->used += length;
    return true;
  }
  return false;
}

void HostArena::ReturnRange(Slab* s, uint64_t offset, uint64_t length) {
  s->used -= length;
  auto [it, inserted] = s->free.emplace(offset, length);
  (void)inserted;
  // Merge with the following range, then with the preceding one.
  auto next = std::next(it);
  if (next != s->free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    s->free.erase(next);
  }
  if (it != s->free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      s->free.erase(it);
    }
  }
}

void* HostArena::CarveLocked(uint64_t length, uint64_t requested, int device) {
  for (auto& s : slabs_) {
    if (s->device != device) continue;
    uint64_t off = 0;
    if (!TakeRange(s.get(), length, &off)) continue;
    void* p = static_cast<char*>(s->lease.data()) + off;
    small_[p] = SmallBlock{s.get(), off, length, requested};
    requested_bytes_ += requested;
    ++allocations_;
    return p;
  }
  return nullptr;
}

ClientResult<void*> HostArena::Allocate(uint64_t size, int device) {
  if (size == 0) return ClientStatus(ErrorCode::kInvalidArgument, "size 0");
  if (size >= options_.small_max) {
    ClientResult<Lease> lease = NewLease(size, device, "block");
    MutexLock l(mu_);
    if (!lease.ok()) {
      ++failures_;
      return lease.status();
    }
    void* p = lease->data();
    requested_bytes_ += size;
    ++allocations_;
    large_.emplace(p, LargeBlock{std::move(*lease), size});
    return p;
  }
  uint64_t length = RoundUp(size, options_.align);
  {
    MutexLock l(mu_);
    if (void* p = CarveLocked(length, size, device)) return p;
  }
  // No room: a new slab (outside the lock), then carve from it.
  ClientResult<Lease> lease = NewLease(options_.slab_bytes, device, "slab");
  MutexLock l(mu_);
  if (!lease.ok()) {
    // Another thread may have added a slab meanwhile.
    if (void* p = CarveLocked(length, size, device)) return p;
    ++failures_;
    return lease.status();
  }
  auto s = std::make_unique<Slab>();
  s->device = device;
  s->free.emplace(0, lease->size());
  s->lease = std::move(*lease);
  slabs_.push_back(std::move(s));
  // Newest first, so that carving prefers it over fragmented older slabs.
  std::rotate(slabs_.rbegin(), slabs_.rbegin() + 1, slabs_.rend());
  void* p = CarveLocked(length, size, device);
  if (p == nullptr) {
    ++failures_;
    return ClientStatus(ErrorCode::kInternal, "a fresh slab could not hold the block");
  }
  return p;
}

bool HostArena::Free(void* ptr) {
  Lease to_release;
  {
    MutexLock l(mu_);
    if (auto it = large_.find(ptr); it != large_.end()) {
      requested_bytes_ -= it->second.requested;
      to_release = std::move(it->second.lease);
      large_.erase(it);
    } else if (auto st = small_.find(ptr); st != small_.end()) {
      SmallBlock b = st->second;
      small_.erase(st);
      requested_bytes_ -= b.requested;
      ReturnRange(b.slab, b.offset, b.length);
      if (b.slab->used == 0) {
        int empty = 0;
        for (const auto& s : slabs_) {
          if (s->device == b.slab->device && s->used == 0) ++empty;
        }
        if (empty > options_.keep_empty_slabs) {
          auto slab = std::find_if(slabs_.begin(), slabs_.end(),
                                   [&](const auto& s) { return s.get() == b.slab; });
          to_release = std::move((*slab)->lease);
          slabs_.erase(slab);
        }
      }
    } else {
      return false;
    }
  }
  if (to_release.valid()) (void)to_release.Release();
  return true;
}

bool HostArena::Owns(const void* ptr) const {
  MutexLock l(mu_);
  return large_.count(ptr) != 0 || small_.count(ptr) != 0;
}

uint64_t HostArena::LeaseIdOf(const void* ptr) const {
  MutexLock l(mu_);
  if (auto it = large_.find(ptr); it != large_.end()) return it->second.lease.id();
  if (auto it = small_.find(ptr); it != small_.end()) return it->second.slab->lease.id();
  return 0;
}

void HostArena::ReleaseEmptySlabs() {
  std::vector<Lease> out;
  {
    MutexLock l(mu_);
    for (auto it = slabs_.begin(); it != slabs_.end();) {
      if ((*it)->used == 0) {
        out.push_back(std::move((*it)->lease));
        it = slabs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Lease& lease : out) (void)lease.Release();
}

ArenaStats HostArena::stats() const {
  MutexLock l(mu_);
  ArenaStats s;
  s.requested_bytes = requested_bytes_;
  for (const auto& [p, b] : large_) s.leased_bytes += b.lease.size();
  for (const auto& slab : slabs_) s.leased_bytes += slab->lease.size();
  s.large_leases = large_.size();
  s.slabs = slabs_.size();
  s.small_blocks = small_.size();
  s.allocations = allocations_;
  s.failures = failures_;
  return s;
}

}  // namespace cxlpool::hostalloc
