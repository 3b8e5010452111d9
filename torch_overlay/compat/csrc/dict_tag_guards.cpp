// torch._dynamo._dict_tag_guards_C (backport only, never exported): the fast
// path of recursive dict-tag guards on torch 2.7.1.
//
// Upstream (2.9+) checks the dict tags of an nn.Module subtree inside its C++
// guard manager (torch/csrc/dynamo/guards.cpp, config
// use_recursive_dict_tags_for_guards). Torch 2.7.1's guard manager cannot be
// rebuilt here, so the backport builds each such subtree under a guard manager of
// its own and puts one DictTagGuard in the tree where the subtree was: a lambda
// guard whose callable is this type. torch/_dynamo/_dict_tag_guards.py (the
// compat layer) finds the subtrees, records what the fast path compares, and runs
// the subtree's own guards whenever the fast path cannot decide; see NOTE:
// [Recursive dict tags on torch 2.7.1] there.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// NOTE: [What a dict-tag snapshot compares]
// A snapshot is a list of entries in the order the subtree's guards reach them,
// parents first, recorded right after the subtree's guards passed:
//   OBJ_DICT: an object's instance dict is still the recorded dict object, and
//             that dict's version tag is unchanged (and, when the entry was
//             recorded right after a TYPE entry of the same object, its type:
//             one entry for a module's TYPE_MATCH and its __dict__);
//   DICT:     a dict (a value of a dict checked before it) has its version tag;
//   TYPE:     an object (reached through dicts checked before it) has its type.
// Every object an entry points to is reached from the root through dicts whose
// tags matched before it is read, so the pointers are borrowed: the root is held
// by a weak reference and compared first, and a dict whose tag matched holds the
// same values it held when recorded. A guard keeps one snapshot per root object
// (a layer's compiled forward is called with each layer), up to max_snapshots. CPython gives every dict mutation a new
// version tag from one process-wide counter, so an unchanged tag means unchanged
// contents, and a dict freed and reallocated at the same address has a new tag.
enum class EntryKind : int { OBJ_DICT = 0, DICT = 1, TYPE = 2 };

struct Entry {
  EntryKind kind;
  PyObject* obj; // borrowed
  PyObject* dict; // borrowed
  uint64_t tag;
  PyObject* type; // strong
};

uint64_t dict_version(PyObject* dict) {
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
}

PyObject* instance_dict(PyObject* obj) {
  PyObject** ptr = _PyObject_GetDictPtr(obj);
  return ptr == nullptr ? nullptr : *ptr;
}

struct Snapshot {
  PyObject* root_ref = nullptr; // weak reference to the recorded root
  std::vector<Entry> entries;
};

void release(Snapshot& snapshot) {
  Py_CLEAR(snapshot.root_ref);
  for (Entry& e : snapshot.entries) {
    Py_XDECREF(e.type);
  }
  snapshot.entries.clear();
}

using Snapshots = std::unordered_map<PyObject*, Snapshot>; // by root address

struct DictTagGuard {
  PyObject_HEAD
  PyObject* slow_path; // callable(value) -> bool
  Snapshots* snapshots;
  Py_ssize_t max_snapshots;
  Py_ssize_t hits;
  Py_ssize_t misses;
  vectorcallfunc vectorcall;
};

void clear_snapshots(DictTagGuard* self) {
  if (self->snapshots != nullptr) {
    for (auto& item : *self->snapshots) {
      release(item.second);
    }
    self->snapshots->clear();
  }
}

bool snapshot_matches(DictTagGuard* self, PyObject* value) {
  auto it = self->snapshots->find(value);
  if (it == self->snapshots->end() ||
      PyWeakref_GetObject(it->second.root_ref) != value) {
    return false; // none recorded, or its root died and the address was reused
  }
  for (const Entry& e : it->second.entries) {
    switch (e.kind) {
      case EntryKind::OBJ_DICT:
        if ((e.type != nullptr &&
             reinterpret_cast<PyObject*>(Py_TYPE(e.obj)) != e.type) ||
            instance_dict(e.obj) != e.dict || dict_version(e.dict) != e.tag) {
          return false;
        }
        break;
      case EntryKind::DICT:
        if (dict_version(e.dict) != e.tag) {
          return false;
        }
        break;
      case EntryKind::TYPE:
        if (reinterpret_cast<PyObject*>(Py_TYPE(e.obj)) != e.type) {
          return false;
        }
        break;
    }
  }
  return true;
}

