// Fuzz target: records read from etcd (untrusted: any host, or anyone with
// write access to the prefix, wrote them). Input: key/value pairs, each
// "key\x1fvalue", separated by \x1e. Every parser must give a record or an
// INVALID_ARGUMENT; a record that parses must survive a round trip; the
// view built from all of them must never offer an unreadable slice as free.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/cluster/cluster_view.h"

namespace {

template <typename Parse>
void RoundTrip(std::string_view text, Parse parse) {
  auto r = parse(text);
  if (!r.ok()) {
    if (r.status().code() != cxlpool::Code::kInvalidArgument) __builtin_trap();
    return;
  }
  const std::string again = cxlpool::cluster::ToJson(*r);
  auto r2 = parse(again);
  if (!r2.ok() || cxlpool::cluster::ToJson(*r2) != again) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cxlpool::cluster;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<cxlpool::etcd::KeyValue> kvs;
  int64_t rev = 1;
  while (!in.empty()) {
    const size_t end = in.find('\x1e');
    std::string_view pair = in.substr(0, end);
    in = end == std::string_view::npos ? std::string_view() : in.substr(end + 1);
    const size_t sep = pair.find('\x1f');
    cxlpool::etcd::KeyValue kv;
    kv.key = std::string(pair.substr(0, sep));
    if (sep != std::string_view::npos) kv.value = std::string(pair.substr(sep + 1));
    kv.create_revision = kv.mod_revision = rev++;
    RoundTrip(kv.value, ParseHostRecord);
    RoundTrip(kv.value, ParseDeviceRecord);
    RoundTrip(kv.value, ParseSliceRecord);
    RoundTrip(kv.value, ParseFenceRecord);
    kvs.push_back(std::move(kv));
  }
  const Keys keys("/cxlpool/v1");
  const ClusterView view = ClusterView::FromKvs(keys, kvs, rev);
  for (const auto& [id, dev] : view.devices) {
    if (dev.slices.size() != dev.record.slices()) __builtin_trap();
    for (const auto& s : dev.slices) {
      // A slice key exists (mod_revision set) but reads as free: never.
      if (s.state == SliceState::kFree && s.mod_revision != 0) __builtin_trap();
    }
  }
  return 0;
}
