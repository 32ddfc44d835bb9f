#include "metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

#include "cxlpool/common/status.h"

namespace cxlpool {
namespace {

bool ValidName(const std::string& n, bool label) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

void AppendEscaped(std::string* out, const std::string& v, bool quote) {
  // Label values and help texts rarely need escaping: append them whole.
  if (v.find_first_of(quote ? "\\\n\"" : "\\\n") == std::string::npos) {
    *out += v;
    return;
  }
  for (char c : v) {
    if (c == '\\')
      *out += "\\\\";
    else if (c == '\n')
      *out += "\\n";
    else if (quote && c == '"')
      *out += "\\\"";
    else
      *out += c;
  }
}

// Integers print whole (byte counts), others with 9 significant digits,
// as printf's %.9g would; to_chars skips printf's locale and parsing.
std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[32];
  std::to_chars_result r;
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 9);
  }
  return std::string(buf, r.ptr);
}

// `{k="v",k2="v2"` without its closing brace, or "" for no labels: built
// once per child and shared by all of a histogram's lines.
std::string LabelBody(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    out += out.empty() ? "{" : ",";
    out += k;
    out += "=\"";
    AppendEscaped(&out, v, true);
    out += '"';
  }
  return out;
}

// One sample line: name+suffix, the labels (plus le="..." when given), value.
void AppendSample(std::string* out, const std::string& name, std::string_view suffix,
                  const std::string& body, std::string_view le, std::string_view value) {
  *out += name;
  *out += suffix;
  if (!le.empty()) {
    if (body.empty()) {
      *out += '{';
    } else {
      *out += body;
      *out += ',';
    }
    *out += "le=\"";
    *out += le;
    *out += "\"}";
  } else if (!body.empty()) {
    *out += body;
    *out += '}';
  }
  *out += ' ';
  *out += value;
  *out += '\n';
}

}  // namespace

void MetricsRegistry::Add(const std::string& name, const std::string& help, Type type,
                          std::vector<double> bounds) {
  CXLPOOL_CHECK(ValidName(name, false));
  auto it = families_.find(name);
  if (it != families_.end()) {
    CXLPOOL_CHECK(it->second.type == type);
    return;
  }
  CXLPOOL_CHECK(std::is_sorted(bounds.begin(), bounds.end()));
  families_[name] = Family{type, help, std::move(bounds), {}};
}

void MetricsRegistry::AddCounter(const std::string& name, const std::string& help) {
  Add(name, help, Type::kCounter, {});
}
void MetricsRegistry::AddGauge(const std::string& name, const std::string& help) {
  Add(name, help, Type::kGauge, {});
}
void MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                   std::vector<double> bounds) {
  Add(name, help, Type::kHistogram, std::move(bounds));
}

MetricsRegistry::Family& MetricsRegistry::Get(const std::string& name, Type type) {
  auto it = families_.find(name);
  CXLPOOL_CHECK(it != families_.end());
  CXLPOOL_CHECK(it->second.type == type);
  return it->second;
}

void MetricsRegistry::Increment(const std::string& name, const Labels& labels, double by) {
  CXLPOOL_CHECK(by >= 0);
  for (const auto& [k, v] : labels) CXLPOOL_CHECK(ValidName(k, true));
  Get(name, Type::kCounter).children[labels].value += by;
}

void MetricsRegistry::SetCounter(const std::string& name, const Labels& labels, double value) {
  for (const auto& [k, v] : labels) CXLPOOL_CHECK(ValidName(k, true));
  Child& c = Get(name, Type::kCounter).children[labels];
  CXLPOOL_CHECK(value >= c.value);
  c.value = value;
}

void MetricsRegistry::Set(const std::string& name, const Labels& labels, double value) {
  for (const auto& [k, v] : labels) CXLPOOL_CHECK(ValidName(k, true));
  Family& f = Get(name, Type::kGauge);
  Child& c = f.children[labels];
  c.value = value;
  c.refresh = f.refresh;
}

void MetricsRegistry::ClearGauge(const std::string& name) {
  Get(name, Type::kGauge).children.clear();
}

void MetricsRegistry::BeginGaugeRefresh(const std::string& name) {
  ++Get(name, Type::kGauge).refresh;
}

void MetricsRegistry::EndGaugeRefresh(const std::string& name) {
  Family& f = Get(name, Type::kGauge);
  std::erase_if(f.children, [&](const auto& kv) { return kv.second.refresh != f.refresh; });
}

void MetricsRegistry::Observe(const std::string& name, const Labels& labels, double value) {
  HistogramCell(name, labels).Observe(value);
}

MetricsRegistry::Cell MetricsRegistry::CounterCell(const std::string& name, const Labels& labels) {
  for (const auto& [k, v] : labels) CXLPOOL_CHECK(ValidName(k, true));
  Cell cell;
  cell.child_ = &Get(name, Type::kCounter).children[labels];
  return cell;
}

MetricsRegistry::Cell MetricsRegistry::HistogramCell(const std::string& name,
                                                     const Labels& labels) {
  for (const auto& [k, v] : labels) CXLPOOL_CHECK(ValidName(k, true));
  Family& f = Get(name, Type::kHistogram);
  Child& c = f.children[labels];
  if (c.buckets.empty()) c.buckets.assign(f.bounds.size() + 1, 0);
  Cell cell;
  cell.child_ = &c;
  cell.bounds_ = &f.bounds;
  return cell;
}

void MetricsRegistry::Cell::Increment(double by) {
  CXLPOOL_CHECK(by >= 0);
  if (child_ != nullptr) child_->value += by;
}

void MetricsRegistry::Cell::Observe(double value) {
  if (child_ == nullptr || bounds_ == nullptr) return;
  size_t i = std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin();
  ++child_->buckets[i];
  ++child_->count;
  child_->value += value;
}

double MetricsRegistry::Value(const std::string& name, const Labels& labels) const {
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto c = it->second.children.find(labels);
  return c == it->second.children.end() ? 0 : c->second.value;
}

uint64_t MetricsRegistry::HistogramCount(const std::string& name, const Labels& labels) const {
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto c = it->second.children.find(labels);
  return c == it->second.children.end() ? 0 : c->second.count;
}

std::string MetricsRegistry::Render() const {
  std::string out;
  out.reserve(last_render_bytes_ + last_render_bytes_ / 8);
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    out += "# HELP " + name + " ";
    AppendEscaped(&out, f.help, false);
    out += "\n# TYPE " + name + " " + type + "\n";
    std::vector<std::string> les;
    for (double b : f.bounds) les.push_back(FormatValue(b));
    for (const auto& [labels, c] : f.children) {
      const std::string body = LabelBody(labels);
      if (f.type != Type::kHistogram) {
        AppendSample(&out, name, "", body, "", FormatValue(c.value));
        continue;
      }
      uint64_t cum = 0;
      for (size_t i = 0; i < les.size(); ++i) {
        cum += c.buckets[i];
        AppendSample(&out, name, "_bucket", body, les[i], std::to_string(cum));
      }
      cum += c.buckets.back();
      AppendSample(&out, name, "_bucket", body, "+Inf", std::to_string(cum));
      AppendSample(&out, name, "_sum", body, "", FormatValue(c.value));
      AppendSample(&out, name, "_count", body, "", std::to_string(c.count));
    }
  }
  last_render_bytes_ = out.size();
  return out;
}

std::vector<double> MetricsRegistry::LatencyBuckets() {
  return {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
          2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};
}

}  // namespace cxlpool
