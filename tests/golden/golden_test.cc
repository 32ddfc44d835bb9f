// Golden tests for `cxlpoolctl topology --json` (see CMakeLists.txt), plus
// the CLI's exit codes and a crash check of the human view on every tree.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv with the current environment minus the cxlpool variables that
// would change the result, plus `env`. Never uses a shell.
RunResult RunCommand(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (key == "CXLPOOL_NVML_LIBRARY" || key == "CXLPOOL_FAKE_NVML_BOARD" ||
        key == "CXLPOOL_FSROOT" || env.count(key)) {
      continue;
    }
    envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  RunResult r;
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) {
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return r;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  return s;
}

std::vector<std::string> Fixtures() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(FIXTURES_DIR, ec)) {
    if (fs::is_directory(e.path() / "root")) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The environment a fixture runs with: the fake NVML and its board when the
// fixture names one.
std::map<std::string, std::string> FixtureEnv(const fs::path& dir) {
  std::map<std::string, std::string> env;
  if (fs::exists(dir / "nvml-board")) {
    std::string board = Trimmed(ReadFile(dir / "nvml-board"));
    env["CXLPOOL_NVML_LIBRARY"] = FAKE_NVML_LIB;
    env["CXLPOOL_FAKE_NVML_BOARD"] = std::string(FAKE_NVML_BOARDS) + "/" + board + ".json";
  }
  return env;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, JsonMatchesExpected) {
  fs::path dir = fs::path(FIXTURES_DIR) / GetParam();
  auto env = FixtureEnv(dir);
  if (env.count("CXLPOOL_FAKE_NVML_BOARD")) {
    ASSERT_TRUE(fs::exists(env["CXLPOOL_FAKE_NVML_BOARD"]))
        << "nvml-board names a missing board: " << env["CXLPOOL_FAKE_NVML_BOARD"];
  }
  RunResult r = RunCommand(
      {CXLPOOLCTL_BIN, "topology", "--json", "--sysfs-root", (dir / "root").string()}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json actual;
  ASSERT_NO_THROW(actual = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(actual["schema_version"], 1);

  fs::path expected_path = dir / "expected.json";
  const char* update = std::getenv("CXLPOOL_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(expected_path, std::ios::binary | std::ios::trunc) << r.out;
    std::cout << "rewrote " << expected_path << "\n";
    return;
  }
  ASSERT_TRUE(fs::exists(expected_path))
      << expected_path << " is missing; run with CXLPOOL_UPDATE_GOLDEN=1 and review it";
  nlohmann::json expected;
  ASSERT_NO_THROW(expected = nlohmann::json::parse(ReadFile(expected_path)));
  if (actual != expected) {
    std::string diff = nlohmann::json::diff(expected, actual).dump(2);
    if (diff.size() > 6000) diff = diff.substr(0, 6000) + "\n...";
    ADD_FAILURE() << GetParam() << ": output differs from expected.json (JSON patch from "
                  << "expected to actual):\n"
                  << diff << "\nIf the change is intended: CXLPOOL_UPDATE_GOLDEN=1 ctest -R golden";
  }
}

TEST_P(Golden, HumanViewRuns) {
  fs::path dir = fs::path(FIXTURES_DIR) / GetParam();
  RunResult r = RunCommand({CXLPOOLCTL_BIN, "topology", "--sysfs-root", (dir / "root").string()},
                           FixtureEnv(dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Memory topology:"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(Fixtures()),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

TEST(GoldenSet, FixturesExist) {
  auto names = Fixtures();
  EXPECT_FALSE(names.empty()) << "no fixture trees under " << FIXTURES_DIR;
}

TEST(CxlpoolctlTopology, MissingRootIsExit1) {
  RunResult r =
      RunCommand({CXLPOOLCTL_BIN, "topology", "--sysfs-root", "/nonexistent/cxlpool-root"}, {});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a directory"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(CxlpoolctlTopology, FsRootFromEnvironment) {
  auto names = Fixtures();
  if (names.empty()) GTEST_SKIP() << "no fixtures";
  fs::path root = fs::path(FIXTURES_DIR) / names.front() / "root";
  RunResult by_env = RunCommand({CXLPOOLCTL_BIN, "topology", "--json", "--no-nvml"},
                                {{"CXLPOOL_FSROOT", root.string()}});
  RunResult by_flag = RunCommand(
      {CXLPOOLCTL_BIN, "topology", "--json", "--no-nvml", "--sysfs-root", root.string()}, {});
  ASSERT_EQ(by_env.exit_code, 0) << by_env.err;
  EXPECT_EQ(by_env.out, by_flag.out);
}

TEST(CxlpoolctlTopology, UsageErrorsAreExit2) {
  EXPECT_EQ(RunCommand({CXLPOOLCTL_BIN, "topology", "--no-such-flag"}, {}).exit_code, 2);
  EXPECT_EQ(RunCommand({CXLPOOLCTL_BIN}, {}).exit_code, 2);
  EXPECT_EQ(RunCommand({CXLPOOLCTL_BIN, "no-such-command"}, {}).exit_code, 2);
  RunResult help = RunCommand({CXLPOOLCTL_BIN, "--help"}, {});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("topology"), std::string::npos);
  EXPECT_NE(help.out.find("Exit status"), std::string::npos);
}

}  // namespace
