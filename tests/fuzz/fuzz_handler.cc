// Fuzz target: request validation as a whole, through an in-process daemon:
// the real DaemonHandler and LeaseManager over a two-socket + CXL topology
// with small pools (real memfds, no node binding). The input is a series of
// requests "conn(1) type(2) len(2) payload" from three connections (root,
// uid 1000, uid 2000). Every request must get exactly one well-formed reply
// (an error reply must carry a code), and once every connection has gone the
// pools must be back to zero leased bytes.
//
// Restart support is on (an in-memory LeaseStore), so RECLAIM reaches the
// path that accounts again a lease the journal lost: a RECLAIM request
// carries one fd per extent of each listed lease (at most 8 fds), each either
// an fd a grant or attach of this run handed out or a fresh sealed memfd
// whose size comes from the input, like a client whose daemon lost its
// journal would send.
//
// An input that starts with 0xFF runs in a daemon that found its journal
// damaged: the grace period (an hour, so it lasts the whole run) keeps
// ALLOC and ATTACH waiting, and RECLAIM of unknown ids may account leases
// again, of one extent or several. The fds of every RECLAIM are kept with
// the handed-out ones, so a later RECLAIM can carry a re-adopted lease's
// memfds under another id. At the end each pool's leased bytes must be the
// sum of the leases listed in it. Otherwise RECLAIM of an unknown id is
// refused, as outside a damaged start.
//
// Leases are cut into extents of 128 KiB (daemon.max_extent), so grants to
// the two version-2 connections come as multi-extent replies with
// EXTENT_FDS frames (one fd per frame: their HELLO says so); the
// version-1 connection (uid 2000) gets one fd per lease.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/proto/codec.h"
#include "handler/daemon_handler.h"
#include "restart_fakes.h"
#include "test_util.h"

