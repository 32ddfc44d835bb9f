// cxlpool-example-cpp: the C++ API in a few lines.
//
//   cxlpool-example-cpp [SOCKET_PATH] [SIZE] [NODE]
//   cxlpool-example-cpp --help | --version
//
// Leases SIZE (default 64M; bytes or with a suffix K, M, G, T) near GPU 0
// (else wherever the daemon chooses), or on NODE, fills and checks them,
// prints the lease, and releases it. An empty SOCKET_PATH ("") is the
// default socket. Exit status: 0 success, 1 refused or no daemon, 2 bad
// command line.
#include <cxlpool/cxlpool.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxlpool/client.hpp>
#include <optional>
#include <string>

namespace {

// "64M" -> 67108864; nullopt for anything that is not a size.
std::optional<uint64_t> ParseSize(const std::string& text) {
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == 0 || end > 19) return std::nullopt;
  uint64_t v = std::strtoull(text.substr(0, end).c_str(), nullptr, 10);
  std::string suffix = text.substr(end);
  int shift = 0;
  if (!suffix.empty()) {
    const std::string units = "KMGT";
    size_t u = units.find(static_cast<char>(std::toupper(suffix[0])));
    if (u == std::string::npos) return std::nullopt;
    shift = 10 * static_cast<int>(u + 1);
    suffix = suffix.substr(1);
    if (!suffix.empty() && suffix != "iB" && suffix != "B") return std::nullopt;
  }
  if (v == 0 || v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf(
        "usage: cxlpool-example-cpp [SOCKET_PATH] [SIZE] [NODE]\n"
        "  SIZE: bytes, or with a suffix K, M, G, T (KiB, MiB, GiB, TiB); default 64M\n"
        "  exit status: 0 ok, 1 refused or no daemon, 2 bad command line\n");
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("cxlpool-example-cpp %s\n", cxlpool_version());
    return 0;
  }
  if (argc > 4 || (argc > 1 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: cxlpool-example-cpp [SOCKET_PATH] [SIZE] [NODE] (--help)\n");
    return 2;
  }
  const std::string socket_path = argc > 1 ? argv[1] : "";
  cxlpool::AllocOptions opts;
  opts.size_bytes = 64ull << 20;
  if (argc > 2) {
    auto size = ParseSize(argv[2]);
    if (!size) {
      std::fprintf(stderr, "cxlpool-example-cpp: '%s' is not a size (e.g. 4096, 64M, 1G)\n",
                   argv[2]);
      return 2;
    }
    opts.size_bytes = *size;
  }
  if (argc > 3) {
    char* end = nullptr;
    long node = std::strtol(argv[3], &end, 10);
    if (end == argv[3] || *end != '\0' || node < 0 || node > 1000000) {
      std::fprintf(stderr, "cxlpool-example-cpp: NODE '%s' is not a node number\n", argv[3]);
      return 2;
    }
    opts.numa_node = static_cast<int>(node);
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
