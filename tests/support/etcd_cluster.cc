#include "etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "cxlpool/common/unique_fd.h"

extern char** environ;

namespace cxlpool::testsupport {

namespace {

using Clock = std::chrono::steady_clock;

// The openssl config of the throwaway CA: no system openssl.cnf is read.
constexpr const char* kOpensslConfig = R"([req]
distinguished_name = dn
prompt = no
[dn]
CN = cxlpool-test
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[leaf_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1,DNS:localhost@EXTRA_SAN@
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
)";

// `name` in $PATH (or `name` itself when it holds a '/'); empty if none is
// executable.
std::string FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string p = dir + "/" + name;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0) {
      return p;
    }
  }
  return "";
}

// The environment for etcd, etcdctl and openssl: ours without ETCD_* and
// ETCDCTL_* (they would override the flags) and without OPENSSL_CONF.
std::vector<std::string> ChildEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view v(*e);
    if (v.starts_with("ETCD") || v.starts_with("OPENSSL_CONF=")) continue;
    env.emplace_back(v);
  }
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The child's side of a fork: stdin from /dev/null, stdout and stderr onto
// `out_fd` / `err_fd`, killed with the parent's thread, then exec. Only
// async-signal-safe calls.
[[noreturn]] void ExecChild(pid_t parent, int null_fd, int out_fd, int err_fd, char** argv,
                            char** envp) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  ::dup2(null_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  ::execve(argv[0], argv, envp);
  constexpr char kMsg[] = "exec failed\n";
  ssize_t n = ::write(2, kMsg, sizeof(kMsg) - 1);
  (void)n;
  ::_exit(127);
}

struct ProcessRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

void ReadSome(int fd, std::string* into, bool* open) {
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n > 0) {
    into->append(buf, static_cast<size_t>(n));
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    *open = false;
  }
}

