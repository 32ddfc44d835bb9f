#include "lease/longterm_pin.h"

#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <vector>

#include "cxlpool/common/page_census.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

Result<uint64_t> KernelZoneFreeBytes(std::string_view zoneinfo, int node, uint64_t page_size) {
  uint64_t pages = 0;
  bool found = false;
  bool in_node = false, kernel = false;
  std::optional<uint64_t> free, low;
  auto flush = [&] {
    if (in_node && kernel && free) {
      found = true;
      uint64_t floor = low.value_or(0);
      if (*free > floor) pages += *free - floor;
    }
    free.reset();
    low.reset();
  };
  for (const auto& line : Split(zoneinfo, '\n')) {
    auto f = SplitWhitespace(line);
    if (f.size() == 4 && f[0] == "Node" && f[2] == "zone" && EndsWith(f[1], ",")) {
      flush();
      auto id = ParseU64(std::string_view(f[1]).substr(0, f[1].size() - 1));
      in_node = id && *id == static_cast<uint64_t>(node);
      kernel = f[3] != "Movable" && f[3] != "Device";
      continue;
    }
    if (!in_node) continue;
    if (f.size() == 3 && f[0] == "pages" && f[1] == "free" && !free) {
      free = ParseU64(f[2]);
    } else if (f.size() == 2 && f[0] == "low" && !low) {
      low = ParseU64(f[1]);
    }
  }
  flush();
  if (!found) {
    return Status(Code::kNotFound,
                  "no kernel zone of node " + std::to_string(node) + " in /proc/zoneinfo");
  }
  return pages * page_size;
}

namespace {

// Pins [addr, addr + len) long-term through io_uring and unpins it again.
Status PinAndUnpin(void* addr, uint64_t len) {
  // One fixed buffer may span at most 1 GiB; the kernel takes up to 16384.
  constexpr uint64_t kMaxBuffer = uint64_t{1} << 30;
  constexpr size_t kMaxBuffers = 16384;
  std::vector<iovec> iov;
  for (uint64_t off = 0; off < len; off += kMaxBuffer) {
    iov.push_back(iovec{static_cast<char*>(addr) + off,
                        static_cast<size_t>(len - off < kMaxBuffer ? len - off : kMaxBuffer)});
  }
  if (iov.size() > kMaxBuffers) {
    return Status(Code::kResourceExhausted, "lease too large to pin through io_uring (" +
                                                HumanBytes(len) + ", at most 16 TiB)");
  }
  io_uring_params params{};
  long ring = ::syscall(__NR_io_uring_setup, 1, &params);
  if (ring < 0) {
    int e = errno;
    Status st = Status::FromErrno(e, "io_uring_setup");
    if (e == ENOSYS || e == EPERM) return Status(Code::kUnsupported, st.message());
    return st;
  }
  UniqueFd fd(static_cast<int>(ring));
  if (::syscall(__NR_io_uring_register, fd.get(), IORING_REGISTER_BUFFERS, iov.data(),
                static_cast<unsigned>(iov.size())) != 0) {
    return Status::FromErrno(errno,
                             "io_uring_register(IORING_REGISTER_BUFFERS, " + HumanBytes(len) + ")");
  }
  // Unpin now rather than in the ring's asynchronous teardown.
  if (::syscall(__NR_io_uring_register, fd.get(), IORING_UNREGISTER_BUFFERS, nullptr, 0) != 0) {
    return Status::FromErrno(errno, "io_uring_register(IORING_UNREGISTER_BUFFERS)");
  }
  return Status::Ok();
}

}  // namespace

Status CheckKernelZoneRoom(uint64_t len, int node, const FileSystem& proc) {
  auto text = proc.ReadFile("/proc/zoneinfo");
  if (!text.ok()) return Status(Code::kIo, "/proc/zoneinfo: " + text.status().message());
  auto free = KernelZoneFreeBytes(*text, node, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  if (!free.ok()) return free.status();
  if (*free < len) {
    return Status(Code::kResourceExhausted, "node " + std::to_string(node) +
                                                "'s kernel zones have " + HumanBytes(*free) +
                                                " free, the lease needs " + HumanBytes(len) +
                                                " there to stay on the node once pinned");
  }
  return Status::Ok();
}

Status SettleInKernelZones(void* addr, uint64_t len, uint64_t page_size, int node) {
  if (addr == nullptr || len == 0) return Status(Code::kInvalidArgument, "no mapping to settle");
  const std::string where = "node " + std::to_string(node);
  if (Status st = PinAndUnpin(addr, len); !st.ok()) {
    return Status(st.code(),
                  "cannot move the lease into " + where + "'s kernel zones: " + st.message());
  }
  auto census = CensusPages(addr, len, page_size);
  if (!census.ok()) return census.status();
  const uint64_t here = census->on_node.count(node) ? census->on_node.at(node) : 0;
  if (here != census->sampled) {
    return Status(
        Code::kResourceExhausted,
        where + "'s kernel zones did not take the whole lease (" + census->ToString() + ")");
  }
  return Status::Ok();
}

}  // namespace cxlpool
