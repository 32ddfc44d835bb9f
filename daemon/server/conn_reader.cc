#include "server/conn_reader.h"

#include <string>
#include <utility>

namespace cxlpool {

Result<wire::FrameReader::Progress> ConnectionReader::Read(int fd) {
  const Admission::FdAllowance a = admission_->FdAllowanceFor(uid_, reader_fds_);
  fd_allowance_limit_ = a.limit;
  reader_.set_fd_allowance(a.fds);
  Result<wire::FrameReader::Progress> p = reader_.Read(fd, 0);
  admission_->SyncFds(uid_, reader_.fds_held(), &reader_fds_);
  return p;
}

uint64_t ConnectionReader::CurrentRequestId() const {
  const wire::FrameHeader& h = reader_.header();
  return reader_.have_header() && h.magic == wire::kFrameMagic ? h.request_id : 0;
}

void ConnectionReader::SyncFds() {
  admission_->SyncFds(uid_, reader_.fds_held(), &reader_fds_);
  SyncAssemblyFds();
}

void ConnectionReader::SyncAssemblyFds() {
  admission_->SyncFds(uid_, assembly_ ? assembly_->fds_held() : 0, &assembly_fds_);
}

void ConnectionReader::Reset() {
  reader_ = wire::FrameReader(reader_.limits());  // closes fds of a frame begun
  admission_->SyncFds(uid_, 0, &reader_fds_);
  DropAssembly();
}

bool ConnectionReader::Announces(const wire::Frame& frame) {
  return wire::ReclaimRequestAssembler::AnnouncedFrames(frame) > 0;
}

Result<std::optional<wire::Frame>> ConnectionReader::Assemble(
    wire::Frame frame, uint32_t version, std::chrono::milliseconds frame_timeout, uint64_t* rid) {
  Status st;
  *rid = frame.header.request_id;
  if (!assembly_) {
    if (version < wire::kExtentWireVersion) {
      st = Status(Code::kProtocol,
                  "RECLAIM_REQUEST announces EXTENT_FDS frames, which need "
                  "protocol version 2; this connection speaks " +
                      std::to_string(version));
    } else {
      assembly_ = std::make_unique<wire::ReclaimRequestAssembler>();
      assembly_deadline_ = Clock::now() + frame_timeout;
      st = assembly_->Start(std::move(frame));
    }
  } else {
    *rid = assembly_->request_id();
    st = assembly_->Add(std::move(frame));
  }
  if (!st.ok()) return Status(Code::kProtocol, st.message());
  if (!assembly_->complete()) {
    SyncAssemblyFds();
    return std::optional<wire::Frame>();
  }
  wire::Frame whole = assembly_->TakeRequest();
  assembly_.reset();  // its fds stay charged until the handler is done with them
  return std::optional<wire::Frame>(std::move(whole));
}

void ConnectionReader::DropAssembly() {
  assembly_.reset();  // closes its fds
  SyncAssemblyFds();
}

}  // namespace cxlpool
