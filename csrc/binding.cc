// The only file that knows about Python: argument checking, buffer access and the GIL.
// All real work (decode, resize, batches, gathers) runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "augment.h"
#include "augment_decode.h"
#include "batch.h"
#include "convert.h"
#include "gather.h"
#include "jpeg.h"

namespace py = pybind11;
using fastload::BatchEngine;

namespace {

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

std::string describe_array(py::handle obj) {
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
void region_views(py::handle regions, std::vector<BufferView>* views,
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
py::array_t<int64_t, py::array::c_style> int_array(py::handle obj, const char* name, int64_t* n,
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

fastload::Worker& local_worker() {
  // Single-sample calls from any Python thread: scratch per OS thread, kept for its lifetime.
  static thread_local fastload::Worker worker;
  return worker;
}

fastload::SampleJob single_job(py::handle crop, py::handle out_hw, bool flip, int img_h,
                               int img_w) {
  fastload::SampleJob job;
  if (crop.is_none()) {
    job.height = img_h;
    job.width = img_w;
  } else {
    const auto c = int_tuple<4>(crop, "crop", INT32_MIN);
    job.top = c[0];
    job.left = c[1];
    job.height = c[2];
    job.width = c[3];
  }
  const auto hw = int_tuple<2>(out_hw, "out_hw", 1);
  job.out_h = hw[0];
  job.out_w = hw[1];
  job.flip = flip;
  return job;
}

py::tuple jpeg_info(py::handle buf) {
  BufferView b(buf, "buf");
  fastload::JpegHeader h;
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    fastload::Worker& w = local_worker();
    ok = w.jpeg.open(b.data(), static_cast<size_t>(b.size()), &h, &err);
    w.jpeg.close();
  }
  if (!ok) throw py::value_error(err);
  return py::make_tuple(h.height, h.width, h.components);
}

py::array decode_jpeg(py::handle buf) {
  BufferView b(buf, "buf");
  fastload::JpegHeader h;
  std::string err;
  bool ok;
  fastload::Worker& w = local_worker();
  {
    py::gil_scoped_release nogil;
    ok = w.jpeg.open(b.data(), static_cast<size_t>(b.size()), &h, &err);
  }
  if (!ok) throw py::value_error(err);
  py::array_t<uint8_t> out({h.height, h.width, 3});
  uint8_t* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    ok = w.jpeg.decode_full(dst, static_cast<ptrdiff_t>(h.width) * 3, &err);
  }
  if (!ok) throw py::value_error(err);
  return out;
}

// Runs one sample job into a fresh (out_h, out_w, 3) array with the GIL released.
py::array run_single(fastload::SampleJob& job) {
  py::array_t<uint8_t> out({job.out_h, job.out_w, 3});
  job.out = out.mutable_data();
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::process_sample(&local_worker(), job, &err);
  }
  if (!ok) throw py::value_error(err);
  return out;
}

py::array resize_crop(py::handle src, py::handle crop, py::handle out_hw, bool flip) {
  if (!py::isinstance<py::array_t<uint8_t>>(src)) {
    throw py::type_error("src: expected a uint8 numpy array of shape (H, W, 3), got " +
                         describe_array(src));
  }
  auto img = py::array_t<uint8_t, py::array::c_style>::ensure(src);
  if (img.ndim() != 3 || img.shape(2) != 3 || img.shape(0) < 1 || img.shape(1) < 1 ||
      img.shape(0) > INT32_MAX || img.shape(1) > INT32_MAX) {
    throw py::value_error("src: expected shape (H, W, 3), got " +
                          std::string(py::str(img.attr("shape"))));
  }
  fastload::SampleJob job = single_job(crop, out_hw, flip, static_cast<int>(img.shape(0)),
                                       static_cast<int>(img.shape(1)));
  job.encoding = fastload::kEncodingRawRgb;
  job.data = img.data();
  job.size = static_cast<size_t>(img.size());
  job.src_h = static_cast<int>(img.shape(0));
  job.src_w = static_cast<int>(img.shape(1));
  return run_single(job);
}

py::array decode_crop_resize(py::handle buf, py::handle crop, py::handle out_hw, bool flip,
                             bool dct_scaling) {
  BufferView b(buf, "buf");
  int img_h = 0, img_w = 0;
  if (crop.is_none()) {  // the crop is the whole image: read its size first
    py::tuple info = jpeg_info(buf);
    img_h = info[0].cast<int>();
    img_w = info[1].cast<int>();
  }
  fastload::SampleJob job = single_job(crop, out_hw, flip, img_h, img_w);
  job.encoding = fastload::kEncodingJpeg;
  job.data = b.data();
  job.size = static_cast<size_t>(b.size());
  job.dct_scaling = dct_scaling;
  return run_single(job);
}

// The fields every batch spec shares: item k reads region[k] of regs, from byte offset[k].
template <typename Spec>
void set_sources(Spec* spec, const std::vector<fastload::Region>& regs, int64_t n,
                 const py::array_t<int64_t, py::array::c_style>& region,
                 const py::array_t<int64_t, py::array::c_style>& offset) {
  spec->regions = regs.data();
  spec->num_regions = static_cast<int64_t>(regs.size());
  spec->n = n;
  spec->region = region.data();
  spec->offset = offset.data();
}

py::list decode_batch(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                      py::handle length, py::handle encoding, py::handle src_hw, py::handle crop,
                      py::handle flip, py::handle out, bool dct_scaling) {
  std::vector<BufferView> views;
  std::vector<fastload::Region> regs;
  region_views(regions, &views, &regs);

  int64_t n = -1;
  auto region_a = int_array(region, "region", &n, 0);
  auto offset_a = int_array(offset, "offset", &n, 0);
  auto length_a = int_array(length, "length", &n, 0);
  auto encoding_v = narrow<uint8_t>(int_array(encoding, "encoding", &n, 0), "encoding", 0, 255);
  auto flip_v = narrow<uint8_t>(int_array(flip, "flip", &n, 0), "flip", 0, 1);
  auto src_hw_v = narrow<int32_t>(int_array(src_hw, "src_hw", &n, 2), "src_hw", INT32_MIN,
                                  INT32_MAX);
  auto crop_v = narrow<int32_t>(int_array(crop, "crop", &n, 4), "crop", INT32_MIN, INT32_MAX);

  if (!py::isinstance<py::array_t<uint8_t>>(out)) {
    throw py::type_error("out: expected a uint8 numpy array of shape (" + std::to_string(n) +
                         ", H, W, 3), got " + describe_array(out));
  }
  py::array out_a = py::reinterpret_borrow<py::array>(out);
  if (out_a.ndim() != 4 || out_a.shape(0) != n || out_a.shape(3) != 3 || out_a.shape(1) < 1 ||
      out_a.shape(2) < 1 || out_a.shape(1) > INT32_MAX || out_a.shape(2) > INT32_MAX) {
    throw py::value_error("out: expected shape (" + std::to_string(n) + ", H, W, 3) with H, W >= 1"
                          ", got shape " + std::string(py::str(out_a.attr("shape"))));
  }
  if (!(out_a.flags() & py::array::c_style)) {
    throw py::value_error("out: expected a C-contiguous array (NHWC memory), got strides " +
                          std::string(py::str(out_a.attr("strides"))));
  }
  if (!out_a.writeable()) throw py::value_error("out: array is read-only");

  fastload::BatchSpec spec;
  set_sources(&spec, regs, n, region_a, offset_a);
  spec.length = length_a.data();
  spec.encoding = encoding_v.data();
  spec.src_hw = src_hw_v.data();
  spec.crop = crop_v.data();
  spec.flip = flip_v.data();
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  spec.out_h = static_cast<int>(out_a.shape(1));
  spec.out_w = static_cast<int>(out_a.shape(2));
  spec.dct_scaling = dct_scaling;

  std::vector<fastload::Failure> failures;
  {
    py::gil_scoped_release nogil;
    failures = pool.run(spec);
  }
  py::list result;
  for (auto& f : failures) result.append(py::make_tuple(f.index, f.message));
  return result;
}

// The output of a raw-byte copy: a writable C-contiguous numpy array of a numeric dtype.
py::array byte_out(py::handle out, const std::string& want) {
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

void gather_rows(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                 int64_t row_bytes, py::handle out) {
  std::vector<BufferView> views;
  std::vector<fastload::Region> regs;
  region_views(regions, &views, &regs);
  int64_t n = -1;
  auto region_a = int_array(region, "region", &n, 0);
  auto offset_a = int_array(offset, "offset", &n, 0);
  if (row_bytes < 0) {
    throw py::value_error("row_bytes must be >= 0, got " + std::to_string(row_bytes));
  }
  if (row_bytes > 0 && n > INT64_MAX / row_bytes) {
    throw py::value_error("n * row_bytes overflows: n=" + std::to_string(n) +
                          ", row_bytes=" + std::to_string(row_bytes));
  }
  const int64_t want = n * row_bytes;
  py::array out_a = byte_out(out, std::to_string(want) + " bytes");
  if (out_a.nbytes() != want) {
    throw py::value_error("out: has " + std::to_string(out_a.nbytes()) + " bytes (" +
                          describe_array(out) + "), expected n * row_bytes = " +
                          std::to_string(n) + " * " + std::to_string(row_bytes) + " = " +
                          std::to_string(want));
  }

  fastload::GatherSpec spec;
  set_sources(&spec, regs, n, region_a, offset_a);
  spec.row_bytes = row_bytes;
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::gather_rows(&pool.pool(), spec, &err);
  }
  if (!ok) throw py::value_error("gather_rows: " + err);
}

void gather_pieces(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                   py::handle length, py::handle dst, py::handle out) {
  std::vector<BufferView> views;
  std::vector<fastload::Region> regs;
  region_views(regions, &views, &regs);
  int64_t n = -1;
  auto region_a = int_array(region, "region", &n, 0);
  auto offset_a = int_array(offset, "offset", &n, 0);
  auto length_a = int_array(length, "length", &n, 0);
  auto dst_a = int_array(dst, "dst", &n, 0);
  py::array out_a = byte_out(out, "any size");
  fastload::PieceSpec spec;
  set_sources(&spec, regs, n, region_a, offset_a);
  spec.length = length_a.data();
  spec.dst = dst_a.data();
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  spec.out_bytes = out_a.nbytes();
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::gather_pieces(&pool.pool(), spec, &err);
  }
  if (!ok) throw py::value_error("gather_pieces: " + err);
}

