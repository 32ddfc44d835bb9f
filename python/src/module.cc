// _cxlpool: the pybind11 binding of libcxlpool's C++ API (cxlpool/client.hpp)
// that the `cxlpool` Python package re-exports.
//
//   Client     a connection to cxlpoold; allocate() / attach() make leases
//   Lease      one mapped lease: buffer protocol (memoryview, NumPy),
//              __dlpack__ / __dlpack_device__ (CPU), context manager
//   LeaseWindow  a byte range of a lease, exported the same two ways
//   LeaseInfo  what the daemon said about a lease
//
// Errors: a failed call raises cxlpool.errors.Error (a subclass per code,
// carrying the daemon's code and message); the C++ side throws CallError,
// which the translator below turns into that exception. Nothing else is
// thrown across the module's boundary.
//
// Lifetime: every export of a lease's memory (a memoryview, a NumPy array, a
// DLPack consumer such as a torch tensor) holds a reference to the Lease
// object and is counted. release() refuses (BufferError) while exports are
// alive; leaving a `with` block with live exports defers the release to the
// moment the last one is gone. A Lease that is garbage collected releases
// itself.
//
// Thread safety: Python objects are used under the GIL. Calls that talk to
// the daemon (connect, allocate, attach, release) drop the GIL while they
// wait; the C++ Lease is moved out of its Python object under the GIL first,
// so two threads never use one cxlpool::Lease at once. DLPack deleters may
// run on any thread: they take the GIL.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/client.hpp"
#include "dlpack.h"

namespace py = pybind11;

namespace cxlpool::py_binding {
namespace {

namespace dl = cxlpool::pydlpack;

// A failed call, raised in Python as cxlpool.errors.Error(code, message).
struct CallError {
  int code;  // cxlpool::ErrorCode, positive
  std::string message;
};

[[noreturn]] void Throw(const ClientStatus& s) {
  throw CallError{static_cast<int>(s.code()), s.message()};
}
[[noreturn]] void ThrowInvalid(const std::string& message) {
  throw CallError{static_cast<int>(ErrorCode::kInvalidArgument), message};
}

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

class PyLease;

// A Lease, as the Python object holds it. The Python wrapper object is kept
// alive by every export (PyObject references), so `this` outlives them.
class PyLease {
 public:
  explicit PyLease(Lease lease) : lease_(std::move(lease)) {
    if (lease_.valid()) info_ = lease_.info();
  }
  ~PyLease() {
    // Garbage collected: no exports can be alive (they hold references).
    if (lease_.valid()) {
      Lease l = std::move(lease_);
      py::gil_scoped_release nogil;
      (void)l.Release();
    }
  }

  bool valid() const { return lease_.valid(); }
  void RequireValid() const {
    if (!lease_.valid()) ThrowInvalid("the lease was released");
  }
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(lease_.data()); }
  uint64_t size() const { return lease_.size(); }
  const LeaseInfo& info() const { return info_; }
  int numa_node() const { return lease_.valid() ? lease_.numa_node() : info_.numa_node; }
  uint64_t id() const { return info_.id; }
  bool revoked() const { return lease_.valid() && lease_.revoked(); }
  int exports() const { return exports_; }
  bool release_pending() const { return release_pending_; }

  uint64_t DevicePtr() const {
    RequireValid();
    ClientResult<uint64_t> d = lease_.device_ptr();
    if (!d.ok()) Throw(d.status());
    return *d;
  }
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> DeviceChunks() const {
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
    for (const DeviceChunk& c : lease_.device_chunks()) {
      out.emplace_back(c.device_ptr, c.offset, c.length);
    }
    return out;
  }
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> Extents() const {
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
    for (const LeaseExtent& e : lease_.extents()) out.emplace_back(e.offset, e.length, e.page_size);
    return out;
  }
  void CudaRegister(int device) {
    RequireValid();
    ClientStatus s;
    {
      py::gil_scoped_release nogil;
      s = lease_.CudaRegister(device);
    }
    if (!s.ok()) Throw(s);
  }
  void CudaUnregister() {
    RequireValid();
    ClientStatus s = lease_.CudaUnregister();
    if (!s.ok()) Throw(s);
  }
  // After pinning by other means (RDMA, io_uring fixed buffers, an engine's
  // own cudaHostRegister): where the kernel says the pages are.
  Placement Verify() {
    RequireValid();
    ClientResult<Placement> p = ClientStatus(ErrorCode::kInternal, "not run");
    {
      py::gil_scoped_release nogil;
      p = lease_.Verify();
    }
    if (!p.ok()) Throw(p.status());
    info_ = lease_.info();
    return *p;
  }

