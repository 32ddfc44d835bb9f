// The C++ client against the in-test FakeServer: hello, allocation and
// mapping, error replies, misbehaving servers, lease events, RAII release,
// leases outliving their client and their connection, and CUDA registration
// through the fake libcuda ($CXLPOOL_CUDA_LIBRARY is set by ctest).
#include "cxlpool/client.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "client_core.h"
#include "fake_server.h"

namespace cxlpool {
namespace {

using testing::FakeServer;

Client ConnectPair(FakeServer& server) {
  UniqueFd sock = server.StartPair();
  auto core = detail::ClientCore::FromSocket(std::move(sock), "fake");
  if (!core.ok()) ADD_FAILURE() << core.status().ToString();
  return core.ok() ? ClientAccess::Wrap(std::move(*core)) : Client();
}

// Polls `cond` until it holds; false when it did not within `timeout`.
template <typename Cond>
bool Eventually(Cond cond, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

bool FillAndCheck(const Lease& l, unsigned char seed) {
  auto* p = static_cast<unsigned char*>(l.data());
  for (uint64_t i = 0; i < l.size(); ++i) p[i] = static_cast<unsigned char>(seed + i * 7);
  for (uint64_t i = 0; i < l.size(); ++i) {
    if (p[i] != static_cast<unsigned char>(seed + i * 7)) return false;
  }
  return true;
}

TEST(ClientTest, HelloNegotiatesVersionOne) {
  FakeServer server;
  Client c = ConnectPair(server);
  ASSERT_TRUE(c.connected());
  EXPECT_EQ(c.protocol_version(), 1u);
  EXPECT_EQ(c.server_version(), "fake-cxlpoold 0");
  EXPECT_EQ(server.hello_client_name().rfind("libcxlpool/", 0), 0u) << server.hello_client_name();
}

TEST(ClientTest, HelloWithAnUnknownVersionIsAProtocolError) {
  FakeServer server;
  server.SetHelloVersion(7);
  auto core = detail::ClientCore::FromSocket(server.StartPair(), "fake");
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), Code::kProtocol);
  EXPECT_NE(core.status().message().find("version 7"), std::string::npos);
}

TEST(ClientTest, AllocateMapsAWritableLeaseAndSendsThePlacement) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 10000;  // the server rounds to 12288
  o.near_gpu = 0;
  o.strict = true;
  o.label = "kv-cache";
  o.tier_preference = {"dram", "cxl"};
  auto lease = c.Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->size(), 12288u);
  EXPECT_EQ(lease->numa_node(), 0);
  EXPECT_EQ(lease->id(), 100u);
  EXPECT_EQ(lease->info().kind, "dram");
  EXPECT_EQ(lease->info().placement_reason, "fake: nearest to GPU 0");
  EXPECT_EQ(lease->info().requested_bytes, 10000u);
  EXPECT_EQ(lease->info().label, "kv-cache");
  EXPECT_TRUE(FillAndCheck(*lease, 3));
  auto reqs = server.allocs();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].size_bytes(), 10000u);
  EXPECT_EQ(reqs[0].gpu(), "0");
  EXPECT_FALSE(reqs[0].has_numa_node());
  EXPECT_TRUE(reqs[0].strict());
  ASSERT_EQ(reqs[0].tier_preference_size(), 2);
  EXPECT_EQ(reqs[0].tier_preference(1), "cxl");
  // Not registered with CUDA: the device pointer says so.
  EXPECT_EQ(lease->device_ptr().status().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(lease->Release().ok());
  EXPECT_FALSE(lease->valid());
  EXPECT_EQ(server.releases(), std::vector<uint64_t>{100});
  EXPECT_EQ(server.live_leases(), 0);
}

TEST(ClientTest, NodeRequestAndMemoryIsSharedWithTheFd) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 4096;
  o.numa_node = 1;
  auto lease = c.Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->numa_node(), 1);
  EXPECT_EQ(lease->info().memory_tier, 2);
  ASSERT_TRUE(server.allocs()[0].has_numa_node());
  EXPECT_EQ(server.allocs()[0].numa_node(), 1);
}

