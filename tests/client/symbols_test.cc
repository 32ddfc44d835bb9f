// libcxlpool.so exports only the C ABI (cxlpool_*) and the C++ API
// (cxlpool::Client, cxlpool::Lease), each under the version node it was
// added in (CXLPOOL_0.1; CXLPOOL_0.2 for attach by owner and the placement
// check; never moved between nodes), and carries SONAME libcxlpool.so.0.
// Read with nm and readelf (binutils);
// exits 77 when they are missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string RunCommand(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

const char* Lib() { return std::getenv("CXLPOOL_SHARED_LIB"); }

TEST(SymbolsTest, OnlyTheApiIsExportedAndVersioned) {
  ASSERT_NE(Lib(), nullptr);
  int status = 0;
  // --defined-only: what the library provides. -C demangles, --with-symbol-versions adds @@.
  std::string out =
      RunCommand(std::string("nm -D -C --defined-only --with-symbol-versions ") + Lib(), &status);
  ASSERT_EQ(status, 0) << out;
  int c_symbols = 0, cxx_symbols = 0;
  for (const std::string& line : Lines(out)) {
    // "<addr> <type> <name>@@VERSION"; the version node itself appears as an absolute symbol.
    size_t sp = line.find(' ', line.find(' ') + 1);
    ASSERT_NE(sp, std::string::npos) << line;
    std::string name = line.substr(sp + 1);
    if (name == "CXLPOOL_0.1" || name == "CXLPOOL_0.2" || name == "CXLPOOL_0.1@@CXLPOOL_0.1" ||
        name == "CXLPOOL_0.2@@CXLPOOL_0.2") {
      continue;
    }
    // Symbols added after 0.1 sit in their own node; nothing else may move.
    static const char* const kAdded02[] = {
        "cxlpool_lease_verify@@", "cxlpool::Lease::Verify()@@", "cxlpool_attach_from@@",
        "cxlpool::Client::AttachFrom(",
        // tiering
        "cxlpool_lease_copy_in@@", "cxlpool_lease_copy_out@@", "cxlpool_lease_note_access@@",
        "cxlpool_lease_hint@@", "cxlpool_lease_pin_tier@@",
        "cxlpool_lease_set_migration_callback@@", "cxlpool_lease_tiering_stats@@",
        "cxlpool_migrations_pending@@", "cxlpool_safe_point@@", "cxlpool_flush_signals@@",
        "cxlpool::Lease::CopyIn(", "cxlpool::Lease::CopyOut(", "cxlpool::Lease::NoteAccess(",
        "cxlpool::Lease::Hint(", "cxlpool::Lease::PinTier(",
        "cxlpool::Lease::SetMigrationCallback(", "cxlpool::Lease::tiering_stats() const@@",
        "cxlpool::Client::MigrationsPending()@@", "cxlpool::Client::SafePoint()@@",
        "cxlpool::Client::FlushSignals()@@",
        // extents
        "cxlpool_lease_extent@@", "cxlpool_lease_extent_count@@",
        "cxlpool::Lease::extents() const@@"};
    bool in_02 = false;
    for (const char* prefix : kAdded02) in_02 = in_02 || name.rfind(prefix, 0) == 0;
    const std::string node = in_02 ? "@@CXLPOOL_0.2" : "@@CXLPOOL_0.1";
    size_t at = name.rfind(node);
    EXPECT_NE(at, std::string::npos) << "unversioned or wrongly versioned export: " << line;
    std::string base = name.substr(0, at);
    if (base.rfind("cxlpool_", 0) == 0) {
      ++c_symbols;
    } else if (base.rfind("cxlpool::Client::", 0) == 0 || base.rfind("cxlpool::Lease::", 0) == 0) {
      ++cxx_symbols;
    } else {
      ADD_FAILURE() << "unexpected export: " << line;
    }
  }
  EXPECT_EQ(c_symbols, 37) << "the C ABI changed: update this count deliberately\n" << out;
  EXPECT_GE(cxx_symbols, 10) << out;
  EXPECT_NE(out.find("cxlpool_alloc@@CXLPOOL_0.1"), std::string::npos);
  EXPECT_NE(out.find("cxlpool_strerror@@CXLPOOL_0.1"), std::string::npos);
  EXPECT_NE(out.find("cxlpool_lease_verify@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(out.find("cxlpool::Lease::Verify()@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(out.find("cxlpool_attach@@CXLPOOL_0.1"), std::string::npos);
  // Added in 0.2: attach by owner; tiering.
  EXPECT_NE(out.find("cxlpool_attach_from@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(out.find("cxlpool::Client::AttachFrom(unsigned int"), std::string::npos);
  EXPECT_NE(out.find("cxlpool_lease_hint@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(out.find("cxlpool_safe_point@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(
      out.find("cxlpool::Lease::CopyIn(unsigned long, void const*, unsigned long)@@CXLPOOL_0.2"),
      std::string::npos);
  EXPECT_NE(out.find("cxlpool::Client::SafePoint()@@CXLPOOL_0.2"), std::string::npos);
  EXPECT_NE(out.find("cxlpool::Client::Connect("), std::string::npos);
}

TEST(SymbolsTest, Soname) {
  int status = 0;
  std::string out = RunCommand(std::string("readelf -d ") + Lib(), &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Library soname: [libcxlpool.so.0]"), std::string::npos) << out;
}

}  // namespace

int main(int argc, char** argv) {
  int status = 0;
  RunCommand("nm --version >/dev/null 2>&1 && readelf --version >/dev/null 2>&1", &status);
  if (status != 0) {
    std::fprintf(stderr, "nm/readelf not installed: skipping\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
