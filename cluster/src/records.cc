// Records in etcd: JSON out, validated JSON in.
#include "cxlpool/cluster/records.h"

#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace cxlpool::cluster {

using nlohmann::json;

namespace {

constexpr size_t kMaxPools = 1024;
constexpr size_t kMaxGpus = 256;
constexpr size_t kMaxDevices = 256;
constexpr size_t kMaxNearest = 64;
constexpr size_t kMaxText = 256;
constexpr int kMaxNode = 4095;

Status Bad(std::string_view record, const std::string& why) {
  return Status(Code::kInvalidArgument, std::string(record) + " record: " + why);
}

// Reads fields of one JSON object, remembering the first error.
class Fields {
 public:
  Fields(std::string_view record, const json& j) : record_(record), j_(j) {
    if (!j_.is_object()) Fail("", "not an object");
  }
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

  uint64_t U64(const char* key, bool required = true) {
    const json* v = Find(key, required);
    if (v == nullptr) return 0;
    if (!v->is_number_unsigned()) return Fail(key, "not an unsigned integer"), 0;
    return v->get<uint64_t>();
  }
  int64_t I64(const char* key, int64_t lo, int64_t hi, bool required = true) {
    const json* v = Find(key, required);
    if (v == nullptr) return 0;
    if (!v->is_number_integer()) return Fail(key, "not an integer"), 0;
    const auto x = v->get<int64_t>();
    if (x < lo || x > hi) return Fail(key, "out of range"), 0;
    return x;
  }
  std::string Text(const char* key, bool required = true) {
    const json* v = Find(key, required);
    if (v == nullptr) return {};
    if (!v->is_string()) return Fail(key, "not a string"), std::string();
    auto s = v->get<std::string>();
    if (s.size() > kMaxText) return Fail(key, "longer than 256 bytes"), std::string();
    for (unsigned char c : s)
      if (c < 0x20 || c == 0x7f) return Fail(key, "has a control character"), std::string();
    return s;
  }
  std::string Name(const char* key) {
    std::string s = Text(key);
    if (ok()) {
      Status st = CheckName(key, s);
      if (!st.ok()) Fail(key, st.message());
    }
    return s;
  }
  bool Bool(const char* key) {
    const json* v = Find(key, false);
    if (v == nullptr) return false;
    if (!v->is_boolean()) return Fail(key, "not a boolean"), false;
    return v->get<bool>();
  }
  // An array of at most `max` entries; nullptr (and an error) otherwise.
  const json* Array(const char* key, size_t max) {
    const json* v = Find(key, false);
    if (v == nullptr) return nullptr;
    if (!v->is_array()) return Fail(key, "not an array"), nullptr;
    if (v->size() > max) return Fail(key, "more than " + std::to_string(max) + " entries"), nullptr;
    return v;
  }
  void Fail(std::string_view key, const std::string& why) {
    if (status_.ok()) status_ = Bad(record_, key.empty() ? why : std::string(key) + ": " + why);
  }

 private:
  const json* Find(const char* key, bool required) {
    if (!ok()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) Fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }

  std::string_view record_;
  const json& j_;
  Status status_;
};

Result<json> ParseObject(std::string_view record, std::string_view text) {
  if (text.size() > kMaxRecordBytes) return Bad(record, "larger than 256 KiB");
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(record, "not JSON");
  if (!j.is_object()) return Bad(record, "not an object");
  return j;
}

Status ReadPool(const json& j, PoolSummary* p) {
  Fields f("host", j);
  p->node = static_cast<int>(f.I64("node", 0, kMaxNode));
  p->kind = f.Text("kind");
  p->tier = f.Text("tier");
  p->capacity = f.U64("capacity");
  p->leased = f.U64("leased");
  p->reserve = f.U64("reserve");
  p->free = f.U64("free");
  if (f.ok() && (p->leased > p->capacity || p->free > p->capacity))
    f.Fail("pools", "leased or free above capacity");
  return f.status();
}

Status ReadGpu(const json& j, GpuSummary* g) {
  Fields f("host", j);
  g->index = static_cast<int>(f.I64("index", 0, 1023));
  g->name = f.Text("name");
  g->busy = f.Bool("busy");
  if (const json* near = f.Array("nearest_nodes", kMaxNearest)) {
    for (const auto& n : *near) {
      if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > kMaxNode)
        return Bad("host", "gpus: nearest_nodes: not a node number");
      g->nearest_nodes.push_back(n.get<int>());
    }
  }
  return f.status();
}

