#include "config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config_tables.h"
#include "cxlpool/common/strings.h"
#include "values/table_reader.h"

namespace cxlpool {

std::string DefaultStateDir(uid_t euid, const char* xdg_state_home, const char* home) {
  if (euid == 0) return "/var/lib/cxlpool";
  if (xdg_state_home != nullptr && xdg_state_home[0] == '/') {
    return std::string(xdg_state_home) + "/cxlpool";
  }
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.local/state/cxlpool";
  return "/tmp/cxlpool-" + std::to_string(euid) + ".state";
}

Result<LoopbackEndpoint> ParseLoopbackEndpoint(std::string_view text) {
  auto bad = [&](const std::string& why) {
    std::string msg = "'";  // appended, not "'" + ...: GCC 12 -O3 -Wrestrict false positive
    msg.append(text).append("': ").append(why);
    return Status(Code::kInvalidArgument, msg);
  };
  std::string_view host, port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("want [::1]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("want HOST:PORT, e.g. 127.0.0.1:9464");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto p = ParseU64(port);
  if (!p || *p == 0 || *p > 65535) return bad("port must be 1..65535");
  LoopbackEndpoint ep;
  ep.port = static_cast<uint16_t>(*p);
  if (host == "localhost") {
    ep.address = "127.0.0.1";
    return ep;
  }
  if (host == "::1") {
    ep.address = "::1";
    return ep;
  }
  auto octets = Split(host, '.');
  bool ipv4 = octets.size() == 4;
  for (const auto& o : octets) {
    auto v = ParseU64(o);
    ipv4 = ipv4 && v && *v <= 255 && !o.empty() && o.size() <= 3;
  }
  if (!ipv4) return bad("host must be a loopback address (127.0.0.1, ::1 or localhost)");
  if (octets[0] != "127") {
    return bad("metrics are only served on loopback (127.0.0.0/8 or ::1); '" + std::string(host) +
               "' is not");
  }
  ep.address = std::string(host);
  return ep;
}

std::string DefaultSocketPath(uid_t euid, const char* xdg_runtime_dir) {
  if (euid == 0) return "/run/cxlpool/cxlpool.sock";
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    return std::string(xdg_runtime_dir) + "/cxlpool.sock";
  }
  return "/tmp/cxlpool-" + std::to_string(euid) + ".sock";
}

namespace {

// The configuration, one table after the other.
Status Build(const toml::table& root, DaemonConfig* cfg) {
  TableReader top(root, "");
  CXLPOOL_RETURN_IF_ERROR(ReadDaemonTable(top, cfg));
  CXLPOOL_RETURN_IF_ERROR(ReadPoolsTables(top, cfg));
  CXLPOOL_RETURN_IF_ERROR(ReadDevdaxTables(top, cfg));
  CXLPOOL_RETURN_IF_ERROR(ReadQuotaTables(top, &cfg->quotas));
  CXLPOOL_RETURN_IF_ERROR(ReadPrioritiesTable(top, &cfg->priority_reserves));
  CXLPOOL_RETURN_IF_ERROR(ReadMetricsTable(top, &cfg->metrics_http_listen));
  CXLPOOL_RETURN_IF_ERROR(ReadTieringTable(top, &cfg->tiering));
  CXLPOOL_RETURN_IF_ERROR(ReadLimitsTable(top, &cfg->limits));
  CXLPOOL_RETURN_IF_ERROR(ReadClusterTable(top, &cfg->cluster));
  return top.CheckUnknown();
}

}  // namespace

Result<DaemonConfig> ParseConfig(std::string_view text, const std::string& origin) {
  DaemonConfig cfg;
  CXLPOOL_RETURN_IF_ERROR(
      ReadTomlText(text, origin, [&](const toml::table& root) { return Build(root, &cfg); }));
  return cfg;
}

Result<DaemonConfig> LoadConfigFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "config " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "config " + path);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status(Code::kInvalidArgument, "config " + path + ": is a directory, not a TOML file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "config " + path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (16u << 20)) {
      ::close(fd);
      return Status(Code::kInvalidArgument, "config " + path + ": larger than 16 MiB");
    }
  }
  ::close(fd);
  return ParseConfig(text, path);
}

}  // namespace cxlpool
