// The augmentation bindings: a plan's pixel steps (augment_batch), with its geometry (augment_tiles), and
// fused with decoding (decode_augment_batch).
#include "bind_common.h"

#include <optional>
#include <string>
#include <vector>

#include "augment.h"
#include "augment_decode.h"

namespace fastload_bind {
namespace {

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

// A plan's pixel steps: op (steps,), offset (steps + 1,) into the rows, and per row its sample and parameters
// (sample (rows,), fparams/iparams (rows, kAugParams)); converted, checked against each other and kept alive
// as long as this object. ``prefix`` names the arrays in errors ("augment " inside a plan tuple).
struct PixelSteps {
  py::array_t<int64_t, py::array::c_style> op, offset, sample, iparams;
  py::array_t<double, py::array::c_style> fparams;
  int64_t steps = -1, rows = -1;

  PixelSteps(py::handle op_h, py::handle offset_h, py::handle sample_h, py::handle fparams_h, py::handle iparams_h,
             const std::string& prefix) {
    op = int_array(op_h, (prefix + "op").c_str(), &steps, 0);
    int64_t bounds = steps + 1;
    offset = int_array(offset_h, (prefix + "offset").c_str(), &bounds, 0);
    sample = int_array(sample_h, (prefix + "sample").c_str(), &rows, 0);
    iparams = int_array(iparams_h, (prefix + "iparams").c_str(), &rows, fastload::kAugParams);
    fparams = float_array(fparams_h, (prefix + "fparams").c_str(), rows, fastload::kAugParams);
  }

  void into(fastload::AugBatchSpec* spec) const {
    spec->num_steps = steps;
    spec->op = op.data();
    spec->offset = offset.data();
    spec->num_rows = rows;
    spec->sample = sample.data();
    spec->fparam = fparams.data();
    spec->iparam = iparams.data();
  }
};

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
  PixelSteps pixel(op, offset, sample, fparams, iparams, "");

  fastload::AugBatchSpec spec;
  spec.images = static_cast<uint8_t*>(img.mutable_data());
  spec.n = img.shape(0);
  spec.h = static_cast<int>(img.shape(1));
  spec.w = static_cast<int>(img.shape(2));
  pixel.into(&spec);
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
  py::array_t<double, py::array::c_style> affine, fill;
  std::optional<PixelSteps> pixel;
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
    interpolation_v = narrow<uint8_t>(int_array(t[3], "augment interpolation", &nn, 0), "augment interpolation", 0, 2);
    fill = float_array(t[4], "augment fill", n, 3);
    pixel.emplace(t[5], t[6], t[7], t[8], t[9], "augment ");
    spec.n = n;
    spec.h = h;
    spec.w = w;
    pixel->into(&spec);
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
                              py::handle flip, py::handle out, py::handle augment, bool dct_scaling,
                              py::handle interpolation, py::handle frames) {
  DecodeBatchArgs args(regions, region, offset, length, encoding, src_hw, crop, flip, out, dct_scaling,
                       interpolation, frames);
  AugArrays a(augment, args.n(), args.spec.out_h, args.spec.out_w);
  std::vector<fastload::Failure> failures;
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::decode_augment_batch(&pool, args.spec, a.spec, &failures, &err);
  }
  if (!ok) throw py::value_error("decode_augment_batch: " + err);
  return failure_list(failures);
}

}  // namespace

void register_augment(py::module_& m) {
  m.attr("AUGMENT_PARAMS") = fastload::kAugParams;
  // name -> operation id, in id order (csrc/augment.h's FASTLOAD_AUG_OPS): engine_native.py maps by name
  m.attr("AUGMENT_OPS") = [] {
    py::dict ids;
    for (int k = 0; k < fastload::kAugNumOps; ++k) ids[fastload::aug_op_name(k)] = k;
    return ids;
  }();
  m.def("augment_batch", &augment_batch, py::arg("pool"), py::arg("images"), py::arg("op"), py::arg("offset"),
        py::arg("sample"), py::arg("fparams"), py::arg("iparams"),
        "augment_batch(pool, images, op, offset, sample, fparams, iparams) -> None\n"
        "Runs an augmentation plan's pixel steps in place on images (uint8 (n, H, W, 3), C-contiguous,\n"
        "writable): step s applies operation op[s] (an id of AUGMENT_OPS, name -> id) to the tiles\n"
        "sample[offset[s]:offset[s+1]], row j with the parameters fparams[j] (float64 (m, 4)) and\n"
        "iparams[j] (int64 (m, 4)). Everything is checked first (ValueError naming the step, row and\n"
        "sample, images untouched); then each tile runs its operations in step order on one of the\n"
        "pool's threads (results do not depend on the thread count). The GIL is released.");
  m.def("augment_tiles", &augment_tiles, py::arg("pool"), py::arg("images"), py::arg("augment"),
        "augment_tiles(pool, images, augment) -> None\n"
        "augment_batch with the plan's geometry: augment = (vflip (n,), has_affine (n,), affine (n, 6),\n"
        "interpolation (n,) 0 nearest / 1 bilinear / 2 bicubic, fill (n, 3), op, offset, sample, fparams, iparams); each\n"
        "tile is flipped top-bottom, warped (PIL's Image.transform AFFINE), then runs its operations. Checked\n"
        "first (ValueError, images untouched). The GIL is released.");
  m.def("decode_augment_batch", &decode_augment_batch, py::arg("pool"), py::arg("regions"), py::arg("region"),
        py::arg("offset"), py::arg("length"), py::arg("encoding"), py::arg("src_hw"), py::arg("crop"),
        py::arg("flip"), py::arg("out"), py::arg("augment"), py::arg("dct_scaling") = true,
        py::arg("interpolation") = py::none(), py::arg("frames") = py::none(),
        "decode_augment_batch(pool, regions, ..., flip, out, augment, dct_scaling=True, interpolation=None)\n"
        "-> failures\n"
        "decode_batch, each sample then augmented (augment as in augment_tiles) by the thread that decoded\n"
        "it, while its tile is in that core's cache. A bad augmentation raises ValueError before any\n"
        "sample is written; failed samples are zeroed and listed as decode_batch's (interpolation: as\n"
        "decode_batch's; frames too).");
}

}  // namespace fastload_bind
