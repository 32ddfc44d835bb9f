// Config: the embedded default parses; percent/bytes capacity; per-node
// overrides; unknown keys and bad values are errors that name the key.
#include "config/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "lease/tier_names.h"

namespace cxlpool {
namespace {

TEST(ConfigTest, EmbeddedDefaultParsesAndMatchesShippedFile) {
  auto cfg = ParseConfig(DefaultConfigText(), "<default>");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(cfg->pool_defaults.capacity.is_percent);
  EXPECT_DOUBLE_EQ(cfg->pool_defaults.capacity.percent, 90.0);
  EXPECT_TRUE(cfg->pool_defaults.pin);
  EXPECT_FALSE(cfg->pool_defaults.reserve_low.is_percent);
  EXPECT_EQ(cfg->pool_defaults.reserve_low.bytes, 256ull << 20);
  EXPECT_EQ(cfg->pool_defaults.reserve_high.bytes, 512ull << 20);
  EXPECT_EQ(cfg->socket_mode, 0660u);
  EXPECT_EQ(cfg->workers, 2u);
  EXPECT_EQ(cfg->stock_workers, 2u);
  EXPECT_EQ(cfg->stock_nice, 10);
  EXPECT_TRUE(cfg->stock_idle);
  EXPECT_EQ(cfg->memory_watch_interval, std::chrono::seconds(10));
  // The shipped daemon/cxlpoold.toml is exactly what is compiled in.
  const char* src = std::getenv("CXLPOOL_SOURCE_DIR");
  if (src != nullptr) {
    std::ifstream in(std::string(src) + "/daemon/cxlpoold.toml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, std::string(DefaultConfigText()));
  }
}

TEST(ConfigTest, EmptyTextGivesDefaults) {
  auto cfg = ParseConfig("", "<empty>");
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(cfg->node_pools.empty());
  EXPECT_TRUE(cfg->quotas.empty());
}

TEST(ConfigTest, CapacityPercentAndBytesAreBoundedByTheNode) {
  auto c = ParseCapacity("50%", "k");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->Resolve(1000), 500u);
  auto b = ParseCapacity("64G", "k");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->Resolve(128ull << 30), 64ull << 30);
  EXPECT_EQ(b->Resolve(16ull << 30), 16ull << 30);  // never more than the node has
  EXPECT_FALSE(ParseCapacity("0%", "k").ok());
  EXPECT_FALSE(ParseCapacity("101%", "k").ok());
  EXPECT_FALSE(ParseCapacity("lots", "k").ok());
}

TEST(ConfigTest, NodeOverridesStartFromDefaults) {
  auto cfg = ParseConfig(R"(
[pools]
capacity = "80%"
pin = false
[pools.node.1]
capacity = "32G"
[pools.node.2]
enabled = false
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->ForNode(0).capacity.Resolve(100), 80u);
  EXPECT_EQ(cfg->ForNode(1).capacity.Resolve(1ull << 40), 32ull << 30);
  EXPECT_FALSE(cfg->ForNode(1).pin);  // inherited
  EXPECT_FALSE(cfg->ForNode(2).enabled);
  EXPECT_TRUE(cfg->ForNode(0).enabled);
  // Only a node's own `enabled` counts as explicit (memory of unknown kind
  // is pooled only then).
  EXPECT_TRUE(cfg->ForNode(2).enabled_explicitly);
  EXPECT_FALSE(cfg->ForNode(1).enabled_explicitly);
  EXPECT_FALSE(cfg->ForNode(0).enabled_explicitly);
}

TEST(ConfigTest, LongTermPinPolicyPerNode) {
  auto cfg = ParseConfig(R"(
[pools.node.1]
long_term_pins = "allow"
enabled = true
[pools.node.2]
long_term_pins = "refuse"
[pools.node.3]
long_term_pins = "auto"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->ForNode(0).long_term_pins, LongTermPinPolicy::kAuto);
  EXPECT_EQ(cfg->ForNode(1).long_term_pins, LongTermPinPolicy::kAllow);
  EXPECT_TRUE(cfg->ForNode(1).enabled_explicitly);
  EXPECT_EQ(cfg->ForNode(2).long_term_pins, LongTermPinPolicy::kRefuse);
  EXPECT_EQ(cfg->ForNode(3).long_term_pins, LongTermPinPolicy::kAuto);
  EXPECT_STREQ(LongTermPinPolicyName(LongTermPinPolicy::kAllow), "allow");
}

TEST(ConfigTest, QuotasAndDevdax) {
  auto cfg = ParseConfig(R"(
[[quota]]
uid = 1000
tier = "cxl"
max_bytes = "8G"
max_leases = 4
[[quota]]
group = "root"
max_bytes = 1073741824
[[devdax]]
region = "dax_region0"
align = "2M"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->quotas.size(), 2u);
  EXPECT_EQ(cfg->quotas[0].scope, QuotaScope::kUid);
  EXPECT_EQ(cfg->quotas[0].id, 1000u);
  EXPECT_EQ(cfg->quotas[0].max_bytes, 8ull << 30);
  EXPECT_EQ(cfg->quotas[1].scope, QuotaScope::kGid);
  EXPECT_EQ(cfg->quotas[1].id, 0u);
  ASSERT_EQ(cfg->devdax.size(), 1u);
  EXPECT_EQ(*cfg->devdax[0].align, 2u << 20);
}

void ExpectError(const std::string& text, const std::string& key) {
  auto cfg = ParseConfig(text, "t.toml");
  ASSERT_FALSE(cfg.ok()) << text;
  EXPECT_EQ(cfg.status().code(), Code::kInvalidArgument);
  EXPECT_NE(cfg.status().message().find(key), std::string::npos)
      << "message '" << cfg.status().message() << "' does not name " << key;
}

TEST(ConfigTest, MaxExtentIsBytesInWholeHugePages) {
  auto none = ParseConfig("", "<empty>");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->max_extent_bytes, 0u);  // one memfd per lease
  auto cut = ParseConfig("[daemon]\nmax_extent = \"64M\"\n", "<t>");
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->max_extent_bytes, 64ull << 20);
}

