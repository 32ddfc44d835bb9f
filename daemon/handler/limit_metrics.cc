#include "handler/limit_metrics.h"

#include <limits>

namespace cxlpool {

namespace {

double Seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

// A timeout of 0 means "never": unlimited, shown as +Inf like every other
// unlimited value in the metrics.
double SecondsOrUnlimited(std::chrono::milliseconds d) {
  return d.count() == 0 ? std::numeric_limits<double>::infinity() : Seconds(d);
}

}  // namespace

std::vector<std::pair<std::string, double>> LimitValues(const ServerLimits& l) {
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  return {
      {"max_connections", d(l.max_connections)},
      {"max_connections_per_uid", d(l.max_connections_per_uid)},
      {"reserved_connections", d(l.reserved_connections)},
      {"max_requests", d(l.max_requests)},
      {"max_requests_per_uid", d(l.max_requests_per_uid)},
      {"max_requests_per_connection", d(l.max_requests_per_connection)},
      {"max_queued_bytes", d(l.max_queued_bytes)},
      {"max_queued_bytes_per_uid", d(l.max_queued_bytes_per_uid)},
      {"max_queued_bytes_per_connection", d(l.max_queued_bytes_per_connection)},
      {"max_fds", d(l.max_fds)},
      {"max_fds_per_uid", d(l.max_fds_per_uid)},
      {"max_fds_per_frame", d(l.max_fds_per_frame)},
      {"max_request_bytes", d(l.max_request_bytes)},
      {"hello_timeout", Seconds(l.hello_timeout)},
      {"idle_timeout", SecondsOrUnlimited(l.idle_timeout)},
      {"frame_timeout", Seconds(l.frame_timeout)},
      {"send_timeout", SecondsOrUnlimited(l.send_timeout)},
      {"max_busy_per_uid", SecondsOrUnlimited(l.max_busy_per_uid)},
  };
}

void ExportLimitMetrics(const ServerStats& stats, const ServerLimits& limits,
                        MetricsRegistry* reg) {
  constexpr const char* kHits = "cxlpool_limit_hits_total";
  constexpr const char* kValue = "cxlpool_limit";
  reg->AddCounter(kHits,
                  "Connections refused or closed, and requests refused, by the limit (the "
                  "limits.<name> config key) that caused it.");
  reg->AddGauge(kValue, "Each limits.<name> in force (timeouts in seconds; +Inf: off).");
  reg->AddGauge("cxlpool_client_requests_in_flight",
                "Requests handed to the daemon and not answered yet (also of closed "
                "connections).");
  reg->AddGauge("cxlpool_client_queued_bytes",
                "Reply bytes held for clients that do not read (128 bytes more per frame).");
  reg->AddGauge("cxlpool_client_fds",
                "Fds held for clients: with requests not handled yet, and in send queues.");
  reg->AddCounter("cxlpool_protocol_errors_total",
                  "Frames refused as malformed (bad header, fds where none belong, unknown "
                  "type).");
  for (const auto& [name, value] : LimitValues(limits)) {
    reg->SetCounter(kHits, {{"limit", name}}, static_cast<double>(stats.hits(name)));
    reg->Set(kValue, {{"limit", name}}, value);
  }
  reg->Set("cxlpool_client_requests_in_flight", static_cast<double>(stats.requests_in_flight));
  reg->Set("cxlpool_client_queued_bytes", static_cast<double>(stats.queued_bytes));
  reg->Set("cxlpool_client_fds", static_cast<double>(stats.fds_held));
  reg->SetCounter("cxlpool_protocol_errors_total", {}, static_cast<double>(stats.protocol_errors));
}

void ExportLimitStats(const ServerStats& stats, std::map<std::string, uint64_t>* counters,
                      std::map<std::string, uint64_t>* gauges) {
  for (const auto& [name, n] : stats.limit_hits) (*counters)["limit_hits_" + name] = n;
  (*counters)["protocol_errors"] = stats.protocol_errors;
  (*gauges)["requests_in_flight"] = stats.requests_in_flight;
  (*gauges)["queued_reply_bytes"] = stats.queued_bytes;
  (*gauges)["client_fds"] = stats.fds_held;
}

}  // namespace cxlpool
