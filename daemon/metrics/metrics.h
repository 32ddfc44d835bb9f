// Metrics: counters, gauges and histograms with labels, rendered in the
// Prometheus text exposition format (version 0.0.4).
//
// Families are registered once by name; each labelled child is created on
// first use and kept (label sets are few: pool, tier, reason, op).
//
// Thread safety: none. The daemon's event-loop thread owns the registry;
// workers post their observations back to it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cxlpool {

using Labels = std::map<std::string, std::string>;

class MetricsRegistry {
  struct Child {
    double value = 0;               // counter / gauge; histogram sum
    uint64_t count = 0;             // histogram
    std::vector<uint64_t> buckets;  // histogram, non-cumulative
    uint64_t refresh = 0;           // gauge: the family's refresh when last set
  };

 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // One counter or histogram child, looked up once and kept by a hot path
  // (every grant): updating it builds no labels and searches no map. Valid
  // as long as the registry; counter and histogram children are never
  // removed. A default-constructed cell ignores updates.
  class Cell {
   public:
    Cell() = default;
    void Increment(double by = 1.0);  // a counter's cell
    void Observe(double value);       // a histogram's cell

   private:
    friend class MetricsRegistry;
    Child* child_ = nullptr;
    const std::vector<double>* bounds_ = nullptr;  // histograms only
  };
  Cell CounterCell(const std::string& name, const Labels& labels);
  Cell HistogramCell(const std::string& name, const Labels& labels);

  // Registers a family; re-registering the same name returns the same id.
  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]* (checked: a bad name crashes).
  void AddCounter(const std::string& name, const std::string& help);
  void AddGauge(const std::string& name, const std::string& help);
  // `bounds`: ascending upper bounds; +Inf is implicit.
  void AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds);

  void Increment(const std::string& name, const Labels& labels = {}, double by = 1.0);
  // A counter kept elsewhere (a cumulative total): sets its value, which
  // must not go down (checked).
  void SetCounter(const std::string& name, const Labels& labels, double value);
  void Set(const std::string& name, const Labels& labels, double value);
  void Set(const std::string& name, double value) { Set(name, {}, value); }
  void Observe(const std::string& name, const Labels& labels, double value);
  void Observe(const std::string& name, double value) { Observe(name, {}, value); }
  // Drops every child of a gauge family.
  void ClearGauge(const std::string& name);
  // Re-publishing a gauge family whose label sets come and go (pools, quota
  // rules): BeginGaugeRefresh, Set every live child, then EndGaugeRefresh
  // drops the children not Set in between. Children that stay are updated
  // in place, so a scrape of an unchanged node allocates nothing for them.
  void BeginGaugeRefresh(const std::string& name);
  void EndGaugeRefresh(const std::string& name);

  double Value(const std::string& name, const Labels& labels = {}) const;
  uint64_t HistogramCount(const std::string& name, const Labels& labels = {}) const;

  // The Prometheus text exposition of every family, sorted by name.
  std::string Render() const;

  // Latency buckets in seconds, 10 us .. 10 s.
  static std::vector<double> LatencyBuckets();

 private:
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;
    std::map<Labels, Child> children;
    uint64_t refresh = 0;  // gauges: bumped by BeginGaugeRefresh
  };
  Family& Get(const std::string& name, Type type);
  void Add(const std::string& name, const std::string& help, Type type, std::vector<double> bounds);
  std::map<std::string, Family> families_;
  mutable size_t last_render_bytes_ = 0;  // reserve hint for the next Render
};

}  // namespace cxlpool