  // Explicit release: refused while the memory is exported.
  void Release() {
    RequireValid();
    if (exports_ > 0) {
      throw py::buffer_error("the lease has " + std::to_string(exports_) +
                             " live exports (memoryviews, arrays, tensors); drop them first");
    }
    ClientStatus s = ReleaseNow();
    if (!s.ok() && s.code() != ErrorCode::kRevoked) Throw(s);
  }
  // `with` exit: now, or when the last export is gone.
  void ReleaseWhenUnexported() {
    if (!lease_.valid()) return;
    if (exports_ > 0) {
      release_pending_ = true;
      return;
    }
    (void)ReleaseNow();
  }

  void Export() { ++exports_; }
  void Unexport() {
    if (--exports_ == 0 && release_pending_) (void)ReleaseNow();
  }

 private:
  ClientStatus ReleaseNow() {
    release_pending_ = false;
    Lease l = std::move(lease_);
    py::gil_scoped_release nogil;
    return l.Release();
  }

  Lease lease_;
  LeaseInfo info_;
  int exports_ = 0;
  bool release_pending_ = false;
};

PyLease& LeaseOf(const py::object& o) { return o.cast<PyLease&>(); }

// ---- buffer protocol (set on the type's slots; see AddBufferSlots) ----

int LeaseGetBuffer(PyObject* obj, Py_buffer* view, int flags) {
  view->obj = nullptr;
  PyLease* self = nullptr;
  try {
    self = py::handle(obj).cast<PyLease*>();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
  if (!self->valid()) {
    PyErr_SetString(PyExc_BufferError, "the lease was released");
    return -1;
  }
  if (PyBuffer_FillInfo(view, obj, reinterpret_cast<void*>(self->ptr()),
                        static_cast<Py_ssize_t>(self->size()), /*readonly=*/0, flags) != 0) {
    return -1;
  }
  self->Export();
  return 0;
}

void LeaseReleaseBuffer(PyObject* obj, Py_buffer* /*view*/) {
  try {
    py::handle(obj).cast<PyLease*>()->Unexport();
  } catch (const std::exception&) {
    // Not a PyLease: cannot happen, the slot is only on the Lease type.
  }
}

void AddBufferSlots(py::handle cls) {
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  heap->as_buffer.bf_getbuffer = LeaseGetBuffer;
  heap->as_buffer.bf_releasebuffer = LeaseReleaseBuffer;
  reinterpret_cast<PyTypeObject*>(cls.ptr())->tp_as_buffer = &heap->as_buffer;
}

// ---- DLPack ----

// What a capsule's tensor owns: a reference to the Lease object (counted as
// an export) and the shape array the DLTensor points at.
struct DlpackOwner {
  PyObject* lease_obj = nullptr;
  int64_t shape[1] = {0};
  dl::DLManagedTensor legacy{};
  dl::DLManagedTensorVersioned versioned{};
};

void DropOwner(DlpackOwner* o) {
  if (o == nullptr) return;
  // At interpreter exit the objects are going away anyway: leak, do not
  // touch Python.
  if (!Py_IsInitialized() || InterpreterFinalizing()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  {
    py::handle h(o->lease_obj);
    try {
      h.cast<PyLease*>()->Unexport();
    } catch (const std::exception&) {
    }
    Py_DECREF(o->lease_obj);
  }
  PyGILState_Release(g);
  delete o;
}

void LegacyDeleter(dl::DLManagedTensor* t) { DropOwner(static_cast<DlpackOwner*>(t->manager_ctx)); }
void VersionedDeleter(dl::DLManagedTensorVersioned* t) {
  DropOwner(static_cast<DlpackOwner*>(t->manager_ctx));
}

constexpr const char* kLegacyName = "dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";

// A capsule that nobody consumed still owns its tensor.
void LegacyCapsuleDestructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, kLegacyName)) {
    auto* t = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  } else {
    PyErr_Clear();
  }
}
void VersionedCapsuleDestructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, kVersionedName)) {
    auto* t = static_cast<dl::DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  } else {
    PyErr_Clear();
  }
}

