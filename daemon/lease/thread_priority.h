// Thread priority for the daemon's background threads: the warm reserve's
// refills run on their own boost::asio::thread_pool whose threads are
// reniced, so the work a client is waiting for wins the CPU over restocking.
//
// Linux keeps a nice value per thread (setpriority(PRIO_PROCESS, tid)).
// Raising it needs no privilege; lowering it below the current one needs
// CAP_SYS_NICE.
//
// Thread safety: SetThreadNice affects only the calling thread.
// LowerPoolPriority must not be called from one of the pool's own threads.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <string>

#include "cxlpool/common/status.h"

namespace cxlpool {

// Sets the calling thread's nice value (-20..19).
Status SetThreadNice(int nice);
// The calling thread's nice value, as the kernel reports it.
Result<int> ThreadNice();

// Puts the calling thread in SCHED_IDLE (idle = true) or back in
// SCHED_OTHER: an idle thread runs only when no other thread wants the CPU,
// and any waking normal thread preempts it. Needs no privilege.
Status SetThreadIdle(bool idle);
// True when the calling thread is SCHED_IDLE.
Result<bool> ThreadIsIdle();

// Runs SetThreadNice(nice), then SetThreadIdle(idle), once on each of the
// `threads` threads of `pool` (a pool built with exactly that many threads)
// and waits for all of them. Each thread is also named `name` (at most 15
// characters; /proc/<pid>/task/<tid>/comm), so every one of them can be
// found and checked from outside. Returns the first failure.
Status SetPoolPriority(boost::asio::thread_pool& pool, unsigned threads, int nice, bool idle,
                       const std::string& name = "cxlpool-stock");

}  // namespace cxlpool