// Runs `argv` (argv[0] a path) to its end with stdout and stderr captured;
// SIGKILLs it after `timeout_ms`. IO when it cannot be started.
Result<ProcessRun> RunProcess(std::vector<std::string> argv, int timeout_ms) {
  int out_p[2];
  int err_p[2];
  if (::pipe2(out_p, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe2");
  UniqueFd out_r(out_p[0]), out_w(out_p[1]);
  if (::pipe2(err_p, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe2");
  UniqueFd err_r(err_p[0]), err_w(err_p[1]);
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd) return Status::FromErrno(errno, "open /dev/null");
  std::vector<std::string> env = ChildEnvironment();
  std::vector<char*> cargv = CStrings(argv);
  std::vector<char*> cenv = CStrings(env);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork " + argv[0]);
  if (pid == 0) {
    ExecChild(parent, null_fd.get(), out_w.get(), err_w.get(), cargv.data(), cenv.data());
  }
  out_w.Reset();
  err_w.Reset();
  ProcessRun run;
  bool out_open = true;
  bool err_open = true;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool killed = false;
  while (out_open || err_open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd fds[2] = {{out_open ? out_r.get() : -1, POLLIN, 0},
                     {err_open ? err_r.get() : -1, POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n < 0 && errno != EINTR) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (out_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ReadSome(out_r.get(), &run.out, &out_open);
    }
    if (err_open && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ReadSome(err_r.get(), &run.err, &err_open);
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!killed && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (killed) run.err += "\n(killed after " + std::to_string(timeout_ms) + " ms)";
  return run;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// `n` distinct free TCP ports on 127.0.0.1: every socket stays bound until
// all are picked, so none repeats; they are free again once this returns.
Result<std::vector<int>> FreeLoopbackPorts(int n) {
  std::vector<UniqueFd> socks;
  std::vector<int> ports;
  for (int i = 0; i < n; ++i) {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) return Status::FromErrno(errno, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      return Status::FromErrno(errno, "bind 127.0.0.1:0");
    }
    socklen_t len = sizeof(a);
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return Status::FromErrno(errno, "getsockname");
    }
    ports.push_back(ntohs(a.sin_port));
    socks.push_back(std::move(s));
  }
  return ports;
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (!f) return Status(Code::kIo, "cannot write " + path);
  return Status::Ok();
}

std::string StripScheme(const std::string& url) {
  auto p = url.find("://");
  return p == std::string::npos ? url : url.substr(p + 3);
}

// One member's answer in `etcdctl endpoint status -w json`.
struct EndpointStatus {
  std::string endpoint;  // without scheme
  uint64_t member_id = 0;
  uint64_t leader = 0;
};

// The entries of `endpoint status -w json` output; endpoints that did not
// answer are simply absent (etcdctl names them on stderr).
std::vector<EndpointStatus> ParseEndpointStatus(const std::string& out) {
  std::vector<EndpointStatus> v;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return v;
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("Endpoint") || !e.contains("Status")) continue;
    const auto& st = e["Status"];
    if (!st.is_object() || !st.contains("header") || !st.contains("leader")) continue;
    const auto& h = st["header"];
    if (!h.is_object() || !h.contains("member_id")) continue;
    if (!e["Endpoint"].is_string() || !h["member_id"].is_number_unsigned() ||
        !st["leader"].is_number_unsigned()) {
      continue;
    }
    v.push_back({StripScheme(e["Endpoint"].get<std::string>()), h["member_id"].get<uint64_t>(),
                 st["leader"].get<uint64_t>()});
  }
  return v;
}

// `endpoint status -w json` of each of `eps`, one etcdctl per endpoint, all
// at once (etcdctl asks several endpoints one after the other, each on its
// own timeout). The members that answered; `errors` gets the others' stderr.
std::vector<EndpointStatus> StatusOfEach(const EtcdCluster& c, const std::vector<std::string>& eps,
                                         int timeout_ms, std::string* errors) {
  std::vector<Result<EtcdCtlRun>> runs(eps.size(), Status(Code::kUnavailable, "not run"));
  std::vector<std::thread> threads;
  for (size_t k = 0; k < eps.size(); ++k) {
    threads.emplace_back([&, k] {
      EtcdCtlOptions o;
      o.endpoints = {eps[k]};
      o.dial_timeout_ms = timeout_ms;
      o.command_timeout_ms = timeout_ms;
      runs[k] = c.CtlRun({"endpoint", "status", "-w", "json"}, o);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<EndpointStatus> all;
  for (size_t k = 0; k < eps.size(); ++k) {
    std::vector<EndpointStatus> one;
    if (runs[k].ok()) one = ParseEndpointStatus(runs[k]->out);
    if (one.empty() && errors != nullptr) {
      *errors +=
          eps[k] + ": " + (runs[k].ok() ? Trim(runs[k]->err) : runs[k].status().ToString()) + "\n";
    }
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

// True when something accepts TCP connections on 127.0.0.1:`port` (a
// member that is not up yet would make etcdctl wait out its dial timeout).
bool Listening(int port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

EtcdCluster::EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(EtcdClusterOptions options) {
  if (options.members < 1 || options.members > 9) {
    return Status(Code::kInvalidArgument,
                  "EtcdCluster: members must be 1..9, got " + std::to_string(options.members));
  }
  struct Need {
    std::string* path;
    const char* name;
  } needs[] = {{&options.etcd_binary, "etcd"},
               {&options.etcdctl_binary, "etcdctl"},
               {&options.openssl_binary, "openssl"}};
  for (auto& n : needs) {
    std::string found = FindBinary(n.path->empty() ? n.name : *n.path);
    if (found.empty()) {
      return Status(Code::kUnsupported,
                    std::string("EtcdCluster: no ") + n.name + " binary (" +
                        (n.path->empty() ? "not in $PATH" : *n.path + " is not executable") +
                        "; Debian: etcd-server, etcd-client, openssl)");
    }
    *n.path = found;
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster(std::move(options)));
  CXLPOOL_RETURN_IF_ERROR(c->MakeDir());
  if (c->options_.tls) CXLPOOL_RETURN_IF_ERROR(c->MakeCertificates());
  // A port picked free can be taken before etcd binds it (by anything on
  // the machine that binds or connects): then start over on new ports.
  for (int attempt = 1;; ++attempt) {
    CXLPOOL_RETURN_IF_ERROR(c->StartMembers());
    Status st = c->WaitHealthy(c->options_.start_timeout_ms);
    if (st.ok()) return c;
    if (attempt == 3 || !c->PortTaken()) return st;
    std::fprintf(stderr, "EtcdCluster: a port was taken under etcd; starting again on others\n");
  }
}

Status EtcdCluster::StartMembers() {
  KillAll();
  members_.clear();
  for (int i = 0; i < options_.members; ++i) {
    std::error_code ec;
    std::filesystem::remove_all(MemberDir(i), ec);
    if (::mkdir(MemberDir(i).c_str(), 0700) != 0) {
      return Status::FromErrno(errno, "mkdir " + MemberDir(i));
    }
  }
  auto ports = FreeLoopbackPorts(2 * options_.members);
  if (!ports.ok()) return ports.status();
  for (int i = 0; i < options_.members; ++i) {
    Member m;
    m.name = "member" + std::to_string(i);
    m.client_port = (*ports)[2 * static_cast<size_t>(i)];
    m.peer_port = (*ports)[2 * static_cast<size_t>(i) + 1];
    members_.push_back(m);
  }
  for (int i = 0; i < size(); ++i) CXLPOOL_RETURN_IF_ERROR(SpawnMember(i, false));
  return Status::Ok();
}

bool EtcdCluster::PortTaken() const {
  for (int i = 0; i < size(); ++i) {
    std::ifstream f(member_log_path(i));
    std::stringstream text;
    text << f.rdbuf();
    if (text.str().find("address already in use") != std::string::npos) return true;
  }
  return false;
}

void EtcdCluster::KillAll() {
  for (auto& m : members_) {
    if (m.pid <= 0) continue;
    ::kill(m.pid, SIGKILL);
    while (::waitpid(m.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    m.pid = -1;
    m.stopped = false;
  }
}

EtcdCluster::~EtcdCluster() {
  KillAll();
  if (dir_.empty()) return;
  const char* keep = std::getenv("CXLPOOL_KEEP_ETCD");
  if (keep != nullptr && std::string(keep) == "1") {
    std::fprintf(stderr, "EtcdCluster: kept %s (CXLPOOL_KEEP_ETCD=1)\n", dir_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Status EtcdCluster::MakeDir() {
  std::string parent = options_.dir_parent;
  if (parent.empty()) {
    const char* t = std::getenv("TMPDIR");
    parent = (t != nullptr && *t != '\0') ? t : "/tmp";
  }
  std::string tmpl = parent + "/cxlpool-etcd-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp " + tmpl);
  dir_ = tmpl;
  token_ = "cxlpool-test-" + std::filesystem::path(dir_).filename().string();
  std::vector<std::string> dirs;
  if (options_.tls) dirs.push_back(CertsDir());
  for (const auto& d : dirs) {
    if (::mkdir(d.c_str(), 0700) != 0) return Status::FromErrno(errno, "mkdir " + d);
  }
  return Status::Ok();
}

Status EtcdCluster::MakeCertificates() {
  const std::string d = CertsDir();
  const std::string cnf = d + "/openssl.cnf";
  std::string config = kOpensslConfig;
  std::string san;
  for (const auto& ip : options_.extra_client_ips) san.append(",IP:").append(ip);
  for (const auto& ip : options_.extra_cert_ips) san.append(",IP:").append(ip);
  config.replace(config.find("@EXTRA_SAN@"), 11, san);
  CXLPOOL_RETURN_IF_ERROR(WriteFile(cnf, config));
  const std::string& ossl = options_.openssl_binary;
  auto run = [&](std::vector<std::string> argv) -> Status {
    std::string what = argv.size() > 1 ? argv[1] : "";
    auto r = RunProcess(std::move(argv), 20000);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0) {
      return Status(Code::kIo, "EtcdCluster: openssl " + what + " failed (exit " +
                                   std::to_string(r->exit_code) + "): " + Trim(r->err));
    }
    return Status::Ok();
  };
  auto key = [&](const std::string& base) -> Status {
    return run({ossl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-out", d + "/" + base + ".key"});
  };
  CXLPOOL_RETURN_IF_ERROR(key("ca"));
  CXLPOOL_RETURN_IF_ERROR(
      run({ossl, "req", "-config", cnf, "-x509", "-new", "-key", d + "/ca.key", "-subj",
           "/CN=cxlpool-test-ca", "-days", "7", "-extensions", "ca_ext", "-out", d + "/ca.crt"}));
  std::vector<std::string> leaves{"client"};
  for (int i = 0; i < options_.members; ++i) leaves.push_back("member" + std::to_string(i));
  int serial = 1000;
  for (const auto& base : leaves) {
    const std::string p = d + "/" + base;
    CXLPOOL_RETURN_IF_ERROR(key(base));
    CXLPOOL_RETURN_IF_ERROR(run({ossl, "req", "-config", cnf, "-new", "-key", p + ".key", "-subj",
                                 "/CN=cxlpool-test", "-out", p + ".csr"}));
    CXLPOOL_RETURN_IF_ERROR(
        run({ossl, "x509", "-req", "-in", p + ".csr", "-CA", d + "/ca.crt", "-CAkey", d + "/ca.key",
             "-set_serial", std::to_string(++serial), "-days", "7", "-extfile", cnf, "-extensions",
             "leaf_ext", "-out", p + ".crt"}));
  }
  return Status::Ok();
}

std::string EtcdCluster::CertsDir() const { return dir_ + "/certs"; }
std::string EtcdCluster::MemberDir(int i) const { return dir_ + "/member" + std::to_string(i); }

std::string EtcdCluster::PeerUrl(int i) const {
  return std::string(options_.tls ? "https" : "http") +
         "://127.0.0.1:" + std::to_string(members_[static_cast<size_t>(i)].peer_port);
}

std::string EtcdCluster::endpoint(int i) const {
  if (i < 0 || i >= size()) return "";
  return "127.0.0.1:" + std::to_string(members_[static_cast<size_t>(i)].client_port);
}

std::string EtcdCluster::client_url(int i) const {
  if (i < 0 || i >= size()) return "";
  return std::string(options_.tls ? "https" : "http") + "://" + endpoint(i);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> v;
  for (int i = 0; i < size(); ++i) v.push_back(endpoint(i));
  return v;
}

std::string EtcdCluster::endpoints_csv() const {
  std::string s;
  for (const auto& e : endpoints()) s += (s.empty() ? "" : ",") + e;
  return s;
}

std::string EtcdCluster::ca_file() const { return options_.tls ? CertsDir() + "/ca.crt" : ""; }
std::string EtcdCluster::client_cert_file() const {
  return options_.tls ? CertsDir() + "/client.crt" : "";
}
std::string EtcdCluster::client_key_file() const {
  return options_.tls ? CertsDir() + "/client.key" : "";
}

pid_t EtcdCluster::member_pid(int i) const {
  return i >= 0 && i < size() ? members_[static_cast<size_t>(i)].pid : -1;
}
bool EtcdCluster::member_running(int i) const { return member_pid(i) > 0; }
bool EtcdCluster::member_stopped(int i) const {
  return member_running(i) && members_[static_cast<size_t>(i)].stopped;
}
uint64_t EtcdCluster::member_id(int i) const {
  return i >= 0 && i < size() ? members_[static_cast<size_t>(i)].id : 0;
}
std::string EtcdCluster::member_log_path(int i) const { return MemberDir(i) + "/etcd.log"; }

std::string EtcdCluster::MemberLogTail(int i, int lines) const {
  std::ifstream f(member_log_path(i));
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(f, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string s;
  for (const auto& l : tail) s += l + "\n";
  return s;
}

std::string EtcdCluster::LogTails(int lines) const {
  std::string s;
  for (int i = 0; i < size(); ++i) {
    s += "--- member" + std::to_string(i) + " (" + member_log_path(i) + ") ---\n";
    s += MemberLogTail(i, lines);
  }
  return s;
}

std::string EtcdCluster::ListenClientUrls(int i) const {
  std::string urls = client_url(i);
  const std::string port = std::to_string(members_[static_cast<size_t>(i)].client_port);
  for (const auto& ip : options_.extra_client_ips)
    urls.append(",")
        .append(options_.tls ? "https://" : "http://")
        .append(ip)
        .append(":")
        .append(port);
  return urls;
}

std::vector<std::string> EtcdCluster::endpoints_on(const std::string& ip) const {
  std::vector<std::string> out;
  for (const auto& m : members_)
    out.push_back(std::string(ip).append(":").append(std::to_string(m.client_port)));
  return out;
}

Status EtcdCluster::SpawnMember(int i, bool existing) {
  Member& m = members_[static_cast<size_t>(i)];
  std::string initial;
  for (int k = 0; k < size(); ++k) {
    initial +=
        (initial.empty() ? "" : ",") + members_[static_cast<size_t>(k)].name + "=" + PeerUrl(k);
  }
  std::vector<std::string> argv{
      options_.etcd_binary,
      "--name=" + m.name,
      "--data-dir=" + MemberDir(i) + "/data",
      "--listen-client-urls=" + ListenClientUrls(i),
      "--advertise-client-urls=" + client_url(i),
      "--listen-peer-urls=" + PeerUrl(i),
      "--initial-advertise-peer-urls=" + PeerUrl(i),
      "--initial-cluster=" + initial,
      std::string("--initial-cluster-state=") + (existing ? "existing" : "new"),
      "--initial-cluster-token=" + token_,
      "--heartbeat-interval=" + std::to_string(options_.heartbeat_ms),
      "--election-timeout=" + std::to_string(options_.election_ms),
      std::string("--pre-vote=") + (options_.pre_vote ? "true" : "false"),
      "--logger=zap",
      "--log-outputs=stderr"};
  if (options_.tls) {
    const std::string c = CertsDir() + "/" + m.name;
    for (std::string flag :
         {"--cert-file=" + c + ".crt", "--key-file=" + c + ".key", "--trusted-ca-file=" + ca_file(),
          std::string("--client-cert-auth"), "--peer-cert-file=" + c + ".crt",
          "--peer-key-file=" + c + ".key", "--peer-trusted-ca-file=" + ca_file(),
          std::string("--peer-client-cert-auth")}) {
      argv.push_back(std::move(flag));
    }
  }
  UniqueFd log(::open(member_log_path(i).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log) return Status::FromErrno(errno, "open " + member_log_path(i));
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd) return Status::FromErrno(errno, "open /dev/null");
  std::string banner = "=== cxlpool EtcdCluster: starting " + m.name + " (" +
                       (existing ? "existing" : "new") + ") ===\n";
  if (::write(log.get(), banner.data(), banner.size()) < 0) {
    return Status::FromErrno(errno, "write " + member_log_path(i));
  }
  std::vector<std::string> env = ChildEnvironment();
  std::vector<char*> cargv = CStrings(argv);
  std::vector<char*> cenv = CStrings(env);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork etcd");
  if (pid == 0) ExecChild(parent, null_fd.get(), log.get(), log.get(), cargv.data(), cenv.data());
  m.pid = pid;
  m.stopped = false;
  return Status::Ok();
}

Status EtcdCluster::KillMember(int i) {
  if (i < 0 || i >= size()) {
    return Status(Code::kInvalidArgument, "EtcdCluster: no member " + std::to_string(i));
  }
  Member& m = members_[static_cast<size_t>(i)];
  if (m.pid <= 0) return Status(Code::kNotFound, "EtcdCluster: " + m.name + " is not running");
  if (::kill(m.pid, SIGKILL) != 0) return Status::FromErrno(errno, "kill " + m.name);
  while (::waitpid(m.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  m.pid = -1;
  m.stopped = false;
  return Status::Ok();
}

Status EtcdCluster::StopMember(int i) {
  if (!member_running(i)) {
    return Status(Code::kNotFound, "EtcdCluster: member " + std::to_string(i) + " is not running");
  }
  Member& m = members_[static_cast<size_t>(i)];
  if (::kill(m.pid, SIGSTOP) != 0) return Status::FromErrno(errno, "SIGSTOP " + m.name);
  // The signal is delivered asynchronously: wait until the kernel reports
  // the child stopped (or gone), so that the caller sees it stopped.
  int status = 0;
  pid_t w;
  while ((w = ::waitpid(m.pid, &status, WUNTRACED)) < 0 && errno == EINTR) {
  }
  if (w == m.pid && !WIFSTOPPED(status)) {
    m.pid = -1;
    return Status(Code::kNotFound, "EtcdCluster: " + m.name + " ended instead of stopping");
  }
  m.stopped = true;
  return Status::Ok();
}

Status EtcdCluster::ContMember(int i) {
  if (!member_running(i)) {
    return Status(Code::kNotFound, "EtcdCluster: member " + std::to_string(i) + " is not running");
  }
  Member& m = members_[static_cast<size_t>(i)];
  if (::kill(m.pid, SIGCONT) != 0) return Status::FromErrno(errno, "SIGCONT " + m.name);
  m.stopped = false;
  return Status::Ok();
}

Status EtcdCluster::RestartMember(int i) {
  if (i < 0 || i >= size()) {
    return Status(Code::kInvalidArgument, "EtcdCluster: no member " + std::to_string(i));
  }
  if (member_running(i)) CXLPOOL_RETURN_IF_ERROR(KillMember(i));
  CXLPOOL_RETURN_IF_ERROR(SpawnMember(i, true));
  return WaitHealthy(options_.start_timeout_ms);
}

std::vector<std::string> EtcdCluster::LiveEndpoints() const {
  std::vector<std::string> v;
  for (int i = 0; i < size(); ++i) {
    if (member_running(i) && !member_stopped(i)) v.push_back(endpoint(i));
  }
  return v;
}

Result<EtcdCtlRun> EtcdCluster::CtlRun(const std::vector<std::string>& args,
                                       const EtcdCtlOptions& ctl) const {
  std::vector<std::string> eps = ctl.endpoints.empty() ? LiveEndpoints() : ctl.endpoints;
  std::string csv;
  for (const auto& e : eps) {
    std::string url = e.find("://") == std::string::npos
                          ? std::string(options_.tls ? "https://" : "http://") + e
                          : e;
    csv += (csv.empty() ? "" : ",") + url;
  }
  std::vector<std::string> argv{
      options_.etcdctl_binary, "--endpoints=" + csv,
      "--dial-timeout=" + std::to_string(ctl.dial_timeout_ms) + "ms",
      "--command-timeout=" + std::to_string(ctl.command_timeout_ms) + "ms"};
  if (options_.tls && ctl.ca) argv.push_back("--cacert=" + ca_file());
  if (options_.tls && ctl.client_cert) {
    argv.push_back("--cert=" + client_cert_file());
    argv.push_back("--key=" + client_key_file());
  }
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = RunProcess(std::move(argv), ctl.dial_timeout_ms + ctl.command_timeout_ms + 3000);
  if (!r.ok()) return r.status();
  EtcdCtlRun run;
  run.exit_code = r->exit_code;
  run.out = std::move(r->out);
  run.err = std::move(r->err);
  return run;
}

Result<std::string> EtcdCluster::Ctl(const std::vector<std::string>& args,
                                     const EtcdCtlOptions& ctl) const {
  auto r = CtlRun(args, ctl);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    return Status(Code::kUnavailable,
                  "etcdctl" + cmd + ": exit " + std::to_string(r->exit_code) + ": " + Trim(r->err));
  }
  return std::move(r->out);
}

int EtcdCluster::leader_index() {
  std::vector<std::string> live = LiveEndpoints();
  if (live.empty()) return -1;
  std::map<uint64_t, int> votes;
  for (const auto& st : StatusOfEach(*this, live, 1000, nullptr)) {
    for (int i = 0; i < size(); ++i) {
      if (endpoint(i) == st.endpoint) members_[static_cast<size_t>(i)].id = st.member_id;
    }
    if (st.leader != 0) ++votes[st.leader];
  }
  if (votes.empty()) return -1;
  auto best = std::max_element(votes.begin(), votes.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  for (int i = 0; i < size(); ++i) {
    if (member_running(i) && members_[static_cast<size_t>(i)].id == best->first) return i;
  }
  return -1;
}

// OK when healthy; UNAVAILABLE (try again) with `why`; another code when a
// member has exited by itself (no use waiting).
Status EtcdCluster::CheckHealthy(std::string* why) {
  std::vector<std::string> live;
  for (int i = 0; i < size(); ++i) {
    Member& m = members_[static_cast<size_t>(i)];
    if (m.pid <= 0) continue;
    int status = 0;
    pid_t w = ::waitpid(m.pid, &status, WNOHANG);
    if (w == m.pid) {
      m.pid = -1;
      std::string how = WIFEXITED(status)
                            ? "exited with code " + std::to_string(WEXITSTATUS(status))
                            : "died of signal " + std::to_string(WTERMSIG(status));
      return Status(Code::kInternal, m.name + " " + how);
    }
    if (!Listening(m.client_port)) {
      *why = m.name + " does not listen on " + endpoint(i) + " yet";
      return Status(Code::kUnavailable, *why);
    }
    live.push_back(endpoint(i));
  }
  if (live.empty()) {
    *why = "no member is running";
    return Status(Code::kUnavailable, *why);
  }
  // Status first, on a short timeout: a member accepts connections before
  // it serves them (until it has joined the cluster) and then holds each
  // call; health commits a proposal, so it waits out its whole timeout
  // while there is no leader.
  std::string errors;
  auto statuses = StatusOfEach(*this, live, 500, &errors);
  if (statuses.size() != live.size()) {
    *why = "endpoint status: " + std::to_string(statuses.size()) + " of " +
           std::to_string(live.size()) + " members answered:\n" + errors;
    return Status(Code::kUnavailable, *why);
  }
  std::map<uint64_t, bool> ids;
  for (const auto& st : statuses) {
    ids[st.member_id] = true;
    for (int i = 0; i < size(); ++i) {
      if (endpoint(i) == st.endpoint) members_[static_cast<size_t>(i)].id = st.member_id;
    }
  }
  for (const auto& st : statuses) {
    if (st.leader == 0 || st.leader != statuses[0].leader || !ids.contains(st.leader)) {
      *why = "members do not agree on a running leader";
      return Status(Code::kUnavailable, *why);
    }
  }
  EtcdCtlOptions o;
  o.endpoints = live;
  o.command_timeout_ms = 2000;
  auto h = CtlRun({"endpoint", "health"}, o);
  if (!h.ok()) return h.status();
  if (h->exit_code != 0) {
    *why = "endpoint health: " + Trim(h->out) + " " + Trim(h->err);
    return Status(Code::kUnavailable, *why);
  }
  return Status::Ok();
}

std::string EtcdCluster::KeepHint() const {
  return " (in " + dir_ + ", removed with the cluster unless CXLPOOL_KEEP_ETCD=1)";
}

Status EtcdCluster::WaitHealthy(int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string why = "not checked";
  for (;;) {
    Status st = CheckHealthy(&why);
    if (st.ok()) return st;
    if (st.code() != Code::kUnavailable) {
      return Status(Code::kUnavailable,
                    "EtcdCluster: " + st.message() + KeepHint() + "\n" + LogTails());
    }
    if (Clock::now() >= deadline) break;
    SleepMs(50);
  }
  return Status(Code::kUnavailable, "EtcdCluster: not healthy after " + std::to_string(timeout_ms) +
                                        " ms: " + why + KeepHint() + "\n" + LogTails());
}

}  // namespace cxlpool::testsupport