// A 1-D uint8 DLPack capsule over [offset, offset + nbytes) of the lease.
// The keyword arguments are the DLPack protocol's (__dlpack__ of array API
// 2023.12); a request this producer cannot honour is a BufferError.
py::object MakeCapsule(const py::object& lease_obj, uint64_t offset, uint64_t nbytes,
                       const py::object& stream, const py::object& max_version,
                       const py::object& dl_device, const py::object& copy) {
  PyLease& lease = LeaseOf(lease_obj);
  if (!lease.valid()) throw py::buffer_error("the lease was released");
  if (!stream.is_none()) {
    // CPU memory has no stream; -1 is how some consumers say "none".
    if (!py::isinstance<py::int_>(stream) || stream.cast<int64_t>() != -1) {
      throw py::buffer_error("a lease is CPU memory: stream must be None");
    }
  }
  if (!dl_device.is_none()) {
    auto dev = dl_device.cast<std::pair<int, int>>();
    if (dev.first != dl::kDLCPU || dev.second != 0) {
      throw py::buffer_error("a lease can only be exported to the CPU device (1, 0)");
    }
  }
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error("copy=True: a lease is exported in place, never copied");
  }
  if (offset > lease.size() || nbytes > lease.size() - offset) {
    ThrowInvalid("window [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                 ") is outside the lease of " + std::to_string(lease.size()) + " bytes");
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= 1;
  }

  auto* owner = new DlpackOwner;
  owner->lease_obj = lease_obj.ptr();
  owner->shape[0] = static_cast<int64_t>(nbytes);
  dl::DLTensor t{};
  t.data = reinterpret_cast<void*>(lease.ptr() + offset);
  t.device = {dl::kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {dl::kDLUInt, 8, 1};
  t.shape = owner->shape;
  t.strides = nullptr;
  t.byte_offset = 0;

  PyObject* cap = nullptr;
  if (versioned) {
    owner->versioned.version = {dl::kMajorVersion, dl::kMinorVersion};
    owner->versioned.manager_ctx = owner;
    owner->versioned.deleter = VersionedDeleter;
    owner->versioned.flags = 0;
    owner->versioned.dl_tensor = t;
    cap = PyCapsule_New(&owner->versioned, kVersionedName, VersionedCapsuleDestructor);
  } else {
    owner->legacy.dl_tensor = t;
    owner->legacy.manager_ctx = owner;
    owner->legacy.deleter = LegacyDeleter;
    cap = PyCapsule_New(&owner->legacy, kLegacyName, LegacyCapsuleDestructor);
  }
  if (cap == nullptr) {
    delete owner;
    throw py::error_already_set();
  }
  Py_INCREF(owner->lease_obj);
  lease.Export();
  return py::reinterpret_steal<py::object>(cap);
}

// A byte range of a lease, exported by DLPack and the buffer protocol's
// Python-level equivalent (memoryview slicing is done on the Lease itself).
struct LeaseWindow {
  py::object lease;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// ---- Client ----

std::vector<std::string> TierList(const py::object& tier) {
  std::vector<std::string> out;
  if (tier.is_none()) return out;
  if (py::isinstance<py::str>(tier)) {
    std::string s = tier.cast<std::string>();
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      std::string part =
          s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!part.empty()) out.push_back(part);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }
  for (const py::handle& h : tier) {
    if (!py::isinstance<py::str>(h)) ThrowInvalid("tier: a string or a sequence of strings");
    out.push_back(h.cast<std::string>());
  }
  return out;
}

