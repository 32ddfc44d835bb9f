#include "tiering/damon_sampler.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"

namespace cxlpool::tiering {

namespace {
constexpr char kAdmin[] = "/sys/kernel/mm/damon/admin";
constexpr char kPagemap[] = "/proc/self/pagemap";
constexpr uint64_t kPage = 4096;
constexpr char kBootId[] = "/proc/sys/kernel/random/boot_id";

uint64_t Le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && at + i < s.size(); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  }
  return v;
}
}  // namespace

DamonSampler::DamonSampler(const FileSystem* sys, const FileSystem* proc, KernelFileWriter* writer,
                           DamonOptions options)
    : sys_(sys), proc_(proc), writer_(writer), options_(options) {
  if (options_.max_regions == 0) options_.max_regions = 1;
}

DamonSampler::~DamonSampler() { Close(); }

void DamonSampler::Close() {
  if (running_) (void)Stop();
  if (opened_ && Write(std::string(kAdmin) + "/kdamonds/nr_kdamonds", "0").ok()) RemoveOwner();
  opened_ = false;
}

// The owner record: "pid P\nstart S\nboot B\n". No fsync: a kdamond does
// not outlive a reboot, and the page cache outlives a killed process.
void DamonSampler::WriteOwner() {
  if (options_.owner_file.empty()) return;
  const pid_t me = ::getpid();
  auto stat = ReadProcStat(*proc_, me);
  auto boot = proc_->ReadTrimmed(kBootId);
  const std::string text = "pid " + std::to_string(me) + "\nstart " +
                           std::to_string(stat.ok() ? stat->start_time : 0) + "\nboot " +
                           (boot.ok() ? *boot : std::string()) + "\n";
  const int fd = ::open(options_.owner_file.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    last_error_ = "DAMON owner record " + options_.owner_file + ": " + std::strerror(err) +
                  " (a kdamond left by a killed daemon will not be taken back)";
  }
}

void DamonSampler::RemoveOwner() const {
  if (!options_.owner_file.empty()) ::unlink(options_.owner_file.c_str());
}

Result<std::string> DamonSampler::LeftByUs() const {
  if (options_.owner_file.empty()) return Status(Code::kNotFound, "no owner record");
  std::ifstream in(options_.owner_file);
  if (!in) return Status(Code::kNotFound, "no owner record");
  std::map<std::string, std::string> rec;
  std::string key, value;
  while (in >> key && std::getline(in >> std::ws, value)) rec[key] = value;
  auto pid = ParseU64(rec["pid"]);
  auto start = ParseU64(rec["start"]);
  const std::string what = "the owner record " + options_.owner_file;
  if (!pid || !start || *pid == 0 || *pid > 0x7fffffff) {
    return Status(Code::kInvalidArgument, what + " is garbled; kdamond 0 is left alone");
  }
  auto boot = proc_->ReadTrimmed(kBootId);
  if (rec["boot"] != (boot.ok() ? *boot : std::string())) {
    return Status(Code::kUnavailable, what + " is from another boot; kdamond 0 is not cxlpoold's");
  }
  const pid_t owner = static_cast<pid_t>(*pid);
  if (owner != ::getpid()) {
    auto st = ReadProcStat(*proc_, owner);
    if (st.ok() && !st->gone() && st->start_time == *start) {
      return Status(Code::kUnavailable, "kdamond 0 belongs to cxlpoold pid " +
                                            std::to_string(owner) + ", which still runs");
    }
  }
  const std::vector<std::pair<std::string, std::string>> ours = {
      {Ctx() + "/operations", "paddr"},
      {Ctx() + "/targets/nr_targets", "1"},
      {Ctx() + "/schemes/nr_schemes", "1"},
      {Ctx() + "/schemes/0/action", "stat"},
  };
  for (const auto& [path, want] : ours) {
    auto got = sys_->ReadTrimmed(path);
    if (!got.ok() || *got != want) {
      return Status(Code::kUnavailable, "kdamond 0 is not set up as cxlpoold sets it up (" + path +
                                            " is " + (got.ok() ? *got : got.status().message()) +
                                            ", not " + want + "); it is left alone");
    }
  }
  return "kdamond 0 left by cxlpoold pid " + std::to_string(owner) + " (gone)";
}

std::string DamonSampler::Kd() const { return std::string(kAdmin) + "/kdamonds/0"; }
std::string DamonSampler::Ctx() const { return Kd() + "/contexts/0"; }

Status DamonSampler::Write(const std::string& path, const std::string& value) {
  return writer_->WriteAt(path, 0, value);
}