TEST(ConfigTest, ReserveWatermarksAreBytesOrPercentAndZeroIsNone) {
  auto none = ParseConfig("", "<empty>");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->pool_defaults.reserve_high.Resolve(1ull << 30), 0u);
  auto cfg = ParseConfig(R"(
[pools]
reserve_low = "1%"
reserve_high = "2%"
[pools.node.1]
reserve_low = 0
reserve_high = "64M"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(cfg->ForNode(0).reserve_low.is_percent);
  EXPECT_EQ(cfg->ForNode(0).reserve_high.Resolve(1000), 20u);
  EXPECT_EQ(cfg->ForNode(1).reserve_low.Resolve(1ull << 30), 0u);
  EXPECT_EQ(cfg->ForNode(1).reserve_high.Resolve(1ull << 30), 64ull << 20);
  ExpectError("[pools]\nreserve_low = \"1G\"\nreserve_high = \"512M\"\n",
              "pools.reserve_low: must not exceed reserve_high");
  ExpectError("[pools]\nreserve_high = \"lots\"\n", "pools.reserve_high");
}

TEST(ConfigTest, BadKeysAndValuesNameTheKey) {
  ExpectError("[pools]\ncapacty = \"50%\"\n", "pools.capacty: unknown key");
  ExpectError("[daemon]\nworkers = 0\n", "daemon.workers");
  ExpectError("[daemon]\nworkers = \"two\"\n", "daemon.workers");
  ExpectError("[daemon]\nstock_workers = 0\n", "daemon.stock_workers");
  ExpectError("[daemon]\nstock_nice = 20\n", "daemon.stock_nice");
  ExpectError("[daemon]\nstock_nice = -1\n", "daemon.stock_nice");
  ExpectError("[daemon]\nstock_idle = 1\n", "daemon.stock_idle");
  ExpectError("[daemon]\ninline_max = \"1G\"\n", "daemon.inline_max");
  ExpectError("[daemon]\ninline_max = \"lots\"\n", "daemon.inline_max");
  ExpectError("[daemon]\nmax_extent = \"3M\"\n", "daemon.max_extent");
  ExpectError("[daemon]\nlog_level = \"loud\"\n", "daemon.log_level");
  ExpectError("[daemon]\nsocket = \"relative.sock\"\n", "daemon.socket");
  ExpectError("[daemon]\nsocket_mode = \"999\"\n", "daemon.socket_mode");
  ExpectError("[daemon]\nadmin_group = \"no-such-group-xyz\"\n", "daemon.admin_group");
  ExpectError("[pools]\ncapacity = \"150%\"\n", "pools.capacity");
  ExpectError("[pools.node.x]\ncapacity = \"1G\"\n", "pools.node.x");
  ExpectError("[pools.node.1]\nbogus = 1\n", "pools.node.1.bogus");
  ExpectError("[pools.node.1]\nlong_term_pins = \"maybe\"\n", "pools.node.1.long_term_pins");
  ExpectError("[pools.node.1]\nlong_term_pins = true\n", "pools.node.1.long_term_pins");
  ExpectError("[pools]\nlong_term_pins = \"allow\"\n", "pools.long_term_pins: unknown key");
  ExpectError("[[quota]]\nuid = 1\ngid = 2\n", "quota[0]");
  ExpectError("[[quota]]\nuser = \"no-such-user-xyz\"\n", "quota[0].user");
  ExpectError("[[quota]]\nuid = 1\ntier = \"fast\"\n", "quota[0].tier");
  ExpectError("[[devdax]]\nalign = \"2M\"\n", "devdax[0].region");
  ExpectError("[[devdax]]\nregion = \"r\"\nalign = \"3M\"\n", "devdax[0].align");
  ExpectError("[nonsense]\n", "nonsense: unknown key");
  ExpectError("[pools\n", "t.toml:1");  // TOML syntax error: position
}

