#include "lease/restart.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

class ProcProbe final : public ProcessProbe {
 public:
  std::optional<uint64_t> StartTime(pid_t pid) const override {
    if (pid <= 0) return std::nullopt;
    static const std::unique_ptr<FileSystem> proc = MakeRootedFileSystem("/");
    auto st = ReadProcStat(*proc, pid);
    // A zombie (or a dying task) no longer holds any fd or mapping.
    if (!st.ok() || st->gone()) return std::nullopt;
    return st->start_time;
  }

  Holding HoldsFile(pid_t pid, uint64_t dev, uint64_t ino) const override {
    if (pid <= 0 || ino == 0) return Holding::kUnknown;
    std::string base = "/proc/" + std::to_string(pid);
    DIR* d = ::opendir((base + "/fd").c_str());
    if (d == nullptr) return errno == ENOENT ? Holding::kNo : Holding::kUnknown;
    bool found = false;
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      struct stat st {};
      if (::stat((base + "/fd/" + e->d_name).c_str(), &st) != 0) continue;
      if (st.st_ino == ino && (dev == 0 || st.st_dev == dev)) {
        found = true;
        break;
      }
    }
    ::closedir(d);
    if (found) return Holding::kYes;
    // A mapping keeps the memory alive even after the fd was closed.
    std::ifstream maps(base + "/maps");
    if (!maps) return Holding::kUnknown;
    std::string line;
    while (std::getline(maps, line)) {
      auto f = SplitWhitespace(line);
      if (f.size() < 5) continue;
      auto inode = ParseU64(f[4]);
      if (!inode || *inode != ino) continue;
      auto colon = f[3].find(':');
      if (dev != 0 && colon != std::string::npos) {
        auto major = ParseU64(f[3].substr(0, colon), 16);
        auto minor = ParseU64(f[3].substr(colon + 1), 16);
        if (major && minor && makedev(*major, *minor) != dev) continue;
      }
      return Holding::kYes;
    }
    return Holding::kNo;
  }

  UniqueFd OpenPidfd(pid_t pid) const override {
#ifdef SYS_pidfd_open
    if (pid > 0) return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
    return UniqueFd();
  }
};

class AwaitedMemory final : public Backing {
 public:
  AwaitedMemory(uint64_t size, uint64_t page, std::string kind)
      : size_(size), page_(page), kind_(std::move(kind)) {}
  int fd() const override { return -1; }
  uint64_t size_bytes() const override { return size_; }
  uint64_t page_size() const override { return page_; }
  const std::string& kind() const override { return kind_; }
  void Reclaim() override {}

 private:
  uint64_t size_;
  uint64_t page_;
  std::string kind_;
};

}  // namespace

std::unique_ptr<ProcessProbe> MakeProcProbe() { return std::make_unique<ProcProbe>(); }

bool HolderAlive(const ProcessProbe& probe, const HolderId& holder) {
  auto st = probe.StartTime(holder.pid);
  if (!st) return false;
  return holder.start_time == 0 || *st == holder.start_time;
}

std::vector<DurableExtent> ExtentsOf(const DurableLease& lease) {
  if (!lease.extents.empty()) return lease.extents;
  return {DurableExtent{lease.size_bytes, lease.inode, lease.inode_dev}};
}

uint32_t FirstNotOn(const DurableLease& lease) {
  for (size_t i = 0; i < lease.extent_pools.size(); ++i) {
    if (lease.extent_pools[i] != lease.migrating_to_pool) return static_cast<uint32_t>(i);
  }
  return 0;
}

Status CheckLeaseFds(const std::vector<UniqueFd>& fds, const DurableLease& lease) {
  const size_t n = ExtentsOf(lease).size();
  if (fds.size() != n) {
    return Status(Code::kInvalidArgument, "lease " + std::to_string(lease.id) + ": it has " +
                                              std::to_string(n) + " extents, " +
                                              std::to_string(fds.size()) + " fds were handed back");
  }
  for (size_t i = 0; i < n; ++i) {
    CXLPOOL_RETURN_IF_ERROR(CheckLeaseFd(fds[i].get(), lease, i));
  }
  return Status::Ok();
}