Status DamonSampler::Open() {
  if (opened_) return Status::Ok();
  if (!sys_->IsDir(kAdmin)) {
    return Status(Code::kUnsupported, "no DAMON sysfs interface (CONFIG_DAMON_SYSFS)");
  }
  const std::string nr_path = std::string(kAdmin) + "/kdamonds/nr_kdamonds";
  auto nr = sys_->ReadTrimmed(nr_path);
  if (!nr.ok()) return nr.status();
  const uint64_t n = ParseU64(*nr).value_or(~0ull);
  if (n != 0) {
    auto st = sys_->ReadTrimmed(Kd() + "/state");
    auto left = n == 1 ? LeftByUs() : Result<std::string>(Status(Code::kNotFound, ""));
    if (!left.ok()) {
      const bool said = left.status().code() != Code::kNotFound;
      return Status(Code::kUnavailable,
                    "DAMON is in use by someone else: " + *nr + " kdamond(s) set up (kdamond 0 " +
                        (st.ok() ? *st : std::string("state unknown")) +
                        "), which cxlpoold does not change" +
                        (said ? "; " + left.status().message() : std::string()));
    }
    // Ours, from a killed daemon: stopped and removed, then made afresh.
    if (!st.ok() || *st != "off") {
      if (Status s = Write(Kd() + "/state", "off"); !s.ok()) {
        return Status(s.code(), "stopping " + *left + ": " + s.message());
      }
    }
    if (Status s = Write(nr_path, "0"); !s.ok()) {
      return Status(s.code(), "removing " + *left + ": " + s.message());
    }
    RemoveOwner();
    reclaimed_ = *left;
  }
  CXLPOOL_RETURN_IF_ERROR(Write(nr_path, "1"));
  opened_ = true;  // from here on the destructor removes the kdamond again
  WriteOwner();
  auto fail = [&](Status s) {
    (void)Write(nr_path, "0");
    opened_ = false;
    return s;
  };
  if (Status s = Write(Kd() + "/contexts/nr_contexts", "1"); !s.ok()) return fail(s);
  auto ops = sys_->ReadTrimmed(Ctx() + "/avail_operations");
  if (!ops.ok()) return fail(ops.status());
  std::vector<std::string> avail = SplitWhitespace(*ops);
  operations_ = avail;
  if (std::find(avail.begin(), avail.end(), "paddr") == avail.end()) {
    return fail(Status(Code::kUnsupported,
                       "DAMON has no \"paddr\" operations (CONFIG_DAMON_PADDR); "
                       "available: " +
                           *ops));
  }
  const std::string attrs = Ctx() + "/monitoring_attrs";
  const std::string pattern = Ctx() + "/schemes/0/access_pattern";
  const std::vector<std::pair<std::string, std::string>> setup = {
      {Ctx() + "/operations", "paddr"},
      {attrs + "/intervals/sample_us", std::to_string(options_.sample_us)},
      {attrs + "/intervals/aggr_us", std::to_string(options_.aggr_us)},
      {attrs + "/intervals/update_us", std::to_string(options_.update_us)},
      {attrs + "/nr_regions/min", "10"},
      {attrs + "/nr_regions/max", std::to_string(std::max<uint32_t>(1000, options_.max_regions))},
      {Ctx() + "/targets/nr_targets", "1"},
      {Ctx() + "/schemes/nr_schemes", "1"},
      {Ctx() + "/schemes/0/action", "stat"},
      {pattern + "/sz/min", "0"},
      {pattern + "/sz/max", std::to_string(~0ull)},
      {pattern + "/nr_accesses/min", "0"},
      {pattern + "/nr_accesses/max", std::to_string(~0u)},
      {pattern + "/age/min", "0"},
      {pattern + "/age/max", std::to_string(~0u)},
  };
  for (const auto& [path, value] : setup) {
    if (Status s = Write(path, value); !s.ok()) return fail(s);
  }
  return Status::Ok();
}

void DamonSampler::Forget(uint64_t lease_id) {
  if (EraseLease(&tracked_, lease_id)) dirty_ = true;
}

Result<std::vector<DamonSampler::Run>> DamonSampler::Frames(const Tracked& t) const {
  const uint64_t pages = t.map.length() / kPage;
  const uint64_t vpn = reinterpret_cast<uintptr_t>(t.map.addr()) / kPage;
  auto e = proc_->ReadAt(kPagemap, vpn * 8, static_cast<size_t>(pages * 8));
  if (!e.ok()) return e.status();
  if (e->size() != pages * 8) return Status(Code::kIo, "short read of /proc/self/pagemap");
  std::vector<Run> runs;
  for (uint64_t i = 0; i < pages; ++i) {
    uint64_t pfn = PagemapPfn(Le64(*e, static_cast<size_t>(i * 8)));
    if (pfn == 0) continue;  // not present, or frame numbers hidden
    uint64_t start = pfn * kPage;
    if (!runs.empty() && runs.back().end == start) {
      runs.back().end += kPage;
    } else {
      runs.push_back({start, start + kPage});
    }
  }
  if (runs.empty()) {
    return Status(Code::kPermissionDenied,
                  "/proc/self/pagemap shows no frame numbers (CAP_SYS_ADMIN needed)");
  }
  return runs;
}

