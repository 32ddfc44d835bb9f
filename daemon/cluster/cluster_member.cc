#include "cluster/cluster_member.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "cxlpool/common/log.h"

namespace cxlpool {

using std::chrono::milliseconds;

namespace {

constexpr const char* kInstanceFile = "cluster-instance";

std::string RandomHex() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd() << rd() << rd();
  return os.str();
}

Result<std::string> ReadSmallFile(const std::string& path);

// This boot of this machine (the kernel's random boot id); "" if unknown.
std::string BootId() {
  auto id = ReadSmallFile("/proc/sys/kernel/random/boot_id");
  if (!id.ok()) return "";
  std::string s = *id;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to `path` through a temporary file and a rename.
Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, tmp);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::FromErrno(err, tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno(errno, path);
  return Status::Ok();
}

}  // namespace

bool InsecureRemote(const ClusterOptions& o) {
  if (!o.ca_file.empty()) return false;
  for (const auto& ep : o.endpoints) {
    const std::string host = ep.substr(0, ep.rfind(':'));
    const bool loopback =
        host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1";
    if (!loopback) return true;
  }
  return false;
}

ClusterMember::ClusterMember(Deps deps) : deps_(std::move(deps)) {}

ClusterMember::~ClusterMember() { Stop(); }

std::string ClusterMember::InstanceId() const {
  if (deps_.state_dir.empty()) return RandomHex();
  const std::string path = deps_.state_dir + "/" + kInstanceFile;
  if (auto text = ReadSmallFile(path); text.ok() && !text->empty()) return *text;
  std::string id = RandomHex();
  Status s = WriteAtomically(path, id);
  if (!s.ok()) {
    CXLPOOL_LOG(kWarning) << "cluster: " << s.ToString();
  }
  return id;
}

Result<std::unique_ptr<ClusterMember>> ClusterMember::Start(Deps deps) {
  const ClusterOptions& o = deps.options;
  etcd::ClientOptions eo;
  eo.endpoints = o.endpoints;
  eo.tls = {o.ca_file, o.cert_file, o.key_file};
  auto client = etcd::Client::Connect(eo);
  if (!client.ok()) return client.status();
  std::unique_ptr<ClusterMember> m(new ClusterMember(std::move(deps)));
  m->etcd_ = std::move(client.value());
  m->registry_ = std::make_unique<cluster::SliceRegistry>(m->etcd_.get(),
                                                          cluster::Keys(m->deps_.options.prefix));
  for (const auto& d : m->deps_.options.shared) {
    auto dev = cluster::SharedDevice::Open(d.path, d.id, m->deps_.sysfs_root);
    if (!dev.ok()) return dev.status();
    m->devices_.push_back(std::move(dev.value()));
  }
  if (InsecureRemote(m->deps_.options)) {
    CXLPOOL_LOG(kWarning) << "cluster: etcd is reached off loopback without TLS; set [cluster] "
                             "ca, cert and key";
  }
  {
    MutexLock lock(m->mu_);
    for (const auto& dev : m->devices_) {
      auto it = m->deps_.held.find(dev->path());
      if (it != m->deps_.held.end()) m->used_at_start_[dev->id()] = it->second;
    }
  }
  cluster::SessionOptions so;
  so.host = m->deps_.options.host;
  so.ttl_s = std::max<int64_t>(
      2, std::chrono::duration_cast<std::chrono::seconds>(m->deps_.options.session_ttl).count());
  so.publish_interval = m->deps_.options.publish_interval;
  ClusterMember* self = m.get();
  cluster::Session::Callbacks cb;
  cb.joined = [self](int64_t) {
    MutexLock lock(self->mu_);
    self->dirty_ = true;
    self->wake_.notify_all();
  };
  cb.lost = [self](int64_t, const std::string&) {
    // Fenced at once, on the session thread; the cluster thread catches up.
    MutexLock lock(self->mu_);
    for (auto& [id, s] : self->stocks_) s->Fence();
    self->dirty_ = true;
    self->wake_.notify_all();
  };
  m->session_ = std::make_unique<cluster::Session>(m->etcd_.get(), m->registry_->keys(), so, cb);
  cluster::HostRecord first = m->deps_.describe ? m->deps_.describe() : cluster::HostRecord{};
  m->boot_id_ = BootId();
  first.instance = m->InstanceId();
  first.boot_id = m->boot_id_;
  first.version = m->deps_.version;
  CXLPOOL_RETURN_IF_ERROR(m->session_->Start(first));
  m->watch_ = m->etcd_->WatchPrefix(
      m->registry_->keys().prefix() + "/", 0,
      [self](const std::vector<etcd::WatchEvent>&, int64_t) {
        MutexLock lock(self->mu_);
        self->dirty_ = true;
        self->wake_.notify_all();
      },
      [self]() -> int64_t {
        MutexLock lock(self->mu_);
        self->dirty_ = true;
        self->wake_.notify_all();
        return 0;  // the cluster thread rereads everything; the watch goes on from now
      });
  m->thread_ = std::thread([self] { self->Loop(); });
  return m;
}