Status CheckLeaseFd(int fd, const DurableLease& lease, size_t index) {
  const std::vector<DurableExtent> extents = ExtentsOf(lease);
  std::string what = "lease " + std::to_string(lease.id) + ": ";
  if (index >= extents.size()) {
    return Status(Code::kInvalidArgument, what + "it has no extent " + std::to_string(index));
  }
  const DurableExtent& x = extents[index];
  if (extents.size() > 1) what += "extent " + std::to_string(index) + ": ";
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    return Status(Code::kInvalidArgument, what + "no usable fd handed back");
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(Code::kInvalidArgument,
                  what + "the fd is not a memfd (this lease is a memfd lease)");
  }
  if (x.inode == 0 || st.st_ino != x.inode || (x.inode_dev != 0 && st.st_dev != x.inode_dev)) {
    return Status(Code::kInvalidArgument, what + "the fd is not this lease's memfd (inode " +
                                              std::to_string(st.st_ino) + ", journalled " +
                                              std::to_string(x.inode) + ")");
  }
  if (static_cast<uint64_t>(st.st_size) != x.size_bytes) {
    return Status(Code::kInvalidArgument,
                  what + "the memfd is " + std::to_string(st.st_size) + " bytes, the " +
                      (extents.size() > 1 ? "extent " : "lease ") + std::to_string(x.size_bytes));
  }
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_GROW)) {
    return Status(Code::kInvalidArgument, what + "the fd is not a sealed cxlpool memfd");
  }
  return Status::Ok();
}

Result<MemfdFacts> CheckUnknownMemfd(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    return Status(Code::kInvalidArgument, "no usable fd handed back");
  }
  if (!S_ISREG(st.st_mode)) return Status(Code::kInvalidArgument, "the fd is not a memfd");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Status(Code::kInvalidArgument, "the fd is not a memfd (no seals)");
  if (!(seals & F_SEAL_GROW) || !(seals & F_SEAL_SEAL) ||
      (seals & (F_SEAL_SHRINK | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))) {
    return Status(Code::kInvalidArgument,
                  "the fd is not sealed like a cxlpool lease (grow and seal, never shrink or "
                  "write)");
  }
  if (st.st_size <= 0) {
    return Status(Code::kInvalidArgument, "the memfd is empty (a revoked or freed lease)");
  }
  MemfdFacts f;
  f.size_bytes = static_cast<uint64_t>(st.st_size);
  f.inode = st.st_ino;
  f.dev = st.st_dev;
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) == 0 && sfs.f_type == HUGETLBFS_MAGIC) {
    f.hugetlb = true;
    f.page_size = static_cast<uint64_t>(st.st_blksize);
  }
  if (f.size_bytes % f.page_size != 0) {
    return Status(Code::kInvalidArgument, "the memfd's size " + std::to_string(f.size_bytes) +
                                              " is not a multiple of its page size");
  }
  return f;
}

std::map<int, uint64_t> ResidentNodes(void* addr, uint64_t size, uint32_t samples) {
  std::map<int, uint64_t> out;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = size / page;
  if (addr == nullptr || pages == 0 || samples == 0) return out;
  const uint64_t step = std::max<uint64_t>(1, pages / samples);
  std::vector<void*> at;
  for (uint64_t i = 0; i < pages && at.size() < samples; i += step) {
    char* p = static_cast<char*>(addr) + i * page;
    unsigned char in_core = 0;
    if (::mincore(p, page, &in_core) != 0 || !(in_core & 1)) continue;
    // Map the page the page cache holds, so move_pages can see it in this
    // process. Never by reading it: the holder may have truncated the file
    // since, and a load past its end is SIGBUS. MADV_POPULATE_READ reports
    // that as an error instead (a kernel before 5.14 has no such call: the
    // page is not counted).
    if (::madvise(p, page, MADV_POPULATE_READ) != 0) continue;
    at.push_back(p);
  }
  if (at.empty()) return out;
  std::vector<int> status(at.size(), -1);
  // The system call itself (libnuma's wrapper adds nothing here).
  if (::syscall(SYS_move_pages, 0, at.size(), at.data(), nullptr, status.data(), 0) != 0) {
    return out;
  }
  for (int node : status) {
    if (node >= 0) ++out[node];
  }
  return out;
}