TEST(ClientTest, ErrorRepliesKeepCodeAndMessage) {
  FakeServer server;
  Client c = ConnectPair(server);
  server.FailNextAlloc(Code::kResourceExhausted, "quota uid 1000 dram: 8 GiB used of 8 GiB");
  AllocOptions o;
  o.size_bytes = 4096;
  auto lease = c.Allocate(o);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(lease.status().c_error(), CXLPOOL_ERESOURCE_EXHAUSTED);
  EXPECT_EQ(lease.status().message(), "quota uid 1000 dram: 8 GiB used of 8 GiB");
  // The connection is still good.
  EXPECT_TRUE(c.Allocate(o).ok());
}

TEST(ClientTest, BadArgumentsNeverReachTheServer) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  EXPECT_EQ(c.Allocate(o).status().code(), ErrorCode::kInvalidArgument);  // size 0
  o.size_bytes = 4096;
  o.numa_node = -2;
  EXPECT_EQ(c.Allocate(o).status().code(), ErrorCode::kInvalidArgument);
  o.numa_node = -1;
  o.acl_uids = {1000};
  EXPECT_EQ(c.Allocate(o).status().code(), ErrorCode::kInvalidArgument);  // ACL without name
  EXPECT_EQ(c.Attach("").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(server.allocs().empty());
  Client empty;
  EXPECT_EQ(empty.Allocate(o).status().code(), ErrorCode::kUnavailable);
}

TEST(ClientTest, FdOfTheWrongSizeIsRefusedAndReleased) {
  FakeServer server;
  Client c = ConnectPair(server);
  server.SetMisbehave(FakeServer::Misbehave::kWrongFdSize);
  AllocOptions o;
  o.size_bytes = 8192;
  auto lease = c.Allocate(o);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), ErrorCode::kProtocol);
  EXPECT_NE(lease.status().message().find("4096 bytes but the daemon announced 8192"),
            std::string::npos)
      << lease.status().message();
  EXPECT_EQ(server.releases(), std::vector<uint64_t>{100}) << "the unusable lease was not returned";
}

TEST(ClientTest, ReplyWithoutFdIsAProtocolError) {
  FakeServer server;
  Client c = ConnectPair(server);
  server.SetMisbehave(FakeServer::Misbehave::kNoFd);
  AllocOptions o;
  o.size_bytes = 4096;
  auto lease = c.Allocate(o);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), ErrorCode::kProtocol);
  EXPECT_NE(lease.status().message().find("no fd"), std::string::npos) << lease.status().message();
}

// Wire version 2: a lease of several extents, their fds on several frames,
// is one contiguous buffer over all of them, aligned for huge pages.
TEST(ClientTest, AMultiExtentLeaseIsOneBuffer) {
  FakeServer server;
  server.SetHelloVersion(2);
  server.SetExtents(2u << 20, 3);
  Client c = ConnectPair(server);
  EXPECT_EQ(c.protocol_version(), 2u);
  AllocOptions o;
  o.size_bytes = (7u << 20) + 100 * 1024;  // 2+2+2 MiB on the reply, the tail on EXTENT_FDS
  auto lease = c.Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->size(), (7u << 20) + 100 * 1024);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(lease->data()) % (2u << 20), 0u);
  EXPECT_TRUE(FillAndCheck(*lease, 9));
  std::vector<int> fds = server.extent_fds(lease->id());
  ASSERT_EQ(fds.size(), 4u);
  const auto* p = static_cast<const unsigned char*>(lease->data());
  uint64_t off = 0;
  for (int fd : fds) {
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    std::vector<unsigned char> buf(static_cast<size_t>(st.st_size));
    ASSERT_EQ(::pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()));
    EXPECT_EQ(std::memcmp(buf.data(), p + off, buf.size()), 0) << "extent at offset " << off;
    off += buf.size();
  }
  EXPECT_EQ(off, lease->size());
  ASSERT_TRUE(lease->Release().ok());
  EXPECT_EQ(server.live_leases(), 0);
}

