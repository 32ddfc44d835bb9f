// Smoke test of cxlpool-bench: --quick prints a table and valid JSON naming
// every figure P1..P7, each measured row carrying a value, a baseline ratio
// that matches its numbers and a verdict; bad usage is an error, a missing
// daemon is reported per figure rather than crashing. No timing is judged.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace {

std::string BinaryDir() {
  const char* b = std::getenv("CXLPOOL_BINARY_DIR");
  return b ? b : ".";
}

struct BenchRun {
  int exit_code = -1;
  std::string out;
};

BenchRun RunBench(const std::string& args) {
  std::string cmd = BinaryDir() + "/tools/bench/cxlpool-bench " + args + " 2>/dev/null";
  BenchRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class BenchSmoke : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* rel : {"/tools/bench/cxlpool-bench", "/daemon/cxlpoold"}) {
      if (::access((BinaryDir() + rel).c_str(), X_OK) != 0) {
        std::fprintf(stderr, "not built: %s\n", rel);
        std::exit(77);
      }
    }
    if (::access("/sys/devices/system/node/node0/meminfo", R_OK) != 0) {
      std::fprintf(stderr, "no NUMA node 0 meminfo\n");
      std::exit(77);
    }
  }
};

TEST_F(BenchSmoke, QuickJsonNamesEveryFigureWithConsistentRatios) {
  BenchRun r = RunBench("--quick --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON:\n" << r.out;
  ASSERT_TRUE(j["results"].is_array());
  EXPECT_EQ(j["quick"], true);
  std::set<std::string> figures;
  const std::set<std::string> verdicts = {"met", "NOT met", "info", "skipped"};
  for (const auto& row : j["results"]) {
    std::string fig = row.at("figure"), metric = row.at("metric"), verdict = row.at("verdict");
    figures.insert(fig);
    EXPECT_TRUE(verdicts.count(verdict)) << metric << ": " << verdict;
    if (verdict == "skipped") {
      // Only what depends on this machine's memory may skip: hugetlb (free
      // huge pages) and the tier moves T1/T2 (two NUMA nodes, a CXL node;
      // the VM tier runs them). Every other figure must run here.
      const std::string note = row.value("note", "");
      const bool machine_dependent = metric.find("hugetlb") != std::string::npos ||
                                     ((fig == "T1" || fig == "T2") && note.rfind("needs ", 0) == 0);
      EXPECT_TRUE(machine_dependent)
          << fig << " " << metric << " skipped: " << row.value("note", "");
      EXPECT_FALSE(row.value("note", "").empty()) << "a skip must say why";
      continue;
    }
    ASSERT_TRUE(row.at("value").is_number()) << metric;
    EXPECT_TRUE(std::isfinite(row["value"].get<double>())) << metric;
    EXPECT_FALSE(row.at("unit").get<std::string>().empty()) << metric;
    if (row["baseline"].is_number()) {
      double b = row["baseline"], v = row["value"], ratio = row["ratio"];
      EXPECT_GT(b, 0) << metric;
      EXPECT_NEAR(ratio, v / b, 1e-9 * std::max(1.0, std::fabs(ratio))) << metric;
    }
    if (row["goal"].is_object()) {
      std::string op = row["goal"]["op"];
      EXPECT_TRUE(op == "le" || op == "ge") << metric;
      double ratio = row["ratio"], goal = row["goal"]["ratio"];
      bool met = op == "le" ? ratio <= goal : ratio >= goal;
      EXPECT_EQ(verdict, met ? "met" : "NOT met") << metric;
    }
  }
  for (const char* f : {"P1", "P2", "P3", "P4", "P5", "P6", "P7"}) {
    EXPECT_TRUE(figures.count(f)) << f << " missing from:\n" << r.out;
  }
  // Every P3 load level comes with its floor (the memfd work alone), an
  // informational row against the same bare baseline.
  std::set<std::string> p3, floors;
  for (const auto& row : j["results"]) {
    if (row.at("figure") != "P3") continue;
    std::string m = row.at("metric");
    const std::string suffix = " floor";
    if (m.size() > suffix.size() &&
        m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0) {
      floors.insert(m.substr(0, m.size() - suffix.size()));
      EXPECT_EQ(row.at("verdict"), "info") << m;
    } else {
      p3.insert(m);
    }
  }
  EXPECT_FALSE(p3.empty());
  EXPECT_EQ(p3, floors) << r.out;
  // P1's warm p50 rows say how often each side's reply stayed on the
  // client's CPU (the bare baseline is bimodal on that).
  int p50_rows = 0;
  for (const auto& row : j["results"]) {
    std::string m = row.at("metric");
    if (row.at("figure") != "P1" || m.size() < 8 || m.compare(m.size() - 8, 8, "warm p50") != 0) {
      continue;
    }
    ++p50_rows;
    std::string note = row.value("note", "");
    EXPECT_NE(note.find("bare on one CPU with the client"), std::string::npos) << note;
    EXPECT_NE(note.find("daemon loop on one CPU with the client"), std::string::npos) << note;
  }
  EXPECT_GT(p50_rows, 0) << r.out;
}

TEST_F(BenchSmoke, QuickTableForOneFigure) {
  BenchRun r = RunBench("--quick --only p5");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| fig "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("|---"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| P5  | node Shmem delta / requested"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| P1 "), std::string::npos) << "--only P5 ran P1:\n" << r.out;
}

TEST_F(BenchSmoke, UnknownFigureIsAUsageError) {
  BenchRun r = RunBench("--only P1,P9");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(BenchSmoke, MissingDaemonIsReportedNotACrash) {
  BenchRun r = RunBench("--quick --json --only P1 --daemon /nonexistent/cxlpoold");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["results"].size(), 1u) << r.out;
  EXPECT_EQ(j["results"][0]["verdict"], "skipped");
  EXPECT_NE(j["results"][0]["note"].get<std::string>().find("no cxlpoold"), std::string::npos)
      << r.out;
}

}  // namespace