std::vector<float> floats(py::handle seq) {
  std::vector<float> v;
  for (py::handle x : py::reinterpret_borrow<py::sequence>(seq)) v.push_back(x.cast<float>());
  return v;
}

void affine_u8_f32(py::handle src, py::handle out, py::handle scale_seq, py::handle shift_seq, bool avx2) {
  if (!PySequence_Check(scale_seq.ptr()) || !PySequence_Check(shift_seq.ptr())) {
    throw py::type_error("scale and shift: expected sequences of floats, got " + type_name(scale_seq) +
                         " and " + type_name(shift_seq));
  }
  const std::vector<float> scale = floats(scale_seq), shift = floats(shift_seq);
  const int64_t channels = static_cast<int64_t>(scale.size());
  if (channels < 1 || channels > fastload::kAffineMaxChannels || shift.size() != scale.size()) {
    throw py::value_error("scale and shift: expected one value per channel (1 to " +
                          std::to_string(fastload::kAffineMaxChannels) + " channels), got " +
                          std::to_string(scale.size()) + " and " + std::to_string(shift.size()));
  }
  if (!py::isinstance<py::array_t<uint8_t>>(src)) {
    throw py::type_error("src: expected a uint8 numpy array, got " + describe_array(src));
  }
  auto src_a = py::reinterpret_borrow<py::array>(src);
  if (!(src_a.flags() & py::array::c_style)) throw py::value_error("src: expected a C-contiguous array");
  if (src_a.ndim() < 1 || src_a.shape(src_a.ndim() - 1) != channels) {
    throw py::value_error("src: expected the last dimension to be the " + std::to_string(channels) +
                          " channels of scale and shift, got " + describe_array(src));
  }
  if (!py::isinstance<py::array_t<float>>(out)) {
    throw py::type_error("out: expected a float32 numpy array, got " + describe_array(out));
  }
  py::array out_a = byte_out(out, "float32");
  if (out_a.size() != src_a.size()) {
    throw py::value_error("out: has " + std::to_string(out_a.size()) + " elements (" + describe_array(out) +
                          "), src has " + std::to_string(src_a.size()));
  }
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::affine_u8_f32(static_cast<const uint8_t*>(src_a.data()), static_cast<float*>(out_a.mutable_data()),
                                 src_a.size(), static_cast<int>(channels), scale.data(), shift.data(), avx2, &err);
  }
  if (!ok) throw py::value_error("affine_u8_f32: " + err);
}