namespace {

using cxlpool::ConnectionId;
using cxlpool::Reply;

void CheckReply(const Reply& r) {
  if (r.type == cxlpool::proto::MSG_ERROR_REPLY) {
    cxlpool::proto::ErrorReply e;
    if (!cxlpool::wire::Decode(r.payload, &e).ok()) __builtin_trap();
    if (e.code() == cxlpool::proto::OK || e.message().empty()) __builtin_trap();
  }
}

// Pools small enough that a grant's prefault (MADV_POPULATE_WRITE) and the
// reclaim after it stay cheap: with 16 MiB pools those kernel page walks
// were half of each run. The CXL node near GPU 0 still holds one 2 MiB
// hugetlb request; the others cover pool-full paths sooner.
cxlpool::Topology SmallPools() {
  auto t = cxlpool::testing::TwoSocketCxl();
  const uint64_t sizes[] = {512ull << 10, 512ull << 10, 2ull << 20, 1ull << 20};
  for (size_t i = 0; i < 4; ++i) t.numa_nodes[i].memory_bytes = sizes[i];
  return t;
}

// A sealed memfd of `pages` pages, sealed as the daemon seals its leases.
cxlpool::UniqueFd SealedMemfd(size_t pages) {
  cxlpool::UniqueFd fd(::memfd_create("fuzz-lease", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(pages * 4096)) != 0) return {};
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

}  // namespace

// Protobuf logs every invalid UTF-8 string it meets; silence it so the
// fuzzer's own output stays readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cxlpool::testing::FakeStore store;
  cxlpool::testing::Harness h(SmallPools(), cxlpool::testing::TestConfig(), nullptr,
                              /*prefault=*/false);
  h.mgr->EnableRestart(&store, nullptr, 1);
  h.mgr->SetMaxExtentBytes(128 << 10);
  const bool damaged = size > 0 && data[0] == 0xFF;
  if (damaged) {
    cxlpool::JournalHealth lost;
    lost.damaged = true;
    lost.may_have_lost_leases = true;
    lost.description = "fuzz: the journal is empty";
    (void)h.mgr->Recover({}, {}, std::chrono::hours(1), lost);
  }
  // The grace timer must not be waited for: run what is ready only.
  auto drain = [&] {
    if (!damaged) return h.Drain();
    h.io.restart();
    h.io.poll();
  };
  std::vector<cxlpool::UniqueFd> handed_out;  // dups of fds replies carried
  cxlpool::FakeFileSystem proc;
  cxlpool::HandlerOptions o;
  o.instance_id = "fuzz";
  o.topology_is_local = false;
  cxlpool::DaemonHandler handler(h.mgr.get(), &proc, o);
  handler.SetPush([](ConnectionId, Reply r) {
    CheckReply(r);
    return cxlpool::Status::Ok();
  });
  const uid_t uids[3] = {0, 1000, 2000};
  for (ConnectionId c = 0; c < 3; ++c) {
    cxlpool::PeerInfo p;
    p.pid = static_cast<pid_t>(100 + c);
    p.uid = uids[c];
    p.gid = uids[c];
    p.comm = "fuzz";
    handler.OnConnect(c, p);
    cxlpool::proto::HelloRequest hello;
    hello.set_min_version(1);
    hello.set_max_version(c == 2 ? 1 : 2);
    hello.set_max_fds_per_frame(1);
    cxlpool::Request r;
    r.type = cxlpool::proto::MSG_HELLO_REQUEST;
    r.request_id = 1;
    r.payload = *cxlpool::wire::Encode(hello);
    handler.OnRequest(c, std::move(r), [](Reply) {});
  }
  size_t off = damaged ? 1 : 0;
  uint64_t id = 2;
  while (off + 5 <= size) {
    ConnectionId c = data[off] % 3;
    uint16_t type = static_cast<uint16_t>(data[off + 1] | (data[off + 2] << 8));
    size_t len = static_cast<size_t>(data[off + 3] | (data[off + 4] << 8));
    off += 5;
    len = std::min(len, size - off);
    cxlpool::Request r;
    r.type = static_cast<cxlpool::proto::MsgType>(type % 128);
    r.request_id = id++;
    r.payload.assign(reinterpret_cast<const char*>(data + off), len);
    off += len;
    if (r.type == cxlpool::proto::MSG_RECLAIM_REQUEST) {
      cxlpool::proto::ReclaimRequest rr;
      if (cxlpool::wire::Decode(r.payload, &rr).ok() && rr.leases_size() <= 4) {
        for (int i = 0; i < rr.leases_size(); ++i) {
          const int extents = std::max(1, std::min(rr.leases(i).extents_size(), 8));
          for (int k = 0; k < extents && r.fds.size() < 8; ++k) {
            const uint64_t pick = rr.leases(i).page_size() + static_cast<uint64_t>(k);
            if (!handed_out.empty() && pick % 2 == 0) {
              r.fds.emplace_back(
                  ::fcntl(handed_out[pick / 2 % handed_out.size()].get(), F_DUPFD_CLOEXEC, 0));
            } else {
              r.fds.push_back(SealedMemfd(1 + rr.leases(i).size_bytes() % 128));
            }
          }
        }
      }
      for (const cxlpool::UniqueFd& fd : r.fds) {
        if (damaged && fd.valid() && handed_out.size() < 16) {
          handed_out.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
        }
      }
    }
    int replies = 0;
    handler.OnRequest(c, std::move(r), [&](Reply rep) {
      CheckReply(rep);
      // A lease reply's EXTENT_FDS frames: one fd each (the HELLO said so),
      // and only behind an ALLOC or ATTACH reply.
      if (!rep.more.empty() && rep.type != cxlpool::proto::MSG_ALLOC_REPLY &&
          rep.type != cxlpool::proto::MSG_ATTACH_REPLY) {
        __builtin_trap();
      }
      for (const Reply& m : rep.more) {
        if (m.type != cxlpool::proto::MSG_EXTENT_FDS || m.fds.size() != 1) __builtin_trap();
      }
      auto keep = [&](const Reply& f) {
        for (int fd : f.fds) {
          if (handed_out.size() < 16) handed_out.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        }
      };
      keep(rep);
      for (const Reply& m : rep.more) keep(m);
      ++replies;
    });
    drain();
    if (replies != 1) __builtin_trap();
  }
  if (damaged) {
    // Leases the journal lost are kept through the grace period, held or
    // not: what each pool counts is what it lists, nothing more.
    std::map<std::string, uint64_t> listed;
    auto all = h.mgr->List(0, true);
    if (!all.ok()) __builtin_trap();
    for (const auto& l : *all) listed[l.pool] += l.size_bytes;
    for (const auto& p : h.mgr->Pools()) {
      if (p.leased_bytes != listed[p.name]) __builtin_trap();
    }
  }
  for (ConnectionId c = 0; c < 3; ++c) handler.OnDisconnect(c);
  drain();
  for (const auto& p : h.mgr->Pools()) {
    if (!damaged && (p.leased_bytes != 0 || p.lease_count != 0)) __builtin_trap();
  }
  h.mgr->Shutdown();
  return 0;
}