// warm_stock (per-size classes) was replaced by the byte reserve: a config
// that still has it, even empty, is refused at load, naming the file, the
// table, the key and what to set instead.
TEST(ConfigTest, RemovedWarmStockIsRefusedNamingTheReplacement) {
  const std::string want =
      "warm_stock: removed; set reserve_low and reserve_high (bytes or a percentage) instead";
  for (const char* text :
       {"[pools]\nwarm_stock = [{ size = \"2M\", count = 2 }]\n", "[pools]\nwarm_stock = []\n"}) {
    auto cfg = ParseConfig(text, "/etc/cxlpool/cxlpoold.toml");
    ASSERT_FALSE(cfg.ok()) << text;
    EXPECT_EQ(cfg.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(cfg.status().message(), "/etc/cxlpool/cxlpoold.toml: pools." + want);
  }
  auto node = ParseConfig("[pools.node.1]\ncapacity = \"1G\"\nwarm_stock = []\n", "t.toml");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().message(), "t.toml: pools.node.1." + want);
  // The same through a file.
  const std::string path = ::testing::TempDir() + "/warm-stock.toml";
  {
    std::ofstream f(path);
    f << "[pools]\nreserve_low = \"64M\"\nreserve_high = \"128M\"\n"
      << "warm_stock = [{ size = \"64M\", count = 1 }]\n";
  }
  auto loaded = LoadConfigFile(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message(), path + ": pools." + want);
  std::remove(path.c_str());
  // Its replacement loads.
  auto reserve = ParseConfig("[pools]\nreserve_low = \"5%\"\nreserve_high = \"10%\"\n", "t.toml");
  ASSERT_TRUE(reserve.ok()) << reserve.status().ToString();
  EXPECT_TRUE(reserve->pool_defaults.reserve_high.is_percent);
}