Status ReadSharedDevice(const json& j, SharedDeviceSummary* d) {
  Fields f("host", j);
  d->id = f.Name("id");
  d->path = f.Text("path");
  d->size = f.U64("size");
  d->slices_owned = static_cast<uint32_t>(f.I64("slices_owned", 0, UINT32_MAX));
  d->slices_used = static_cast<uint32_t>(f.I64("slices_used", 0, UINT32_MAX));
  if (f.ok() && d->slices_used > d->slices_owned)
    f.Fail("shared_devices", "more slices used than owned");
  return f.status();
}

template <typename T, typename Reader>
Status ReadList(Fields& f, const char* key, size_t max, Reader read, std::vector<T>* out) {
  const json* arr = f.Array(key, max);
  if (!f.ok()) return f.status();
  if (arr == nullptr) return Status::Ok();
  for (const auto& e : *arr) {
    T item;
    CXLPOOL_RETURN_IF_ERROR(read(e, &item));
    out->push_back(std::move(item));
  }
  return Status::Ok();
}

}  // namespace

std::string ToJson(const HostRecord& r) {
  json j{
      {"host", r.host},       {"instance", r.instance},         {"boot_id", r.boot_id},
      {"version", r.version}, {"published_at", r.published_at}, {"shared_fenced", r.shared_fenced}};
  j["pools"] = json::array();
  for (const auto& p : r.pools)
    j["pools"].push_back({{"node", p.node},
                          {"kind", p.kind},
                          {"tier", p.tier},
                          {"capacity", p.capacity},
                          {"leased", p.leased},
                          {"reserve", p.reserve},
                          {"free", p.free}});
  j["gpus"] = json::array();
  for (const auto& g : r.gpus)
    j["gpus"].push_back({{"index", g.index},
                         {"name", g.name},
                         {"nearest_nodes", g.nearest_nodes},
                         {"busy", g.busy}});
  j["shared_devices"] = json::array();
  for (const auto& d : r.shared_devices)
    j["shared_devices"].push_back({{"id", d.id},
                                   {"path", d.path},
                                   {"size", d.size},
                                   {"slices_owned", d.slices_owned},
                                   {"slices_used", d.slices_used}});
  return j.dump();
}

std::string ToJson(const DeviceRecord& r) {
  return json{{"size", r.size}, {"slice_bytes", r.slice_bytes}}.dump();
}

std::string ToJson(const SliceRecord& r) {
  return json{{"owner", r.owner}, {"epoch", r.epoch}, {"since", r.since}}.dump();
}

std::string ToJson(const FenceRecord& r) {
  return json{
      {"host", r.host}, {"epoch", r.epoch}, {"by", r.by}, {"at", r.at}, {"reason", r.reason}}
      .dump();
}

Result<HostRecord> ParseHostRecord(std::string_view text) {
  auto j = ParseObject("host", text);
  if (!j.ok()) return j.status();
  HostRecord r;
  Fields f("host", *j);
  r.host = f.Name("host");
  r.instance = f.Text("instance");
  r.boot_id = f.Text("boot_id", false);
  r.version = f.Text("version");
  r.published_at = f.I64("published_at", 0, INT64_MAX);
  r.shared_fenced = f.Bool("shared_fenced");
  CXLPOOL_RETURN_IF_ERROR(f.status());
  CXLPOOL_RETURN_IF_ERROR(ReadList(f, "pools", kMaxPools, ReadPool, &r.pools));
  CXLPOOL_RETURN_IF_ERROR(ReadList(f, "gpus", kMaxGpus, ReadGpu, &r.gpus));
  CXLPOOL_RETURN_IF_ERROR(
      ReadList(f, "shared_devices", kMaxDevices, ReadSharedDevice, &r.shared_devices));
  return r;
}

