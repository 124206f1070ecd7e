// Python objects <-> grpc's byte buffers and metadata (called with the GIL held).
//
// Metadata reaches Python as grpc.aio gives it: a key or a value that is not UTF-8 decoded as Latin-1, a
// "-bin" value as bytes. A reply part of kZeroCopyFrom bytes or more that its owner cannot write to is
// sent from the owner's memory: the buffer export is held (Held) until grpc lets go of the slice, and let
// go of on the Python thread (a kRelease event, then Release).

#include "frontdoor.h"  // first: Python.h comes before any system header

#include <cstring>

namespace mcp_frontdoor {

namespace {

constexpr Py_ssize_t kZeroCopyFrom = 64 << 10;

// Called by grpc (any thread, no GIL) when it lets go of a slice: the release waits for the Python thread.
void ReleaseHeld(void* p) {
  auto* held = static_cast<Held*>(p);
  held->door->Post(Event{kRelease, 0, nullptr, grpc::ByteBuffer(), false, held});
}

// As grpc.aio decodes a metadata key or a text value: UTF-8, else Latin-1 (any bytes decode).
PyObject* Text(grpc::string_ref s) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  if (out == nullptr && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
    PyErr_Clear();
    out = PyUnicode_DecodeLatin1(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  }
  return out;
}

}  // namespace

PyObject* Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid()) return PyBytes_FromStringAndSize("", 0);
  grpc::Status st = buffer.Dump(&slices);
  if (!st.ok()) {
    PyErr_SetString(PyExc_RuntimeError, st.error_message().c_str());
    return nullptr;
  }
  Py_ssize_t size = 0;
  for (auto& s : slices) size += static_cast<Py_ssize_t>(s.size());
  if (slices.size() == 1) {
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slices[0].begin()), size);
  }
  PyObject* out = PyBytes_FromStringAndSize(nullptr, size);
  if (out == nullptr) return nullptr;
  char* at = PyBytes_AS_STRING(out);
  for (auto& s : slices) {
    std::memcpy(at, s.begin(), s.size());
    at += s.size();
  }
  return out;
}

void Release(Held* held) {
  PyBuffer_Release(&held->view);
  delete held;
}

bool Buffer(Door* door, PyObject* data, grpc::ByteBuffer* out) {
  std::vector<grpc::Slice> slices;
  std::string small;  // adjacent small parts, copied into one slice
  auto flush = [&] {
    if (!small.empty()) {
      slices.emplace_back(small.data(), small.size());
      small.clear();
    }
  };
  auto add = [&](PyObject* part) {
    Py_buffer view;
    if (PyObject_GetBuffer(part, &view, PyBUF_SIMPLE) != 0) return false;
    if (view.len < kZeroCopyFrom || !view.readonly) {  // a writable buffer may change before it is sent
      small.append(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
      PyBuffer_Release(&view);
      return true;
    }
    flush();
    auto* held = new Held{door, view};
    slices.emplace_back(view.buf, static_cast<size_t>(view.len), &ReleaseHeld, held);
    return true;
  };
  if (PyList_Check(data) || PyTuple_Check(data)) {
    PyObject* seq = PySequence_Fast(data, "a reply is a bytes-like object or a sequence of them");
    if (seq == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
      if (!add(PySequence_Fast_GET_ITEM(seq, i))) {
        Py_DECREF(seq);
        return false;  // the slices made so far release what they hold
      }
    }
    Py_DECREF(seq);
  } else if (!add(data)) {
    return false;
  }
  flush();
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
  return true;
}

std::string BadMetadata(const std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& [key, value] : pairs) {
    if (key.empty() || key.rfind("grpc-", 0) == 0 || key[0] == ':') {
      return "key \"" + key + "\" is reserved or empty";
    }
    for (unsigned char c : key) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
        return "key \"" + key + "\" has a character other than a-z 0-9 - _ .";
      }
    }
    bool binary = key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
    if (binary) continue;
    for (unsigned char c : value) {
      if (c < 0x20 || c > 0x7e) return "the value of \"" + key + "\" is not printable ASCII";
    }
  }
  return "";
}

PyObject* Metadata(const std::multimap<grpc::string_ref, grpc::string_ref>& md) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(md.size()));
  if (out == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const auto& [key, value] : md) {
    bool binary = key.size() > 4 && std::memcmp(key.data() + key.size() - 4, "-bin", 4) == 0;
    PyObject* k = Text(key);
    PyObject* v = binary ? PyBytes_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()))
                         : Text(value);
    PyObject* item = (k != nullptr && v != nullptr) ? PyTuple_Pack(2, k, v) : nullptr;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i++, item);
  }
  return out;
}

PyObject* Auth(const grpc::AuthContext* auth) {
  PyObject* out = PyDict_New();
  if (out == nullptr || auth == nullptr) return out;
  for (auto it = auth->begin(); it != auth->end(); ++it) {
    const auto& prop = *it;
    PyObject* key = PyUnicode_FromStringAndSize(prop.first.data(), static_cast<Py_ssize_t>(prop.first.size()));
    PyObject* value = PyBytes_FromStringAndSize(prop.second.data(), static_cast<Py_ssize_t>(prop.second.size()));
    if (key == nullptr || value == nullptr) {
      Py_XDECREF(key);
      Py_XDECREF(value);
      Py_DECREF(out);
      return nullptr;
    }
    PyObject* list = PyDict_GetItemWithError(out, key);
    if (list == nullptr) {
      if (PyErr_Occurred() || (list = PyList_New(0)) == nullptr || PyDict_SetItem(out, key, list) != 0) {
        Py_XDECREF(list);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(out);
        return nullptr;
      }
      Py_DECREF(list);  // the dict holds it
    }
    int rc = PyList_Append(list, value);
    Py_DECREF(key);
    Py_DECREF(value);
    if (rc != 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

}  // namespace mcp_frontdoor
