// FakeDamon: a fake DAMON sysfs tree and pagemap for the DamonSampler
// tests (damon_sampler_test.cc, engine_test.cc). The directories appear as
// the kernel makes them when nr_* files are written, "on"/"commit" check the
// regions as the kernel does, "update_schemes_tried_regions" fills
// tried_regions from the committed regions (split where the accesses change,
// as DAMON's adaptive regions would be) with nr_accesses from what a fake
// holder touched. Frame numbers come from a fake /proc/self/pagemap. It fails
// closed: a path it did not make is NOT_FOUND, for reads and for writes.
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/strings.h"
#include "tiering/sampler.h"

namespace cxlpool::tiering::fakes {

inline constexpr char kAdmin[] = "/sys/kernel/mm/damon/admin";
inline const std::string kKd = std::string(kAdmin) + "/kdamonds/0";
inline const std::string kCtx = kKd + "/contexts/0";

inline std::string DamonLe64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

class FakeDamon final : public FileSystem, public KernelFileWriter {
 public:
  FakeDamon() {
    dirs_ = {"/sys/kernel/mm/damon", kAdmin, std::string(kAdmin) + "/kdamonds"};
    files_[std::string(kAdmin) + "/kdamonds/nr_kdamonds"] = "0";
  }

  // ---- FileSystem
  Result<std::string> ReadFile(std::string_view path) const override {
    std::string p(path);
    if (p == "/proc/self/pagemap") return Status(Code::kInvalidArgument, "binary");
    auto it = files_.find(p);
    if (it == files_.end()) return Status(Code::kNotFound, "fake: no " + p);
    return it->second + "\n";
  }
  Result<std::string> ReadAt(std::string_view path, uint64_t offset, size_t len) const override {
    if (path != "/proc/self/pagemap")
      return Status(Code::kNotFound, "fake: no " + std::string(path));
    if (offset % 8 != 0 || len % 8 != 0) return Status(Code::kInvalidArgument, "unaligned");
    pagemap_reads.push_back({offset / 8, len / 8});
    std::string out;
    for (uint64_t i = 0; i < len / 8; ++i) {
      uint64_t vpn = offset / 8 + i;
      uint64_t pfn = hide_pfns ? 0 : scatter ? (vpn * 3 + shift) : (vpn + shift);
      out += DamonLe64((uint64_t{1} << 63) | (pfn & ((uint64_t{1} << 50) - 1)));
    }
    return out;
  }
  Result<std::vector<std::string>> ListDir(std::string_view path) const override {
    std::string p(path);
    if (!dirs_.count(p)) return Status(Code::kNotFound, "fake: no dir " + p);
    std::set<std::string> names;
    for (const auto& [f, v] : files_) {
      if (f.rfind(p + "/", 0) == 0)
        names.insert(f.substr(p.size() + 1, f.find('/', p.size() + 1) - p.size() - 1));
    }
    for (const auto& d : dirs_) {
      if (d.rfind(p + "/", 0) == 0)
        names.insert(d.substr(p.size() + 1, d.find('/', p.size() + 1) - p.size() - 1));
    }
    return std::vector<std::string>(names.begin(), names.end());
  }
  Result<std::string> ReadLink(std::string_view) const override {
    return Status(Code::kInvalidArgument, "fake: no links");
  }
  bool Exists(std::string_view path) const override {
    return files_.count(std::string(path)) || dirs_.count(std::string(path));
  }
  bool IsDir(std::string_view path) const override { return dirs_.count(std::string(path)) != 0; }
  const std::string& root() const override { return root_; }

  // ---- KernelFileWriter
  Status WriteAt(const std::string& path, uint64_t offset, const std::string& data) override {
    writes.push_back(path + "=" + data);
    if (offset != 0) return Status(Code::kInvalidArgument, "offset");
    if (!files_.count(path)) return Status(Code::kNotFound, "fake: no " + path);
    if (deny.count(path)) return Status(Code::kPermissionDenied, "open " + path + ": EACCES");
    const std::string dir = path.substr(0, path.rfind('/'));
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name == "nr_kdamonds") {
      if (running) return Status(Code::kIo, "EBUSY");
      RemoveUnder(dir + "/0");
      if (data == "1") {
        Dir(kKd);
        Dir(kKd + "/contexts");
        files_[kKd + "/state"] = "off";
        files_[kKd + "/contexts/nr_contexts"] = "0";
      }
    } else if (name == "nr_contexts" && data == "1") {
      Dir(kCtx);
      files_[kCtx + "/avail_operations"] = avail_operations;
      files_[kCtx + "/operations"] = "vaddr";
      for (const char* f : {"intervals/sample_us", "intervals/aggr_us", "intervals/update_us",
                            "nr_regions/min", "nr_regions/max"}) {
        files_[kCtx + "/monitoring_attrs/" + f] = "0";
      }
      Dir(kCtx + "/monitoring_attrs");
      Dir(kCtx + "/monitoring_attrs/intervals");
      Dir(kCtx + "/monitoring_attrs/nr_regions");
      Dir(kCtx + "/targets");
      Dir(kCtx + "/schemes");
      files_[kCtx + "/targets/nr_targets"] = "0";
      files_[kCtx + "/schemes/nr_schemes"] = "0";
    } else if (name == "nr_targets" && data == "1") {
      Dir(kCtx + "/targets/0");
      Dir(kCtx + "/targets/0/regions");
      files_[kCtx + "/targets/0/regions/nr_regions"] = "0";
    } else if (name == "nr_regions" && dir == kCtx + "/targets/0/regions") {
      RemoveUnder(dir + "/");
      Dir(dir);
      for (uint64_t i = 0; i < ParseU64(data).value_or(0); ++i) {
        Dir(dir + "/" + std::to_string(i));
        files_[dir + "/" + std::to_string(i) + "/start"] = "0";
        files_[dir + "/" + std::to_string(i) + "/end"] = "0";
      }
    } else if (name == "nr_schemes" && data == "1") {
      const std::string s = kCtx + "/schemes/0";
      Dir(s);
      Dir(s + "/tried_regions");
      files_[s + "/action"] = "stat";
      for (const char* k : {"sz", "nr_accesses", "age"}) {
        files_[s + "/access_pattern/" + k + "/min"] = "0";
        files_[s + "/access_pattern/" + k + "/max"] = "0";
      }
    } else if (name == "state") {
      return State(data);
    }
    files_[path] = data;
    return Status::Ok();
  }

