#include "pool/pool.h"

#include <algorithm>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

namespace {
constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage2M = 2ull << 20;

Result<uint64_t> RoundUp(uint64_t v, uint64_t align) {
  if (v == 0) return Status(Code::kInvalidArgument, "size must be greater than 0");
  if (v > UINT64_MAX - align) return Status(Code::kInvalidArgument, "size too large");
  return (v + align - 1) / align * align;
}
}  // namespace

Pool::Pool(std::string name, int numa_node, std::string kind, std::optional<int> tier,
           uint64_t capacity, std::string quota_tier)
    : name_(std::move(name)),
      numa_node_(numa_node),
      kind_(std::move(kind)),
      tier_(tier),
      quota_tier_(std::move(quota_tier)),
      capacity_(capacity) {}

Pool::~Pool() = default;

uint64_t Pool::reserve_bytes() const {
  const ExtentReserve* r = reserve();
  return r == nullptr ? 0 : r->used_bytes();
}

bool Pool::TryReserve(uint64_t bytes) {
  if (bytes > capacity_) return false;
  if (used_bytes() + bytes > capacity_ && !MakeRoom(bytes)) return false;
  reserved_ += bytes;
  return true;
}

void Pool::CancelReserve(uint64_t bytes) {
  CXLPOOL_CHECK(reserved_ >= bytes);
  reserved_ -= bytes;
}

void Pool::CommitReserve(uint64_t bytes, bool new_lease) {
  CXLPOOL_CHECK(reserved_ >= bytes);
  reserved_ -= bytes;
  leased_ += bytes;
  if (new_lease) ++lease_count_;
}

void Pool::BeginReclaim(uint64_t bytes) {
  CXLPOOL_CHECK(leased_ >= bytes && lease_count_ > 0);
  leased_ -= bytes;
  reclaiming_ += bytes;
  --lease_count_;
}

void Pool::MoveLeaseOut(uint64_t bytes, bool whole_lease) {
  CXLPOOL_CHECK(leased_ >= bytes && lease_count_ > 0);
  leased_ -= bytes;
  if (whole_lease) --lease_count_;
}

void Pool::MoveLeaseIn(uint64_t bytes, bool whole_lease) {
  leased_ += bytes;
  if (whole_lease) ++lease_count_;
}

void Pool::ReleaseLeased(uint64_t bytes) {
  CXLPOOL_CHECK(reclaiming_ >= bytes);
  reclaiming_ -= bytes;
}

bool Pool::FitsAfterReclaims(uint64_t bytes) const {
  // Reserve extents being retired come back too; ready ones MakeRoom
  // retires; those being built stay.
  const ExtentReserve* r = reserve();
  const uint64_t retiring = r == nullptr ? 0 : r->retiring_bytes();
  if ((reclaiming_ == 0 && retiring == 0) || bytes > capacity_) return false;
  const uint64_t reserve_kept = r == nullptr ? 0 : r->building_bytes();
  return leased_ + reserved_ + reserve_kept + bytes <= capacity_;
}

bool Pool::SetCapacity(uint64_t capacity) {
  if (capacity < leased_ + reserved_ + reclaiming_) return false;
  uint64_t old = capacity_;
  capacity_ = capacity;
  if (used_bytes() > capacity_ && !MakeRoom(0)) {
    capacity_ = old;
    return false;
  }
  CapacityChanged();
  return true;
}

bool Pool::MakeRoom(uint64_t bytes) {
  if (bytes > capacity_) return false;
  if (ExtentReserve* r = reserve(); r != nullptr && used_bytes() + bytes > capacity_) {
    // Ready reserve extents never left the daemon: retired here, on the
    // loop (their pages go back at once).
    r->Evict(used_bytes() + bytes - capacity_);
    RetireReserveNow();
  }
  return used_bytes() + bytes <= capacity_;
}

void Pool::RetireReserveNow() {
  ExtentReserve* r = reserve();
  if (r == nullptr) return;
  for (auto& e : r->TakeRetiring()) {
    const uint64_t n = e->size_bytes();
    e->Retire();
    r->Retired(n);
  }
}

// ---- MemfdPool ----------------------------------------------------------------