int OptionalIndex(const py::object& v, const char* what) {
  if (v.is_none()) return -1;
  if (!py::isinstance<py::int_>(v)) ThrowInvalid(std::string(what) + ": an int or None");
  int64_t i = v.cast<int64_t>();
  if (i < -1 || i > (1 << 20)) ThrowInvalid(std::string(what) + " must be >= 0, or None");
  return static_cast<int>(i);
}

std::vector<uint32_t> IdList(const py::object& v, const char* what) {
  std::vector<uint32_t> out;
  if (v.is_none()) return out;
  for (const py::handle& h : v) {
    if (!py::isinstance<py::int_>(h)) ThrowInvalid(std::string(what) + ": a sequence of ints");
    int64_t i = h.cast<int64_t>();
    if (i < 0 || i > 0xffffffffll) ThrowInvalid(std::string(what) + ": ids are 0..2^32-1");
    out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

class PyClient {
 public:
  explicit PyClient(const std::optional<std::string>& socket) {
    std::string path = socket.value_or("");
    ClientResult<Client> c = ClientStatus(ErrorCode::kInternal, "not run");
    {
      py::gil_scoped_release nogil;
      if (path.empty()) path = Client::DefaultSocketPath();
      c = Client::Connect(path);
    }
    if (!c.ok()) Throw(c.status());
    client_ = std::move(*c);
    socket_ = path;
  }

  std::unique_ptr<PyLease> Allocate(const py::object& size, const py::object& numa_node,
                                    const py::object& near_gpu, const py::object& gpu,
                                    const py::object& tier, bool strict, bool hugetlb,
                                    bool cuda_register, bool long_term_pin,
                                    const std::string& label, const py::object& name,
                                    const py::object& acl_uids, const py::object& acl_gids) {
    if (!py::isinstance<py::int_>(size)) ThrowInvalid("size: an int");
    if (PyObject_RichCompareBool(size.ptr(), py::int_(0).ptr(), Py_LE) == 1) {
      ThrowInvalid("size must be > 0");
    }
    if (PyObject_RichCompareBool(size.ptr(), py::int_(UINT64_MAX).ptr(), Py_GT) == 1) {
      ThrowInvalid("size does not fit in 64 bits");
    }
    AllocOptions o;
    o.size_bytes = size.cast<uint64_t>();
    o.numa_node = OptionalIndex(numa_node, "numa_node");
    o.near_gpu = OptionalIndex(near_gpu, "near_gpu");
    if (!gpu.is_none()) o.gpu = gpu.cast<std::string>();
    o.tier_preference = TierList(tier);
    o.strict = strict;
    o.hugetlb = hugetlb;
    o.cuda_register = cuda_register;
    o.long_term_pin = long_term_pin;
    o.label = label;
    if (!name.is_none()) {
      o.name = name.cast<std::string>();
      if (o.name.empty()) ThrowInvalid("name: a non-empty string, or None for a private lease");
    }
    o.acl_uids = IdList(acl_uids, "acl_uids");
    o.acl_gids = IdList(acl_gids, "acl_gids");
    ClientResult<Lease> l = ClientStatus(ErrorCode::kInternal, "not run");
    {
      py::gil_scoped_release nogil;
      l = client_.Allocate(o);
    }
    if (!l.ok()) Throw(l.status());
    return std::make_unique<PyLease>(std::move(*l));
  }

  std::unique_ptr<PyLease> Attach(const std::string& name, std::optional<uint32_t> owner_uid) {
    ClientResult<Lease> l = ClientStatus(ErrorCode::kInternal, "not run");
    {
      py::gil_scoped_release nogil;
      l = owner_uid ? client_.AttachFrom(*owner_uid, name) : client_.Attach(name);
    }
    if (!l.ok()) Throw(l.status());
    return std::make_unique<PyLease>(std::move(*l));
  }

  int ProcessEvents() {
    ClientResult<int> n = client_.ProcessEvents();
    if (!n.ok()) Throw(n.status());
    return *n;
  }

  void Close() { client_ = Client(); }
  bool connected() const { return client_.connected(); }
  const std::string& socket() const { return socket_; }
  uint32_t protocol_version() const { return client_.protocol_version(); }
  std::string server_version() const { return client_.server_version(); }

 private:
  Client client_;
  std::string socket_;
};

std::string LeaseRepr(const PyLease& l) {
  if (!l.valid()) return "<cxlpool.Lease id=" + std::to_string(l.id()) + " released>";
  const LeaseInfo& i = l.info();
  std::string r = "<cxlpool.Lease id=" + std::to_string(i.id) +
                  " size=" + std::to_string(l.size()) + " node=" + std::to_string(l.numa_node()) +
                  " kind=" + i.kind + " backing=" + i.backing;
  if (!i.name.empty()) r += " name=" + i.name;
  return r + ">";
}

}  // namespace
}  // namespace cxlpool::py_binding