TEST(ConfigTest, MemoryWatchInterval) {
  auto dflt = ParseConfig("", "<empty>");
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ(dflt->memory_watch_interval, std::chrono::seconds(10)) << "default without the key";
  struct Case {
    const char* value;
    std::chrono::milliseconds want;
  } cases[] = {
      {"\"10s\"", std::chrono::seconds(10)},   {"\"500ms\"", std::chrono::milliseconds(500)},
      {"\"2m\"", std::chrono::minutes(2)},     {"\"1h\"", std::chrono::hours(1)},
      {"\"30\"", std::chrono::seconds(30)},    {"5", std::chrono::seconds(5)},
      {"\"0\"", std::chrono::milliseconds(0)}, {"0", std::chrono::milliseconds(0)}};
  for (const auto& c : cases) {
    auto cfg = ParseConfig(std::string("[daemon]\nmemory_watch_interval = ") + c.value + "\n");
    ASSERT_TRUE(cfg.ok()) << c.value << ": " << cfg.status().ToString();
    EXPECT_EQ(cfg->memory_watch_interval, c.want) << c.value;
  }
  for (const char* bad :
       {"\"soon\"", "\"10x\"", "\"-1s\"", "-3", "\"25h\"", "\"50ms\"", "\"\"", "true", "1.5"}) {
    auto cfg = ParseConfig(std::string("[daemon]\nmemory_watch_interval = ") + bad + "\n");
    ASSERT_FALSE(cfg.ok()) << bad;
    EXPECT_EQ(cfg.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(cfg.status().message().find("daemon.memory_watch_interval"), std::string::npos)
        << bad << ": " << cfg.status().message();
  }
  auto msg = ParseConfig("[daemon]\nmemory_watch_interval = \"soon\"\n", "t.toml");
  EXPECT_EQ(msg.status().message(),
            "t.toml: daemon.memory_watch_interval: bad duration 'soon' (want e.g. \"10s\", "
            "\"500ms\", \"2m\" or \"0\"; at most 24h)");
}

TEST(ConfigTest, StrictValues) {
  // A capacity of nothing is refused, as bytes or as an integer.
  ExpectError("[pools]\ncapacity = \"0\"\n", "pools.capacity");
  ExpectError("[pools]\ncapacity = 0\n", "pools.capacity");
  ExpectError("[pools]\ncapacity = \"100\"\n", "pools.capacity");
  ExpectError("[pools.node.1]\ncapacity = \"0\"\n", "pools.node.1.capacity");
  ExpectError("[pools]\ncapacity = \"-1\"\n", "pools.capacity");
  ExpectError("[pools]\ncapacity = \"18446744073709551616\"\n", "pools.capacity");
  ExpectError("[pools]\ncapacity = -5\n", "pools.capacity");
  EXPECT_TRUE(ParseConfig("[pools]\ncapacity = \"4K\"\n").ok());
  ExpectError("[[quota]]\nuid = 1\nmax_bytes = \"-1\"\n", "quota[0].max_bytes");
  ExpectError("[[quota]]\nuid = 1\nmax_bytes = -1\n", "quota[0].max_bytes");
  ExpectError("[[quota]]\nuid = 1\nmax_leases = -1\n", "quota[0].max_leases");
  ExpectError("[[quota]]\nuid = -1\n", "quota[0].uid");
  ExpectError("[daemon]\ngrace_period = 3601\n", "daemon.grace_period");
  // A mode the daemon itself could not use is refused; a world-writable one
  // is accepted with a warning that names the key.
  ExpectError("[daemon]\nsocket_mode = \"0066\"\n", "daemon.socket_mode");
  ExpectError("[daemon]\nsocket_mode = \"-1\"\n", "daemon.socket_mode");
  auto world = ParseConfig("[daemon]\nsocket_mode = \"0777\"\n");
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  ASSERT_EQ(world->warnings.size(), 1u);
  EXPECT_NE(world->warnings[0].find("daemon.socket_mode '0777' is world-writable"),
            std::string::npos)
      << world->warnings[0];
  auto group = ParseConfig("[daemon]\nsocket_mode = \"0660\"\n");
  ASSERT_TRUE(group.ok());
  EXPECT_TRUE(group->warnings.empty());
}

TEST(ConfigTest, Limits) {
  auto dflt = ParseConfig(DefaultConfigText(), "<default>");
  ASSERT_TRUE(dflt.ok());
  // The shipped file leaves the fd-derived limits unset.
  EXPECT_FALSE(dflt->limits.max_connections.has_value());
  EXPECT_FALSE(dflt->limits.max_fds.has_value());
  EXPECT_EQ(dflt->limits.max_requests_per_uid, 256u);
  EXPECT_EQ(dflt->limits.max_queued_bytes, 64ull << 20);
  EXPECT_EQ(dflt->limits.idle_timeout, std::chrono::minutes(10));
  EXPECT_EQ(dflt->limits.max_busy_per_uid, std::chrono::milliseconds(250));
  auto cfg = ParseConfig(R"(
[limits]
max_connections = 100
max_connections_per_uid = 10
reserved_connections = 0
max_queued_bytes_per_connection = "2M"
max_fds_per_frame = 0
idle_timeout = "0"
send_timeout = 5
frame_timeout = "250ms"
max_busy_per_uid = "0"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->limits.max_connections, 100u);
  EXPECT_EQ(cfg->limits.max_connections_per_uid, 10u);
  EXPECT_EQ(cfg->limits.reserved_connections, 0u);
  EXPECT_EQ(cfg->limits.max_queued_bytes_per_connection, 2u << 20);
  EXPECT_EQ(cfg->limits.max_fds_per_frame, 0u);
  EXPECT_EQ(cfg->limits.idle_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(cfg->limits.send_timeout, std::chrono::seconds(5));
  EXPECT_EQ(cfg->limits.frame_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(cfg->limits.max_busy_per_uid, std::chrono::milliseconds(0));
  ExpectError("[limits]\nmax_connections = 0\n", "limits.max_connections");
  ExpectError("[limits]\nmax_connections = -1\n", "limits.max_connections");
  ExpectError("[limits]\nmax_connections = \"many\"\n", "limits.max_connections");
  ExpectError("[limits]\nmax_connections = 99999999999\n", "limits.max_connections");
  ExpectError("[limits]\nmax_fds_per_frame = 254\n", "limits.max_fds_per_frame");
  ExpectError("[limits]\nmax_queued_bytes = \"-1\"\n", "limits.max_queued_bytes");
  ExpectError("[limits]\nmax_queued_bytes = \"1K\"\n", "limits.max_queued_bytes");
  ExpectError("[limits]\nmax_queued_bytes = \"18446744073709551616\"\n", "limits.max_queued_bytes");
  ExpectError("[limits]\nmax_request_bytes = 100\n", "limits.max_request_bytes");
  ExpectError("[limits]\nhello_timeout = \"0\"\n", "limits.hello_timeout");
  ExpectError("[limits]\nframe_timeout = \"5ms\"\n", "limits.frame_timeout");
  ExpectError("[limits]\nidle_timeout = \"-1s\"\n", "limits.idle_timeout");
  ExpectError("[limits]\nidle_timeout = -1\n", "limits.idle_timeout");
  ExpectError("[limits]\nsend_timeout = \"25h\"\n", "limits.send_timeout");
  ExpectError("[limits]\nmax_busy_per_uid = \"5ms\"\n", "limits.max_busy_per_uid");
  ExpectError("[limits]\nmax_busy_per_uid = \"65s\"\n", "limits.max_busy_per_uid");
  ExpectError("[limits]\nmax_connection = 5\n", "limits.max_connection: unknown key");
  ExpectError("limits = 5\n", "limits");
}

TEST(ConfigTest, DirectoryIsNotAConfig) {
  auto cfg = LoadConfigFile("/tmp");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), Code::kInvalidArgument);
  EXPECT_NE(cfg.status().message().find("is a directory"), std::string::npos)
      << cfg.status().message();
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto cfg = LoadConfigFile("/nonexistent/cxlpoold.toml");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), Code::kNotFound);
}

