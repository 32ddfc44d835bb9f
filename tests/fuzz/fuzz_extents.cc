// Fuzz target: the receiving side of multi-extent lease replies
// (LeaseReplyAssembler, PlaceExtents) and of RECLAIM_REQUESTs split over
// frames (ReclaimRequestAssembler, the daemon's side). The input is a
// sequence of frames, each [u8 type][u8 fds][u16 length, little-endian]
// [payload]; the first is the reply (or the request), the rest are offered
// as the frames that follow it. `type` picks ALLOC_REPLY, ATTACH_REPLY,
// EXTENT_FDS, ERROR_REPLY, RECLAIM_REQUEST or a stray type; `fds % 8` real
// fds ride on the frame. Nothing may crash, a whole request has one fd per
// extent, and every fd must be closed once the assembler is done (or handed
// out, then closed).
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"

namespace {

// Open fds other than `keep` that are the memfd `keep` (the fds a frame
// brought): a leak if any survive an input. Counting by inode leaves
// libFuzzer's own files out of it.
int CopiesOf(int keep) {
  struct stat want {};
  if (::fstat(keep, &want) != 0) return -1;
  int n = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    struct stat st {};
    if (fd != keep && ::fstat(fd, &st) == 0 && st.st_ino == want.st_ino &&
        st.st_dev == want.st_dev) {
      ++n;
    }
  }
  return n;
}

cxlpool::proto::MsgType TypeOf(uint8_t sel) {
  using namespace cxlpool::proto;
  switch (sel % 6) {
    case 0:
    case 1:
      return MSG_ALLOC_REPLY;
    case 2:
      return MSG_ATTACH_REPLY;
    case 3:
    case 4:
      return MSG_EXTENT_FDS;
    default:
      if (sel & 0x80) return MSG_ERROR_REPLY;
      return sel & 0x20 ? MSG_RECLAIM_REQUEST : MSG_STAT_REPLY;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int kMemfd = ::memfd_create("fuzz-extents", MFD_CLOEXEC);
  {
    std::vector<cxlpool::wire::Frame> frames;
    size_t off = 0;
    while (off + 4 <= size && frames.size() < 64) {
      cxlpool::wire::Frame f;
      f.header.type = static_cast<uint16_t>(TypeOf(data[off]));
      f.header.request_id = 7 + (data[off] & 0x40 ? 1 : 0);  // now and then a wrong id
      size_t nfds = data[off + 1] % 8;
      size_t len = data[off + 2] | (static_cast<size_t>(data[off + 3]) << 8);
      off += 4;
      len = std::min(len, size - off);
      f.payload.assign(reinterpret_cast<const char*>(data + off), len);
      off += len;
      for (size_t i = 0; i < nfds; ++i) f.fds.emplace_back(::fcntl(kMemfd, F_DUPFD_CLOEXEC, 0));
      frames.push_back(std::move(f));
    }
    if (!frames.empty() && frames[0].type() == cxlpool::proto::MSG_RECLAIM_REQUEST) {
      cxlpool::wire::ReclaimRequestAssembler a;
      cxlpool::Status st = a.Start(std::move(frames[0]));
      for (size_t i = 1; st.ok() && !a.complete() && i < frames.size(); ++i) {
        st = a.Add(std::move(frames[i]));
      }
      if (st.ok() && a.complete()) {
        cxlpool::wire::Frame whole = a.TakeRequest();
        cxlpool::proto::ReclaimRequest r;
        // Whole at Start when it announces no frames (an unsplit RECLAIM of
        // one lease), else after them: one lease either way.
        if (!cxlpool::wire::Decode(whole.payload, &r).ok() || r.leases_size() != 1) {
          __builtin_trap();
        }
        const size_t want = static_cast<size_t>(std::max(1, r.leases(0).extents_size()));
        if (whole.fds.size() != want) __builtin_trap();
        for (const auto& fd : whole.fds) {
          if (!fd.valid()) __builtin_trap();
        }
      }
    } else if (!frames.empty()) {
      cxlpool::proto::AllocReply r;
      if (cxlpool::wire::Decode(frames[0].payload, &r).ok()) {
        (void)cxlpool::wire::PlaceExtents(r.lease());
      }
      cxlpool::wire::LeaseReplyAssembler a;
      cxlpool::Status st = a.Start(std::move(frames[0]));
      for (size_t i = 1; st.ok() && !a.complete() && i < frames.size(); ++i) {
        st = a.Add(std::move(frames[i]));
      }
      if (st.ok() && a.complete()) {
        auto extents = a.TakeExtents();
        if (extents.empty()) __builtin_trap();
        uint64_t sum = 0;
        for (const auto& e : extents) {
          if (!e.fd.valid() || e.place.offset != sum) __builtin_trap();
          sum += e.place.size;
        }
        if (sum != a.lease().size_bytes()) __builtin_trap();
      }
    }
  }
  if (CopiesOf(kMemfd) != 0) __builtin_trap();  // an fd leaked
  return 0;
}
