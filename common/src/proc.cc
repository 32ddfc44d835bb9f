#include "cxlpool/common/proc.h"

#include <charconv>
#include <climits>

#include "cxlpool/common/strings.h"

namespace cxlpool {

Result<ProcStat> ParseProcStat(std::string_view text) {
  auto bad = [](const std::string& why) {
    return Status(Code::kInvalidArgument, "not a /proc/<pid>/stat line: " + why);
  };
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return bad("no (comm)");
  }
  ProcStat st;
  auto pid = ParseI64(Trim(text.substr(0, open)));
  if (!pid || *pid <= 0 || *pid > INT_MAX) return bad("no pid");
  st.pid = static_cast<pid_t>(*pid);
  st.comm = std::string(text.substr(open + 1, close - open - 1));
  // fields[0] is field 3 (state), fields[k] is field k + 3.
  auto fields = SplitWhitespace(text.substr(close + 1));
  if (fields.size() < 20) return bad(std::to_string(fields.size() + 2) + " fields, 22 needed");
  if (fields[0].size() != 1) return bad("state '" + std::string(fields[0]) + "'");
  st.state = fields[0][0];
  auto start = ParseU64(fields[19]);
  if (!start) return bad("start time '" + std::string(fields[19]) + "'");
  st.start_time = *start;
  if (fields.size() > 36) {
    auto cpu = ParseI64(fields[36]);
    if (!cpu || *cpu < 0 || *cpu > INT_MAX)
      return bad("processor '" + std::string(fields[36]) + "'");
    st.processor = static_cast<int>(*cpu);
  }
  return st;
}

Result<ProcStat> ReadProcStat(const FileSystem& fs, pid_t pid) {
  auto text = fs.ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return text.status();
  return ParseProcStat(*text);
}

std::vector<gid_t> ParseStatusGroups(std::string_view status_text) {
  std::vector<gid_t> out;
  for (const auto& line : Split(status_text, '\n')) {
    if (!StartsWith(line, "Groups:")) continue;
    for (const auto& f : SplitWhitespace(std::string_view(line).substr(7))) {
      auto v = ParseU64(f);
      if (v && *v < 0xffffffffull) out.push_back(static_cast<gid_t>(*v));
    }
    break;
  }
  return out;
}

uint64_t ParseStatusCapEff(std::string_view status_text) {
  for (const auto& line : Split(status_text, '\n')) {
    if (!StartsWith(line, "CapEff:")) continue;
    std::string_view hex = std::string_view(line).substr(7);
    while (!hex.empty() && (hex.front() == ' ' || hex.front() == '\t')) hex.remove_prefix(1);
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
    if (ec != std::errc() || end == hex.data()) return 0;
    return v;
  }
  return 0;
}

bool HaveEffectiveCapability(int cap) {
  if (cap < 0 || cap > 63) return false;
  auto text = MakeRootedFileSystem("/")->ReadFile("/proc/self/status");
  if (!text.ok()) return false;
  return (ParseStatusCapEff(*text) >> cap) & 1;
}

std::string ParseUnifiedCgroup(std::string_view cgroup_text) {
  for (const auto& line : Split(cgroup_text, '\n')) {
    if (StartsWith(line, "0::")) return std::string(line.substr(3));
  }
  return "";
}

}  // namespace cxlpool
