// EtcdCluster: a real etcd cluster on loopback for the cluster-layer tests
// (issue 39). Start() makes a throwaway CA and certificates with the openssl
// CLI, picks free loopback ports, forks and execs one `etcd` per member
// (etcd-server 3.4) and waits until every member is healthy and agrees on a
// leader. Members can then be killed, stopped, continued and restarted on
// their kept data dirs and ports; etcdctl runs through Ctl() with the
// cluster's TLS files.
//
// Layout of dir() (a fresh mkdtemp "cxlpool-etcd-XXXXXX" under the parent):
//   certs/ca.{crt,key}, certs/member<i>.{crt,key}, certs/client.{crt,key}
//   member<i>/data      the member's --data-dir (kept across RestartMember)
//   member<i>/etcd.log  the member's stdout and stderr, appended on restart
// The destructor SIGKILLs and reaps every member and removes dir(), unless
// CXLPOOL_KEEP_ETCD=1 (then it says on stderr where dir() is).
//
// Every certificate is EC prime256v1, CN "cxlpool-test", signed by the CA;
// the member certificates and the client one all carry subjectAltName
// IP:127.0.0.1 and DNS:localhost (and the extra IPs of the options) and are good for serverAuth and
// clientAuth.
//
// The members are started with PR_SET_PDEATHSIG=SIGKILL: they die with the
// thread that started them (keep one EtcdCluster on the test's main thread).
//
// Thread safety: none; one owner (the test's main thread).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool::testsupport {

struct EtcdClusterOptions {
  int members = 3;
  // https with client and peer certificate auth; false: plain http, no TLS flags.
  bool tls = true;
  // Where the cluster's mkdtemp dir goes; empty: $TMPDIR, else /tmp.
  std::string dir_parent;
  // Bound on Start()'s wait until the cluster is healthy.
  int start_timeout_ms = 20000;
  // Raft timing (etcd's --heartbeat-interval, --election-timeout), in ms.
  int heartbeat_ms = 100;
  int election_ms = 1000;
  // --pre-vote (off by default in etcd 3.4, on in 3.5): a member that comes
  // back from a partition or a stop does not depose a working leader.
  bool pre_vote = true;
  // More addresses of this machine the members serve clients on besides
  // 127.0.0.1 (each must exist when they start: the host side of a veth to a
  // network namespace); the certificates name them too.
  std::vector<std::string> extra_client_ips;
  // More IP addresses the certificates name, that the members do not listen
  // on: a QEMU guest on user-mode networking dials 10.0.2.2, which QEMU
  // forwards to 127.0.0.1 of this machine.
  std::vector<std::string> extra_cert_ips;
  // The binaries; empty: looked up in $PATH ("etcd", "etcdctl", "openssl").
  std::string etcd_binary;
  std::string etcdctl_binary;
  std::string openssl_binary;
};

// How Ctl() runs etcdctl.
struct EtcdCtlOptions {
  // Endpoints ("127.0.0.1:P"; one with a scheme is passed as it is);
  // empty: every member that runs and is not stopped.
  std::vector<std::string> endpoints;
  // Pass --cacert (tls clusters).
  bool ca = true;
  // Pass --cert/--key: the client certificate (tls clusters).
  bool client_cert = true;
  // etcdctl's --dial-timeout and --command-timeout, in ms; the process is
  // SIGKILLed if it runs past dial + command + 3 s.
  int dial_timeout_ms = 1000;
  int command_timeout_ms = 3000;
};

// What one etcdctl run did.
struct EtcdCtlRun {
  int exit_code = -1;  // -1: killed by a signal (or by the time bound)
  std::string out;
  std::string err;
};

class EtcdCluster {
 public:
  // UNSUPPORTED when etcd, etcdctl or openssl is not found (the message says
  // which; tests skip on it); INVALID_ARGUMENT for bad options; UNAVAILABLE
  // with the tail of every member's log when the cluster is not healthy
  // within start_timeout_ms; IO for the rest.
  static Result<std::unique_ptr<EtcdCluster>> Start(EtcdClusterOptions options = {});

  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  bool tls() const { return options_.tls; }
  // The cluster's dir (see the layout above).
  const std::string& dir() const { return dir_; }