Status DamonSampler::Commit(std::vector<Run> regions) {
  std::sort(regions.begin(), regions.end(),
            [](const Run& a, const Run& b) { return a.start < b.start; });
  std::vector<Run> merged;
  for (const Run& r : regions) {
    if (!merged.empty() && r.start <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  // Too many runs: close the smallest gaps first (those regions then take in
  // frames between the leases' own, which the note in docs/daemon.md says).
  if (merged.size() > options_.max_regions) {
    std::vector<uint64_t> gaps;
    for (size_t i = 1; i < merged.size(); ++i) gaps.push_back(merged[i].start - merged[i - 1].end);
    std::vector<uint64_t> sorted = gaps;
    const size_t close = merged.size() - options_.max_regions;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(close - 1), sorted.end());
    const uint64_t limit = sorted[close - 1];
    std::vector<Run> fewer;
    size_t closed = 0;
    for (size_t i = 0; i < merged.size(); ++i) {
      if (i > 0 && closed < close && gaps[i - 1] <= limit) {
        fewer.back().end = merged[i].end;
        ++closed;
      } else {
        fewer.push_back(merged[i]);
      }
    }
    merged = std::move(fewer);
  }
  const std::string base = Ctx() + "/targets/0/regions";
  CXLPOOL_RETURN_IF_ERROR(Write(base + "/nr_regions", std::to_string(merged.size())));
  for (size_t i = 0; i < merged.size(); ++i) {
    const std::string r = base + "/" + std::to_string(i);
    CXLPOOL_RETURN_IF_ERROR(Write(r + "/start", std::to_string(merged[i].start)));
    CXLPOOL_RETURN_IF_ERROR(Write(r + "/end", std::to_string(merged[i].end)));
  }
  CXLPOOL_RETURN_IF_ERROR(Write(Kd() + "/state", running_ ? "commit" : "on"));
  running_ = true;
  committed_ = std::move(merged);
  return Status::Ok();
}

Status DamonSampler::Stop() {
  Status s = Write(Kd() + "/state", "off");
  running_ = false;
  committed_.clear();
  return s;
}

Result<std::vector<std::pair<DamonSampler::Run, uint32_t>>> DamonSampler::TriedRegions() {
  CXLPOOL_RETURN_IF_ERROR(Write(Kd() + "/state", "update_schemes_tried_regions"));
  const std::string dir = Ctx() + "/schemes/0/tried_regions";
  auto names = sys_->ListDir(dir);
  if (!names.ok()) return names.status();
  std::vector<std::pair<Run, uint32_t>> out;
  for (const std::string& n : *names) {
    if (!ParseU64(n)) continue;  // total_bytes
    const std::string r = dir + "/" + n;
    auto s = sys_->ReadTrimmed(r + "/start");
    auto e = sys_->ReadTrimmed(r + "/end");
    auto a = sys_->ReadTrimmed(r + "/nr_accesses");
    if (!s.ok() || !e.ok() || !a.ok()) {
      return !s.ok() ? s.status() : !e.ok() ? e.status() : a.status();
    }
    auto sv = ParseU64(*s), ev = ParseU64(*e), av = ParseU64(*a);
    if (!sv || !ev || !av || *ev < *sv) {
      return Status(Code::kIo, "unparsable DAMON region " + r + ": " + *s + " " + *e + " " + *a);
    }
    out.push_back({{*sv, *ev}, static_cast<uint32_t>(std::min<uint64_t>(*av, ~0u))});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& x, const auto& y) { return x.first.start < y.first.start; });
  return out;
}

