#include "cxlpool/cluster/shared_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "cxlpool/cluster/records.h"

namespace cxlpool::cluster {

namespace {

constexpr char kMagic[] = "CXLPOOL-SHARED-DEVICE v1\n";
constexpr size_t kHeaderUsed = 4096;  // magic, then "id=<id>\n", then zeros

Result<uint64_t> DeviceSize(int fd, const std::string& path, const std::string& sysfs_root) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "shared device " + path);
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  if (!S_ISCHR(st.st_mode))
    return Status(Code::kInvalidArgument,
                  "shared device " + path + ": neither a devdax device nor a file");
  const std::string size_path = sysfs_root + "/sys/dev/char/" + std::to_string(major(st.st_rdev)) +
                                ":" + std::to_string(minor(st.st_rdev)) + "/size";
  std::ifstream in(size_path);
  uint64_t size = 0;
  if (!(in >> size))
    return Status(Code::kNotFound, "shared device " + path + ": no size in " + size_path);
  return size;
}

// Maps [offset, offset+len) of the device, shared; offset page aligned.
Result<void*> Map(int fd, uint64_t offset, uint64_t len, const std::string& path) {
  void* p =
      ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return Status::FromErrno(errno, "shared device " + path + ": mmap");
  return p;
}

}  // namespace

SharedDevice::SharedDevice(std::string path, std::string id, UniqueFd fd, uint64_t size)
    : path_(std::move(path)), id_(std::move(id)), fd_(std::move(fd)), size_(size) {}

SharedDevice::~SharedDevice() = default;

Result<std::unique_ptr<SharedDevice>> SharedDevice::Open(const std::string& path,
                                                         const std::string& id,
                                                         const std::string& sysfs_root) {
  if (!id.empty()) CXLPOOL_RETURN_IF_ERROR(CheckName("shared device id", id));
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return Status::FromErrno(errno, "shared device " + path);
  auto size = DeviceSize(fd.get(), path, sysfs_root);
  if (!size.ok()) return size.status();
  if (*size < kHeaderBytes + kSliceAlign)
    return Status(Code::kInvalidArgument, "shared device " + path + ": smaller than 4 MiB");
  auto mapped = Map(fd.get(), 0, kHeaderBytes, path);
  if (!mapped.ok()) return mapped.status();
  char* header = static_cast<char*>(*mapped);
  std::string found;
  const size_t magic_len = sizeof kMagic - 1;
  Status status;
  if (std::memcmp(header, kMagic, magic_len) == 0) {
    const char* line = header + magic_len;
    const char* end = static_cast<const char*>(std::memchr(line, '\n', kHeaderUsed - magic_len));
    if (std::strncmp(line, "id=", 3) != 0 || end == nullptr) {
      status = Status(Code::kInvalidArgument, "shared device " + path + ": garbled header");
    } else {
      found.assign(line + 3, end);
      status = CheckName("shared device id", found);
    }
  } else if (std::find_if(header, header + kHeaderUsed, [](char c) { return c != 0; }) !=
             header + kHeaderUsed) {
    status = Status(Code::kInvalidArgument,
                    "shared device " + path + ": holds data but no cxlpool header; refusing it");
  }
  if (status.ok() && found.empty()) {
    if (id.empty()) {
      status = Status(Code::kNotFound,
                      "shared device " + path + " has no id yet: give it one (cluster.shared id)");
    } else {
      const std::string text = std::string(kMagic) + "id=" + id + "\n";
      std::memcpy(header, text.data(), text.size());
      ::msync(header, kHeaderUsed, MS_SYNC);
      found = id;
    }
  }
  if (status.ok() && !id.empty() && found != id)
    status = Status(Code::kInvalidArgument,
                    "shared device " + path + " is '" + found + "', configured as '" + id + "'");
  ::munmap(header, kHeaderBytes);
  if (!status.ok()) return status;
  return std::unique_ptr<SharedDevice>(new SharedDevice(path, found, std::move(fd), *size));
}

Status SharedDevice::Zero(uint64_t offset, uint64_t len) {
  if (offset % kSliceAlign != 0 || len == 0 || offset + len > data_bytes())
    return Status(Code::kInvalidArgument, "shared device " + path_ + ": zero range out of bounds");
  auto mapped = Map(fd_.get(), DeviceOffset(offset), len, path_);
  if (!mapped.ok()) return mapped.status();
  std::memset(*mapped, 0, len);
  ::msync(*mapped, len, MS_SYNC);
  ::munmap(*mapped, len);
  return Status::Ok();
}

}  // namespace cxlpool::cluster
