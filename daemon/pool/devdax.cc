#include "pool/devdax.h"

#include <daxctl/libdaxctl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool {

int DaxRegionId(const std::string& name) {
  std::string_view s = name;
  for (std::string_view prefix : {"dax_region", "region"}) {
    if (StartsWith(s, prefix)) {
      s.remove_prefix(prefix.size());
      break;
    }
  }
  auto v = ParseU64(s);
  if (!v || *v > 1u << 20) return -1;
  return static_cast<int>(*v);
}

const std::string& DevdaxBacking::kind() const {
  static const std::string kKind = "devdax";
  return kKind;
}

DevdaxBacking::DevdaxBacking(DaxControl* control, Device device, UniqueFd fd)
    : control_(control), dev_(std::move(device)), fd_(std::move(fd)) {}

void DevdaxBacking::AdoptFd(UniqueFd fd) {
  if (reclaimed_ || fd_.valid()) return;
  fd_ = std::move(fd);
}

void DevdaxBacking::Reclaim() {
  if (reclaimed_) return;
  reclaimed_ = true;
  fd_.Reset();
  if (dev_.carved && control_ != nullptr) {
    Status st = control_->DestroyDevice(dev_.region, dev_.device);
    if (!st.ok()) {
      CXLPOOL_LOG(kError) << "devdax: could not destroy " << dev_.device << " in " << dev_.region
                          << " (a client may still hold it open): " << st.ToString();
    }
  }
}

std::string DevNumberString(uint64_t rdev) {
  return std::to_string(major(rdev)) + ":" + std::to_string(minor(rdev));
}

std::optional<uint64_t> ParseDevNumber(std::string_view text) {
  text = Trim(text);
  auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto maj = ParseU64(text.substr(0, colon));
  auto min = ParseU64(text.substr(colon + 1));
  if (!maj || !min || *maj > 0xfffff || *min > 0xfffff) return std::nullopt;
  return makedev(static_cast<unsigned>(*maj), static_cast<unsigned>(*min));
}

Result<uint64_t> CharDeviceNumber(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    return Status(Code::kInvalidArgument, "no usable fd");
  }
  if (!S_ISCHR(st.st_mode)) {
    return Status(Code::kInvalidArgument,
                  std::string("the fd is not a DAX character device (it is ") +
                      (S_ISREG(st.st_mode) ? "a regular file or memfd" : "not a device") + ")");
  }
  return static_cast<uint64_t>(st.st_rdev);
}

Result<uint64_t> ReadDaxDeviceNumber(const FileSystem& fs, const std::string& device) {
  if (device.empty() || device.find('/') != std::string::npos || device == "." || device == "..") {
    return Status(Code::kInvalidArgument, "'" + device + "' is not a DAX device name");
  }
  std::string path = "/sys/bus/dax/devices/" + device + "/dev";
  auto text = fs.ReadTrimmed(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) {
      return Status(Code::kNotFound, "DAX device " + device + " does not exist (no " + path + ")");
    }
    return text.status();
  }
  auto rdev = ParseDevNumber(*text);
  if (!rdev) return Status(Code::kIo, path + ": '" + *text + "' is not MAJ:MIN");
  return *rdev;
}

Status CheckDaxFd(DaxControl& control, int fd, const std::string& device,
                  uint64_t journalled_rdev) {
  auto have = control.FdDeviceNumber(fd);
  if (!have.ok()) return Status(Code::kInvalidArgument, have.status().message());
  auto now = control.DeviceNumber(device);
  if (!now.ok()) return now.status();
  if (journalled_rdev != 0 && *now != journalled_rdev) {
    return Status(Code::kInvalidArgument, device + " is now device " + DevNumberString(*now) +
                                              ", journalled " + DevNumberString(journalled_rdev) +
                                              " (destroyed and created again?)");
  }
  if (*have != *now) {
    return Status(Code::kInvalidArgument, "the fd is device " + DevNumberString(*have) + ", not " +
                                              device + " (" + DevNumberString(*now) + ")");
  }
  return Status::Ok();
}

Result<uint64_t> DaxControl::FdDeviceNumber(int fd) { return CharDeviceNumber(fd); }

Result<uint64_t> DaxControl::DeviceNumber(const std::string& device) {
  static const std::unique_ptr<FileSystem> kRoot = MakeRootedFileSystem("/");
  return ReadDaxDeviceNumber(*kRoot, device);
}

Result<uint64_t> DaxControl::DeviceSize(const std::string& device) {
  static const std::unique_ptr<FileSystem> kRoot = MakeRootedFileSystem("/");
  if (device.empty() || device.find('/') != std::string::npos || device == "." || device == "..") {
    return Status(Code::kInvalidArgument, "'" + device + "' is not a DAX device name");
  }
  const std::string path = "/sys/bus/dax/devices/" + device + "/size";
  auto text = kRoot->ReadTrimmed(path);
  if (!text.ok()) return text.status();
  auto v = ParseU64(*text);
  if (!v) return Status(Code::kIo, path + ": '" + *text + "' is not a size");
  return *v;
}