// A C-contiguous float64 array of shape (n, cols) (safe casts only: float and integer dtypes).
py::array_t<double, py::array::c_style> float_array(py::handle obj, const char* name, int64_t n, int64_t cols) {
  const std::string want = "(" + std::to_string(n) + ", " + std::to_string(cols) + ")";
  auto arr = py::array_t<double, py::array::c_style>::ensure(obj);
  if (!arr) {
    throw py::type_error(std::string(name) + ": expected a float array of shape " + want + ", got " +
                         describe_array(obj));
  }
  if (arr.ndim() != 2 || arr.shape(0) != n || arr.shape(1) != cols) {
    throw py::value_error(std::string(name) + ": expected shape " + want + ", got shape " +
                          std::string(py::str(arr.attr("shape"))));
  }
  return arr;
}

void augment_batch(BatchEngine& pool, py::handle images, py::handle op, py::handle offset, py::handle sample,
                   py::handle fparams, py::handle iparams) {
  if (!py::isinstance<py::array_t<uint8_t>>(images)) {
    throw py::type_error("images: expected a uint8 numpy array of shape (n, H, W, 3), got " + describe_array(images));
  }
  py::array img = py::reinterpret_borrow<py::array>(images);
  if (img.ndim() != 4 || img.shape(3) != 3 || img.shape(1) < 1 || img.shape(2) < 1 || img.shape(1) > INT32_MAX ||
      img.shape(2) > INT32_MAX) {
    throw py::value_error("images: expected shape (n, H, W, 3) with H, W >= 1, got shape " +
                          std::string(py::str(img.attr("shape"))));
  }
  if (!(img.flags() & py::array::c_style)) {
    throw py::value_error("images: expected a C-contiguous array (NHWC memory), got strides " +
                          std::string(py::str(img.attr("strides"))) + " for shape " +
                          std::string(py::str(img.attr("shape"))));
  }
  if (!img.writeable()) throw py::value_error("images: array is read-only (the operations run in place)");
  int64_t steps = -1, rows = -1;
  auto op_a = int_array(op, "op", &steps, 0);
  int64_t bounds = steps + 1;
  auto offset_a = int_array(offset, "offset", &bounds, 0);
  auto sample_a = int_array(sample, "sample", &rows, 0);
  auto iparams_a = int_array(iparams, "iparams", &rows, fastload::kAugParams);
  auto fparams_a = float_array(fparams, "fparams", rows, fastload::kAugParams);

  fastload::AugBatchSpec spec;
  spec.images = static_cast<uint8_t*>(img.mutable_data());
  spec.n = img.shape(0);
  spec.h = static_cast<int>(img.shape(1));
  spec.w = static_cast<int>(img.shape(2));
  spec.num_steps = steps;
  spec.op = op_a.data();
  spec.offset = offset_a.data();
  spec.num_rows = rows;
  spec.sample = sample_a.data();
  spec.fparam = fparams_a.data();
  spec.iparam = iparams_a.data();
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::augment_batch(&pool.pool(), spec, &err);
  }
  if (!ok) throw py::value_error("augment_batch: " + err);
}