TEST(ClientTest, ExtentFdsThatDoNotAddUpAreAProtocolError) {
  FakeServer server;
  server.SetHelloVersion(2);
  server.SetExtents(2u << 20, 2);
  server.SetMisbehave(FakeServer::Misbehave::kExtentFdShort);
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 5u << 20;
  auto lease = c.Allocate(o);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), ErrorCode::kProtocol);
  EXPECT_NE(lease.status().message().find("carries 0"), std::string::npos)
      << lease.status().message();
}

TEST(ClientTest, MismatchedRequestIdBreaksTheConnection) {
  FakeServer server;
  Client c = ConnectPair(server);
  server.SetMisbehave(FakeServer::Misbehave::kWrongRequestId);
  AllocOptions o;
  o.size_bytes = 4096;
  auto lease = c.Allocate(o);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), ErrorCode::kProtocol);
  // Broken for good: later calls fail fast, no hang.
  auto again = c.Allocate(o);
  EXPECT_EQ(again.status().code(), ErrorCode::kProtocol);
  EXPECT_EQ(server.allocs().size(), 1u);
}

TEST(ClientTest, LeaseSurvivesTheConnection) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 4096;
  auto lease = c.Allocate(o);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(FillAndCheck(*lease, 9));
  server.SetMisbehave(FakeServer::Misbehave::kCloseOnAlloc);
  auto second = c.Allocate(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kUnavailable) << second.status().ToString();
  // The mapping and fd are the lease's own; the fake server does not
  // truncate on disconnect, so the memory is still there.
  EXPECT_EQ(static_cast<unsigned char*>(lease->data())[100], static_cast<unsigned char>(9 + 700));
  auto rel = lease->Release();
  EXPECT_EQ(rel.code(), ErrorCode::kUnavailable);
  EXPECT_FALSE(lease->valid());
}

TEST(ClientTest, LeaseOutlivesItsClientAndMoveReleasesOnce) {
  FakeServer server;
  Lease kept;
  {
    Client c = ConnectPair(server);
    AllocOptions o;
    o.size_bytes = 4096;
    auto a = c.Allocate(o);
    auto b = c.Allocate(o);
    ASSERT_TRUE(a.ok() && b.ok());
    kept = std::move(*a);
    Lease moved(std::move(*b));
    EXPECT_FALSE(b->valid());
    EXPECT_EQ(b->data(), nullptr);
    EXPECT_EQ(moved.id(), 101u);
  }  // `moved` released here; the client object is gone, the connection not
  EXPECT_EQ(server.releases(), std::vector<uint64_t>{101});
  ASSERT_TRUE(kept.valid());
  EXPECT_TRUE(FillAndCheck(kept, 1));
  EXPECT_TRUE(kept.Release().ok());
  EXPECT_EQ(server.releases(), (std::vector<uint64_t>{101, 100}));
  server.Join();  // the last lease closed the connection
  EXPECT_EQ(kept.Release().code(), ErrorCode::kInvalidArgument);
}

TEST(ClientTest, RevokedEventMarksTheLease) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 4096;
  auto a = c.Allocate(o);
  auto b = c.Allocate(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->revoked());
  // An event that arrives while a request waits for its reply.
  server.PushBeforeNextReply(a->id(), "revoked");
  auto d = c.Allocate(o);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(a->revoked());
  EXPECT_FALSE(b->revoked());
  // Events between requests, drained without blocking.
  server.PushNow(b->id(), "revoked");
  server.PushNow(b->id(), "something-new");
  // PushNow wrote both frames before returning, so they are readable now.
  auto handled = c.ProcessEvents();
  ASSERT_TRUE(handled.ok()) << handled.status().ToString();
  EXPECT_EQ(*handled, 2);
  EXPECT_TRUE(b->revoked());
  EXPECT_EQ(a->Release().code(), ErrorCode::kRevoked);
}

