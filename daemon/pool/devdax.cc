#include "pool/devdax.h"

#include <daxctl/libdaxctl.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

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

namespace {

class DevdaxBacking final : public Backing {
 public:
  DevdaxBacking(DaxControl* control, std::string region, std::string device, UniqueFd fd,
                uint64_t size, uint64_t align, bool carved)
      : control_(control),
        region_(std::move(region)),
        device_(std::move(device)),
        fd_(std::move(fd)),
        size_(size),
        align_(align),
        carved_(carved) {}
  ~DevdaxBacking() override { Reclaim(); }

  int fd() const override { return fd_.get(); }
  uint64_t size_bytes() const override { return size_; }
  uint64_t page_size() const override { return align_; }
  const std::string& kind() const override {
    static const std::string kKind = "devdax";
    return kKind;
  }
  void Reclaim() override {
    if (!fd_.valid()) return;
    fd_.Reset();
    if (carved_) {
      Status st = control_->DestroyDevice(region_, device_);
      if (!st.ok()) {
        CXLPOOL_LOG(kError) << "devdax: could not destroy " << device_ << " in " << region_
                            << " (a client may still hold it open): " << st.ToString();
      }
    }
  }

 private:
  DaxControl* control_;
  std::string region_;
  std::string device_;
  UniqueFd fd_;
  uint64_t size_;
  uint64_t align_;
  bool carved_;
};

class LibDaxctlControl final : public DaxControl {
 public:
  explicit LibDaxctlControl(daxctl_ctx* ctx) : ctx_(ctx) {}
  ~LibDaxctlControl() override { daxctl_unref(ctx_); }

  Result<DaxRegionState> Region(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
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

  Result<std::string> CreateDevice(const std::string& name, uint64_t size,
                                   uint64_t align) override {
    std::lock_guard<std::mutex> lock(mu_);
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

  Status DestroyDevice(const std::string& name, const std::string& device) override {
    std::lock_guard<std::mutex> lock(mu_);
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
  Result<daxctl_region*> Find(const std::string& name) {
    int id = DaxRegionId(name);
    daxctl_region* region = nullptr;
    daxctl_region_foreach(ctx_, region) {
      if (daxctl_region_get_id(region) == id) return region;
    }
    return Status(Code::kNotFound, "no DAX region '" + name + "'");
  }

  std::mutex mu_;
  daxctl_ctx* ctx_;
};

}  // namespace

std::unique_ptr<Backing> MakeDevdaxBacking(DaxControl* control, std::string region,
                                           std::string device, UniqueFd fd, uint64_t size,
                                           uint64_t align, bool carved) {
  return std::make_unique<DevdaxBacking>(control, std::move(region), std::move(device),
                                         std::move(fd), size, align, carved);
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
