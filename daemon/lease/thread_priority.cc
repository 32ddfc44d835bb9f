#include "lease/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <latch>
#include <string>

#include "cxlpool/common/thread_annotations.h"

namespace cxlpool {
namespace {

id_t ThisThread() { return static_cast<id_t>(::syscall(SYS_gettid)); }

}  // namespace

Status SetThreadNice(int nice) {
  if (nice < -20 || nice > 19) {
    return Status(Code::kInvalidArgument, "nice " + std::to_string(nice) + " is not in -20..19");
  }
  if (::setpriority(PRIO_PROCESS, ThisThread(), nice) != 0) {
    return Status::FromErrno(errno, "setpriority(thread, " + std::to_string(nice) + ")");
  }
  return Status::Ok();
}

Result<int> ThreadNice() {
  errno = 0;
  int n = ::getpriority(PRIO_PROCESS, ThisThread());
  if (n == -1 && errno != 0) return Status::FromErrno(errno, "getpriority(thread)");
  return n;
}

Status SetThreadIdle(bool idle) {
  struct sched_param p {};
  p.sched_priority = 0;
  int policy = idle ? SCHED_IDLE : SCHED_OTHER;
  if (::sched_setscheduler(static_cast<pid_t>(ThisThread()), policy, &p) != 0) {
    return Status::FromErrno(errno, std::string("sched_setscheduler(thread, ") +
                                        (idle ? "SCHED_IDLE" : "SCHED_OTHER") + ")");
  }
  return Status::Ok();
}

Result<bool> ThreadIsIdle() {
  int policy = ::sched_getscheduler(static_cast<pid_t>(ThisThread()));
  if (policy < 0) return Status::FromErrno(errno, "sched_getscheduler(thread)");
  return policy == SCHED_IDLE;
}

Status SetPoolPriority(boost::asio::thread_pool& pool, unsigned threads, int nice, bool idle,
                       const std::string& name) {
  if (name.empty() || name.size() > 15) {
    return Status(Code::kInvalidArgument,
                  "thread name '" + name + "' is not 1..15 characters (/proc comm)");
  }
  // Every task blocks until all have started, so each thread takes exactly
  // one of them.
  std::latch started(threads);
  std::latch finished(threads);
  Mutex mu;  // guards first
  Status first = Status::Ok();
  for (unsigned i = 0; i < threads; ++i) {
    boost::asio::post(pool, [&] {
      Status st = Status::Ok();
      if (int e = ::pthread_setname_np(::pthread_self(), name.c_str()); e != 0) {
        st = Status::FromErrno(e, "pthread_setname_np(" + name + ")");
      }
      if (st.ok()) st = SetThreadNice(nice);
      if (st.ok() && idle) st = SetThreadIdle(true);
      {
        MutexLock lock(mu);
        if (first.ok() && !st.ok()) first = st;
      }
      started.arrive_and_wait();
      finished.count_down();
    });
  }
  finished.wait();
  return first;
}

}  // namespace cxlpool