TEST(ConfigTest, DefaultSocketPath) {
  EXPECT_EQ(DefaultSocketPath(0, "/run/user/0"), "/run/cxlpool/cxlpool.sock");
  EXPECT_EQ(DefaultSocketPath(1000, "/run/user/1000"), "/run/user/1000/cxlpool.sock");
  EXPECT_EQ(DefaultSocketPath(1000, nullptr), "/tmp/cxlpool-1000.sock");
  EXPECT_EQ(DefaultSocketPath(1000, ""), "/tmp/cxlpool-1000.sock");
}

// Every duration key takes the same forms with the same limits: an integer
// of seconds or a string with a unit, 0..24h.
TEST(ConfigTest, DurationsAreReadAlikeInEveryTable) {
  for (const char* table : {"tiering", "limits", "daemon"}) {
    std::string key = std::string(table) == "tiering"  ? "min_residency"
                      : std::string(table) == "limits" ? "idle_timeout"
                                                       : "memory_watch_interval";
    // Built with += : GCC 12's -O3 -Wrestrict misfires on "[" + string + ...
    auto text = [&](const std::string& value) {
      std::string t;
      t += '[';
      t += table;
      t += "]\n";
      t += key;
      t += " = ";
      t += value;
      t += '\n';
      return t;
    };
    std::string where = table;
    where += '.';
    where += key;
    for (const auto& [value, want] : std::vector<std::pair<std::string, int64_t>>{
             {"2", 2000}, {"\"2s\"", 2000}, {"\"500ms\"", 500}, {"\"1h\"", 3600000}}) {
      auto cfg = ParseConfig(text(value));
      ASSERT_TRUE(cfg.ok()) << table << "." << key << " = " << value << ": "
                            << cfg.status().ToString();
      std::chrono::milliseconds got = std::string(table) == "tiering"  ? cfg->tiering.min_residency
                                      : std::string(table) == "limits" ? *cfg->limits.idle_timeout
                                                                       : cfg->memory_watch_interval;
      EXPECT_EQ(got.count(), want) << table << "." << key << " = " << value;
    }
    for (const char* bad : {"\"25h\"", "-1", "\"soon\"", "true"}) {
      ExpectError(text(bad), where);
    }
  }
}

