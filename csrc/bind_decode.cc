// The decode bindings: one JPEG (header, full decode), one sample crop/resize/flip, and decode_batch.
#include "bind_common.h"

#include <string>
#include <vector>

#include "batch.h"
#include "jpeg.h"

namespace fastload_bind {
namespace {

fastload::Worker& local_worker() {
  // Single-sample calls from any Python thread: scratch per OS thread, kept for its lifetime.
  static thread_local fastload::Worker worker;
  return worker;
}

fastload::SampleJob single_job(py::handle crop, py::handle out_hw, bool flip, int img_h,
                               int img_w, int interpolation, py::handle frame = py::none()) {
  if (interpolation != fastload::kResizeBilinear && interpolation != fastload::kResizeBicubic) {
    throw py::value_error("interpolation: expected 0 (bilinear) or 1 (bicubic), got " + std::to_string(interpolation));
  }
  fastload::SampleJob job;
  job.interpolation = interpolation;
  if (!frame.is_none()) {  // (top, left, height, width, resize_h, resize_w, y, x): Plan.frames' row
    const auto f = int_tuple<8>(frame, "frame", INT32_MIN);
    if (f[4] <= 0 || f[5] <= 0) {
      throw py::value_error("frame: resize size must be positive, got " + std::to_string(f[4]) + "x" +
                            std::to_string(f[5]));
    }
    job.top = f[0];
    job.left = f[1];
    job.height = f[2];
    job.width = f[3];
    job.resize_h = f[4];
    job.resize_w = f[5];
    job.frame_y = f[6];
    job.frame_x = f[7];
  } else if (crop.is_none()) {
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

py::array resize_crop(py::handle src, py::handle crop, py::handle out_hw, bool flip, int interpolation,
                      py::handle frame) {
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
                                       static_cast<int>(img.shape(1)), interpolation, frame);
  job.encoding = fastload::kEncodingRawRgb;
  job.data = img.data();
  job.size = static_cast<size_t>(img.size());
  job.src_h = static_cast<int>(img.shape(0));
  job.src_w = static_cast<int>(img.shape(1));
  return run_single(job);
}

py::array decode_crop_resize(py::handle buf, py::handle crop, py::handle out_hw, bool flip,
                             bool dct_scaling, int interpolation, py::handle frame) {
  BufferView b(buf, "buf");
  int img_h = 0, img_w = 0;
  if (crop.is_none() && frame.is_none()) {  // the crop is the whole image: read its size first
    py::tuple info = jpeg_info(buf);
    img_h = info[0].cast<int>();
    img_w = info[1].cast<int>();
  }
  fastload::SampleJob job = single_job(crop, out_hw, flip, img_h, img_w, interpolation, frame);
  job.encoding = fastload::kEncodingJpeg;
  job.data = b.data();
  job.size = static_cast<size_t>(b.size());
  job.dct_scaling = dct_scaling;
  return run_single(job);
}

py::list decode_batch(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                      py::handle length, py::handle encoding, py::handle src_hw, py::handle crop,
                      py::handle flip, py::handle out, bool dct_scaling, py::handle interpolation,
                      py::handle frames) {
  DecodeBatchArgs args(regions, region, offset, length, encoding, src_hw, crop, flip, out, dct_scaling,
                       interpolation, frames);
  std::vector<fastload::Failure> failures;
  {
    py::gil_scoped_release nogil;
    failures = pool.run(args.spec);
  }
  return failure_list(failures);
}

}  // namespace

void register_decode(py::module_& m) {
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
        py::arg("flip") = false, py::arg("interpolation") = 0, py::arg("frame") = py::none(),
        "resize_crop(src, crop, out_hw, flip=False, interpolation=0, frame=None) -> uint8 array (out_h, out_w, 3).\n"
        "crop = (top, left, height, width) or None for the whole image; PIL's antialiased resize,\n"
        "interpolation 0 = BILINEAR, 1 = BICUBIC; then horizontal flip if flip. frame = (top, left, height,\n"
        "width, resize_h, resize_w, y, x) instead of crop: that box resized whole to resize_h x resize_w, the\n"
        "out_hw window at (y, x) of it (PIL's crop(box).resize(size).crop(window); transforms.Plan.frames).");
  m.def("decode_crop_resize", &decode_crop_resize, py::arg("buf"), py::arg("crop"),
        py::arg("out_hw"), py::arg("flip") = false, py::arg("dct_scaling") = true, py::arg("interpolation") = 0,
        py::arg("frame") = py::none(),
        "decode_crop_resize(buf, crop, out_hw, flip=False, dct_scaling=True, interpolation=0, frame=None) ->\n"
        "uint8 array (out_h, out_w, 3): decode a JPEG, crop, resize and flip like one decode_batch sample\n"
        "(frame: as resize_crop's).");
  m.def("decode_batch", &decode_batch, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("encoding"), py::arg("src_hw"),
        py::arg("crop"), py::arg("flip"), py::arg("out"), py::arg("dct_scaling") = true,
        py::arg("interpolation") = py::none(), py::arg("frames") = py::none(),
        "decode_batch(pool, regions, region, offset, length, encoding, src_hw, crop, flip, out,\n"
        "             dct_scaling=True, interpolation=None, frames=None) -> list[(index, message)] of failed\n"
        "samples. frames: None or int32 (n, 8), each row as resize_crop's frame, used instead of crop.\n"
        "Sample k's bytes are regions[region[k]][offset[k]:offset[k]+length[k]]; encoding 0 = JPEG,\n"
        "1 = raw RGB (src_hw[k] = (H, W)); crop[k] = (top, left, height, width); the result is\n"
        "written into out[k] (out: C-contiguous uint8 (n, H, W, 3)); failed samples are zeroed.\n"
        "interpolation: None (all bilinear) or uint8 (n,), 0 = PIL's BILINEAR, 1 = PIL's BICUBIC.");
}

}  // namespace fastload_bind
