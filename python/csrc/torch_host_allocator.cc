// _torch_host_allocator.so: PyTorch's CUDA host (pinned-memory) allocator
// served from cxlpool leases, for PyTorch 2.8 and later.
//
// PyTorch looks its pinned-memory allocator up with
// at::getHostAllocator(at::kCUDA): pin_memory(), torch.empty(...,
// pin_memory=True), the DataLoader's pin thread and the non_blocking copy
// path's record_event all go through it. cxlpool_torch_install() puts a
// LeaseHostAllocator there with at::setHostAllocator at a priority above
// the CUDA caching allocator's (0). Each allocation is a HostArena block
// (client_lib/hostalloc): an exact-size lease near the current CUDA device,
// registered with CUDA on it, or a piece of a slab lease for small
// requests. A block used by a stream (record_event) is freed once an event
// recorded on each such stream at free time has completed, as the caching
// allocator does; blocks are never cached beyond HostArena's one spare slab
// per device, so freed memory goes back to the pool.
//
// When the daemon refuses (quota, full pool, gone) the allocation falls back
// to the allocator that was installed before (PyTorch's own), logged once.
//
// The C interface below is what cxlpool/_torch_ext.py loads with ctypes; no
// Python headers are needed.
//
// Thread safety: PyTorch calls allocate/free/record_event from any thread;
// one mutex guards the stream and pending tables, HostArena has its own.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "host_arena.h"

namespace {

using cxlpool::hostalloc::ArenaOptions;
using cxlpool::hostalloc::HostArena;

int CurrentCudaDevice() {
  try {
    const c10::impl::DeviceGuardImplInterface* impl =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    return impl->getDevice().index();
  } catch (const std::exception&) {
    return -1;
  }
}

class LeaseHostAllocator final : public at::HostAllocator {
 public:
  LeaseHostAllocator(std::unique_ptr<HostArena> arena, at::HostAllocator* fallback)
      : arena_(std::move(arena)), fallback_(fallback) {}

  at::DataPtr allocate(size_t n) override {
    ProcessEvents();
    if (n == 0) return {nullptr, nullptr, &Deleter, at::DeviceType::CPU};
    int device = CurrentCudaDevice();
    cxlpool::ClientResult<void*> p = arena_->Allocate(n, device < 0 ? 0 : device);
    if (p.ok()) return {*p, *p, &Deleter, at::DeviceType::CPU};
    if (!said_fallback_.exchange(true)) {
      std::fprintf(stderr,
                   "cxlpool.torch: a pinned allocation of %zu bytes falls back to PyTorch's "
                   "allocator: %s (said once)\n",
                   n, p.status().ToString().c_str());
    }
    TORCH_CHECK(fallback_ != nullptr, "cxlpool pinned allocator: ", n,
                " bytes: ", p.status().ToString());
    return fallback_->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    if (ctx == nullptr || !arena_->Owns(ctx)) {
      return fallback_ != nullptr && fallback_->record_event(ptr, ctx, stream);
    }
    std::lock_guard<std::mutex> l(mu_);
    std::vector<c10::Stream>& s = streams_[ctx];
    for (const c10::Stream& have : s) {
      if (have == stream) return true;
    }
    s.push_back(stream);
    return true;
  }

  void empty_cache() override {
    ProcessEvents();
    arena_->ReleaseEmptySlabs();
    if (fallback_ != nullptr) fallback_->empty_cache();
  }

  at::HostStats get_stats() override { return at::HostStats{}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  void Free(void* ptr) {
    std::vector<c10::Event> events;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = streams_.find(ptr);
      if (it != streams_.end()) {
        for (const c10::Stream& s : it->second) {
          c10::Event e(s.device_type());
          e.record(s);
          events.push_back(std::move(e));
        }
        streams_.erase(it);
      }
      if (!events.empty()) {
        pending_.push_back(Pending{ptr, std::move(events)});
        ++deferred_;
        return;
      }
    }
    arena_->Free(ptr);
  }