PyObject* DictTagGuard_vectorcall(
    PyObject* callable,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  auto* self = reinterpret_cast<DictTagGuard*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 1 ||
      (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "DictTagGuard takes exactly one argument");
    return nullptr;
  }
  if (snapshot_matches(self, args[0])) {
    self->hits++;
    Py_RETURN_TRUE;
  }
  self->misses++;
  return PyObject_CallOneArg(self->slow_path, args[0]);
}

PyObject* DictTagGuard_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kwlist[] = {"slow_path", "max_snapshots", nullptr};
  PyObject* slow_path = nullptr;
  Py_ssize_t max_snapshots = 1;
  if (!PyArg_ParseTupleAndKeywords(
          args, kwds, "O|n", const_cast<char**>(kwlist), &slow_path, &max_snapshots)) {
    return nullptr;
  }
  if (max_snapshots < 1) {
    PyErr_SetString(PyExc_ValueError, "max_snapshots must be at least 1");
    return nullptr;
  }
  if (!PyCallable_Check(slow_path)) {
    PyErr_SetString(PyExc_TypeError, "slow_path must be callable");
    return nullptr;
  }
  auto* self = reinterpret_cast<DictTagGuard*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  Py_INCREF(slow_path);
  self->slow_path = slow_path;
  self->snapshots = new Snapshots();
  self->max_snapshots = max_snapshots;
  self->hits = 0;
  self->misses = 0;
  self->vectorcall = DictTagGuard_vectorcall;
  return reinterpret_cast<PyObject*>(self);
}

int DictTagGuard_traverse(DictTagGuard* self, visitproc visit, void* arg) {
  Py_VISIT(self->slow_path);
  return 0;
}

int DictTagGuard_clear(DictTagGuard* self) {
  Py_CLEAR(self->slow_path);
  clear_snapshots(self);
  return 0;
}

void DictTagGuard_dealloc(DictTagGuard* self) {
  PyObject_GC_UnTrack(self);
  DictTagGuard_clear(self);
  delete self->snapshots;
  self->snapshots = nullptr;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// record(root, entries) -> bool: entries is a sequence of (kind, obj) pairs in
// check order, kind one of "obj_dict", "dict", "type"; the tags and types
// compared later are read now. False (nothing recorded) when max_snapshots other
// roots hold one.
PyObject* DictTagGuard_record(DictTagGuard* self, PyObject* args) {
  PyObject* root = nullptr;
  PyObject* items = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &root, &items)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(items, "entries must be a sequence");
  if (seq == nullptr) {
    return nullptr;
  }
  // Built apart and released whole if anything fails.
  Snapshot candidate;
  candidate.root_ref = PyWeakref_NewRef(root, nullptr);
  if (candidate.root_ref == nullptr) {
    Py_DECREF(seq);
    return nullptr;
  }
  std::vector<Entry>& recorded = candidate.entries;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  recorded.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    const char* kind = nullptr;
    PyObject* obj = nullptr;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "sO", &kind, &obj)) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "each entry is a (kind, object) tuple");
      }
      release(candidate);
      Py_DECREF(seq);
      return nullptr;
    }
    Entry e{EntryKind::TYPE, obj, nullptr, 0, nullptr};
    const std::string k(kind);
    if (k == "obj_dict") {
      e.kind = EntryKind::OBJ_DICT;
      e.dict = instance_dict(obj);
      if (e.dict == nullptr || !PyDict_Check(e.dict)) {
        PyErr_SetString(PyExc_TypeError, "obj_dict entry: object has no instance dict");
      }
    } else if (k == "dict") {
      e.kind = EntryKind::DICT;
      e.dict = obj;
      if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "dict entry: not a dict");
      }
    } else if (k == "type") {
      e.type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
      Py_INCREF(e.type);
    } else {
      PyErr_Format(PyExc_ValueError, "unknown entry kind %s", kind);
    }
    if (PyErr_Occurred()) {
      Py_XDECREF(e.type);
      release(candidate);
      Py_DECREF(seq);
      return nullptr;
    }
    if (e.dict != nullptr) {
      e.tag = dict_version(e.dict);
    }
    if (e.kind == EntryKind::OBJ_DICT && !recorded.empty() &&
        recorded.back().kind == EntryKind::TYPE && recorded.back().obj == obj) {
      // The object's type and its dict in one entry.
      e.type = recorded.back().type;
      recorded.back() = e;
      continue;
    }
    recorded.push_back(e);
  }
  Py_DECREF(seq);
  auto it = self->snapshots->find(root);
  if (it == self->snapshots->end()) {
    if (static_cast<Py_ssize_t>(self->snapshots->size()) >= self->max_snapshots) {
      // Make room from roots that died.
      for (auto dead = self->snapshots->begin(); dead != self->snapshots->end();) {
        if (PyWeakref_GetObject(dead->second.root_ref) == Py_None) {
          release(dead->second);
          dead = self->snapshots->erase(dead);
        } else {
          ++dead;
        }
      }
    }
    if (static_cast<Py_ssize_t>(self->snapshots->size()) >= self->max_snapshots) {
      release(candidate);
      Py_RETURN_FALSE;
    }
    it = self->snapshots->emplace(root, Snapshot()).first;
  }
  release(it->second);
  std::swap(it->second, candidate); // candidate now holds nothing
  Py_RETURN_TRUE;
}