// An augmentation plan's arrays (fastload/_augment/engine_native.py native_arrays + geometry_arrays) for n
// tiles of h x w, converted and kept alive as long as this object (its spec points into them).
struct AugArrays {
  py::array_t<int64_t, py::array::c_style> op, offset, sample, iparams, vflip, has_affine, interpolation;
  py::array_t<double, py::array::c_style> fparams, affine, fill;
  std::vector<uint8_t> vflip_v, has_affine_v, interpolation_v, pad_active_v;
  std::vector<int32_t> pad_hw_v, pad_rows_v, pad_cols_v;
  py::array_t<double, py::array::c_style> pad_fill;
  fastload::AugBatchSpec spec;

  AugArrays(py::handle augment, int64_t n, int h, int w) {
    const size_t len = py::isinstance<py::tuple>(augment) ? py::len(augment) : 0;
    if (len != 10 && len != 15) {
      throw py::type_error("augment: expected a tuple of 10 arrays (vflip, has_affine, affine, interpolation, fill, "
                           "op, offset, sample, fparams, iparams), or 15 with (pad_active, pad_hw, pad_rows, "
                           "pad_cols, pad_fill), got " + type_name(augment) + " of length " + std::to_string(len));
    }
    py::tuple t = py::reinterpret_borrow<py::tuple>(augment);
    int64_t nn = n;
    vflip_v = narrow<uint8_t>(int_array(t[0], "augment vflip", &nn, 0), "augment vflip", 0, 1);
    has_affine_v = narrow<uint8_t>(int_array(t[1], "augment has_affine", &nn, 0), "augment has_affine", 0, 1);
    affine = float_array(t[2], "augment affine", n, 6);
    interpolation_v = narrow<uint8_t>(int_array(t[3], "augment interpolation", &nn, 0), "augment interpolation", 0, 1);
    fill = float_array(t[4], "augment fill", n, 3);
    int64_t steps = -1, rows = -1;
    op = int_array(t[5], "augment op", &steps, 0);
    int64_t bounds = steps + 1;
    offset = int_array(t[6], "augment offset", &bounds, 0);
    sample = int_array(t[7], "augment sample", &rows, 0);
    fparams = float_array(t[8], "augment fparams", rows, fastload::kAugParams);
    iparams = int_array(t[9], "augment iparams", &rows, fastload::kAugParams);
    spec.n = n;
    spec.h = h;
    spec.w = w;
    spec.num_steps = steps;
    spec.op = op.data();
    spec.offset = offset.data();
    spec.num_rows = rows;
    spec.sample = sample.data();
    spec.fparam = fparams.data();
    spec.iparam = iparams.data();
    spec.vflip = vflip_v.data();
    spec.has_affine = has_affine_v.data();
    spec.affine = affine.data();
    spec.interpolation = interpolation_v.data();
    spec.fill = fill.data();
    if (len == 15) {
      int64_t rows_h = h, cols_w = w;
      pad_active_v = narrow<uint8_t>(int_array(t[10], "augment pad_active", &nn, 0), "augment pad_active", 0, 1);
      pad_hw_v = narrow<int32_t>(int_array(t[11], "augment pad_hw", &nn, 2), "augment pad_hw", 0, INT32_MAX);
      pad_rows_v =
          narrow<int32_t>(int_array(t[12], "augment pad_rows", &nn, rows_h), "augment pad_rows", -1, INT32_MAX);
      pad_cols_v =
          narrow<int32_t>(int_array(t[13], "augment pad_cols", &nn, cols_w), "augment pad_cols", -1, INT32_MAX);
      pad_fill = float_array(t[14], "augment pad_fill", n, 3);
      spec.pad_active = pad_active_v.data();
      spec.pad_hw = pad_hw_v.data();
      spec.pad_rows = pad_rows_v.data();
      spec.pad_cols = pad_cols_v.data();
      spec.pad_fill = pad_fill.data();
    }
  }
};

