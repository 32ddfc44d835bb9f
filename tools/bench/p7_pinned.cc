// P7: host memory committed for PyTorch-like pinned requests (weight
// shards, optimizer state, KV-cache blocks, DataLoader batches, offloaded
// activations, small tensors), served the way cxlpool.torch's pinned
// allocator serves them (HostArena: exact-size leases, small blocks carved
// from slab leases), next to a power-of-two rounding allocator measured in
// the same run (PyTorch's CachingHostAllocator rounds every request up to a
// power of two and commits that much).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "bench.h"
#include "host_arena.h"

namespace cxlpool::bench {

namespace {

uint64_t Pow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

struct Request {
  const char* what;
  uint64_t bytes;
  int count;
};

// Sizes a training or serving process pins. `h` is the hidden size: 4096
// for a 7B-class model (full run), 1024 for --quick.
std::vector<Request> TorchLikeRequests(bool quick) {
  const uint64_t h = quick ? 1024 : 4096;
  const uint64_t ffn = quick ? 2752 : 11008;
  const uint64_t bf16 = 2, fp32 = 4;
  return {
      {"qkv weight (bf16)", 3 * h * h * bf16, 2},
      {"o_proj weight (bf16)", h * h * bf16, 2},
      {"mlp weight (bf16)", h * ffn * bf16, 3},
      {"adam state shard (fp32)", h * ffn * fp32, 1},
      {"activation offload 8x3000xh (bf16)", 8 * 3000 * h * bf16 / (quick ? 4 : 1), 1},
      {"dataloader batch 32x3x224x224 (fp32)", 32 * 3 * 224 * 224 * fp32 / (quick ? 4 : 1), 2},
      {"kv block 16 tok x 8 heads x 128 x k,v (bf16)", 16 * 8 * 128 * 2 * bf16, 24},
      {"layernorm weight (bf16)", h * bf16, 16},
      {"labels 32 x int64", 32 * 8, 16},
      {"odd tensor 1000x1000 (fp32)", 1000 * 1000 * fp32, 2},
  };
}

}  // namespace

void RunP7(const Options& o, Report* r) {
  std::vector<Request> reqs = TorchLikeRequests(o.quick);
  uint64_t requested = 0, pow2 = 0;
  int n = 0;
  for (const Request& q : reqs) {
    requested += q.bytes * static_cast<uint64_t>(q.count);
    pow2 += Pow2(q.bytes) * static_cast<uint64_t>(q.count);
    n += q.count;
  }
  const std::string mix = std::to_string(n) + " PyTorch-like requests (" +
                          std::to_string(reqs.size()) + " kinds, " + HumanSize(requested) +
                          " requested)";

  DaemonConfig cfg;
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P7", "pinned committed / requested", sock.status().ToString());
  auto w = WireClient::Connect(*sock);
  if (!w.ok()) return r->Skip("P7", "pinned committed / requested", w.status().ToString());
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P7", "pinned", s.ToString());
  auto client = Client::Connect(*sock);
  if (!client.ok()) return r->Skip("P7", "pinned", client.status().ToString());

  // ---- cxlpool: HostArena, as cxlpool.torch's allocator uses it ----
  hostalloc::ArenaOptions ao;
  ao.cuda_register = false;  // no GPU here; registration does not change committed bytes
  ao.label = "bench-p7";
  auto arena = std::make_unique<hostalloc::HostArena>(std::move(*client), ao);
  SettleVmstat();
  auto m0 = NodeMeminfo(o.node);
  auto p0 = ProcStatus(::getpid());
  if (!m0.ok()) return r->Skip("P7", "pinned", m0.status().ToString());
  if (!p0.ok()) return r->Skip("P7", "pinned", p0.status().ToString());
  std::vector<void*> blocks;
  for (const Request& q : reqs) {
    for (int i = 0; i < q.count; ++i) {
      auto p = arena->Allocate(q.bytes, -1);
      if (!p.ok()) {
        for (void* b : blocks) arena->Free(b);
        return r->Skip("P7", "pinned", std::string(q.what) + ": " + p.status().ToString());
      }
      // A pinned buffer is written before it is copied from.
      std::fill_n(static_cast<char*>(*p), std::min<uint64_t>(q.bytes, 64), 1);
      blocks.push_back(*p);
    }
  }
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P7", "pinned", s.ToString());
  SettleVmstat();
  auto m1 = NodeMeminfo(o.node);
  auto p1 = ProcStatus(::getpid());
  hostalloc::ArenaStats st = arena->stats();
  for (void* b : blocks) arena->Free(b);
  arena->ReleaseEmptySlabs();
  if (!m1.ok() || !p1.ok()) return r->Skip("P7", "pinned", "meminfo or /proc/self/status after");
  int64_t shmem = Field(*m1, "Shmem") - Field(*m0, "Shmem");
  // The leases' pages as this process maps them (MAP_POPULATE): resident
  // shmem of the bench alone, which other processes on the node cannot move.
  int64_t rss_shmem = Field(*p1, "RssShmem") - Field(*p0, "RssShmem");

  // ---- baseline: a power-of-two rounding allocator, committing as
  // cudaHostAlloc does (every page populated) ----
  auto s0 = ProcStatus(::getpid());
  std::vector<std::pair<void*, uint64_t>> maps;
  bool mapped = true;
  for (const Request& q : reqs) {
    for (int i = 0; i < q.count && mapped; ++i) {
      uint64_t len = Pow2(q.bytes);
      void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) {
        mapped = false;
        break;
      }
      ::madvise(p, len, MADV_NOHUGEPAGE);
      maps.emplace_back(p, len);
    }
  }
  auto s1 = ProcStatus(::getpid());
  for (auto& [p, len] : maps) ::munmap(p, len);
  int64_t rounded = (s0.ok() && s1.ok()) ? Field(*s1, "RssAnon") - Field(*s0, "RssAnon") : 0;

  auto row = [&](const std::string& metric, int64_t v, const std::string& op,
                 const std::string& note) {
    Row x;
    x.figure = "P7";
    x.metric = metric;
    x.value = MiB(v);
    x.baseline = MiB(static_cast<int64_t>(requested));
    x.unit = "MiB";
    x.goal_op = op;
    x.goal = 1.01;
    x.note = note;
    r->Add(std::move(x));
  };
  row("cxlpool pinned: RssShmem delta / requested", rss_shmem, "le",
      mix + "; " + std::to_string(st.large_leases) + " exact leases + " + std::to_string(st.slabs) +
          " slab leases for " + std::to_string(st.small_blocks) +
          " small blocks; the leases' resident pages as the bench maps them");
  row("cxlpool pinned: node Shmem delta / requested", shmem, "",
      "node-wide: moves with every other process's shared memory on the node");
  row("cxlpool pinned: leased bytes / requested", static_cast<int64_t>(st.leased_bytes), "",
      "HostArena's leases, daemon page rounding included");
  if (mapped && s0.ok() && s1.ok()) {
    row("pow2 rounding allocator (PyTorch CachingHostAllocator): committed / requested", rounded,
        "",
        "measured in this run: RssAnon growth of the bench for the same requests rounded up "
        "to powers of two and populated");
  } else {
    r->Skip("P7", "pow2 rounding allocator committed", "mmap of the rounded sizes failed");
  }
  row("pow2 rounding allocator: arithmetic / requested", static_cast<int64_t>(pow2), "",
      "sum of the rounded sizes");
}

}  // namespace cxlpool::bench
