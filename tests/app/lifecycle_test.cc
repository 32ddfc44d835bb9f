// Lifecycle: components stop, and then join, newest first, each once; a
// component without hooks still shows in both orders.
#include "lifecycle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cxlpool {
namespace {

using Names = std::vector<std::string>;

TEST(LifecycleTest, StopsAndJoinsInReverseStartOrder) {
  Lifecycle life;
  Names calls;
  for (std::string name : {"threads", "leases", "server"}) {
    life.Started(name, {.stop = [&calls, name] { calls.push_back("stop " + name); },
                        .join = [&calls, name] { calls.push_back("join " + name); }});
  }
  life.Started("signals");  // nothing to stop
  EXPECT_EQ(life.started(), (Names{"threads", "leases", "server", "signals"}));
  EXPECT_TRUE(life.stopped().empty());

  life.StopAll();
  EXPECT_EQ(calls, (Names{"stop server", "stop leases", "stop threads"}));
  EXPECT_EQ(life.stopped(), (Names{"signals", "server", "leases", "threads"}));
  life.StopAll();  // once only
  EXPECT_EQ(calls.size(), 3u);

  life.JoinAll();
  life.JoinAll();
  EXPECT_EQ(calls, (Names{"stop server", "stop leases", "stop threads", "join server",
                          "join leases", "join threads"}));
}

TEST(LifecycleTest, StopHookMayBeAlone) {
  Lifecycle life;
  int stops = 0;
  life.Started("timer", {.stop = [&] { ++stops; }});
  life.JoinAll();  // no join hook: nothing runs
  EXPECT_EQ(stops, 0);
  life.StopAll();
  EXPECT_EQ(stops, 1);
}

}  // namespace
}  // namespace cxlpool