MemfdPool::MemfdPool(const NumaNode& node, uint64_t capacity, const PoolConfig& cfg, Options opts)
    : Pool("node" + std::to_string(node.id), node.id, NodeKindName(node.kind), node.memory_tier,
           capacity, NodeKindName(node.kind)),
      cfg_(cfg),
      opts_(opts) {
  MemfdSpec base;
  base.numa_node = opts_.bind ? numa_node() : -1;
  base.pin = cfg_.pin;
  base.prefault = opts_.prefault;
  base.thp =
      cfg_.thp && (opts_.shmem_thp == ShmemThp::kAdvise || opts_.shmem_thp == ShmemThp::kAlways);
  base.hugetlb = cfg_.hugetlb;
  base.name = "cxlpool:" + name();
  auto settings = ResolveReserve(cfg_.reserve_low, cfg_.reserve_high, capacity);
  if (!settings.ok()) {
    // The config reader refuses low > high; a capacity clamp cannot cause it.
    CXLPOOL_LOG(kWarning) << name() << ": " << settings.status().message() << "; no reserve";
    settings = ReserveSettings{};
  }
  reserve_ = std::make_unique<ExtentReserve>(name(), std::move(*settings), base);
}

void MemfdPool::CapacityChanged() {
  auto s = ResolveReserve(cfg_.reserve_low, cfg_.reserve_high, capacity());
  if (s.ok()) reserve_->Reconfigure(std::move(*s));
}

Status MemfdPool::SetReserveWatermarks(const CapacitySpec& low, const CapacitySpec& high) {
  auto s = ResolveReserve(low, high, capacity());
  if (!s.ok()) return s.status();
  cfg_.reserve_low = low;
  cfg_.reserve_high = high;
  reserve_->Reconfigure(std::move(*s));
  return Status::Ok();
}

Result<uint64_t> MemfdPool::RoundSize(uint64_t requested, bool hugetlb) const {
  auto r = RoundUp(requested, (hugetlb || cfg_.hugetlb) ? kHugePage2M : kSmallPage);
  if (!r.ok()) return r;
  if (*r > capacity()) {
    return Status(Code::kResourceExhausted, name() + ": " + HumanBytes(*r) +
                                                " exceeds the pool's capacity of " +
                                                HumanBytes(capacity()));
  }
  return r;
}

uint64_t MemfdPool::FreeHugepages() const {
  if (opts_.fs == nullptr) return 0;
  auto text = opts_.fs->ReadTrimmed("/sys/devices/system/node/node" + std::to_string(numa_node()) +
                                    "/hugepages/hugepages-2048kB/free_hugepages");
  if (!text.ok()) return 0;
  return ParseU64(*text).value_or(0);
}

Result<std::unique_ptr<Backing>> MemfdPool::Build(uint64_t size, bool hugetlb,
                                                  const FillOffer& offer) const {
  MemfdSpec spec;
  spec.offer_fill = offer;
  spec.stop = reserve_->build_stop();  // shutdown ends a cold build too
  spec.size_bytes = size;
  spec.numa_node = opts_.bind ? numa_node() : -1;
  spec.pin = cfg_.pin;
  spec.prefault = opts_.prefault;
  spec.thp =
      cfg_.thp && (opts_.shmem_thp == ShmemThp::kAdvise || opts_.shmem_thp == ShmemThp::kAlways);
  spec.name = "cxlpool:" + name();
  bool want_huge = (hugetlb || cfg_.hugetlb) && size % kHugePage2M == 0;
  if (want_huge) {
    uint64_t free_pages = FreeHugepages();
    if (free_pages >= size / kHugePage2M) {
      spec.hugetlb = true;
      auto r = CreateMemfdBacking(spec);
      if (r.ok() || hugetlb) return r;
      CXLPOOL_LOG(kInfo) << name()
                         << ": hugetlb build failed, using small pages: " << r.status().ToString();
      spec.hugetlb = false;
    } else if (hugetlb) {
      return Status(Code::kResourceExhausted,
                    name() + ": hugetlb asked for " + std::to_string(size / kHugePage2M) +
                        " free 2 MiB pages, the node has " + std::to_string(free_pages));
    }
  }
  return CreateMemfdBacking(spec);
}

// ---- DevdaxPool ---------------------------------------------------------------

