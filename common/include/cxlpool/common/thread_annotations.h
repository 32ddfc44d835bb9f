// Clang thread-safety annotations, and a mutex that carries them.
//
// libstdc++'s std::mutex is not annotated, so state guarded by one cannot be
// checked. Guarded state uses cxlpool::Mutex and cxlpool::MutexLock instead;
// clang builds with -Wthread-safety (CMakeLists.txt) then prove at compile
// time that every GUARDED_BY member is touched with its mutex held and every
// REQUIRES function is called with it. With GCC the annotations are empty.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define CXLPOOL_TSA(x) __attribute__((x))
#else
#define CXLPOOL_TSA(x)
#endif

#define CAPABILITY(x) CXLPOOL_TSA(capability(x))
#define SCOPED_CAPABILITY CXLPOOL_TSA(scoped_lockable)
#define GUARDED_BY(x) CXLPOOL_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) CXLPOOL_TSA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) CXLPOOL_TSA(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) CXLPOOL_TSA(acquired_after(__VA_ARGS__))
#define REQUIRES(...) CXLPOOL_TSA(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) CXLPOOL_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CXLPOOL_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) CXLPOOL_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) CXLPOOL_TSA(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) CXLPOOL_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) CXLPOOL_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS CXLPOOL_TSA(no_thread_safety_analysis)

namespace cxlpool {

// A std::mutex the analysis knows. Lockable, so std::scoped_lock works too,
// but MutexLock is what the analysis follows through a scope.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (a callback run under the lock).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for a scope. It can be released and taken again inside the
// scope (Unlock/Lock), and waits on a condition variable with it held: the
// wait gives the mutex up while it sleeps, as std::condition_variable does.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

  // Callers loop on their guarded condition around these, so the analysis
  // sees every read of guarded state under the lock.
  void Wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <class Clock, class Duration>
  std::cv_status WaitUntil(std::condition_variable& cv,
                           const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv.wait_until(lock_, deadline);
  }
  template <class Rep, class Period>
  std::cv_status WaitFor(std::condition_variable& cv,
                         const std::chrono::duration<Rep, Period>& timeout) {
    return cv.wait_for(lock_, timeout);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace cxlpool
