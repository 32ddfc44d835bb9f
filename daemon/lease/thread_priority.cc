#include "lease/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <latch>
#include <mutex>
#include <string>

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

Status SetPoolNice(boost::asio::thread_pool& pool, unsigned threads, int nice) {
  // Every task blocks until all have started, so each thread takes exactly
  // one of them.
  std::latch started(threads);
  std::latch finished(threads);
  std::mutex mu;
  Status first = Status::Ok();
  for (unsigned i = 0; i < threads; ++i) {
    boost::asio::post(pool, [&] {
      Status st = SetThreadNice(nice);
      {
        std::lock_guard<std::mutex> lock(mu);
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
