// The mask bindings (fields/mask.py): decode_mask (one PNG, for ds[i] and checks) and decode_mask_batch (a
// batch moved with its image's plan into (n, H, W) uint8 rows, on the pool's threads, GIL released).
#include "bind_common.h"

#include <cstring>
#include <string>
#include <vector>

#include "mask.h"

namespace fastload_bind {
namespace {

template <typename T>
std::vector<T> column(py::handle obj, const char* name, int64_t n, int64_t cols, int64_t lo, int64_t hi) {
  return narrow<T>(int_array(obj, name, &n, cols), name, lo, hi);
}

py::array decode_mask(py::handle data, int h, int w) {
  BufferView view(data, "data");
  std::vector<uint8_t> pixels;
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::decode_mask_png(view.data(), static_cast<size_t>(view.size()), h, w, &pixels, &err);
  }
  if (!ok) throw py::value_error(err);
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(h), static_cast<py::ssize_t>(w)});
  std::memcpy(out.mutable_data(), pixels.data(), pixels.size());
  return out;
}

py::list decode_mask_batch(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                           py::handle length, py::handle src_hw, py::handle crop, py::handle box_hw,
                           py::handle padded, py::handle rows, py::handle cols, py::handle hflip, py::handle vflip,
                           py::handle has_affine, py::handle affine, py::handle fill, py::handle out,
                           py::handle frames) {
  const Sources sources(regions, region, offset);
  int64_t n = sources.n();
  auto length_a = int_array(length, "length", &n, 0);
  if (!py::isinstance<py::array_t<uint8_t>>(out)) {
    throw py::type_error("out: expected a uint8 numpy array of shape (" + std::to_string(n) + ", H, W), got " +
                         describe_array(out));
  }
  py::array out_a = py::reinterpret_borrow<py::array>(out);
  if (out_a.ndim() != 3 || out_a.shape(0) != n || out_a.shape(1) < 1 || out_a.shape(2) < 1 ||
      out_a.shape(1) > INT32_MAX || out_a.shape(2) > INT32_MAX) {
    throw py::value_error("out: expected shape (" + std::to_string(n) + ", H, W) with H, W >= 1, got shape " +
                          std::string(py::str(out_a.attr("shape"))));
  }
  if (!(out_a.flags() & py::array::c_style) || !out_a.writeable()) {
    throw py::value_error("out: expected a writable C-contiguous array");
  }
  const int64_t oh = out_a.shape(1), ow = out_a.shape(2);
  auto src_hw_v = column<int32_t>(src_hw, "src_hw", n, 2, INT32_MIN, INT32_MAX);
  auto crop_v = column<int32_t>(crop, "crop", n, 4, INT32_MIN, INT32_MAX);
  auto box_v = column<int32_t>(box_hw, "box_hw", n, 2, INT32_MIN, INT32_MAX);
  auto padded_v = column<uint8_t>(padded, "padded", n, 0, 0, 1);
  auto rows_v = column<int32_t>(rows, "rows", n, oh, -1, INT32_MAX);
  auto cols_v = column<int32_t>(cols, "cols", n, ow, -1, INT32_MAX);
  auto hflip_v = column<uint8_t>(hflip, "hflip", n, 0, 0, 1);
  auto vflip_v = column<uint8_t>(vflip, "vflip", n, 0, 0, 1);
  auto affine_flag = column<uint8_t>(has_affine, "has_affine", n, 0, 0, 1);
  auto affine_a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(affine);
  if (!affine_a || affine_a.size() != n * 6) {
    throw py::value_error("affine: expected " + std::to_string(n) + " x 6 floats, got " + describe_array(affine));
  }
  // fill: one value for every sample's window and affine, or n x 2 (window, affine) per sample
  std::vector<uint8_t> fill_v;
  if (py::isinstance<py::int_>(fill)) {
    int overflow = 0;
    const long long f = PyLong_AsLongLongAndOverflow(fill.ptr(), &overflow);
    if (overflow != 0 || f < 0 || f > 255) {
      throw py::value_error("fill: " + std::string(py::str(fill)) + " is outside [0, 255]");
    }
    fill_v.assign(static_cast<size_t>(2 * n), static_cast<uint8_t>(f));
  } else {
    fill_v = column<uint8_t>(fill, "fill", n, 2, 0, 255);
  }
  std::vector<int32_t> frames_v;  // Plan.frames: (top, left, height, width, resize_h, resize_w, y, x) per sample
  if (!frames.is_none()) frames_v = column<int32_t>(frames, "frames", n, 8, INT32_MIN, INT32_MAX);
  fastload::MaskBatchSpec spec;
  sources.set(&spec);
  if (!frames_v.empty()) spec.frames = frames_v.data();
  spec.length = length_a.data();
  spec.src_hw = src_hw_v.data();
  spec.crop = crop_v.data();
  spec.box_hw = box_v.data();
  spec.padded = padded_v.data();
  spec.rows = rows_v.data();
  spec.cols = cols_v.data();
  spec.hflip = hflip_v.data();
  spec.vflip = vflip_v.data();
  spec.has_affine = affine_flag.data();
  spec.affine = affine_a.data();
  spec.fill = fill_v.data();
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  spec.out_h = static_cast<int>(oh);
  spec.out_w = static_cast<int>(ow);
  std::vector<fastload::MaskFailure> failures;
  {
    py::gil_scoped_release nogil;
    failures = fastload::decode_mask_batch(&pool.pool(), spec);
  }
  py::list result;
  for (auto& f : failures) result.append(py::make_tuple(f.index, f.message));
  return result;
}

}  // namespace

void register_mask(py::module_& m) {
  m.def("decode_mask", &decode_mask, py::arg("data"), py::arg("height"), py::arg("width"),
        "decode_mask(data, height, width) -> (height, width) uint8 array\n\n"
        "An 8-bit grayscale PNG of exactly that size (a mask field's blob); ValueError otherwise.");
  m.def("decode_mask_batch", &decode_mask_batch, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("src_hw"), py::arg("crop"), py::arg("box_hw"),
        py::arg("padded"), py::arg("rows"), py::arg("cols"), py::arg("hflip"), py::arg("vflip"),
        py::arg("has_affine"), py::arg("affine"), py::arg("fill"), py::arg("out"), py::arg("frames") = py::none(),
        "decode_mask_batch(pool, regions, region, offset, length, src_hw, crop, box_hw, padded, rows, cols, hflip,\n"
        "                  vflip, has_affine, affine, fill, out, frames=None) -> [(index, message)]\n\n"
        "Decode each PNG mask and move it as PIL moves it (fields/mask.py): crop, NEAREST resize to box_hw, a\n"
        "padded window (rows/cols, -1 = fill), flips, the affine NEAREST with fill; failures zero their row.\n"
        "fill: an int in [0, 255] for every sample, or (n, 2) per sample: the window's fill, the affine's.\n"
        "frames: None, or int32 (n, 8) as decode_batch's: the box resized whole NEAREST, the output its window\n"
        "(instead of crop; not with a padded window).");
}

}  // namespace fastload_bind
