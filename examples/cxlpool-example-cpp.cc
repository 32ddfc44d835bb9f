// cxlpool-example-cpp: the C++ API in a few lines.
//
//   cxlpool-example-cpp [SOCKET_PATH] [SIZE_BYTES] [NODE]
//
// Leases SIZE bytes (default 64 MiB) near GPU 0 (else wherever the daemon
// chooses), or on NODE, fills and checks
// them, prints the lease, and lets ~Lease release it.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxlpool/client.hpp>
#include <string>

int main(int argc, char** argv) {
  const std::string socket_path = argc > 1 ? argv[1] : "";
  cxlpool::AllocOptions opts;
  opts.size_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 64ull << 20;
  if (argc > 3) {
    opts.numa_node = std::atoi(argv[3]);
  } else {
    opts.near_gpu = 0;
  }
  opts.label = "cxlpool-example-cpp";

  auto client = cxlpool::Client::Connect(socket_path);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto lease = client->Allocate(opts);
  if (!lease.ok() && lease.status().code() == cxlpool::ErrorCode::kNotFound && argc <= 3) {
    // No GPU 0 on this machine: let the daemon place it.
    std::printf("note: %s; letting the daemon choose the node\n", lease.status().message().c_str());
    opts.near_gpu = -1;
    lease = client->Allocate(opts);
  }
  if (!lease.ok()) {
    std::fprintf(stderr, "allocate: %s\n", lease.status().ToString().c_str());
    return 1;
  }
  auto* p = static_cast<unsigned char*>(lease->data());
  for (uint64_t i = 0; i < lease->size(); ++i) p[i] = static_cast<unsigned char>(i ^ 0x5a);
  for (uint64_t i = 0; i < lease->size(); ++i) {
    if (p[i] != static_cast<unsigned char>(i ^ 0x5a)) {
      std::fprintf(stderr, "pattern mismatch at byte %" PRIu64 "\n", i);
      return 1;
    }
  }
  std::printf("lease id=%" PRIu64 " node=%d size=%" PRIu64 " kind=%s (%s)\n", lease->id(),
              lease->numa_node(), lease->size(), lease->info().kind.c_str(),
              lease->info().placement_reason.c_str());
  cxlpool::ClientStatus released = lease->Release();
  if (!released.ok()) {
    std::fprintf(stderr, "release: %s\n", released.ToString().c_str());
    return 1;
  }
  return 0;
}