PYBIND11_MODULE(_cxlpool, m) {
  using namespace cxlpool::py_binding;
  using cxlpool::LeaseInfo;
  using cxlpool::Placement;
  m.doc() = "Binding of libcxlpool (the cxlpool client library); use the cxlpool package.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CallError& e) {
      try {
        py::object make = py::module_::import("cxlpool.errors").attr("_from_code");
        py::object exc = make(e.code, e.message);
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });

  m.def("default_socket_path", &cxlpool::Client::DefaultSocketPath,
        "The socket Client() connects to without one: $CXLPOOL_SOCKET, else the root or\n"
        "per-user default (see cxlpool.h).");
  m.def(
      "version", [] { return std::string(cxlpool_version()); }, "libcxlpool's version.");
  m.def(
      "strerror", [](int code) { return std::string(cxlpool_strerror(code)); }, py::arg("c_error"),
      "The C ABI's text for a CXLPOOL_E* code (negative).");

  py::class_<LeaseInfo>(m, "LeaseInfo", "What the daemon said about a lease.")
      .def_readonly("id", &LeaseInfo::id)
      .def_readonly("size_bytes", &LeaseInfo::size_bytes)
      .def_readonly("requested_bytes", &LeaseInfo::requested_bytes)
      .def_readonly("page_size", &LeaseInfo::page_size)
      .def_readonly("numa_node", &LeaseInfo::numa_node)
      .def_readonly("memory_tier", &LeaseInfo::memory_tier)
      .def_readonly("holders", &LeaseInfo::holders)
      .def_readonly("kind", &LeaseInfo::kind)
      .def_readonly("backing", &LeaseInfo::backing)
      .def_readonly("placement_reason", &LeaseInfo::placement_reason)
      .def_readonly("pool", &LeaseInfo::pool)
      .def_readonly("device_offset", &LeaseInfo::device_offset)
      .def_readonly("label", &LeaseInfo::label)
      .def_readonly("name", &LeaseInfo::name)
      .def_readonly("owner_uid", &LeaseInfo::owner_uid)
      .def_readonly("owner_gid", &LeaseInfo::owner_gid)
      .def_readonly("long_term_pin", &LeaseInfo::long_term_pin)
      .def_readonly("placed_numa_node", &LeaseInfo::placed_numa_node)
      .def_readonly("moved_reason", &LeaseInfo::moved_reason)
      .def("__repr__", [](const LeaseInfo& i) {
        return "LeaseInfo(id=" + std::to_string(i.id) +
               ", size_bytes=" + std::to_string(i.size_bytes) +
               ", requested_bytes=" + std::to_string(i.requested_bytes) +
               ", numa_node=" + std::to_string(i.numa_node) + ", kind='" + i.kind + "', backing='" +
               i.backing + "', pool='" + i.pool + "', name='" + i.name + "')";
      });

  py::class_<Placement>(m, "Placement", "Where the kernel says a lease's pages are (Lease.verify).")
      .def_readonly("numa_node", &Placement::numa_node,
                    "The node holding most sampled pages; -1 when none is resident.")
      .def_readonly("placed_numa_node", &Placement::placed_numa_node,
                    "Where the daemon had accounted the lease before the check.")
      .def_readonly("moved", &Placement::moved,
                    "The pages are off placed_numa_node (the daemon was told and moved the "
                    "accounting).")
      .def_readonly("pages_sampled", &Placement::pages_sampled)
      .def_readonly("pages_on_node", &Placement::pages_on_node)
      .def_readonly("pages_absent", &Placement::pages_absent)
      .def("__repr__", [](const Placement& p) {
        return "Placement(numa_node=" + std::to_string(p.numa_node) +
               ", placed_numa_node=" + std::to_string(p.placed_numa_node) +
               ", moved=" + (p.moved ? "True" : "False") +
               ", pages_sampled=" + std::to_string(p.pages_sampled) +
               ", pages_on_node=" + std::to_string(p.pages_on_node) + ")";
      });

  py::class_<LeaseWindow>(m, "LeaseWindow",
                          "Bytes [offset, offset + nbytes) of a lease, exported with DLPack.")
      .def_readonly("lease", &LeaseWindow::lease)
      .def_readonly("offset", &LeaseWindow::offset)
      .def_readonly("nbytes", &LeaseWindow::nbytes)
      .def(
          "__dlpack__",
          [](const LeaseWindow& w, const py::object& stream, const py::object& max_version,
             const py::object& dl_device, const py::object& copy) {
            return MakeCapsule(w.lease, w.offset, w.nbytes, stream, max_version, dl_device, copy);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const LeaseWindow&) { return std::make_pair(1, 0); });

  py::class_<PyLease> lease(m, "Lease", py::buffer_protocol(), R"(A mapped lease of pool memory.

Made by Client.allocate() or Client.attach(). The memory is exported in place
through the buffer protocol (memoryview(lease), numpy.frombuffer(lease)) and
DLPack (numpy.from_dlpack(lease), torch.from_dlpack(lease)); each export keeps
the lease alive. release() returns the memory to the daemon; leaving a `with`
block releases it, or defers that until the last export is gone.)");
  AddBufferSlots(lease);
  lease.def_property_readonly("ptr", &PyLease::ptr, "Address of the mapping (0 once released).")
      .def_property_readonly("size", &PyLease::size,
                             "Mapped bytes (the daemon's page-rounded size).")
      .def_property_readonly(
          "requested_size", [](const PyLease& l) { return l.info().requested_bytes; },
          "Bytes asked for at allocation.")
      .def_property_readonly("id", &PyLease::id)
      .def_property_readonly("numa_node", &PyLease::numa_node)
      .def_property_readonly(
          "name",
          [](const PyLease& l) -> py::object {
            if (l.info().name.empty()) return py::none();
            return py::str(l.info().name);
          },
          "The shared name, or None for a private lease.")
      .def_property_readonly("info", &PyLease::info, py::return_value_policy::copy)
      .def_property_readonly("revoked", &PyLease::revoked,
                             "True once the daemon revoked it (its memory then raises SIGBUS).")
      .def_property_readonly("released", [](const PyLease& l) { return !l.valid(); })
      .def_property_readonly("exports", &PyLease::exports,
                             "Live exports: memoryviews, arrays and DLPack consumers.")
      .def_property_readonly("release_pending", &PyLease::release_pending)
      .def_property_readonly("device_ptr", &PyLease::DevicePtr,
                             "CUDA device pointer of the whole lease (raises when not registered).")
      .def_property_readonly("device_chunks", &PyLease::DeviceChunks,
                             "Registered chunks as (device_ptr, offset, length); [] if none.")
      .def_property_readonly("extents", &PyLease::Extents,
                             "The lease's extents as (offset, length, page_size), in order, back\n"
                             "to back; pin one io_uring buffer per extent.")
      .def("cuda_register", &PyLease::CudaRegister, py::arg("device") = 0,
           "Registers the mapping with CUDA on `device` (cuMemHostRegister, DEVICEMAP|PORTABLE).")
      .def("cuda_unregister", &PyLease::CudaUnregister)
      .def("verify", &PyLease::Verify,
           "After pinning the lease by other means (RDMA, io_uring fixed buffers, your own\n"
           "cudaHostRegister): samples move_pages over it and returns a Placement. Pages that\n"
           "left their node are reported to the daemon, which moves the lease's accounting;\n"
           "info then shows the new node and placed_numa_node the old one.")
      .def("release", &PyLease::Release,
           "Returns the memory to the daemon. BufferError while exports are alive.")
      .def(
          "window",
          [](py::object self, uint64_t offset, uint64_t nbytes) {
            PyLease& l = LeaseOf(self);
            l.RequireValid();
            if (offset > l.size() || nbytes > l.size() - offset) {
              ThrowInvalid("window [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                           ") is outside the lease of " + std::to_string(l.size()) + " bytes");
            }
            return LeaseWindow{std::move(self), offset, nbytes};
          },
          py::arg("offset"), py::arg("nbytes"),
          "A byte range of the lease for DLPack consumers (torch.from_dlpack(w)).")
      .def(
          "__dlpack__",
          [](const py::object& self, const py::object& stream, const py::object& max_version,
             const py::object& dl_device, const py::object& copy) {
            return MakeCapsule(self, 0, LeaseOf(self).size(), stream, max_version, dl_device, copy);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "A DLPack capsule of the whole mapping: 1-D uint8 on the CPU.")
      .def("__dlpack_device__", [](const PyLease&) { return std::make_pair(1, 0); })
      .def("__len__", [](const PyLease& l) { return l.valid() ? l.size() : 0; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyLease& l, const py::object&, const py::object&, const py::object&) {
             l.ReleaseWhenUnexported();
             return false;
           })
      .def("__repr__", &LeaseRepr);

  py::class_<PyClient>(m, "Client", R"(A connection to cxlpoold.

Client(socket=None) connects (None: default_socket_path()) and raises
cxlpool.UnavailableError / NotFoundError when no daemon answers. Leases outlive
the Client object and its close(): each keeps the connection open.)")
      .def(py::init<const std::optional<std::string>&>(), py::arg("socket") = py::none())
      .def("allocate", &PyClient::Allocate, py::arg("size"), py::kw_only(),
           py::arg("numa_node") = py::none(), py::arg("near_gpu") = py::none(),
           py::arg("gpu") = py::none(), py::arg("tier") = py::none(), py::arg("strict") = false,
           py::arg("hugetlb") = false, py::arg("cuda_register") = false,
           py::arg("long_term_pin") = false, py::arg("label") = "", py::arg("name") = py::none(),
           py::arg("acl_uids") = py::none(), py::arg("acl_gids") = py::none(),
           R"(A lease of `size` bytes (the daemon rounds up to its page size).

numa_node: a node id, or None to let the daemon place it. near_gpu: a GPU index to
place it near; gpu: a GPU UUID or PCI bus id (overrides near_gpu). tier: node kinds in
order of preference, a list or "dram,cxl". strict: refuse rather than fall back.
hugetlb: ask for hugetlb backing. cuda_register: register with CUDA on near_gpu (0 when
None); a failed registration does not fail the allocation, device_ptr raises its error.
long_term_pin: the caller will pin the lease long-term itself (RDMA, io_uring fixed
buffers, its own cudaHostRegister; cuda_register implies it), so the daemon never
places it where a pin would move it; call verify() after pinning.
label: shown by `cxlpoolctl leases`. name: make it a shared named lease that processes
whose uid is in acl_uids or gid in acl_gids (and the owner) can attach().

Raises InvalidArgumentError, ResourceExhaustedError (pool full, quota; the message
names the limit), NotFoundError (unknown node or GPU), AlreadyExistsError (name taken),
UnavailableError (no daemon), ProtocolError, IoError.)")
      .def("attach", &PyClient::Attach, py::arg("name"), py::arg("owner_uid") = py::none(),
           "Maps the shared lease `name` of uid `owner_uid` (None: this process's own uid;\n"
           "names live in one namespace per owner). info.owner_uid says whose it is.\n"
           "Raises NotFoundError (no such name, or not in its ACL), UnavailableError.")
      .def("process_events", &PyClient::ProcessEvents,
           "Reads pushed lease events (revocations) without blocking; returns how many.")
      .def("close", &PyClient::Close)
      .def_property_readonly("connected", &PyClient::connected)
      .def_property_readonly("socket", &PyClient::socket)
      .def_property_readonly("protocol_version", &PyClient::protocol_version)
      .def_property_readonly("server_version", &PyClient::server_version)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, const py::object&, const py::object&, const py::object&) {
        c.Close();
        return false;
      });
}
