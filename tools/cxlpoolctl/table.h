// A plain-text table for cxlpoolctl's human views: columns padded to their
// widest cell, numbers right-aligned.
// Thread safety: a value; no shared state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cxlpool::ctl {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// JSON text of `j` (indent < 0: one line). Invalid UTF-8 coming from the
// machine (sysfs values, process names) is replaced, never thrown.
inline std::string JsonText(const nlohmann::ordered_json& j, int indent = 2) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// "-" for an empty string; used for absent facts in tables.
inline std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

}  // namespace cxlpool::ctl
