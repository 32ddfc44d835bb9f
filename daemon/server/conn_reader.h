// ConnectionReader: reads one connection's frames, with the fds that come
// with them, and reassembles a RECLAIM_REQUEST from the EXTENT_FDS frames it
// announces. The fds it holds (of a frame being read, and of a RECLAIM being
// assembled) are charged to the uid in Admission, and each read may take no
// more fds than Admission leaves the uid.
//
// Thread safety: single-owner (the server's event-loop thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "cxlpool/common/status.h"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"
#include "server/admission.h"

namespace cxlpool {

class ConnectionReader {
 public:
  using Clock = std::chrono::steady_clock;

  // `admission` (borrowed) is charged for `uid`.
  ConnectionReader(wire::RecvLimits limits, Admission* admission, uid_t uid)
      : reader_(limits), admission_(admission), uid_(uid) {}
  ConnectionReader(const ConnectionReader&) = delete;
  ConnectionReader& operator=(const ConnectionReader&) = delete;

  // Reads what socket `fd` has, with the fd allowance Admission leaves the
  // uid; fds over it are closed as they arrive (frames().fds_refused()).
  Result<wire::FrameReader::Progress> Read(int fd);
  const wire::FrameReader& frames() const { return reader_; }
  wire::Frame TakeFrame() { return reader_.TakeFrame(); }
  // The fd limit that cut the last read's allowance below
  // max_fds_per_frame; nullptr when none did.
  const char* fd_allowance_limit() const { return fd_allowance_limit_; }
  // The request id of the frame being read, when its header is ours; else 0.
  uint64_t CurrentRequestId() const;
  // Charges what it holds now (after a frame's fds were handed on).
  void SyncFds();
  // Closes every fd it holds: a frame begun, a RECLAIM being assembled.
  void Reset();

  // RECLAIM reassembly. A frame belongs to it when one is being assembled,
  // or when it is a RECLAIM_REQUEST that announces EXTENT_FDS frames.
  bool assembling() const { return assembly_ != nullptr; }
  static bool Announces(const wire::Frame& frame);
  // Adds `frame`, starting an assembly (of a connection speaking `version`;
  // its frames must all come within `frame_timeout`): the whole request once
  // its last frame is in, nullopt until then. PROTOCOL when the frames do not
  // add up; *rid is then the request id to echo.
  Result<std::optional<wire::Frame>> Assemble(wire::Frame frame, uint32_t version,
                                              std::chrono::milliseconds frame_timeout,
                                              uint64_t* rid);
  void DropAssembly();
  uint64_t assembly_request_id() const { return assembly_->request_id(); }
  uint32_t assembly_frames_left() const { return assembly_->frames_left(); }
  Clock::time_point assembly_deadline() const { return assembly_deadline_; }

 private:
  void SyncAssemblyFds();

  wire::FrameReader reader_;
  Admission* admission_;
  uid_t uid_;
  uint64_t reader_fds_ = 0;  // charged for reader_
  const char* fd_allowance_limit_ = nullptr;
  // The RECLAIM_REQUEST waiting for its EXTENT_FDS frames (null: none), the
  // fds charged for it, and when the last of its frames must have come.
  std::unique_ptr<wire::ReclaimRequestAssembler> assembly_;
  uint64_t assembly_fds_ = 0;
  Clock::time_point assembly_deadline_;
};

}  // namespace cxlpool