  // The regions the kdamond monitors (as last turned on / committed).
  std::vector<std::pair<uint64_t, uint64_t>> monitored;
  // Physical byte ranges a holder touched since the last report.
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  std::string avail_operations = "vaddr fvaddr paddr";
  std::set<std::string> deny;
  mutable std::vector<std::pair<uint64_t, uint64_t>> pagemap_reads;  // vpn, pages
  std::vector<std::string> writes;
  uint64_t shift = 100000;
  bool scatter = false;
  bool hide_pfns = false;
  bool running = false;

  // A file of the fake's own (a /proc/<pid>/stat, the boot id).
  void Put(const std::string& path, const std::string& value) { files_[path] = value; }
  void RemoveSysfs() {
    dirs_.clear();
    files_.clear();
  }
  std::string File(const std::string& p) const {
    auto it = files_.find(p);
    return it == files_.end() ? "<none>" : it->second;
  }
  // The physical range the k-th pagemap read covered (one read per unit).
  std::pair<uint64_t, uint64_t> FramesOfRead(size_t k) const {
    auto [vpn, n] = pagemap_reads.at(k);
    return {(vpn + shift) * 4096, (vpn + n + shift) * 4096};
  }

 private:
  void Dir(const std::string& d) { dirs_.insert(d); }
  void RemoveUnder(const std::string& prefix) {
    for (auto it = files_.begin(); it != files_.end();) {
      it = it->first.rfind(prefix, 0) == 0 ? files_.erase(it) : std::next(it);
    }
    for (auto it = dirs_.begin(); it != dirs_.end();) {
      it = it->rfind(prefix, 0) == 0 ? dirs_.erase(it) : std::next(it);
    }
  }
  Status State(const std::string& v) {
    if (v == "on" || v == "commit") {
      if ((v == "on") == running) return Status(Code::kInvalidArgument, "EINVAL: state");
      if (File(kCtx + "/operations") != "paddr") return Status(Code::kInvalidArgument, "ops");
      std::vector<std::pair<uint64_t, uint64_t>> regs;
      const std::string base = kCtx + "/targets/0/regions";
      uint64_t n = ParseU64(File(base + "/nr_regions")).value_or(0);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t s = ParseU64(File(base + "/" + std::to_string(i) + "/start")).value_or(0);
        uint64_t e = ParseU64(File(base + "/" + std::to_string(i) + "/end")).value_or(0);
        if (s >= e || (!regs.empty() && s < regs.back().second)) {
          return Status(Code::kInvalidArgument, "EINVAL: regions not sorted or empty");
        }
        regs.push_back({s, e});
      }
      monitored = regs;
      running = true;
      files_[kKd + "/state"] = "on";
      return Status::Ok();
    }
    if (v == "off") {
      running = false;
      monitored.clear();
      files_[kKd + "/state"] = "off";
      return Status::Ok();
    }
    if (v == "update_schemes_tried_regions") {
      if (!running) return Status(Code::kInvalidArgument, "EINVAL: not running");
      const std::string tr = kCtx + "/schemes/0/tried_regions";
      RemoveUnder(tr + "/");
      Dir(tr);
      files_[tr + "/total_bytes"] = "0";
      int k = 0;
      for (auto [s, e] : monitored) {
        // Split where the accesses change, as DAMON's adaptive regions do.
        std::set<uint64_t> cuts = {s, e};
        for (auto [ts, te] : touched) {
          if (ts > s && ts < e) cuts.insert(ts);
          if (te > s && te < e) cuts.insert(te);
        }
        for (auto c = cuts.begin(); std::next(c) != cuts.end(); ++c) {
          uint64_t a = *c, b = *std::next(c);
          bool hit = false;
          for (auto [ts, te] : touched) hit = hit || (ts < b && a < te);
          const std::string d = tr + "/" + std::to_string(k++);
          Dir(d);
          files_[d + "/start"] = std::to_string(a);
          files_[d + "/end"] = std::to_string(b);
          files_[d + "/nr_accesses"] = hit ? "18" : "0";
          files_[d + "/age"] = "3";
        }
      }
      touched.clear();
      return Status::Ok();
    }
    return Status(Code::kInvalidArgument, "EINVAL: state " + v);
  }

  std::map<std::string, std::string> files_;
  std::set<std::string> dirs_;
  std::string root_ = "<fake-damon>";
};

}  // namespace cxlpool::tiering::fakes
