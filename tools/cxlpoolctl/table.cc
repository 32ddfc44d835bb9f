#include "table.h"

#include <algorithm>
#include <cctype>

namespace cxlpool::ctl {
namespace {
// Cells that start with a digit (counts, sizes, ages) are right-aligned.
bool Numeric(const std::string& s) {
  return !s.empty() && std::isdigit(static_cast<unsigned char>(s[0]));
}
}  // namespace

std::string Table::Render() const {
  std::vector<size_t> width;
  for (const auto& r : rows_) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (size_t ri = 0; ri < rows_.size(); ++ri) {
    const auto& r = rows_[ri];
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      std::string pad(width[i] - r[i].size(), ' ');
      bool right = ri > 0 && Numeric(r[i]);
      line += right ? pad + r[i] : r[i] + (i + 1 < r.size() ? pad : "");
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace cxlpool::ctl
