// SharedDevice: a devdax device (or, in tests and labs, a regular file) that
// several hosts map. Its first 2 MiB hold a header naming the device's
// stable id, written by the first daemon configured with that id; slices
// follow it. Every host reads the same id from the same bytes, whatever the
// device is called locally (/dev/dax0.0 here, /dev/dax1.0 there).
//
// Thread safety: Zero and the accessors from any thread; Open once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool::cluster {

class SharedDevice {
 public:
  static constexpr uint64_t kHeaderBytes = 2ull << 20;

  // Opens `path` and reads its header. When the header is blank and `id` is
  // given, writes it; when it names another id, INVALID_ARGUMENT; when it is
  // blank and no id is given, NOT_FOUND ("name the device's id once").
  // `sysfs_root` finds a devdax device's size (/sys/dev/char/M:m/size).
  static Result<std::unique_ptr<SharedDevice>> Open(const std::string& path, const std::string& id,
                                                    const std::string& sysfs_root = "/");
  ~SharedDevice();

  const std::string& id() const { return id_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // whole device
  uint64_t data_bytes() const { return size_ > kHeaderBytes ? size_ - kHeaderBytes : 0; }
  int fd() const { return fd_.get(); }
  // Where data byte `offset` (a slice's start) is on the device.
  static uint64_t DeviceOffset(uint64_t offset) { return kHeaderBytes + offset; }

  // Writes zeros over data bytes [offset, offset+len), through a shared
  // mapping, so every host that maps the device sees them.
  Status Zero(uint64_t offset, uint64_t len);

 private:
  SharedDevice(std::string path, std::string id, UniqueFd fd, uint64_t size);
  std::string path_;
  std::string id_;
  UniqueFd fd_;
  uint64_t size_ = 0;
};

}  // namespace cxlpool::cluster