  // Frees the deferred blocks whose events have all completed.
  void ProcessEvents() {
    std::vector<void*> ready;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        bool done = true;
        for (const c10::Event& e : it->events) done = done && e.query();
        if (done) {
          ready.push_back(it->ptr);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (void* p : ready) arena_->Free(p);
  }

  HostArena& arena() { return *arena_; }
  uint64_t deferred() {
    std::lock_guard<std::mutex> l(mu_);
    return deferred_;
  }

  static void Deleter(void* ctx);

 private:
  struct Pending {
    void* ptr;
    std::vector<c10::Event> events;
  };
  std::unique_ptr<HostArena> arena_;
  at::HostAllocator* fallback_;
  std::atomic<bool> said_fallback_{false};
  std::mutex mu_;
  std::unordered_map<void*, std::vector<c10::Stream>> streams_;
  std::vector<Pending> pending_;
  uint64_t deferred_ = 0;
};

// Never destroyed: pinned tensors are freed during interpreter teardown,
// after this library's static destructors would have run.
std::mutex g_install_mu;
std::atomic<LeaseHostAllocator*> g_allocator{nullptr};

void LeaseHostAllocator::Deleter(void* ctx) {
  if (ctx == nullptr) return;
  LeaseHostAllocator* a = g_allocator.load(std::memory_order_acquire);
  if (a != nullptr) a->Free(ctx);
}

// at::setHostAllocator takes the allocator itself in PyTorch 2.8 and 2.9,
// and a function returning it in later versions.
template <typename A, typename = void>
struct TakesPointer : std::false_type {};
template <typename A>
struct TakesPointer<A, std::void_t<decltype(at::setHostAllocator(at::kCUDA, std::declval<A*>(),
                                                                 std::declval<uint8_t>()))>>
    : std::true_type {};

template <typename A>
void Install(A* allocator, uint8_t priority) {
  if constexpr (TakesPointer<A>::value) {
    at::setHostAllocator(at::kCUDA, allocator, priority);
  } else {
    at::setHostAllocator(
        at::kCUDA, [allocator]() -> at::HostAllocator* { return allocator; }, priority);
  }
}

void SetError(char* err, size_t len, const std::string& what) {
  if (err == nullptr || len == 0) return;
  std::snprintf(err, len, "%s", what.c_str());
}

}  // namespace

#define CXLPOOL_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// Connects to the daemon and installs the allocator (once; later calls
// return 0). Returns 0 or a negative CXLPOOL_E* code with `err` filled.
CXLPOOL_TORCH_EXPORT int cxlpool_torch_install(const char* socket, uint64_t small_max,
                                               uint64_t slab_bytes, int priority, char* err,
                                               size_t err_len) {
  std::lock_guard<std::mutex> l(g_install_mu);
  if (g_allocator.load() != nullptr) return 0;
  if (priority < 1 || priority > 255) {
    SetError(err, err_len, "priority must be 1..255 (PyTorch's own allocator has 0)");
    return CXLPOOL_EINVALID_ARGUMENT;
  }
  cxlpool::ClientResult<cxlpool::Client> c =
      cxlpool::Client::Connect(socket != nullptr ? socket : "");
  if (!c.ok()) {
    SetError(err, err_len, c.status().message());
    return c.status().c_error();
  }
  ArenaOptions o;
  o.small_max = small_max;
  o.slab_bytes = slab_bytes;
  o.label = "torch-pinned";
  o.cuda_register = true;
  o.require_registration = true;
  at::HostAllocator* previous = nullptr;
  try {
    previous = at::getHostAllocator(at::kCUDA);
  } catch (const std::exception&) {
    previous = nullptr;
  }
  auto* a = new LeaseHostAllocator(std::make_unique<HostArena>(std::move(*c), o), previous);
  try {
    Install(a, static_cast<uint8_t>(priority));
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("at::setHostAllocator: ") + e.what());
    return CXLPOOL_EINTERNAL;
  }
  if (at::getHostAllocator(at::kCUDA) != a) {
    SetError(err, err_len, "an allocator of a higher priority is already installed");
    return CXLPOOL_EALREADY_EXISTS;
  }
  g_allocator.store(a, std::memory_order_release);
  return 0;
}

CXLPOOL_TORCH_EXPORT int cxlpool_torch_installed() { return g_allocator.load() != nullptr; }

// requested_bytes, leased_bytes, large_leases, slabs, small_blocks,
// allocations, failures, deferred_frees: the first n of them.
CXLPOOL_TORCH_EXPORT int cxlpool_torch_stats(uint64_t* out, int n) {
  LeaseHostAllocator* a = g_allocator.load();
  if (a == nullptr || out == nullptr) return 0;
  cxlpool::hostalloc::ArenaStats s = a->arena().stats();
  const uint64_t v[] = {s.requested_bytes, s.leased_bytes, s.large_leases, s.slabs,
                        s.small_blocks,    s.allocations,  s.failures,     a->deferred()};
  int k = 0;
  for (; k < n && k < static_cast<int>(sizeof(v) / sizeof(v[0])); ++k) out[k] = v[k];
  return k;
}

// The lease id behind a pinned pointer this allocator handed out, else 0.
CXLPOOL_TORCH_EXPORT uint64_t cxlpool_torch_lease_id(const void* ptr) {
  LeaseHostAllocator* a = g_allocator.load();
  return a == nullptr ? 0 : a->arena().LeaseIdOf(ptr);
}