TEST(ClientTest, SharedLeaseAttach) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 8192;
  o.name = "weights";
  o.acl_uids = {1000, 1001};
  o.acl_gids = {44};
  auto owner = c.Allocate(o);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(server.allocs()[0].acl_uids_size(), 2);
  EXPECT_EQ(server.allocs()[0].acl_gids(0), 44u);
  EXPECT_EQ(c.Allocate(o).status().code(), ErrorCode::kAlreadyExists);
  std::memcpy(owner->data(), "hello", 6);
  auto other = c.Attach("weights");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(other->data(), owner->data());
  EXPECT_STREQ(static_cast<const char*>(other->data()), "hello");
  EXPECT_EQ(other->info().name, "weights");
  EXPECT_EQ(c.Attach("nope").status().code(), ErrorCode::kNotFound);
}

TEST(ClientTest, ConcurrentAllocationsFromSeveralThreads) {
  FakeServer server;
  Client c = ConnectPair(server);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        AllocOptions o;
        o.size_bytes = 4096;
        auto l = c.Allocate(o);
        if (l.ok() && FillAndCheck(*l, static_cast<unsigned char>(t)) && l->Release().ok()) {
          ++ok[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 8));
  EXPECT_EQ(server.live_leases(), 0);
}

TEST(ClientTest, ConnectByPath) {
  char dir[] = "/tmp/cxlpool-client-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.sock";
  auto missing = Client::Connect(path);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(Client::Connect(std::string(200, 'x')).status().code(), ErrorCode::kInvalidArgument);
  {
    FakeServer server;
    ASSERT_TRUE(server.StartListening(path).ok());
    auto c = Client::Connect(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->protocol_version(), 1u);
  }
  unlink(path.c_str());
  rmdir(dir);
}

// The daemon is gone and the restart watcher is waiting for it to come back
// (up to $CXLPOOL_RECONNECT_TIMEOUT_MS): a release must not wait with it. It
// returns at once, and the lease is handed back and released when the
// daemon is back.
TEST(ClientTest, ReleaseDoesNotWaitForAReconnect) {
  char dir[] = "/tmp/cxlpool-client-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.sock";
  setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "30000", 1);
  uint64_t id = 0;
  {
    FakeServer first;
    ASSERT_TRUE(first.StartListening(path).ok());
    auto c = Client::Connect(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    AllocOptions o;
    o.size_bytes = 1 << 20;
    auto lease = c->Allocate(o);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    id = lease->info().id;
    std::shared_ptr<detail::ClientCore> core = ClientAccess::Core(*c);
    first.HangUp();  // the watcher sees EOF and starts reconnecting (refused)

    auto release = std::async(std::launch::async, [&] { return lease->Release(); });
    // Not a timing goal: without the fix this waits out the 30 s reconnect.
    ASSERT_EQ(release.wait_for(std::chrono::seconds(15)), std::future_status::ready)
        << "release waited for the reconnect";
    EXPECT_TRUE(release.get().ok());
    EXPECT_EQ(core->reconnects(), 0u);

    unlink(path.c_str());
    FakeServer second;
    ASSERT_TRUE(second.StartListening(path).ok());
    EXPECT_TRUE(second.WaitForRelease(std::chrono::seconds(20)));
    EXPECT_EQ(core->reconnects(), 1u);
    EXPECT_EQ(second.reclaims(), std::vector<uint64_t>{id});
    EXPECT_EQ(second.releases(), std::vector<uint64_t>{id});
    EXPECT_EQ(second.live_leases(), 0);
    // Another thread still gets a working connection.
    auto again = c->Allocate(o);
    EXPECT_TRUE(again.ok()) << again.status().ToString();
  }
  unsetenv("CXLPOOL_RECONNECT_TIMEOUT_MS");
  unlink(path.c_str());
  rmdir(dir);
}

