// Smoke test of cxlpool-bench: --quick prints a table and valid JSON naming
// every figure (P1..P7, P1u, the P2 mixes, recycled, the cluster's C1 and
// C2), each measured row carrying a value, a baseline ratio that matches its
// numbers and a verdict; bad usage is an error, a missing daemon is reported
// per figure rather than crashing. No timing is judged.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
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
  for (const char* f : {"P1", "P1u", "P2", "P2any", "P2_4k", "P2cold", "P3", "P4", "P5", "P6", "P7",
                        "recycled", "C1", "C2", "C3", "C4", "R1", "R2"}) {
    EXPECT_TRUE(figures.count(f)) << f << " missing from:\n" << r.out;
  }
  // Issue 18's figures through the daemon: each any-size mix has its whole-mix
  // row and at least one band row; P1u its p50 and p99 with goals; recycled
  // a row per page size; P5 counts the reserve.
  std::map<std::string, std::set<std::string>> metrics;
  for (const auto& row : j["results"]) metrics[row.at("figure")].insert(row.at("metric"));
  for (const char* f : {"P2any", "P2_4k", "P2cold"}) {
    EXPECT_TRUE(metrics[f].count("ready, whole mix (sum of times)")) << f << "\n" << r.out;
    int bands = 0;
    for (const std::string& m : metrics[f]) bands += m.rfind("ready, median per request ", 0) == 0;
    EXPECT_EQ(bands, 3) << f << " (the --quick mix reaches every size band)\n" << r.out;
  }
  for (const auto& row : j["results"]) {
    const std::string fig = row.at("figure"), m = row.at("metric");
    if (fig == "P2any" && m == "ready, whole mix (sum of times)") {
      EXPECT_TRUE(row["goal"].is_object()) << "P2any's whole mix has the 0.1x goal";
    }
    if (fig == "P2cold" && m.rfind("ready, median per request ", 0) == 0) {
      EXPECT_EQ(row["goal"]["ratio"], 1.2) << m;
    }
  }
  EXPECT_TRUE(metrics["P1u"].count("cxlpool_alloc 2 MiB to a usable pointer p50")) << r.out;
  EXPECT_TRUE(metrics["P1u"].count("cxlpool_alloc 2 MiB to a usable pointer p99")) << r.out;
  EXPECT_TRUE(metrics["recycled"].count("release to reserve again, 32 MiB thp")) << r.out;
  EXPECT_TRUE(metrics["recycled"].count("release to reserve again, 32 MiB 4k")) << r.out;
  EXPECT_TRUE(metrics["P5"].count("node Shmem incl. reserve / requested")) << r.out;
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

TEST_F(BenchSmoke, MixSizeOptionsShapeTheMix) {
  BenchRun r = RunBench("--quick --json --only p2_4K --max-size 3000000 --mix-count 6");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  bool whole = false;
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row.at("figure"), "P2_4k") << row;
    EXPECT_NE(row.at("verdict"), "skipped") << row;
    if (row.at("metric") == "ready, whole mix (sum of times)") {
      whole = true;
      EXPECT_NE(row.at("note").get<std::string>().find("6 sizes log-uniform 4 KiB..3000000 B"),
                std::string::npos)
          << row;
    }
    // Nothing of 64 MiB or more in a mix capped at 3 MB.
    EXPECT_EQ(row.at("metric").get<std::string>().find(">= 64 MiB"), std::string::npos) << row;
  }
  EXPECT_TRUE(whole) << r.out;
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
