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
#include <string>
#include <vector>

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
};

// The real one, on libdaxctl. UNSUPPORTED when the library context fails.
Result<std::unique_ptr<DaxControl>> MakeLibDaxctlControl();

// A lease backed by a DAX device. Reclaim closes the daemon's fd and, for a
// carved sub-device, destroys it (a client that still holds the device open
// keeps it busy; the failure is logged and the capacity stays free on paper,
// see docs/daemon.md).
std::unique_ptr<Backing> MakeDevdaxBacking(DaxControl* control, std::string region,
                                           std::string device, UniqueFd fd, uint64_t size,
                                           uint64_t align, bool carved);

// "dax_region3" / "region3" / "3" -> 3; -1 if none of those.
int DaxRegionId(const std::string& name);

}  // namespace cxlpool