// augment_batch with the plan's geometry: tiles (n, H, W, 3) in place.
void augment_tiles(BatchEngine& pool, py::handle images, py::handle augment) {
  if (!py::isinstance<py::array_t<uint8_t>>(images)) {
    throw py::type_error("images: expected a uint8 numpy array of shape (n, H, W, 3), got " + describe_array(images));
  }
  py::array img = py::reinterpret_borrow<py::array>(images);
  if (img.ndim() != 4 || img.shape(3) != 3 || img.shape(1) < 1 || img.shape(2) < 1 || img.shape(1) > INT32_MAX ||
      img.shape(2) > INT32_MAX || !(img.flags() & py::array::c_style) || !img.writeable()) {
    throw py::value_error("images: expected a writable C-contiguous array of shape (n, H, W, 3), got shape " +
                          std::string(py::str(img.attr("shape"))));
  }
  AugArrays a(augment, img.shape(0), static_cast<int>(img.shape(1)), static_cast<int>(img.shape(2)));
  if (a.spec.pad_active != nullptr) {
    throw py::value_error("augment_tiles: padded crop windows are assembled while decoding (decode_augment_batch); "
                          "tiles given here are already assembled: pass the 10-array augment tuple");
  }
  a.spec.images = static_cast<uint8_t*>(img.mutable_data());
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::augment_batch(&pool.pool(), a.spec, &err);
  }
  if (!ok) throw py::value_error("augment_tiles: " + err);
}