void ClusterMember::Loop() {
  auto next_publish = std::chrono::steady_clock::now();
  std::string instance;
  while (true) {
    {
      MutexLock lock(mu_);
      if (!dirty_ && !stopping_) lock.WaitFor(wake_, milliseconds(1000));
      if (stopping_) return;
      dirty_ = false;
    }
    Reconcile();
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_publish && deps_.describe) {
      if (instance.empty()) instance = InstanceId();
      cluster::HostRecord r = deps_.describe();
      r.instance = instance;
      r.boot_id = boot_id_;
      r.version = deps_.version;
      r.published_at = deps_.clock->WallSeconds();
      const ClusterStats st = stats();
      r.shared_fenced = st.shared_fenced;
      {
        MutexLock lock(mu_);
        for (auto& [id, s] : stocks_) {
          for (const auto& d : devices_) {
            if (d->id() != id) continue;
            r.shared_devices.push_back({id, d->path(), d->size(), s->owned(), s->used()});
          }
        }
      }
      session_->Publish(std::move(r));
      next_publish = now + deps_.options.publish_interval;
    }
  }
}

void ClusterMember::Reconcile() {
  const int64_t epoch = session_->epoch();
  if (epoch == 0) {
    MutexLock lock(mu_);  // fenced already by the loss; again, for a stock built since
    for (auto& [id, s] : stocks_) s->Fence();
    return;
  }
  auto view = registry_->Read();
  if (!view.ok()) {
    reconcile_errors_.fetch_add(1);
    return;
  }
  // The stocks, at the first join (each device's slicing lives in etcd).
  for (size_t i = 0; i < devices_.size(); ++i) {
    const auto& dev = devices_[i];
    {
      MutexLock lock(mu_);
      if (stocks_.count(dev->id())) continue;
    }
    const SharedDeviceOptions& o = deps_.options.shared[i];
    auto rec = registry_->EnsureDevice(
        dev->id(),
        cluster::DeviceRecord{dev->data_bytes() / o.slice_bytes * o.slice_bytes, o.slice_bytes});
    if (!rec.ok()) {
      CXLPOOL_LOG(kError) << "cluster: shared device " << dev->path() << ": "
                          << rec.status().ToString();
      reconcile_errors_.fetch_add(1);
      continue;
    }
    // Built and installed under one lock: a ReturnSlice before it edits
    // used_at_start_, one after it reaches the stock.
    MutexLock lock(mu_);
    stocks_[dev->id()] = std::make_unique<cluster::SliceStock>(
        registry_.get(), dev.get(), *rec, deps_.options.host,
        cluster::StockOptions{o.claim_ahead, o.idle_release}, deps_.clock,
        std::move(used_at_start_[dev->id()]), [this] { return session_->certainly_live(); });
    used_at_start_.erase(dev->id());
    dirty_ = true;  // reread: the device record is new
  }
  std::vector<cluster::SliceStock*> stocks;
  {
    MutexLock lock(mu_);
    for (auto& [id, s] : stocks_) stocks.push_back(s.get());
  }
  for (auto* s : stocks) {
    auto step = s->Reconcile(*view, epoch);
    if (!step.ok()) {
      reconcile_errors_.fetch_add(1);
      continue;
    }
    if (deps_.lost) {
      for (uint32_t index : step->lost) {
        for (const auto& d : devices_)
          if (d->id() == s->device_id()) deps_.lost(d->path(), index);
      }
    }
    if (step->claimed || step->released || step->readopted || step->freed_stale || step->dropped) {
      CXLPOOL_LOG(kInfo) << "cluster: " << s->device_id() << ": claimed " << step->claimed
                         << ", released " << step->released << ", re-adopted " << step->readopted
                         << ", freed " << step->freed_stale << ", dropped " << step->dropped;
    }
  }
  MutexLock lock(mu_);
  ++rounds_;
  reconciled_.notify_all();
  view_stats_.hosts = static_cast<uint32_t>(view->hosts.size());
  view_stats_.slices_quarantined =
      static_cast<uint32_t>(view->CountSlices(cluster::SliceState::kQuarantined));
  view_stats_.invalid_records = static_cast<uint32_t>(view->invalid.size());
}