Result<DeviceRecord> ParseDeviceRecord(std::string_view text) {
  auto j = ParseObject("device", text);
  if (!j.ok()) return j.status();
  DeviceRecord r;
  Fields f("device", *j);
  r.size = f.U64("size");
  r.slice_bytes = f.U64("slice_bytes");
  CXLPOOL_RETURN_IF_ERROR(f.status());
  if (r.slice_bytes == 0 || r.slice_bytes % kSliceAlign != 0)
    return Bad("device", "slice_bytes: not a positive multiple of 2 MiB");
  if (r.size < r.slice_bytes) return Bad("device", "size: smaller than one slice");
  if (r.size / r.slice_bytes > (1u << 24)) return Bad("device", "more than 16 M slices");
  return r;
}

Result<SliceRecord> ParseSliceRecord(std::string_view text) {
  auto j = ParseObject("slice", text);
  if (!j.ok()) return j.status();
  SliceRecord r;
  Fields f("slice", *j);
  r.owner = f.Name("owner");
  r.epoch = f.I64("epoch", 1, INT64_MAX);
  r.since = f.I64("since", 0, INT64_MAX);
  CXLPOOL_RETURN_IF_ERROR(f.status());
  return r;
}

Result<FenceRecord> ParseFenceRecord(std::string_view text) {
  auto j = ParseObject("fence", text);
  if (!j.ok()) return j.status();
  FenceRecord r;
  Fields f("fence", *j);
  r.host = f.Name("host");
  r.epoch = f.I64("epoch", 1, INT64_MAX);
  r.by = f.Text("by");
  r.at = f.I64("at", 0, INT64_MAX);
  r.reason = f.Text("reason", false);
  CXLPOOL_RETURN_IF_ERROR(f.status());
  if (r.by.empty()) return Bad("fence", "by: empty");
  return r;
}

// ---- keys ----

Keys::Keys(std::string prefix) : prefix_(std::move(prefix)) {
  while (!prefix_.empty() && prefix_.back() == '/') prefix_.pop_back();
}

std::string Keys::Host(std::string_view host) const { return Hosts() + std::string(host); }
std::string Keys::Device(std::string_view device) const { return Devices() + std::string(device); }
std::string Keys::DeviceSlices(std::string_view device) const {
  return Slices() + std::string(device) + "/";
}
std::string Keys::Slice(std::string_view device, uint32_t index) const {
  char idx[16];
  std::snprintf(idx, sizeof idx, "%08u", index);  // fixed width: keys sort by index
  return DeviceSlices(device) + idx;
}
std::string Keys::Fence(std::string_view host, int64_t epoch) const {
  return Fences() + std::string(host) + "/" + std::to_string(epoch);
}

namespace {

// "<a>/<b>" after `base`, with a and b valid; nullopt otherwise.
std::optional<std::pair<std::string, std::string>> TwoParts(std::string_view key,
                                                            const std::string& base) {
  if (key.substr(0, base.size()) != base) return std::nullopt;
  key.remove_prefix(base.size());
  const auto slash = key.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string a(key.substr(0, slash)), b(key.substr(slash + 1));
  if (!CheckName("key", a).ok() || b.empty() || b.size() > 19 ||
      b.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::make_pair(a, b);
}

}  // namespace

std::optional<Keys::SliceId> Keys::ParseSlice(std::string_view key) const {
  auto parts = TwoParts(key, Slices());
  // Exactly as Slice() writes it: one key per slice, no aliases ("1", "001").
  if (!parts || parts->second.size() != 8) return std::nullopt;
  uint64_t index = 0;
  const auto& b = parts->second;
  auto [p, ec] = std::from_chars(b.data(), b.data() + b.size(), index);
  if (ec != std::errc() || index > UINT32_MAX) return std::nullopt;
  return SliceId{parts->first, static_cast<uint32_t>(index)};
}

std::optional<std::pair<std::string, int64_t>> Keys::ParseFence(std::string_view key) const {
  auto parts = TwoParts(key, Fences());
  if (!parts) return std::nullopt;
  int64_t epoch = 0;
  const auto& b = parts->second;
  auto [p, ec] = std::from_chars(b.data(), b.data() + b.size(), epoch);
  if (ec != std::errc() || epoch <= 0) return std::nullopt;
  return std::make_pair(parts->first, epoch);
}

std::optional<std::string> Keys::ParseHost(std::string_view key) const {
  const std::string base = Hosts();
  if (key.substr(0, base.size()) != base) return std::nullopt;
  std::string host(key.substr(base.size()));
  if (!CheckName("host", host).ok()) return std::nullopt;
  return host;
}

}  // namespace cxlpool::cluster
