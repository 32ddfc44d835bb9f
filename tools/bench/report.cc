// What a run produced: rows, the table and the JSON (Report), latency
// percentiles (Stats) and the small formatting helpers. See bench.h.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench.h"

namespace cxlpool::bench {

// ---------------------------------------------------------------- report

bool Options::Wants(const std::string& p) const {
  return only.empty() || std::find(only.begin(), only.end(), p) != only.end();
}

std::string Row::Verdict() const {
  if (skipped) return "skipped";
  if (goal_op.empty() || baseline <= 0) return "info";
  double r = Ratio();
  bool met = goal_op == "le" ? r <= goal : r >= goal;
  return met ? "met" : "NOT met";
}

void Report::Skip(const std::string& figure, const std::string& metric, const std::string& why) {
  Row r;
  r.figure = figure;
  r.metric = metric;
  r.skipped = true;
  r.note = why;
  Add(std::move(r));
}

namespace {

std::string Num(double v) {
  char buf[64];
  if (v == 0) return "0";
  double a = std::fabs(v);
  if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (a >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

std::string GoalText(const Row& r) {
  if (r.goal_op.empty()) return "-";
  return std::string(r.goal_op == "le" ? "<= " : ">= ") + Num(r.goal) + "x";
}

}  // namespace

std::string Report::Table() const {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"fig", "metric", "cxlpool", "baseline", "unit", "ratio", "goal", "verdict"});
  for (const Row& r : rows) {
    if (r.skipped) {
      cells.push_back({r.figure, r.metric, "-", "-", "-", "-", "-", "skipped"});
    } else {
      cells.push_back({r.figure, r.metric, Num(r.value), r.baseline > 0 ? Num(r.baseline) : "-",
                       r.unit, r.baseline > 0 ? Num(r.Ratio()) + "x" : "-", GoalText(r),
                       r.Verdict()});
    }
  }
  std::vector<size_t> w(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  std::ostringstream out;
  for (size_t k = 0; k < cells.size(); ++k) {
    const auto& row = cells[k];
    out << "|";
    for (size_t i = 0; i < row.size(); ++i) {
      out << " " << row[i] << std::string(w[i] - row[i].size(), ' ') << " |";
    }
    out << "\n";
    if (k == 0) {
      out << "|";
      for (size_t i = 0; i < row.size(); ++i) out << std::string(w[i] + 2, '-') << "|";
      out << "\n";
    }
  }
  bool any_note = false;
  for (const Row& r : rows) {
    if (r.note.empty()) continue;
    if (!any_note) out << "\nNotes:\n";
    any_note = true;
    out << "- " << r.figure << " " << r.metric << ": " << r.note << "\n";
  }
  for (const std::string& n : notes) out << "- " << n << "\n";
  return out.str();
}

std::string Report::Json(const Options& o) const {
  nlohmann::json j;
  j["command"] = o.command_line;
  j["quick"] = o.quick;
  j["node"] = o.node;
  j["mode"] = o.spawn() ? "spawned daemon" : "running daemon at " + o.socket;
  auto& arr = j["results"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json e;
    e["figure"] = r.figure;
    e["metric"] = r.metric;
    e["verdict"] = r.Verdict();
    e["note"] = r.note;
    if (!r.skipped) {
      e["value"] = r.value;
      e["unit"] = r.unit;
      if (r.baseline > 0) {
        e["baseline"] = r.baseline;
        e["ratio"] = r.Ratio();
      } else {
        e["baseline"] = nullptr;
        e["ratio"] = nullptr;
      }
      if (!r.goal_op.empty()) {
        e["goal"] = {{"op", r.goal_op}, {"ratio", r.goal}};
      } else {
        e["goal"] = nullptr;
      }
    }
    arr.push_back(std::move(e));
  }
  j["notes"] = notes;
  return j.dump(2);
}

double Stats::PercentileUs(double q) const {
  if (v_.empty()) return 0;
  if (!sorted_) {
    std::sort(v_.begin(), v_.end());
    sorted_ = true;
  }
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v_.size())));
  if (rank == 0) rank = 1;
  if (rank > v_.size()) rank = v_.size();
  return static_cast<double>(v_[rank - 1]) / 1000.0;
}

uint64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string HumanSize(uint64_t b) {
  if (b >= kGiB && b % kGiB == 0) return std::to_string(b / kGiB) + " GiB";
  if (b >= kMiB && b % kMiB == 0) return std::to_string(b / kMiB) + " MiB";
  if (b >= kKiB && b % kKiB == 0) return std::to_string(b / kKiB) + " KiB";
  return std::to_string(b) + " B";
}

Row MeasuredRow(const std::string& figure, const std::string& metric, double value, double baseline,
                const std::string& unit, const std::string& goal_op, double goal,
                const std::string& note) {
  Row x;
  x.figure = figure;
  x.metric = metric;
  x.value = value;
  x.baseline = baseline;
  x.unit = unit;
  x.goal_op = goal_op;
  x.goal = goal;
  x.note = note;
  return x;
}

}  // namespace cxlpool::bench