void ClusterMember::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    wake_.notify_all();
    reconciled_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  if (watch_) watch_->Stop();
  std::vector<cluster::SliceStock*> stocks;
  {
    MutexLock lock(mu_);
    for (auto& [id, s] : stocks_) stocks.push_back(s.get());
  }
  // No grant while the unused slices go back.
  for (auto* s : stocks) s->Fence();
  // Unused slices go back before the session ends; used ones stay ours (as
  // an earlier epoch) for the next start to re-adopt.
  const int64_t epoch = session_ ? session_->epoch() : 0;
  if (epoch != 0) {
    for (auto* s : stocks) (void)s->ReleaseUnused(epoch);
  }
  if (session_) session_->Leave();
}

ClusterStats ClusterMember::stats() const {
  ClusterStats st;
  {
    MutexLock lock(mu_);
    st = view_stats_;
    for (const auto& [id, s] : stocks_) {
      st.slices_owned += s->owned();
      st.slices_used += s->used();
    }
  }
  st.live = session_ && session_->live();
  st.epoch = session_ ? session_->epoch() : 0;
  st.joins = session_ ? session_->joins() : 0;
  st.losses = session_ ? session_->losses() : 0;
  st.publishes = session_ ? session_->publishes() : 0;
  st.last_loss = session_ ? session_->last_loss() : "";
  st.shared_fenced = !devices_.empty() && !st.live;
  st.reconcile_errors = reconcile_errors_.load();
  st.insecure_remote = InsecureRemote(deps_.options);
  return st;
}

std::string ClusterMember::DeviceIdOf(const std::string& path) const {
  for (const auto& d : devices_)
    if (d->path() == path) return d->id();
  return "";
}

void ClusterMember::Wake() {
  MutexLock lock(mu_);
  dirty_ = true;
  wake_.notify_all();
}

Result<cluster::SliceGrant> ClusterMember::TakeSlice(const std::string& path, milliseconds wait) {
  const std::string id = DeviceIdOf(path);
  if (id.empty()) return Status(Code::kNotFound, "no shared device " + path + " in [cluster]");
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    cluster::SliceStock* s = stock(id);
    if (s == nullptr) {
      return Status(Code::kUnavailable,
                    "shared device " + id + ": this host has not joined the cluster yet");
    }
    auto g = s->Take();
    if (g.ok() || g.status().code() != Code::kResourceExhausted) {
      if (g.ok()) Wake();  // claim ahead again
      return g;
    }
    // None ready: ask the cluster thread for a round (it claims one) and
    // wait for it, not past the deadline.
    MutexLock lock(mu_);
    dirty_ = true;
    wake_.notify_all();
    const uint64_t round = rounds_;
    while (rounds_ == round && !stopping_) {
      if (lock.WaitUntil(reconciled_, deadline) == std::cv_status::timeout) break;
    }
    if (rounds_ == round || stopping_) {
      return Status(Code::kResourceExhausted,
                    g.status().message() + " within " + std::to_string(wait.count()) +
                        " ms (every slice is owned, quarantined or in use)");
    }
  }
}

void ClusterMember::ReturnSlice(const std::string& path, uint32_t index) {
  const std::string id = DeviceIdOf(path);
  {
    MutexLock lock(mu_);
    auto it = stocks_.find(id);
    if (it == stocks_.end()) {
      auto u = used_at_start_.find(id);
      if (u != used_at_start_.end()) u->second.erase(index);
      return;
    }
    it->second->Return(index);
  }
  Wake();
}

void ClusterMember::ForgetLost(const std::string& path, uint32_t index) {
  if (cluster::SliceStock* s = stock(DeviceIdOf(path))) s->ForgetLost(index);
}

cluster::SliceStock* ClusterMember::stock(const std::string& id) {
  MutexLock lock(mu_);
  auto it = stocks_.find(id);
  return it == stocks_.end() ? nullptr : it->second.get();
}

}  // namespace cxlpool
