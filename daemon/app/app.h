// cxlpoold's body as a library: RunDaemon reads the settings (settings.h),
// forks into the background unless told not to, and runs a Daemon
// (daemon.h), which builds every component. daemon/main.cc only parses the
// command line and calls RunDaemon. See docs/daemon.md.
//
// Thread safety: RunDaemon runs the daemon's event loop on the calling
// thread until SIGINT/SIGTERM; call it once per process.
#pragma once

#include "settings.h"

namespace cxlpool {

// The process exit code (cxlpoold(8), EXIT STATUS): 0 after a clean
// shutdown; 1 when the daemon could not start (socket, pools, state
// directory, background fork); 2 for a bad command line or configuration,
// including a metrics.http_listen address that cannot be bound. The unit
// does not restart on 2 (RestartPreventExitStatus=2).
int RunDaemon(const DaemonFlags& flags);

}  // namespace cxlpool