Result<std::unique_ptr<Backing>> AdoptMemfd(UniqueFd fd, const DurableLease& lease, bool pin,
                                            uint64_t size) {
  if (size == 0) size = lease.size_bytes;
  if (size == 0) return Status(Code::kInvalidArgument, "lease size 0");
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) {
    return Status::FromErrno(errno, "mmap of lease " + std::to_string(lease.id) + "'s memfd");
  }
  if (pin && ::mlock(addr, size) != 0) {
    CXLPOOL_LOG(kWarning) << "lease " << lease.id << ": mlock after adoption failed ("
                          << std::strerror(errno) << "); the memory is kept, unpinned";
  }
  return WrapMemfdBacking(std::move(fd), addr, size, lease.page_size ? lease.page_size : 4096,
                          lease.backing.empty() ? std::string("memfd") : lease.backing);
}

Result<std::vector<std::unique_ptr<Backing>>> AdoptMemfds(std::vector<UniqueFd> fds,
                                                          const DurableLease& lease, bool pin) {
  const std::vector<DurableExtent> extents = ExtentsOf(lease);
  if (fds.size() != extents.size()) {
    return Status(Code::kInvalidArgument, "lease " + std::to_string(lease.id) + ": " +
                                              std::to_string(fds.size()) + " fds for " +
                                              std::to_string(extents.size()) + " extents");
  }
  // Every extent mapped first: a backing truncates its memfd when it goes,
  // so none is made until all of them can be (a failure unmaps and closes,
  // and the holders' memory stays as it is).
  std::vector<void*> maps;
  for (size_t i = 0; i < fds.size(); ++i) {
    void* addr = extents[i].size_bytes == 0
                     ? MAP_FAILED
                     : ::mmap(nullptr, extents[i].size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                              fds[i].get(), 0);
    if (addr == MAP_FAILED) {
      const int err = extents[i].size_bytes == 0 ? EINVAL : errno;
      for (size_t j = 0; j < maps.size(); ++j) ::munmap(maps[j], extents[j].size_bytes);
      return Status::FromErrno(
          err, "mmap of lease " + std::to_string(lease.id) + "'s extent " + std::to_string(i));
    }
    maps.push_back(addr);
  }
  std::vector<std::unique_ptr<Backing>> out;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (pin && ::mlock(maps[i], extents[i].size_bytes) != 0) {
      CXLPOOL_LOG(kWarning) << "lease " << lease.id << ": mlock after adoption failed ("
                            << std::strerror(errno) << "); the memory is kept, unpinned";
    }
    out.push_back(WrapMemfdBacking(std::move(fds[i]), maps[i], extents[i].size_bytes,
                                   lease.page_size ? lease.page_size : 4096,
                                   lease.backing.empty() ? std::string("memfd") : lease.backing));
  }
  return out;
}

std::vector<std::unique_ptr<Backing>> MakeAwaitedBackings(const DurableLease& lease) {
  std::vector<std::unique_ptr<Backing>> out;
  for (const DurableExtent& x : ExtentsOf(lease)) {
    out.push_back(std::make_unique<AwaitedMemory>(x.size_bytes,
                                                  lease.page_size ? lease.page_size : 4096,
                                                  lease.backing.empty() ? "memfd" : lease.backing));
  }
  return out;
}

}  // namespace cxlpool