std::vector<SampleResult> DamonSampler::Sample(const std::vector<SampleTarget>& targets) {
  std::vector<SampleResult> out;
  last_error_.clear();
  if (!opened_) {
    if (targets.empty()) return out;
    if (Status st = Open(); !st.ok()) {  // e.g. someone else took DAMON meanwhile
      last_error_ = "DAMON: " + st.ToString();
      return out;
    }
  }
  std::set<Key> seen;
  bool changed = std::exchange(dirty_, false);
  for (const SampleTarget& t : targets) {
    const Key key{t.lease_id, t.unit};
    Tracked* found = TrackTarget(&tracked_, t, &last_error_);
    if (found == nullptr) continue;
    Tracked& tr = *found;
    auto frames = Frames(tr);
    if (!frames.ok()) {  // not sampled: dropped, tried again next round
      last_error_ = frames.status().ToString();
      tracked_.erase(key);
      dirty_ = true;
      continue;
    }
    seen.insert(key);
    bool same =
        frames->size() == tr.runs.size() &&
        std::equal(frames->begin(), frames->end(), tr.runs.begin(),
                   [](const Run& a, const Run& b) { return a.start == b.start && a.end == b.end; });
    if (!same) {  // new, or its pages moved: armed again, counted next round
      tr.runs = std::move(*frames);
      tr.armed = false;
    }
    if (!tr.armed) changed = true;
  }
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (seen.count(it->first) == 0) {  // pinned since, or gone
      it = tracked_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  // What the kdamond saw over the regions committed before this round.
  std::vector<std::pair<Run, uint32_t>> tried;
  bool any_armed = false;
  for (const auto& [k, t] : tracked_) any_armed = any_armed || t.armed;
  if (running_ && any_armed) {
    auto r = TriedRegions();
    if (r.ok()) {
      tried = std::move(*r);
    } else {
      last_error_ = "DAMON regions: " + r.status().ToString();
    }
  }
  for (const SampleTarget& t : targets) {
    auto it = tracked_.find({t.lease_id, t.unit});
    if (it == tracked_.end()) continue;
    SampleResult res{t.lease_id, t.unit, 0, 0};
    if (it->second.armed) {
      for (const Run& run : it->second.runs) {
        // Regions are sorted; find the first that ends after run.start.
        auto r = std::lower_bound(
            tried.begin(), tried.end(), run.start,
            [](const std::pair<Run, uint32_t>& x, uint64_t v) { return x.first.end <= v; });
        for (; r != tried.end() && r->first.start < run.end; ++r) {
          uint64_t lo = std::max(run.start, r->first.start), hi = std::min(run.end, r->first.end);
          if (hi <= lo) continue;
          res.sampled += (hi - lo) / kPage;
          if (r->second > 0) res.accessed += (hi - lo) / kPage;
        }
      }
    }
    out.push_back(res);
  }
  if (changed) {
    std::vector<Run> all;
    for (const auto& [k, t] : tracked_) all.insert(all.end(), t.runs.begin(), t.runs.end());
    Status st = all.empty() ? Status::Ok() : Commit(std::move(all));
    if (st.ok()) {
      for (auto& [k, t] : tracked_) t.armed = true;
    } else {
      last_error_ = "DAMON commit: " + st.ToString();
    }
  }
  // Nothing to watch: no kdamond is kept (a daemon killed while idle leaves
  // none behind); the next target opens one again.
  if (tracked_.empty()) Close();
  return out;
}

std::unique_ptr<AccessSampler> ChooseSampler(const std::string& mode, KernelAccess* access,
                                             const FileSystem* sys, const FileSystem* proc,
                                             KernelFileWriter* writer, const DamonOptions& damon) {
  if (mode == "off") {
    access->sampler = "none";
    access->why = "tiering.sampling is \"off\"; temperatures come from the holders' signals only";
    return nullptr;
  }
  const bool idle_ok = access->sampler == "idle_page";
  if (idle_ok && mode != "damon") {
    return std::make_unique<IdlePageSampler>(sys, proc, writer);
  }
  std::string why_not;
  if (mode == "idle_page") {
    why_not = "tiering.sampling is \"idle_page\"";
  } else if (!access->damon_sysfs) {
    why_not = "no DAMON sysfs interface (CONFIG_DAMON_SYSFS)";
  } else if (!access->pagemap_pfns) {
    why_not = "/proc/self/pagemap hides frame numbers (CAP_SYS_ADMIN needed)";
  } else {
    auto d = std::make_unique<DamonSampler>(sys, proc, writer, damon);
    Status st = d->Open();
    // With no kdamond at start there was no context to read them from.
    if (access->damon_operations.empty()) access->damon_operations = d->operations();
    if (st.ok()) {
      d->Close();  // opened again once there is a lease to sample
      access->sampler = "damon";
      access->why =
          "DAMON paddr monitoring of each lease's page frames (kdamond 0, created by cxlpoold "
          "while there are leases to sample) sees every holder's CPU accesses";
      if (!d->reclaimed().empty()) access->why += "; took back " + d->reclaimed();
      access->damon_driven = true;
      return d;
    }
    why_not = st.message();
  }
  access->sampler = "none";
  const std::string only = "; temperatures come from the holders' signals only";
  if (auto at = access->why.find(only); at != std::string::npos) access->why.erase(at);
  access->why += "; DAMON not driven: " + why_not + only;
  return nullptr;
}

}  // namespace cxlpool::tiering
