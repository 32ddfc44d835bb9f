// Long-term pins on a node with both kernel and movable zones (placement
// rule 4 in lease/placement.h; docs/daemon.md, "Long-term pins").
//
// A memfd lease's pages are movable allocations, so they fault into the
// node's ZONE_MOVABLE first. A long-term pin (FOLL_LONGTERM: CUDA's
// cuMemHostRegister, RDMA registration, io_uring fixed buffers) migrates
// every pinned page out of ZONE_MOVABLE: into a kernel zone of the page's
// own node while that has room, else into another node's, silently
// (measured on Debian 12's kernel under QEMU: tests/vm, topology cxl-pin).
// SettleInKernelZones does that migration itself, on a worker right after
// the build and before the grant, through the kernel's own long-term-pin
// path (io_uring fixed-buffer registration, then unregistration), and then
// asks move_pages whether every page is still on the node. The holder's own
// pin later finds the pages in a kernel zone and moves nothing.
//
// Thread safety: reentrant; call it on a worker, on a mapping nobody else
// touches yet.
#pragma once

#include <cstdint>
#include <string_view>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"

namespace cxlpool {

// Bytes the kernel zones of `node` can still give without dipping below
// their low watermark, from /proc/zoneinfo text ("pages free" minus "low",
// per zone other than Movable and Device; `page_size` bytes per page).
// NOT_FOUND when the node has no kernel zone in the text.
Result<uint64_t> KernelZoneFreeBytes(std::string_view zoneinfo, int node, uint64_t page_size);

// Before building: does `node`'s kernel zones have `len` bytes free (from
// /proc/zoneinfo read through `proc`, this machine's)? A lease that cannot
// fit there is not built on the node at all.
// Errors: RESOURCE_EXHAUSTED (too little room, naming both sizes), IO
// (/proc/zoneinfo unreadable), NOT_FOUND (no kernel zone of the node).
Status CheckKernelZoneRoom(uint64_t len, int node, const FileSystem& proc);

// After building: moves the pages of [addr, addr + len) (the daemon's
// mapping of the lease, bound to `node`) into node's kernel zones and checks
// with move_pages that every page is still on the node.
// Errors: RESOURCE_EXHAUSTED (some pages left the node; the census says
// where), UNSUPPORTED (no io_uring: ENOSYS, or EPERM from a seccomp filter or
// kernel.io_uring_disabled), IO (any other failure). On error the caller
// discards the backing.
Status SettleInKernelZones(void* addr, uint64_t len, uint64_t page_size, int node);

}  // namespace cxlpool