namespace {

class LibDaxctlControl final : public DaxControl {
 public:
  explicit LibDaxctlControl(daxctl_ctx* ctx) : ctx_(ctx) {}
  ~LibDaxctlControl() override { daxctl_unref(ctx_); }

  Result<DaxRegionState> Region(const std::string& name) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto r = Find(name);
    if (!r.ok()) return r.status();
    daxctl_region* region = *r;
    DaxRegionState s;
    s.name = name;
    s.size_bytes = daxctl_region_get_size(region);
    s.available_bytes = daxctl_region_get_available_size(region);
    s.align_bytes = daxctl_region_get_align(region);
    s.dynamic = daxctl_region_get_dev_seed(region) != nullptr;
    daxctl_dev* dev = nullptr;
    daxctl_dev_foreach(region, dev) {
      if (daxctl_dev_get_size(dev) == 0) continue;
      s.devices.push_back(daxctl_dev_get_devname(dev));
      if (s.target_node < 0) s.target_node = daxctl_dev_get_target_node(dev);
    }
    return s;
  }

  Result<std::string> CreateDevice(const std::string& name, uint64_t size, uint64_t align) override
      EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto r = Find(name);
    if (!r.ok()) return r.status();
    daxctl_region* region = *r;
    if (daxctl_region_get_available_size(region) < size) {
      return Status(Code::kResourceExhausted,
                    name + ": only " + HumanBytes(daxctl_region_get_available_size(region)) +
                        " left to carve, " + HumanBytes(size) + " asked");
    }
    int rc = daxctl_region_create_dev(region);
    if (rc < 0) return Status::FromErrno(-rc, name + ": create device");
    daxctl_dev* dev = daxctl_region_get_dev_seed(region);
    if (dev == nullptr) return Status(Code::kUnsupported, name + ": not a dynamic region");
    std::string devname = daxctl_dev_get_devname(dev);
    if ((rc = daxctl_dev_set_align(dev, align)) < 0 || (rc = daxctl_dev_set_size(dev, size)) < 0 ||
        (rc = daxctl_dev_enable_devdax(dev)) < 0) {
      Status st = Status::FromErrno(-rc, name + ": configure " + devname);
      daxctl_dev_set_size(dev, 0);
      daxctl_region_destroy_dev(region, dev);
      return st;
    }
    return devname;
  }

  Status DestroyDevice(const std::string& name, const std::string& device) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto r = Find(name);
    if (!r.ok()) return r.status();
    daxctl_dev* dev = nullptr;
    daxctl_dev_foreach(*r, dev) {
      if (device != daxctl_dev_get_devname(dev)) continue;
      int rc = daxctl_dev_disable(dev);
      if (rc < 0) return Status::FromErrno(-rc, "disable " + device);
      if ((rc = daxctl_dev_set_size(dev, 0)) < 0) return Status::FromErrno(-rc, "shrink " + device);
      if ((rc = daxctl_region_destroy_dev(*r, dev)) < 0) {
        return Status::FromErrno(-rc, "destroy " + device);
      }
      return Status::Ok();
    }
    return Status(Code::kNotFound, name + ": no device " + device);
  }

  Result<UniqueFd> Open(const std::string& device) override {
    std::string path = "/dev/" + device;
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) return Status::FromErrno(errno, "open " + path);
    return fd;
  }

 private:
  Result<daxctl_region*> Find(const std::string& name) REQUIRES(mu_) {
    int id = DaxRegionId(name);
    daxctl_region* region = nullptr;
    daxctl_region_foreach(ctx_, region) {
      if (daxctl_region_get_id(region) == id) return region;
    }
    return Status(Code::kNotFound, "no DAX region '" + name + "'");
  }

  // Every libdaxctl call on ctx_ (and the regions it hands out) holds mu_.
  Mutex mu_;
  daxctl_ctx* const ctx_ PT_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Backing> MakeDevdaxBacking(DaxControl* control, std::string region,
                                           std::string device, UniqueFd fd, uint64_t size,
                                           uint64_t align, bool carved, uint64_t rdev) {
  DevdaxBacking::Device d;
  d.region = std::move(region);
  d.device = std::move(device);
  d.size_bytes = size;
  d.align_bytes = align;
  d.carved = carved;
  d.rdev = rdev;
  return std::make_unique<DevdaxBacking>(control, std::move(d), std::move(fd));
}

Result<std::unique_ptr<DaxControl>> MakeLibDaxctlControl() {
  daxctl_ctx* ctx = nullptr;
  int rc = daxctl_new(&ctx);
  if (rc < 0 || ctx == nullptr) {
    return Status(Code::kUnsupported, std::string("libdaxctl: ") + std::strerror(-rc));
  }
  return std::unique_ptr<DaxControl>(new LibDaxctlControl(ctx));
}

}  // namespace cxlpool