// How often the thread of this process named `comm` has slept and been
// woken (voluntary_ctxt_switches); -1 when there is no such thread.
long VoluntarySwitchesOf(const std::string& comm) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream name(e.path() / "comm");
    std::string n;
    if (!std::getline(name, n) || n != comm) continue;
    std::ifstream status(e.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
    }
  }
  return -1;
}

// The thread of this process named `comm` is blocked in epoll_wait
// (/proc/<tid>/syscall names the system call a thread sleeps in).
bool InEpollWait(const std::string& comm) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream name(e.path() / "comm");
    std::string n;
    if (!std::getline(name, n) || n != comm) continue;
    std::ifstream syscall(e.path() / "syscall");
    long nr = -1;
    if (!(syscall >> nr)) return false;
#ifdef SYS_epoll_wait
    if (nr == SYS_epoll_wait) return true;
#endif
#ifdef SYS_epoll_pwait2
    if (nr == SYS_epoll_pwait2) return true;
#endif
    return nr == SYS_epoll_pwait;
  }
  return false;
}

// The restart watcher waits on the connection while leases are live. A
// reply is the caller's to read: 200 calls must not wake the watcher each
// time, and an event between calls still reaches it.
TEST(ClientTest, TheWatcherSleepsThroughRepliesAndWakesForEvents) {
  char dir[] = "/tmp/cxlpool-client-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.sock";
  {
    FakeServer server;
    ASSERT_TRUE(server.StartListening(path).ok());
    auto c = Client::Connect(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    AllocOptions o;
    o.size_bytes = 4096;
    auto held = c->Allocate(o);  // starts the watcher
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    ASSERT_TRUE(Eventually([] { return InEpollWait("cxlpool-watch"); }))
        << "no thread named cxlpool-watch waiting on the connection";
    const long before = VoluntarySwitchesOf("cxlpool-watch");
    for (int i = 0; i < 100; ++i) {
      auto l = c->Allocate(o);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      ASSERT_TRUE(l->Release().ok());
    }
    const long woken = VoluntarySwitchesOf("cxlpool-watch") - before;
    // Woken by the replies it would be about once a call.
    EXPECT_LT(woken, 20) << "the watcher woke for the replies";

    server.PushNow(held->id(), "revoked");
    EXPECT_TRUE(Eventually([&] { return held->revoked(); }))
        << "the watcher did not read an event between calls";
  }
  unlink(path.c_str());
  rmdir(dir);
}

// Open fds of this process whose target names `what` (/proc/self/fd).
int OpenFdsNaming(const std::string& what) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find(what) != std::string::npos) ++n;
  }
  return n;
}

// A release deferred while the daemon is gone keeps the lease's memfd only
// until the reconnect gives up.
TEST(ClientTest, ADeferredReleaseIsDroppedWhenTheDaemonDoesNotComeBack) {
  char dir[] = "/tmp/cxlpool-client-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.sock";
  setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "200", 1);
  {
    FakeServer server;
    ASSERT_TRUE(server.StartListening(path).ok());
    auto c = Client::Connect(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    AllocOptions o;
    o.size_bytes = 1 << 20;
    auto lease = c->Allocate(o);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    server.HangUp();
    EXPECT_TRUE(lease->Release().ok());
    // The fake's own memfd went with its connection; what is left is the
    // client's dup, until the watcher's reconnect gives up.
    EXPECT_TRUE(Eventually([] { return OpenFdsNaming("fake-lease") == 0; }))
        << OpenFdsNaming("fake-lease") << " fds of the lease left open";
  }
  unsetenv("CXLPOOL_RECONNECT_TIMEOUT_MS");
  unlink(path.c_str());
  rmdir(dir);
}

