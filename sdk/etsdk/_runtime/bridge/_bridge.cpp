// etsdk native bridge: registers Python-backed backends into the ExecuTorch
// runtime's backend registry and forwards init / execute / destroy to Python.
//
// Written against the Python C API only (no pybind11): mixing torch's bundled
// pybind11 with another copy in one translation unit crashed at import.
// Everything that can be decided in Python is decided there; this file only
// moves pointers across the boundary.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/executor/program.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace et = ::executorch::runtime;
using et::BackendExecutionContext;
using et::BackendInitContext;
using et::BackendInterface;
using et::CompileSpec;
using et::DelegateHandle;
using et::EValue;
using et::Error;
using et::FreeableBuffer;
using et::NamedDataMap;
using et::Result;
using et::Span;

namespace {

// ---------------------------------------------------------------- OwnedBuffer
// A read-only Python buffer that owns an ExecuTorch FreeableBuffer. Memory is
// released when the last Python reference goes away, so a binding may keep a
// zero-copy view of its blob or of named data for as long as it needs.
struct OwnedBuffer {
  PyObject_HEAD FreeableBuffer buffer;
};

int owned_buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* ob = reinterpret_cast<OwnedBuffer*>(self);
  return PyBuffer_FillInfo(
      view,
      self,
      const_cast<void*>(ob->buffer.data()),
      static_cast<Py_ssize_t>(ob->buffer.size()),
      /*readonly=*/1,
      flags);
}

void owned_buffer_dealloc(PyObject* self) {
  auto* ob = reinterpret_cast<OwnedBuffer*>(self);
  ob->buffer.Free();
  ob->buffer.~FreeableBuffer();
  Py_TYPE(self)->tp_free(self);
}

Py_ssize_t owned_buffer_len(PyObject* self) {
  return static_cast<Py_ssize_t>(
      reinterpret_cast<OwnedBuffer*>(self)->buffer.size());
}

PyBufferProcs owned_buffer_as_buffer = {owned_buffer_getbuffer, nullptr};
PySequenceMethods owned_buffer_as_sequence = {owned_buffer_len};

PyTypeObject OwnedBufferType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* make_owned_buffer(FreeableBuffer&& buf) {
  auto* ob = PyObject_New(OwnedBuffer, &OwnedBufferType);
  if (ob == nullptr) {
    buf.Free();
    return nullptr;
  }
  new (&ob->buffer) FreeableBuffer(std::move(buf));
  return reinterpret_cast<PyObject*>(ob);
}

// ------------------------------------------------------------------ NamedData
// The runtime's named data map, usable from Python only while init() runs.
// A program without named data gives init a null map: that is an empty map,
// not an error. ``active`` is false once init has returned.
struct NamedData {
  PyObject_HEAD const NamedDataMap* map;
  bool active;
};

PyObject* named_data_invalid() {
  PyErr_SetString(
      PyExc_RuntimeError,
      "named data is only available while the binding's init() runs");
  return nullptr;
}

PyObject* named_data_get(PyObject* self, PyObject* arg) {
  auto* nd = reinterpret_cast<NamedData*>(self);
  if (!nd->active) {
    return named_data_invalid();
  }
  Py_ssize_t len = 0;
  const char* key = PyUnicode_AsUTF8AndSize(arg, &len);
  if (key == nullptr) {
    return nullptr;
  }
  if (nd->map == nullptr) {
    PyErr_Format(PyExc_KeyError, "named data key '%s' not found (the program has no named data)", key);
    return nullptr;
  }
  Result<FreeableBuffer> data =
      nd->map->get_data(std::string_view(key, static_cast<size_t>(len)));
  if (!data.ok()) {
    PyErr_Format(
        PyExc_KeyError,
        "named data key '%s' not found (runtime error 0x%x)",
        key,
        static_cast<unsigned>(data.error()));
    return nullptr;
  }
  return make_owned_buffer(std::move(data.get()));
}