DevdaxPool::DevdaxPool(DaxControl* control, const DaxRegionState& region, std::string kind,
                       std::optional<int> tier, uint64_t align)
    : Pool(region.dynamic || region.devices.empty() ? region.name : region.devices.front(),
           region.target_node, std::move(kind), tier,
           region.dynamic ? region.available_bytes : region.size_bytes, "devdax"),
      control_(control),
      region_(region.name),
      device_(region.devices.empty() ? std::string() : region.devices.front()),
      dynamic_(region.dynamic),
      align_(std::max<uint64_t>(align, kSmallPage)) {}

Result<uint64_t> DevdaxPool::RoundSize(uint64_t requested, bool hugetlb) const {
  if (hugetlb) {
    return Status(Code::kInvalidArgument, name() + ": hugetlb does not apply to devdax");
  }
  if (requested == 0) return Status(Code::kInvalidArgument, "size must be greater than 0");
  if (!dynamic_) {
    if (requested > capacity()) {
      return Status(Code::kResourceExhausted, name() + ": static device of " +
                                                  HumanBytes(capacity()) + " cannot hold " +
                                                  HumanBytes(requested));
    }
    return capacity();  // leased whole
  }
  auto r = RoundUp(requested, align_);
  if (r.ok() && *r > capacity()) {
    return Status(Code::kResourceExhausted, name() + ": " + HumanBytes(*r) +
                                                " exceeds the region's capacity of " +
                                                HumanBytes(capacity()));
  }
  return r;
}

namespace {
// The device number journalled with a devdax lease; 0 (logged) when the fd
// cannot tell (its reclaim after a restart then trusts sysfs alone).
uint64_t DeviceNumberOf(DaxControl* control, int fd) {
  auto rdev = control->FdDeviceNumber(fd);
  if (rdev.ok()) return *rdev;
  CXLPOOL_LOG(kWarning) << "devdax: device number of a new lease: " << rdev.status().ToString();
  return 0;
}
}  // namespace

Result<std::unique_ptr<Backing>> DevdaxPool::Build(uint64_t size, bool, const FillOffer&) const {
  if (!dynamic_) {
    if (device_.empty()) return Status(Code::kNotFound, name() + ": region has no device");
    auto fd = control_->Open(device_);
    if (!fd.ok()) return fd.status();
    uint64_t rdev = DeviceNumberOf(control_, fd->get());
    return MakeDevdaxBacking(control_, region_, device_, std::move(*fd), size, align_, false, rdev);
  }
  auto dev = control_->CreateDevice(region_, size, align_);
  if (!dev.ok()) return dev.status();
  auto fd = control_->Open(*dev);
  if (!fd.ok()) {
    Status st = control_->DestroyDevice(region_, *dev);
    if (!st.ok()) {
      CXLPOOL_LOG(kError) << "devdax: " << st.ToString();
    }
    return fd.status();
  }
  uint64_t rdev = DeviceNumberOf(control_, fd->get());
  return MakeDevdaxBacking(control_, region_, *dev, std::move(*fd), size, align_, true, rdev);
}

std::string DevdaxPool::LeaseDevice(const std::string& journalled) const {
  return dynamic_ ? journalled : device_;
}

bool DevdaxPool::DeviceExists(const std::string& device) const {
  return !device.empty() && control_->DeviceNumber(device).ok();
}

Result<uint64_t> DevdaxPool::CurrentDeviceNumber(const std::string& device) const {
  return control_->DeviceNumber(device);
}

std::vector<std::pair<std::string, uint64_t>> DevdaxPool::CarvedDevices() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  if (!dynamic_) return out;
  auto r = control_->Region(region_);
  if (!r.ok()) return out;
  for (const std::string& dev : r->devices) {
    auto size = control_->DeviceSize(dev);
    if (size.ok() && *size > 0) out.emplace_back(dev, *size);
  }
  return out;
}

Status DevdaxPool::DestroyDevice(const std::string& device) const {
  return control_->DestroyDevice(region_, device);
}

void DevdaxPool::CountCarvedAtStart(uint64_t bytes) {
  if (dynamic_) SetCapacity(capacity() + bytes);
}

std::unique_ptr<DevdaxBacking> DevdaxPool::Recovered(const std::string& device, uint64_t size,
                                                     uint64_t rdev, UniqueFd fd) const {
  DevdaxBacking::Device d;
  d.region = region_;
  d.device = device;
  d.size_bytes = size;
  d.align_bytes = align_;
  d.carved = dynamic_;
  d.rdev = rdev;
  return std::make_unique<DevdaxBacking>(control_, std::move(d), std::move(fd));
}

