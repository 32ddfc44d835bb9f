// cxlpool-microbench's main: Google Benchmark's, plus --version (every
// cxlpool binary has one). --help lists Google Benchmark's own flags.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>

#include "cxlpool/common/version.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s\n", cxlpool::VersionLine("cxlpool-microbench").c_str());
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