// decode_batch fused with the augmentation: each sample augmented by the thread that decoded it.
py::list decode_augment_batch(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                              py::handle length, py::handle encoding, py::handle src_hw, py::handle crop,
                              py::handle flip, py::handle out, py::handle augment, bool dct_scaling) {
  std::vector<BufferView> views;
  std::vector<fastload::Region> regs;
  region_views(regions, &views, &regs);
  int64_t n = -1;
  auto region_a = int_array(region, "region", &n, 0);
  auto offset_a = int_array(offset, "offset", &n, 0);
  auto length_a = int_array(length, "length", &n, 0);
  auto encoding_v = narrow<uint8_t>(int_array(encoding, "encoding", &n, 0), "encoding", 0, 255);
  auto flip_v = narrow<uint8_t>(int_array(flip, "flip", &n, 0), "flip", 0, 1);
  auto src_hw_v = narrow<int32_t>(int_array(src_hw, "src_hw", &n, 2), "src_hw", INT32_MIN, INT32_MAX);
  auto crop_v = narrow<int32_t>(int_array(crop, "crop", &n, 4), "crop", INT32_MIN, INT32_MAX);
  if (!py::isinstance<py::array_t<uint8_t>>(out)) {
    throw py::type_error("out: expected a uint8 numpy array of shape (" + std::to_string(n) + ", H, W, 3), got " +
                         describe_array(out));
  }
  py::array out_a = py::reinterpret_borrow<py::array>(out);
  if (out_a.ndim() != 4 || out_a.shape(0) != n || out_a.shape(3) != 3 || out_a.shape(1) < 1 || out_a.shape(2) < 1 ||
      out_a.shape(1) > INT32_MAX || out_a.shape(2) > INT32_MAX || !(out_a.flags() & py::array::c_style) ||
      !out_a.writeable()) {
    throw py::value_error("out: expected a writable C-contiguous array of shape (" + std::to_string(n) +
                          ", H, W, 3) with H, W >= 1, got shape " + std::string(py::str(out_a.attr("shape"))));
  }
  fastload::BatchSpec spec;
  set_sources(&spec, regs, n, region_a, offset_a);
  spec.length = length_a.data();
  spec.encoding = encoding_v.data();
  spec.src_hw = src_hw_v.data();
  spec.crop = crop_v.data();
  spec.flip = flip_v.data();
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  spec.out_h = static_cast<int>(out_a.shape(1));
  spec.out_w = static_cast<int>(out_a.shape(2));
  spec.dct_scaling = dct_scaling;
  AugArrays a(augment, n, spec.out_h, spec.out_w);
  std::vector<fastload::Failure> failures;
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::decode_augment_batch(&pool, spec, a.spec, &failures, &err);
  }
  if (!ok) throw py::value_error("decode_augment_batch: " + err);
  py::list result;
  for (auto& f : failures) result.append(py::make_tuple(f.index, f.message));
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "fastload native core: JPEG decode, crop/resize/flip, batched decoding and row gathers.";

  // The image encodings of the packed "meta" column, defined once (csrc/batch.h); Python reads them from
  // here (fastload/formats/_layout.py).
  m.attr("IMAGE_JPEG") = static_cast<int>(fastload::kEncodingJpeg);
  m.attr("IMAGE_RAW") = static_cast<int>(fastload::kEncodingRawRgb);

  m.def("jpeg_info", &jpeg_info, py::arg("buf"),
        "jpeg_info(buf) -> (height, width, components) from the JPEG header.\n"
        "Raises ValueError on corrupt data.");
  m.def("decode_jpeg", &decode_jpeg, py::arg("buf"),
        "decode_jpeg(buf) -> uint8 array (H, W, 3), full-size RGB.\n"
        "Grayscale is replicated; CMYK/YCCK is converted like PIL's convert('RGB').");
  m.def("resize_crop", &resize_crop, py::arg("src"), py::arg("crop"), py::arg("out_hw"),
        py::arg("flip") = false,
        "resize_crop(src, crop, out_hw, flip=False) -> uint8 array (out_h, out_w, 3).\n"
        "crop = (top, left, height, width) or None for the whole image; PIL BILINEAR "
        "(antialiased) resize, then horizontal flip if flip.");
  m.def("decode_crop_resize", &decode_crop_resize, py::arg("buf"), py::arg("crop"),
        py::arg("out_hw"), py::arg("flip") = false, py::arg("dct_scaling") = true,
        "decode_crop_resize(buf, crop, out_hw, flip=False, dct_scaling=True) -> uint8 array\n"
        "(out_h, out_w, 3): decode a JPEG, crop, resize and flip like one decode_batch sample.");

  py::class_<BatchEngine>(m, "Pool", "Persistent native thread pool (0 = calling thread only).")
      .def(py::init<int>(), py::arg("num_threads"))
      .def_property_readonly("size", &BatchEngine::size)
      .def("__repr__",
           [](const BatchEngine& p) { return "fastload._C.Pool(" + std::to_string(p.size()) + ")"; });

  m.def("decode_batch", &decode_batch, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("encoding"), py::arg("src_hw"),
        py::arg("crop"), py::arg("flip"), py::arg("out"), py::arg("dct_scaling") = true,
        "decode_batch(pool, regions, region, offset, length, encoding, src_hw, crop, flip, out,\n"
        "             dct_scaling=True) -> list[(index, message)] of failed samples.\n"
        "Sample k's bytes are regions[region[k]][offset[k]:offset[k]+length[k]]; encoding 0 = JPEG,\n"
        "1 = raw RGB (src_hw[k] = (H, W)); crop[k] = (top, left, height, width); the result is\n"
        "written into out[k] (out: C-contiguous uint8 (n, H, W, 3)); failed samples are zeroed.");

  m.attr("AFFINE_MAX_CHANNELS") = fastload::kAffineMaxChannels;
  m.def("affine_u8_f32", &affine_u8_f32, py::arg("src"), py::arg("out"), py::arg("scale"), py::arg("shift"),
        py::arg("avx2") = true,
        "affine_u8_f32(src, out, scale, shift, avx2=True) -> None\n"
        "out = float32(src) * scale[c] + shift[c] for channel c = the last dimension of src (uint8,\n"
        "C-contiguous; out: float32, C-contiguous, writable, as many elements, not overlapping src):\n"
        "ToDtype(float32, scale=True) + Normalize in one pass. A multiply then an add (no fused\n"
        "multiply-add), the same bits with AVX2 (avx2=True, where the CPU has it) or without. The GIL\n"
        "is released.");

  m.attr("AUGMENT_PARAMS") = fastload::kAugParams;
  m.attr("AUGMENT_OPS") = [] {
    py::tuple names(static_cast<size_t>(fastload::kAugNumOps));
    for (int k = 0; k < fastload::kAugNumOps; ++k) names[k] = fastload::aug_op_name(k);
    return names;
  }();
  m.def("augment_batch", &augment_batch, py::arg("pool"), py::arg("images"), py::arg("op"), py::arg("offset"),
        py::arg("sample"), py::arg("fparams"), py::arg("iparams"),
        "augment_batch(pool, images, op, offset, sample, fparams, iparams) -> None\n"
        "Runs an augmentation plan's pixel steps in place on images (uint8 (n, H, W, 3), C-contiguous,\n"
        "writable): step s applies operation op[s] (an index into AUGMENT_OPS) to the tiles\n"
        "sample[offset[s]:offset[s+1]], row j with the parameters fparams[j] (float64 (m, 4)) and\n"
        "iparams[j] (int64 (m, 4)). Everything is checked first (ValueError naming the step, row and\n"
        "sample, images untouched); then each tile runs its operations in step order on one of the\n"
        "pool's threads (results do not depend on the thread count). The GIL is released.");

  m.def("gather_pieces", &gather_pieces, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("dst"), py::arg("out"),
        "gather_pieces(pool, regions, region, offset, length, dst, out) -> None\n"
        "Copies regions[region[k]][offset[k]:offset[k]+length[k]] to the bytes of out starting at\n"
        "dst[k] (out: any numeric dtype and shape, C-contiguous, writable) for k in range(n): the\n"
        "variable-length rows of a padded or packed batch. Every piece is bounds-checked first: a\n"
        "bad one raises ValueError naming it, with out untouched. 2 MiB and more are split across\n"
        "the pool's threads; the GIL is released.");

  m.def("gather_rows", &gather_rows, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("row_bytes"), py::arg("out"),
        "gather_rows(pool, regions, region, offset, row_bytes, out) -> None\n"
        "Copies regions[region[k]][offset[k]:offset[k]+row_bytes] into the k-th row_bytes of out\n"
        "(any dtype and shape; C-contiguous, writable, n * row_bytes bytes) for k in range(n).\n"
        "Every row is bounds-checked first: a bad one raises ValueError naming it, with out\n"
        "untouched. Batches of 2 MiB and more are split across the pool's threads (if it has two\n"
        "or more); smaller ones are copied in the calling thread. The GIL is released.");


  m.def("augment_tiles", &augment_tiles, py::arg("pool"), py::arg("images"), py::arg("augment"),
        "augment_tiles(pool, images, augment) -> None\n"
        "augment_batch with the plan's geometry: augment = (vflip (n,), has_affine (n,), affine (n, 6),\n"
        "interpolation (n,) 0 nearest / 1 bilinear, fill (n, 3), op, offset, sample, fparams, iparams); each\n"
        "tile is flipped top-bottom, warped (PIL's Image.transform AFFINE), then runs its operations. Checked\n"
        "first (ValueError, images untouched). The GIL is released.");
  m.def("decode_augment_batch", &decode_augment_batch, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("encoding"), py::arg("src_hw"), py::arg("crop"),
        py::arg("flip"), py::arg("out"), py::arg("augment"), py::arg("dct_scaling") = true,
        "decode_augment_batch(pool, regions, ..., flip, out, augment, dct_scaling=True) -> failures\n"
        "decode_batch, each sample then augmented (augment as in augment_tiles) by the thread that decoded\n"
        "it, while its tile is in that core's cache. A bad augmentation raises ValueError before any\n"
        "sample is written; failed samples are zeroed and listed as decode_batch's.");
}
