// What the binding files (bind_*.cc, binding.cc) share: argument checking, buffer access and the
// register_<area> functions. Only these files include Python; the rest of csrc/ is plain C++.
// All real work (decode, resize, batches, gathers) runs with the GIL released.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "batch.h"

namespace py = pybind11;

namespace fastload_bind {

using fastload::BatchEngine;

// One per area, each adding its functions to the module (called in order by binding.cc).
void register_decode(py::module_& m);
void register_convert(py::module_& m);
void register_augment(py::module_& m);
void register_gather(py::module_& m);

inline std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

inline std::string describe_array(py::handle obj) {
  if (py::isinstance<py::array>(obj)) {
    py::array a = py::reinterpret_borrow<py::array>(obj);
    return "dtype " + std::string(py::str(a.dtype())) + " shape " +
           std::string(py::str(a.attr("shape")));
  }
  return "an object of type " + type_name(obj);
}

// A contiguous, read-only view of any object exporting the buffer protocol. Must be destroyed
// with the GIL held.
class BufferView {
 public:
  BufferView(py::handle obj, const std::string& what) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw py::type_error(what + ": expected a contiguous bytes-like object (bytes, memoryview, "
                           "mmap, numpy uint8 array), got " + type_name(obj));
    }
    held_ = true;
  }
  BufferView(BufferView&& o) noexcept : view_(o.view_), held_(o.held_) { o.held_ = false; }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  BufferView& operator=(BufferView&&) = delete;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  int64_t size() const { return static_cast<int64_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Exports every buffer in the `regions` list; views keep them exported until destroyed.
inline void region_views(py::handle regions, std::vector<BufferView>* views,
                  std::vector<fastload::Region>* regs) {
  if (!py::isinstance<py::sequence>(regions) || py::isinstance<py::str>(regions) ||
      PyObject_CheckBuffer(regions.ptr())) {
    throw py::type_error("regions: expected a list of bytes-like objects, got " +
                         type_name(regions));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(regions);
  views->reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    views->emplace_back(seq[i], "regions[" + std::to_string(i) + "]");
    regs->push_back({views->back().data(), views->back().size()});
  }
}

// Converts obj to a C-contiguous int64 array (safe casts only: any integer or bool dtype) of
// the given shape (-1 = any length, whose value is returned through *n if *n < 0).
inline py::array_t<int64_t, py::array::c_style> int_array(py::handle obj, const char* name, int64_t* n,
                                                    int64_t cols) {
  const std::string want = cols ? "(n, " + std::to_string(cols) + ")" : std::string("(n,)");
  auto arr = py::array_t<int64_t, py::array::c_style>::ensure(obj);
  if (!arr) {
    throw py::type_error(std::string(name) + ": expected an integer array of shape " + want +
                         ", got " + describe_array(obj));
  }
  const bool shape_ok = cols ? (arr.ndim() == 2 && arr.shape(1) == cols) : arr.ndim() == 1;
  if (!shape_ok || (*n >= 0 && arr.shape(0) != *n)) {
    const std::string expect = *n >= 0 ? (cols ? "(" + std::to_string(*n) + ", " +
                                                     std::to_string(cols) + ")"
                                               : "(" + std::to_string(*n) + ",)")
                                       : want;
    throw py::value_error(std::string(name) + ": expected shape " + expect + ", got shape " +
                          std::string(py::str(arr.attr("shape"))));
  }
  if (*n < 0) *n = arr.shape(0);
  return arr;
}

// Narrows int64 values into [lo, hi], naming the first offender.
template <typename T>
std::vector<T> narrow(const py::array_t<int64_t, py::array::c_style>& a, const char* name,
                      int64_t lo, int64_t hi) {
  const int64_t* p = a.data();
  std::vector<T> out(static_cast<size_t>(a.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < lo || p[i] > hi) {
      throw py::value_error(std::string(name) + ": value " + std::to_string(p[i]) +
                            " at flat position " + std::to_string(i) + " is outside [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out[i] = static_cast<T>(p[i]);
  }
  return out;
}

// Reads a fixed-length tuple of ints (e.g. crop or out_hw) with range checks.
template <size_t N>
std::array<int, N> int_tuple(py::handle obj, const char* name, int64_t lo) {
  int64_t n = static_cast<int64_t>(N);
  auto arr = int_array(obj, name, &n, 0);
  auto v = narrow<int>(arr, name, lo, INT32_MAX);
  std::array<int, N> out;
  for (size_t i = 0; i < N; ++i) out[i] = v[i];
  return out;
}

// A batch's sources, checked and held for as long as the batch runs (the region views must be released with the
// GIL held): item k reads regions[region[k]] from byte offset[k]; n() is their common length, which the callers'
// further per-item arrays must match. set(spec) fills the fields every batch spec shares.
class Sources {
 public:
  Sources(py::handle regions, py::handle region, py::handle offset) {
    region_views(regions, &views_, &regs_);
    region_ = int_array(region, "region", &n_, 0);
    offset_ = int_array(offset, "offset", &n_, 0);
  }
  Sources(const Sources&) = delete;
  Sources& operator=(const Sources&) = delete;

  int64_t n() const { return n_; }

  template <typename Spec>
  void set(Spec* spec) const {
    spec->regions = regs_.data();
    spec->num_regions = static_cast<int64_t>(regs_.size());
    spec->n = n_;
    spec->region = region_.data();
    spec->offset = offset_.data();
  }

 private:
  std::vector<BufferView> views_;
  std::vector<fastload::Region> regs_;
  int64_t n_ = -1;
  py::array_t<int64_t, py::array::c_style> region_, offset_;
};

// The output of a raw-byte copy: a writable C-contiguous numpy array of a numeric dtype.
inline py::array byte_out(py::handle out, const std::string& want) {
  if (!py::isinstance<py::array>(out)) {
    throw py::type_error("out: expected a writable C-contiguous numpy array of " + want +
                         ", got " + describe_array(out) + " (for a torch tensor pass tensor.numpy())");
  }
  py::array out_a = py::reinterpret_borrow<py::array>(out);
  if (out_a.dtype().attr("hasobject").cast<bool>()) {
    throw py::type_error("out: dtype " + std::string(py::str(out_a.dtype())) +
                         " holds Python objects; rows are raw bytes, use a numeric dtype");
  }
  if (!(out_a.flags() & py::array::c_style)) {
    throw py::value_error("out: expected a C-contiguous array, got strides " +
                          std::string(py::str(out_a.attr("strides"))) +
                          "; gather into np.empty(...) and copy, or pass a contiguous view");
  }
  if (!out_a.writeable()) throw py::value_error("out: array is read-only");
  return out_a;
}

// decode_batch's (and decode_augment_batch's) arguments, checked, held for as long as the batch runs (the
// region views must be released with the GIL held), and set into ``spec``: sample k's bytes are
// regions[region[k]][offset[k]:offset[k]+length[k]], written into out[k] (C-contiguous uint8 (n, H, W, 3)).
class DecodeBatchArgs {
 public:
  DecodeBatchArgs(py::handle regions, py::handle region, py::handle offset, py::handle length,
                  py::handle encoding, py::handle src_hw, py::handle crop, py::handle flip, py::handle out,
                  bool dct_scaling, py::handle interpolation = py::none(), py::handle frames = py::none())
      : sources_(regions, region, offset), n_(sources_.n()) {
    length_ = int_array(length, "length", &n_, 0);
    encoding_ = narrow<uint8_t>(int_array(encoding, "encoding", &n_, 0), "encoding", 0, 255);
    flip_ = narrow<uint8_t>(int_array(flip, "flip", &n_, 0), "flip", 0, 1);
    if (!interpolation.is_none()) {  // per sample: 0 bilinear, 1 bicubic (resize.h's ResizeFilter)
      interpolation_ = narrow<uint8_t>(int_array(interpolation, "interpolation", &n_, 0), "interpolation", 0, 1);
      spec.interpolation = interpolation_.data();
    }
    src_hw_ = narrow<int32_t>(int_array(src_hw, "src_hw", &n_, 2), "src_hw", INT32_MIN, INT32_MAX);
    crop_ = narrow<int32_t>(int_array(crop, "crop", &n_, 4), "crop", INT32_MIN, INT32_MAX);
    if (!frames.is_none()) {  // per sample (top, left, height, width, resize_h, resize_w, y, x): Plan.frames
      frames_ = narrow<int32_t>(int_array(frames, "frames", &n_, 8), "frames", INT32_MIN, INT32_MAX);
      spec.frames = frames_.data();
    }
    if (!py::isinstance<py::array_t<uint8_t>>(out)) {
      throw py::type_error("out: expected a uint8 numpy array of shape (" + std::to_string(n_) +
                           ", H, W, 3), got " + describe_array(out));
    }
    py::array out_a = py::reinterpret_borrow<py::array>(out);
    if (out_a.ndim() != 4 || out_a.shape(0) != n_ || out_a.shape(3) != 3 || out_a.shape(1) < 1 ||
        out_a.shape(2) < 1 || out_a.shape(1) > INT32_MAX || out_a.shape(2) > INT32_MAX) {
      throw py::value_error("out: expected shape (" + std::to_string(n_) + ", H, W, 3) with H, W >= 1"
                            ", got shape " + std::string(py::str(out_a.attr("shape"))));
    }
    if (!(out_a.flags() & py::array::c_style)) {
      throw py::value_error("out: expected a C-contiguous array (NHWC memory), got strides " +
                            std::string(py::str(out_a.attr("strides"))));
    }
    if (!out_a.writeable()) throw py::value_error("out: array is read-only");
    sources_.set(&spec);
    spec.length = length_.data();
    spec.encoding = encoding_.data();
    spec.src_hw = src_hw_.data();
    spec.crop = crop_.data();
    spec.flip = flip_.data();
    spec.out = static_cast<uint8_t*>(out_a.mutable_data());
    spec.out_h = static_cast<int>(out_a.shape(1));
    spec.out_w = static_cast<int>(out_a.shape(2));
    spec.dct_scaling = dct_scaling;
  }
  DecodeBatchArgs(const DecodeBatchArgs&) = delete;
  DecodeBatchArgs& operator=(const DecodeBatchArgs&) = delete;

  int64_t n() const { return n_; }
  fastload::BatchSpec spec;

 private:
  Sources sources_;
  int64_t n_;
  py::array_t<int64_t, py::array::c_style> length_;
  std::vector<uint8_t> encoding_, flip_, interpolation_;
  std::vector<int32_t> src_hw_, crop_, frames_;
};

// A batch's failed samples as decode_batch returns them: [(index, message)].
inline py::list failure_list(const std::vector<fastload::Failure>& failures) {
  py::list result;
  for (auto& f : failures) result.append(py::make_tuple(f.index, f.message));
  return result;
}

}  // namespace fastload_bind