PyObject* DictTagGuard_forget(DictTagGuard* self, PyObject* /*unused*/) {
  clear_snapshots(self);
  Py_RETURN_NONE;
}

PyObject* DictTagGuard_get_hits(DictTagGuard* self, void* /*unused*/) {
  return PyLong_FromSsize_t(self->hits);
}

PyObject* DictTagGuard_get_misses(DictTagGuard* self, void* /*unused*/) {
  return PyLong_FromSsize_t(self->misses);
}

PyObject* DictTagGuard_get_size(DictTagGuard* self, void* /*unused*/) {
  Py_ssize_t n = 0;
  for (const auto& item : *self->snapshots) {
    n += static_cast<Py_ssize_t>(item.second.entries.size());
  }
  return PyLong_FromSsize_t(n);
}

PyObject* DictTagGuard_get_recorded(DictTagGuard* self, void* /*unused*/) {
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(self->snapshots->size()));
}

PyMethodDef DictTagGuard_methods[] = {
    {"record",
     reinterpret_cast<PyCFunction>(DictTagGuard_record),
     METH_VARARGS,
     "record(root, entries) -> bool: snapshot what the fast path compares for root"},
    {"forget",
     reinterpret_cast<PyCFunction>(DictTagGuard_forget),
     METH_NOARGS,
     "drop every snapshot: calls run the slow path until the next record"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef DictTagGuard_getset[] = {
    {"hits",
     reinterpret_cast<getter>(DictTagGuard_get_hits),
     nullptr,
     "calls the snapshot decided",
     nullptr},
    {"misses",
     reinterpret_cast<getter>(DictTagGuard_get_misses),
     nullptr,
     "calls that ran the slow path",
     nullptr},
    {"size",
     reinterpret_cast<getter>(DictTagGuard_get_size),
     nullptr,
     "entries of all snapshots",
     nullptr},
    {"recorded",
     reinterpret_cast<getter>(DictTagGuard_get_recorded),
     nullptr,
     "snapshots recorded (root objects)",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject DictTagGuardType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "torch._dynamo._dict_tag_guards_C",
    "Fast path of recursive dict-tag guards (backport of "
    "use_recursive_dict_tags_for_guards to torch 2.7.1).",
    -1,
    nullptr};

} // namespace

PyMODINIT_FUNC PyInit__dict_tag_guards_C() {
  DictTagGuardType.tp_name = "torch._dynamo._dict_tag_guards_C.DictTagGuard";
  DictTagGuardType.tp_basicsize = sizeof(DictTagGuard);
  DictTagGuardType.tp_flags =
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  DictTagGuardType.tp_doc =
      "DictTagGuard(slow_path, max_snapshots=1): a guard on a subtree; True when "
      "the dict tags recorded for this root still match, else slow_path(value).";
  DictTagGuardType.tp_new = DictTagGuard_new;
  DictTagGuardType.tp_dealloc = reinterpret_cast<destructor>(DictTagGuard_dealloc);
  DictTagGuardType.tp_traverse = reinterpret_cast<traverseproc>(DictTagGuard_traverse);
  DictTagGuardType.tp_clear = reinterpret_cast<inquiry>(DictTagGuard_clear);
  DictTagGuardType.tp_call = PyVectorcall_Call;
  DictTagGuardType.tp_vectorcall_offset = offsetof(DictTagGuard, vectorcall);
  DictTagGuardType.tp_methods = DictTagGuard_methods;
  DictTagGuardType.tp_getset = DictTagGuard_getset;
  if (PyType_Ready(&DictTagGuardType) < 0) {
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  Py_INCREF(&DictTagGuardType);
  if (PyModule_AddObject(m, "DictTagGuard", reinterpret_cast<PyObject*>(&DictTagGuardType)) < 0) {
    Py_DECREF(&DictTagGuardType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
