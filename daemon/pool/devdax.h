// DaxControl: the seam between devdax pools and libdaxctl.
//
// A dynamic DAX region (hmem, CXL RAM) is carved into sub-devices, one per
// lease: create a device, set its alignment and size, enable it in devdax
// mode, open /dev/daxR.N and hand that fd over. The sub-device is destroyed
// when the lease ends. A static region (made from a pmem namespace) cannot be
// sub-divided: its one device is leased whole.
//
// MakeLibDaxctlControl() talks to the kernel through libdaxctl (exercised in
// the VM tier); tests use a fake (tests/daemon/fake_dax_control.h).
//
// Thread safety: implementations must be safe to call from several worker
// threads at once (the libdaxctl one serialises on a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "pool/backing.h"

namespace cxlpool {

struct DaxRegionState {
  std::string name;              // as configured: "dax_region0" / "region0"
  uint64_t size_bytes = 0;       // whole region
  uint64_t available_bytes = 0;  // not yet carved
  uint64_t align_bytes = 0;      // region alignment (>= 4 KiB)
  bool dynamic = false;          // can be sub-divided
  int target_node = -1;
  std::vector<std::string> devices;  // enabled devices ("dax0.0")
};

class DaxControl {
 public:
  virtual ~DaxControl() = default;
  // NOT_FOUND when the region does not exist.
  virtual Result<DaxRegionState> Region(const std::string& region) = 0;
  // Carves a devdax sub-device of exactly `size` (a multiple of `align`) and
  // returns its name ("dax0.3"). RESOURCE_EXHAUSTED when the region is full.
  virtual Result<std::string> CreateDevice(const std::string& region, uint64_t size,
                                           uint64_t align) = 0;
  // Disables and destroys a sub-device made by CreateDevice.
  virtual Status DestroyDevice(const std::string& region, const std::string& device) = 0;
  // Opens /dev/<device> read-write, O_CLOEXEC.
  virtual Result<UniqueFd> Open(const std::string& device) = 0;

  // Identifying a devdax fd (a lease handed back after a restart). The
  // defaults read the kernel; test fakes override both.
  // Which device `fd` is: its st_rdev when it is a character device;
  // INVALID_ARGUMENT when it is not one (a memfd, a regular file).
  virtual Result<uint64_t> FdDeviceNumber(int fd);
  // The device number of DAX device `device` now, from sysfs
  // (/sys/bus/dax/devices/<device>/dev, "MAJ:MIN"); NOT_FOUND when gone.
  virtual Result<uint64_t> DeviceNumber(const std::string& device);
  // The size of DAX device `device` now, from sysfs
  // (/sys/bus/dax/devices/<device>/size, bytes); NOT_FOUND when gone.
  virtual Result<uint64_t> DeviceSize(const std::string& device);
};

// The real one, on libdaxctl. UNSUPPORTED when the library context fails.
Result<std::unique_ptr<DaxControl>> MakeLibDaxctlControl();

// A lease backed by a DAX device. Reclaim closes the daemon's fd and, for a
// carved sub-device, destroys it (a client that still holds the device open
// keeps it busy; the failure is logged and the capacity stays free on paper,
// see docs/daemon.md).
//
// After a daemon restart a journalled devdax lease comes back as a
// DevdaxBacking without an fd (fd() is -1) until its holder hands the device
// back (AdoptFd): it still owns its sub-device, so a lease whose holders
// never come back destroys it when freed.
class DevdaxBacking final : public Backing {
 public:
  struct Device {
    std::string region;  // as configured ("dax_region0")
    std::string device;  // "dax0.1"
    uint64_t size_bytes = 0;
    uint64_t align_bytes = 0;
    bool carved = false;  // a sub-device made for this lease (destroyed at the end)
    uint64_t rdev = 0;    // st_rdev of /dev/<device>; 0 unknown
  };
  // `fd` may be invalid (a recovered lease awaiting its fd).
  DevdaxBacking(DaxControl* control, Device device, UniqueFd fd);
  ~DevdaxBacking() override { Reclaim(); }

  int fd() const override { return fd_.get(); }
  uint64_t size_bytes() const override { return dev_.size_bytes; }
  uint64_t page_size() const override { return dev_.align_bytes; }
  const std::string& kind() const override;
  const std::string& dax_device() const override { return dev_.device; }
  uint64_t device_number() const override { return dev_.rdev; }
  bool carved() const { return dev_.carved; }
  // Gives a recovered lease the device fd handed back (already checked with
  // CheckDaxFd). Ignored once reclaimed; replaces nothing if one is held.
  void AdoptFd(UniqueFd fd);
  void Reclaim() override;

 private:
  DaxControl* control_;
  Device dev_;
  UniqueFd fd_;
  bool reclaimed_ = false;
};

std::unique_ptr<Backing> MakeDevdaxBacking(DaxControl* control, std::string region,
                                           std::string device, UniqueFd fd, uint64_t size,
                                           uint64_t align, bool carved, uint64_t rdev = 0);

// "MAJ:MIN" of a device number (for messages).
std::string DevNumberString(uint64_t rdev);
// Parses a sysfs "dev" file ("252:3\n"); nullopt when garbled.
std::optional<uint64_t> ParseDevNumber(std::string_view text);
// st_rdev of `fd` if it is a character device, else INVALID_ARGUMENT.
Result<uint64_t> CharDeviceNumber(int fd);
// /sys/bus/dax/devices/<device>/dev through `fs`. NOT_FOUND when the device
// does not exist; INVALID_ARGUMENT for a name that is not a plain device name.
Result<uint64_t> ReadDaxDeviceNumber(const FileSystem& fs, const std::string& device);

// Is `fd` the DAX device `device`? A character device whose device number
// is the one `device` has now and, when `journalled_rdev` is not 0, the one
// journalled at the grant (a destroyed and re-created device of the same
// name is not the lease's). INVALID_ARGUMENT naming what differs; NOT_FOUND
// when `device` no longer exists.
Status CheckDaxFd(DaxControl& control, int fd, const std::string& device, uint64_t journalled_rdev);

// "dax_region3" / "region3" / "3" -> 3; -1 if none of those.
int DaxRegionId(const std::string& name);

}  // namespace cxlpool