TEST(ClientTest, DefaultSocketPathRule) {
  setenv("CXLPOOL_SOCKET", "/tmp/explicit.sock", 1);
  EXPECT_EQ(Client::DefaultSocketPath(), "/tmp/explicit.sock");
  unsetenv("CXLPOOL_SOCKET");
  if (geteuid() == 0) {
    EXPECT_EQ(Client::DefaultSocketPath(), "/run/cxlpool/cxlpool.sock");
  } else {
    setenv("XDG_RUNTIME_DIR", "/nonexistent-xdg", 1);
    EXPECT_EQ(Client::DefaultSocketPath(), "/run/cxlpool/cxlpool.sock");  // no user socket
  }
}

// Binds a unix socket at `path` (replacing whatever is there).
int BindSocketAt(const std::string& path) {
  unlink(path.c_str());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  return fd;
}

// A non-root user's own daemon listens on $XDG_RUNTIME_DIR/cxlpool.sock, else
// /tmp/cxlpool-<uid>.sock (daemon/config); the client finds both, and never
// a /tmp socket somebody else owns.
TEST(ClientTest, DefaultSocketPathFindsTheUsersOwnDaemon) {
  const uid_t me = geteuid();
  const uid_t uid = me == 0 ? 4242 : me;  // root plays a user by chown
  const std::string tmp_sock = "/tmp/cxlpool-" + std::to_string(uid) + ".sock";
  char dir[] = "/tmp/cxlpool-xdg-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string xdg_sock = std::string(dir) + "/cxlpool.sock";

  EXPECT_EQ(detail::DefaultSocketPathFor(0, dir), "/run/cxlpool/cxlpool.sock");
  unlink(tmp_sock.c_str());
  EXPECT_EQ(detail::DefaultSocketPathFor(uid, dir), "/run/cxlpool/cxlpool.sock");

  int t = BindSocketAt(tmp_sock);
  if (me == 0) {
    ASSERT_EQ(chown(tmp_sock.c_str(), uid, 0), 0);
  }
  EXPECT_EQ(detail::DefaultSocketPathFor(uid, dir), tmp_sock);
  EXPECT_EQ(detail::DefaultSocketPathFor(uid, nullptr), tmp_sock);
  if (me == 0) {
    ASSERT_EQ(chown(tmp_sock.c_str(), 4343, 0), 0);  // planted by another user
    EXPECT_EQ(detail::DefaultSocketPathFor(uid, dir), "/run/cxlpool/cxlpool.sock");
  }

  int x = BindSocketAt(xdg_sock);
  EXPECT_EQ(detail::DefaultSocketPathFor(uid, dir), xdg_sock);  // XDG first
  close(x);
  close(t);
  unlink(xdg_sock.c_str());
  unlink(tmp_sock.c_str());
  rmdir(dir);
}

TEST(ClientTest, CudaRegistrationThroughTheFakeDriver) {
  FakeServer server;
  Client c = ConnectPair(server);
  AllocOptions o;
  o.size_bytes = 1 << 20;
  o.cuda_register = true;
  auto lease = c.Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto dptr = lease->device_ptr();
  ASSERT_TRUE(dptr.ok()) << dptr.status().ToString();
  EXPECT_EQ(*dptr, reinterpret_cast<uint64_t>(lease->data()));  // the fake's unified addressing
  ASSERT_EQ(lease->device_chunks().size(), 1u);
  EXPECT_EQ(lease->device_chunks()[0].length, 1u << 20);
  EXPECT_EQ(lease->CudaRegister(0).code(), ErrorCode::kAlreadyExists);
  EXPECT_TRUE(lease->CudaUnregister().ok());
  EXPECT_EQ(lease->device_ptr().status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(lease->CudaRegister(5).code(), ErrorCode::kUnavailable);  // the fake has 1 device
  EXPECT_EQ(lease->device_ptr().status().code(), ErrorCode::kUnavailable);
  EXPECT_TRUE(lease->CudaRegister(0).ok());
  EXPECT_TRUE(lease->Release().ok());  // unregisters too
}

}  // namespace
}  // namespace cxlpool