  // Client endpoints, "127.0.0.1:P" without scheme, one per member in member
  // order (killed members included); endpoints_csv() joins them with ','.
  std::vector<std::string> endpoints() const;
  std::string endpoints_csv() const;
  std::string endpoint(int i) const;
  // endpoints() on another client address (one of extra_client_ips).
  std::vector<std::string> endpoints_on(const std::string& ip) const;
  // "https://127.0.0.1:P" (or http:// without TLS).
  std::string client_url(int i) const;
  // The TLS files (empty strings without TLS).
  std::string ca_file() const;
  std::string client_cert_file() const;
  std::string client_key_file() const;

  // The member's pid; -1 after KillMember (until RestartMember).
  pid_t member_pid(int i) const;
  // False after KillMember (until RestartMember); true while stopped.
  bool member_running(int i) const;
  bool member_stopped(int i) const;
  // The member's etcd id (etcd logs it in hex), learned by WaitHealthy and
  // leader_index; 0 until then.
  uint64_t member_id(int i) const;
  std::string member_log_path(int i) const;
  // The last `lines` lines of the member's log.
  std::string MemberLogTail(int i, int lines = 30) const;
  // Every member's log tail, each under a "--- member<i> ---" heading.
  std::string LogTails(int lines = 30) const;

  // The index of the member that the running, not stopped members say is
  // the leader (etcdctl endpoint status -w json, one per member at once; the
  // view most of them hold); -1 when none answers, none knows a leader, or
  // the one they name is not running (just killed: poll until they elect).
  // Each call takes one etcdctl round (~50 ms; 1 s at most).
  int leader_index();

  // SIGKILL and reap; the data dir stays. INVALID_ARGUMENT for a bad index,
  // NOT_FOUND when not running.
  Status KillMember(int i);
  // SIGSTOP the member and wait until it is stopped / SIGCONT it.
  Status StopMember(int i);
  Status ContMember(int i);
  // Starts a killed member again (SIGKILLing it first if it still runs) with
  // --initial-cluster-state existing on its kept data dir and ports, then
  // WaitHealthy(start_timeout_ms).
  Status RestartMember(int i);
  // Polls until every running member (killed ones left out; a stopped one
  // never answers, so stop none while waiting) reports healthy through
  // `etcdctl endpoint health` and they all name the same leader, which is
  // one of them. UNAVAILABLE with the log tails after `timeout_ms`.
  Status WaitHealthy(int timeout_ms = 20000);

  // etcdctl `args` over the cluster's TLS files and endpoints (see
  // EtcdCtlOptions). The run itself; the exit code is not judged.
  Result<EtcdCtlRun> CtlRun(const std::vector<std::string>& args,
                            const EtcdCtlOptions& ctl = {}) const;
  // CtlRun that wants exit code 0: its stdout, else UNAVAILABLE with the
  // command's stderr.
  Result<std::string> Ctl(const std::vector<std::string>& args,
                          const EtcdCtlOptions& ctl = {}) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
    bool stopped = false;
    uint64_t id = 0;
  };

  explicit EtcdCluster(EtcdClusterOptions options);
  Status MakeDir();
  Status MakeCertificates();
  // (Re)makes the member dirs, picks ports and spawns every member.
  Status StartMembers();
  // Whether a member's log says it could not bind its port.
  bool PortTaken() const;
  void KillAll();
  std::string KeepHint() const;
  Status SpawnMember(int i, bool existing);
  Status CheckHealthy(std::string* why);
  std::string MemberDir(int i) const;
  std::string CertsDir() const;
  std::string PeerUrl(int i) const;
  std::string ListenClientUrls(int i) const;
  std::vector<std::string> LiveEndpoints() const;

  EtcdClusterOptions options_;
  std::string dir_;
  std::string token_;
  std::vector<Member> members_;
};

}  // namespace cxlpool::testsupport