TEST(ConfigTest, OneTableOfTierNames) {
  for (const char* t : {"dram", "cxl", "hbm", "nvm", "unknown", "devdax", "shared"}) {
    EXPECT_TRUE(IsTierName(t)) << t;
  }
  EXPECT_FALSE(IsTierName("gpu"));  // GPU memory is never pooled
  EXPECT_FALSE(IsTierName(""));
  EXPECT_EQ(TierNamesHint(), "dram, cxl, hbm, nvm, devdax, shared");
  auto cfg = ParseConfig("[[quota]]\nuid = 1\ntier = \"gpu\"\nmax_bytes = 1\n", "t.toml");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().message(),
            "t.toml: quota[0].tier: unknown tier 'gpu' (dram, cxl, hbm, nvm, devdax, shared)");
}

// [cluster]: nothing without endpoints; every bad value named by its key.
TEST(ConfigTest, ClusterTable) {
  auto none = ParseConfig("", "<empty>");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->cluster.enabled());

  auto cfg = ParseConfig(R"(
[cluster]
endpoints = ["10.0.0.1:2379", "etcd2:2379"]
host = "node07"
session_ttl = "5s"
publish_interval = "500ms"
ca = "/etc/cxlpool/ca.pem"
cert = "/etc/cxlpool/node.pem"
key = "/etc/cxlpool/node.key"
[[cluster.shared]]
path = "/dev/dax3.0"
id = "rack1-mhd0"
slice_size = "2G"
claim_ahead = 3
idle_release = "5m"
)",
                         "<cluster>");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const ClusterOptions& c = cfg->cluster;
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.endpoints.size(), 2u);
  EXPECT_EQ(c.host, "node07");
  EXPECT_EQ(c.session_ttl, std::chrono::seconds(5));
  EXPECT_EQ(c.publish_interval, std::chrono::milliseconds(500));
  ASSERT_EQ(c.shared.size(), 1u);
  EXPECT_EQ(c.shared[0].slice_bytes, 2ull << 30);
  EXPECT_EQ(c.shared[0].claim_ahead, 3u);
  EXPECT_EQ(c.shared[0].idle_release, std::chrono::minutes(5));

  struct Bad {
    const char* toml;
    const char* key;
  } bad[] = {
      {"[cluster]\nendpoints = [\"http://e:2379\"]", "cluster.endpoints"},
      {"[cluster]\nendpoints = \"e:2379\"", "cluster.endpoints"},
      {"[cluster]\nendpoints = [\"e:2379\"]\nhost = \"a b\"", "cluster.host"},
      {"[cluster]\nendpoints = [\"e:2379\"]\nsession_ttl = \"1s\"", "cluster.session_ttl"},
      {"[cluster]\nendpoints = [\"e:2379\"]\ncert = \"/c\"", "cluster.cert"},
      {"[cluster]\nendpoints = [\"e:2379\"]\n[[cluster.shared]]\nid = \"x\"",
       "cluster.shared[0].path"},
      {"[cluster]\nendpoints = [\"e:2379\"]\n[[cluster.shared]]\npath = \"/dev/dax0.0\"\n"
       "slice_size = \"3M\"",
       "cluster.shared[0].slice_size"},
      {"[cluster]\n[[cluster.shared]]\npath = \"/dev/dax0.0\"", "cluster.endpoints"},
      {"[cluster]\nendpoints = [\"e:2379\"]\nttl = 3", "cluster.ttl"},
  };
  for (const auto& b : bad) {
    auto r = ParseConfig(b.toml, "<bad>");
    ASSERT_FALSE(r.ok()) << b.toml;
    EXPECT_NE(r.status().message().find(b.key), std::string::npos)
        << b.toml << " -> " << r.status().message();
  }
}

}  // namespace
}  // namespace cxlpool