PyObject* named_data_keys(PyObject* self, PyObject*) {
  auto* nd = reinterpret_cast<NamedData*>(self);
  if (!nd->active) {
    return named_data_invalid();
  }
  if (nd->map == nullptr) {
    return PyList_New(0);
  }
  Result<uint32_t> n = nd->map->get_num_keys();
  if (!n.ok()) {
    return PyList_New(0);
  }
  PyObject* out = PyList_New(0);
  for (uint32_t i = 0; out != nullptr && i < n.get(); ++i) {
    Result<const char*> k = nd->map->get_key(i);
    if (!k.ok()) {
      continue;
    }
    PyObject* s = PyUnicode_FromString(k.get());
    if (s == nullptr || PyList_Append(out, s) != 0) {
      Py_XDECREF(s);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(s);
  }
  return out;
}

PyMethodDef named_data_methods[] = {
    {"get", named_data_get, METH_O, "get(key) -> read-only zero-copy buffer"},
    {"keys", named_data_keys, METH_NOARGS, "keys() -> list of keys"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject NamedDataType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -------------------------------------------------------------------- Backend
// Per-slot cache of the torch tensor wrapping an argument. ExecuTorch's
// planned memory is stable across calls, so after the first call a tensor
// argument costs one comparison instead of a Python allocation.
struct CachedArg {
  void* data = nullptr;
  size_t nbytes = 0;
  int dtype = -1;
  std::vector<int64_t> sizes;
  PyObject* tensor = nullptr;  // owned
};

struct Handle {
  PyObject* execute = nullptr;  // bound method, owned
  PyObject* owner = nullptr;  // the binding's handle object, owned
  PyObject* check = nullptr;  // check(args): called when the runtime hands over new memory, owned
  std::vector<CachedArg> cache;
};

PyObject* g_wrap_tensor = nullptr;  // python: wrap(memoryview, dtype, sizes)

// Hands the pending Python exception to the dispatcher, which keeps it for the
// caller of execute / load_method (the runtime itself only sees an error code).
void record_error(PyObject* dispatcher, const char* phase, PyObject* owner) {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != nullptr && tb != nullptr) {
    PyException_SetTraceback(value, tb);
  }
  if (value != nullptr && dispatcher != nullptr) {
    PyObject* r = PyObject_CallMethod(
        dispatcher, "record_error", "sOO", phase, value,
        owner == nullptr ? Py_None : owner);
    Py_XDECREF(r);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (PyErr_Occurred()) {
    PyErr_WriteUnraisable(dispatcher);
  }
}

class BridgeBackend final : public BackendInterface {
 public:
  explicit BridgeBackend(std::string name) : name_(std::move(name)) {}

  const char* name() const {
    return name_.c_str();
  }

  void set_dispatcher(PyObject* d) {
    Py_XINCREF(d);
    Py_XSETREF(dispatcher_, d);
  }

  bool is_available() const override {
    return true;
  }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      et::ArrayRef<CompileSpec> compile_specs) const override {
    PyGILState_STATE gil = PyGILState_Ensure();
    Result<DelegateHandle*> result = init_locked(context, processed, compile_specs);
    PyGILState_Release(gil);
    return result;
  }

  Error execute(
      BackendExecutionContext& /*context*/,
      DelegateHandle* raw,
      Span<EValue*> args) const override {
    PyGILState_STATE gil = PyGILState_Ensure();
    Error err = execute_locked(static_cast<Handle*>(raw), args);
    PyGILState_Release(gil);
    return err;
  }

  void destroy(DelegateHandle* raw) const override {
    if (raw == nullptr) {
      return;
    }
    if (!Py_IsInitialized()) {
      return;  // interpreter gone: nothing left to release safely
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    auto* h = static_cast<Handle*>(raw);
    if (dispatcher_ != nullptr) {
      PyObject* r =
          PyObject_CallMethod(dispatcher_, "destroy", "O", h->owner);
      if (r == nullptr) {
        PyErr_WriteUnraisable(dispatcher_);
      }
      Py_XDECREF(r);
    }
    for (CachedArg& c : h->cache) {
      Py_XDECREF(c.tensor);
    }
    Py_XDECREF(h->check);
    Py_XDECREF(h->execute);
    Py_XDECREF(h->owner);
    delete h;
    PyGILState_Release(gil);
  }

 private:
  Result<DelegateHandle*> init_locked(
      BackendInitContext& context,
      FreeableBuffer* processed,
      et::ArrayRef<CompileSpec> compile_specs) const {
    if (dispatcher_ == nullptr) {
      return Error::InvalidState;
    }
    // The blob moves into a Python-owned buffer: zero-copy, freed when the
    // binding drops it.
    PyObject* blob = make_owned_buffer(std::move(*processed));
    PyObject* specs = PyList_New(0);
    for (size_t i = 0; specs != nullptr && i < compile_specs.size(); ++i) {
      const CompileSpec& cs = compile_specs[i];
      PyObject* item = Py_BuildValue(
          "(sy#)",
          cs.key,
          static_cast<const char*>(cs.value.buffer),
          static_cast<Py_ssize_t>(cs.value.nbytes));
      if (item == nullptr || PyList_Append(specs, item) != 0) {
        Py_XDECREF(item);
        Py_CLEAR(specs);
        break;
      }
      Py_DECREF(item);
    }
    auto* nd = PyObject_New(NamedData, &NamedDataType);
    if (nd != nullptr) {
      nd->map = context.get_named_data_map();
      nd->active = true;
    }
    const char* method = context.get_method_name();
    PyObject* owner = nullptr;
    if (blob != nullptr && specs != nullptr && nd != nullptr) {
      owner = PyObject_CallMethod(
          dispatcher_,
          "init",
          "sOOOs",
          name_.c_str(),
          blob,
          specs,
          reinterpret_cast<PyObject*>(nd),
          method == nullptr ? "" : method);
    }
    if (nd != nullptr) {
      nd->map = nullptr;  // the map is only guaranteed valid during init
      nd->active = false;
    }
    Py_XDECREF(reinterpret_cast<PyObject*>(nd));
    Py_XDECREF(specs);
    Py_XDECREF(blob);
    if (owner == nullptr) {
      // The dispatcher records binding errors itself; anything that still
      // escapes (e.g. building the arguments failed) is recorded here.
      record_error(dispatcher_, "init", nullptr);
      return Error::DelegateInvalidCompatibility;
    }
    if (owner == Py_None) {
      Py_DECREF(owner);
      return Error::DelegateInvalidCompatibility;
    }
    PyObject* check = nullptr;
    if (PyTuple_Check(owner) && PyTuple_GET_SIZE(owner) == 2) {
      // (handle, check): the dispatcher's argument check rides along.
      PyObject* pair = owner;
      owner = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
      check = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
      Py_DECREF(pair);
    }
    PyObject* exec = PyObject_GetAttrString(owner, "execute");
    if (exec == nullptr) {
      record_error(dispatcher_, "init", owner);
      Py_DECREF(owner);
      Py_XDECREF(check);
      return Error::InvalidState;
    }
    auto* h = new Handle();
    h->owner = owner;
    h->execute = exec;
    if (check == Py_None) {
      Py_CLEAR(check);
    }
    h->check = check;
    return static_cast<DelegateHandle*>(h);
  }

  PyObject* wrap_tensor(CachedArg& slot, et::EValue* ev, bool* miss) const {
    const auto& t = ev->toTensor();
    void* data = t.mutable_data_ptr();
    size_t nbytes = t.nbytes();
    int dtype = static_cast<int>(t.scalar_type());
    auto sizes = t.sizes();
    bool hit = slot.tensor != nullptr && slot.data == data &&
        slot.nbytes == nbytes && slot.dtype == dtype &&
        slot.sizes.size() == sizes.size();
    for (size_t i = 0; hit && i < sizes.size(); ++i) {
      hit = slot.sizes[i] == static_cast<int64_t>(sizes[i]);
    }
    if (hit) {
      Py_INCREF(slot.tensor);
      return slot.tensor;
    }
    auto dim_order = t.dim_order();
    for (size_t i = 0; i < dim_order.size(); ++i) {
      if (static_cast<size_t>(dim_order[i]) != i) {
        PyErr_SetString(
            PyExc_ValueError,
            "etsdk bridge: only contiguous (default dim order) tensors are "
            "supported as delegate arguments");
        return nullptr;
      }
    }
    PyObject* mv = PyMemoryView_FromMemory(
        static_cast<char*>(data), static_cast<Py_ssize_t>(nbytes), PyBUF_WRITE);
    if (mv == nullptr) {
      return nullptr;
    }
    PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
    for (size_t i = 0; shape != nullptr && i < sizes.size(); ++i) {
      PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(sizes[i]));
    }
    PyObject* tensor = shape == nullptr
        ? nullptr
        : PyObject_CallFunction(g_wrap_tensor, "OiO", mv, dtype, shape);
    Py_DECREF(mv);
    Py_XDECREF(shape);
    if (tensor == nullptr) {
      return nullptr;
    }
    Py_XSETREF(slot.tensor, tensor);
    *miss = true;
    slot.data = data;
    slot.nbytes = nbytes;
    slot.dtype = dtype;
    slot.sizes.assign(sizes.begin(), sizes.end());
    Py_INCREF(tensor);
    return tensor;
  }

  Error execute_locked(Handle* h, Span<EValue*> args) const {
    if (h->cache.size() != args.size()) {
      h->cache.resize(args.size());
    }
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
    if (tuple == nullptr) {
      PyErr_WriteUnraisable(h->owner);
      return Error::MemoryAllocationFailed;
    }
    bool miss = false;
    for (size_t i = 0; i < args.size(); ++i) {
      EValue* ev = args[i];
      PyObject* item = nullptr;
      if (ev->isTensor()) {
        item = wrap_tensor(h->cache[i], ev, &miss);
      } else if (ev->isInt()) {
        item = PyLong_FromLongLong(ev->toInt());
      } else if (ev->isDouble()) {
        item = PyFloat_FromDouble(ev->toDouble());
      } else if (ev->isBool()) {
        item = PyBool_FromLong(ev->toBool());
      } else if (ev->isNone()) {
        item = Py_NewRef(Py_None);
      } else {
        PyErr_Format(
            PyExc_TypeError,
            "etsdk bridge: delegate argument %zu has an unsupported EValue "
            "tag %d",
            i,
            static_cast<int>(ev->tag));
      }
      if (item == nullptr) {
        Py_DECREF(tuple);
        record_error(dispatcher_, "execute", h->owner);
        return Error::InvalidArgument;
      }
      PyTuple_SET_ITEM(tuple, i, item);
    }
    if (miss && h->check != nullptr) {
      // New memory from the runtime (first call, or re-planned): check the
      // arguments against the delegate's signature before the binding runs.
      PyObject* ok = PyObject_CallOneArg(h->check, tuple);
      if (ok == nullptr) {
        Py_DECREF(tuple);
        for (CachedArg& c : h->cache) {
          Py_CLEAR(c.tensor);  // check again next time
        }
        record_error(dispatcher_, "execute", h->owner);
        return Error::InvalidArgument;
      }
      Py_DECREF(ok);
    }
    PyObject* r = PyObject_CallOneArg(h->execute, tuple);
    Py_DECREF(tuple);
    if (r == nullptr) {
      record_error(dispatcher_, "execute", h->owner);
      return Error::Internal;
    }
    Py_DECREF(r);
    return Error::Ok;
  }

  std::string name_;
  PyObject* dispatcher_ = nullptr;
};

// Registered backends live for the whole process: the runtime's registry has
// no unregister, so a name is registered once and re-pointed afterwards.
std::mutex g_mutex;
std::map<std::string, BridgeBackend*> g_backends;

PyObject* py_register(PyObject*, PyObject* args) {
  const char* name = nullptr;
  PyObject* dispatcher = nullptr;
  if (!PyArg_ParseTuple(args, "sO", &name, &dispatcher)) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_backends.find(name);
  if (it != g_backends.end()) {
    it->second->set_dispatcher(dispatcher);
    return PyUnicode_FromString("repointed");
  }
  if (et::get_backend_class(name) != nullptr) {
    PyErr_Format(
        PyExc_ValueError,
        "backend id '%s' is already registered in the ExecuTorch runtime by "
        "another library",
        name);
    return nullptr;
  }
  auto* backend = new BridgeBackend(name);
  backend->set_dispatcher(dispatcher);
  Error err = et::register_backend({backend->name(), backend});
  if (err != Error::Ok) {
    delete backend;  // never registered, safe to free
    PyErr_Format(
        PyExc_OverflowError,
        "could not register backend id '%s' in the ExecuTorch runtime (error "
        "0x%x); %zu backends are registered, and the runtime's registry has a "
        "fixed number of slots",
        name,
        static_cast<unsigned>(err),
        et::get_num_registered_backends());
    return nullptr;
  }
  g_backends.emplace(name, backend);
  return PyUnicode_FromString("registered");
}

PyObject* py_runtime_backends(PyObject*, PyObject*) {
  size_t n = et::get_num_registered_backends();
  PyObject* out = PyList_New(0);
  for (size_t i = 0; out != nullptr && i < n; ++i) {
    Result<const char*> name = et::get_backend_name(i);
    if (!name.ok()) continue;
    PyObject* s = PyUnicode_FromString(name.get());
    if (s == nullptr || PyList_Append(out, s) != 0) {
      Py_XDECREF(s);
      Py_CLEAR(out);
    } else {
      Py_DECREF(s);
    }
  }
  return out;
}

PyObject* py_set_wrap_tensor(PyObject*, PyObject* fn) {
  Py_INCREF(fn);
  Py_XSETREF(g_wrap_tensor, fn);
  Py_RETURN_NONE;
}

// inspect_program(path, key) -> ([(method, [backend ids])], bytes | None).
// Parses and verifies the program with the runtime's own loader, so a
// corrupted file is refused here before any backend is registered or any
// method is loaded; also returns the program-level named data under ``key``
// (etsdk's program record), readable before any delegate initialises.
PyObject* py_program_backends(PyObject*, PyObject* args) {
  const char* path = nullptr;
  const char* record_key = nullptr;
  if (!PyArg_ParseTuple(args, "ss", &path, &record_key)) {
    return nullptr;
  }
  auto loader = ::executorch::extension::FileDataLoader::from(path);
  if (!loader.ok()) {
    PyErr_Format(
        PyExc_OSError, "cannot open '%s' (runtime error 0x%x)", path,
        static_cast<unsigned>(loader.error()));
    return nullptr;
  }
  auto program = et::Program::load(
      &loader.get(), et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    PyErr_Format(
        PyExc_ValueError,
        "the ExecuTorch runtime refused '%s' as a program (runtime error "
        "0x%x)",
        path,
        static_cast<unsigned>(program.error()));
    return nullptr;
  }
  PyObject* out = PyList_New(0);
  size_t n = program->num_methods();
  for (size_t i = 0; out != nullptr && i < n; ++i) {
    auto mname = program->get_method_name(i);
    if (!mname.ok()) continue;
    auto meta = program->method_meta(mname.get());
    if (!meta.ok()) continue;
    PyObject* ids = PyList_New(0);
    for (size_t b = 0; ids != nullptr && b < meta->num_backends(); ++b) {
      auto bn = meta->get_backend_name(b);
      if (!bn.ok()) continue;
      PyObject* s = PyUnicode_FromString(bn.get());
      if (s == nullptr || PyList_Append(ids, s) != 0) {
        Py_XDECREF(s);
        Py_CLEAR(ids);
      } else {
        Py_DECREF(s);
      }
    }
    PyObject* item = ids == nullptr ? nullptr : Py_BuildValue("(sN)", mname.get(), ids);
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_CLEAR(out);
    } else {
      Py_DECREF(item);
    }
  }
  if (out == nullptr) {
    return nullptr;
  }
  PyObject* record = nullptr;
  auto map = program->get_named_data_map();
  if (map.ok() && map.get() != nullptr) {
    auto data = map.get()->get_data(record_key);
    if (data.ok()) {
      record = PyBytes_FromStringAndSize(
          static_cast<const char*>(data->data()),
          static_cast<Py_ssize_t>(data->size()));
      data->Free();
      if (record == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
    }
  }
  if (record == nullptr) {
    record = Py_NewRef(Py_None);
  }
  return Py_BuildValue("(NN)", out, record);
}

PyMethodDef module_methods[] = {
    {"register", py_register, METH_VARARGS,
     "register(name, dispatcher) -> 'registered' | 'repointed'"},
    {"runtime_backends", py_runtime_backends, METH_NOARGS,
     "names registered in the runtime's backend registry"},
    {"set_wrap_tensor", py_set_wrap_tensor, METH_O,
     "set the function that turns (memoryview, dtype, sizes) into a tensor"},
    {"inspect_program", py_program_backends, METH_VARARGS,
     "inspect_program(path, key) -> ([(method, [backend ids])], bytes | None)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_etsdk_bridge", "etsdk native bridge", -1,
    module_methods};

} // namespace

PyMODINIT_FUNC PyInit__etsdk_bridge(void) {
  OwnedBufferType.tp_name = "etsdk._runtime.bridge.OwnedBuffer";
  OwnedBufferType.tp_basicsize = sizeof(OwnedBuffer);
  OwnedBufferType.tp_flags = Py_TPFLAGS_DEFAULT;
  OwnedBufferType.tp_dealloc = owned_buffer_dealloc;
  OwnedBufferType.tp_as_buffer = &owned_buffer_as_buffer;
  OwnedBufferType.tp_as_sequence = &owned_buffer_as_sequence;
  OwnedBufferType.tp_doc = "read-only buffer owning runtime memory";
  NamedDataType.tp_name = "etsdk._runtime.bridge.NamedData";
  NamedDataType.tp_basicsize = sizeof(NamedData);
  NamedDataType.tp_flags = Py_TPFLAGS_DEFAULT;
  NamedDataType.tp_methods = named_data_methods;
  NamedDataType.tp_doc = "the runtime's named data map during init";
  if (PyType_Ready(&OwnedBufferType) < 0 || PyType_Ready(&NamedDataType) < 0) {
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  PyModule_AddIntConstant(m, "ABI_VERSION", 2);
  return m;
}