Status DevdaxPool::CheckFd(int fd, const std::string& device, uint64_t rdev) const {
  return CheckDaxFd(*control_, fd, device, rdev);
}

// ---- BuildPools ---------------------------------------------------------------

namespace {
std::string DaxSourceKind(const std::optional<std::string>& source) {
  if (source == "cxl") return "cxl";
  if (source == "nvdimm") return "nvm";
  if (source == "hmem") return "dram";
  return "unknown";
}
}  // namespace

Result<std::vector<std::unique_ptr<Pool>>> BuildPools(const Topology& topo,
                                                      const PoolsConfig& config,
                                                      const PoolBuildOptions& options,
                                                      std::vector<std::string>* warnings) {
  std::vector<std::unique_ptr<Pool>> pools;
  for (const auto& [id, cfg] : config.node_pools) {
    if (topo.FindNode(id) == nullptr && warnings) {
      warnings->push_back("pools.node." + std::to_string(id) + ": no such NUMA node; ignored");
    }
  }
  MemfdPool::Options mopts;
  mopts.bind = options.bind;
  mopts.prefault = options.prefault;
  mopts.fs = options.fs;
  mopts.shmem_thp = options.fs ? ReadShmemThp(*options.fs) : ShmemThp::kUnknown;
  for (const auto& node : topo.numa_nodes) {
    if (!node.memory_bytes || *node.memory_bytes == 0) continue;
    const PoolConfig& cfg = config.ForNode(node.id);
    if (!cfg.enabled) continue;
    if (auto why = NotPooledReason(node)) {
      // GPU memory never; memory of unknown kind only when the node's own
      // table says enabled = true.
      if (node.kind == NodeKind::kGpu || !cfg.enabled_explicitly) {
        if (warnings)
          warnings->push_back("node " + std::to_string(node.id) + " not pooled: " + *why);
        continue;
      }
      if (warnings) {
        warnings->push_back("node " + std::to_string(node.id) +
                            " (kind unknown) pooled: [pools.node." + std::to_string(node.id) +
                            "] enabled = true");
      }
    }
    uint64_t cap = cfg.capacity.Resolve(*node.memory_bytes);
    pools.push_back(std::make_unique<MemfdPool>(node, cap, cfg, mopts));
  }
  for (size_t i = 0; i < config.devdax.size(); ++i) {
    const auto& d = config.devdax[i];
    std::string key = "devdax[" + std::to_string(i) + "]";
    if (options.dax == nullptr) {
      return Status(Code::kUnsupported, key + ": devdax pools need libdaxctl");
    }
    // Accept a device name ("dax0.0") for its region.
    std::string region = d.region;
    const DaxDevice* dev = nullptr;
    for (const auto& x : topo.dax_devices) {
      if (x.name == d.region || (x.region && *x.region == d.region)) {
        dev = &x;
        if (x.region) region = *x.region;
        break;
      }
    }
    auto state = options.dax->Region(region);
    if (!state.ok()) {
      return Status(state.status().code(), key + ".region: " + state.status().message());
    }
    if (dev != nullptr && dev->mode && *dev->mode != "devdax") {
      return Status(Code::kInvalidArgument,
                    key + ".region: " + dev->name + " is in " + *dev->mode + " mode, not devdax");
    }
    std::string kind = "unknown";
    std::optional<int> tier;
    if (const NumaNode* n = topo.FindNode(state->target_node)) {
      kind = NodeKindName(n->kind);
      tier = n->memory_tier;
    } else if (dev != nullptr) {
      kind = DaxSourceKind(dev->source);
    }
    uint64_t align = d.align.value_or(state->align_bytes);
    if (state->align_bytes != 0 && align % state->align_bytes != 0) {
      return Status(Code::kInvalidArgument, key + ".align: " + HumanBytes(align) +
                                                " is not a multiple of the region's " +
                                                HumanBytes(state->align_bytes));
    }
    if (!state->dynamic && state->devices.empty()) {
      return Status(Code::kNotFound, key + ".region: static region " + region + " has no device");
    }
    pools.push_back(std::make_unique<DevdaxPool>(options.dax, *state, kind, tier, align));
  }
  return pools;
}

}  // namespace cxlpool
