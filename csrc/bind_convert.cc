// The conversion binding: affine_u8_f32 (ToDtype(float32, scale=True) + Normalize in one pass) and
// mix_affine_u8_f32 (the same pass with MixUp's blend or CutMix's box fused in).
#include "bind_common.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "convert.h"

namespace fastload_bind {
namespace {

std::vector<float> floats(py::handle seq) {
  std::vector<float> v;
  for (py::handle x : py::reinterpret_borrow<py::sequence>(seq)) v.push_back(x.cast<float>());
  return v;
}

// Both kernels' checked arguments: src uint8 C-contiguous with the channels last, out float32 of as many
// elements, C-contiguous and writable, one scale and shift per channel.
struct AffineArgs {
  py::array src, out;
  std::vector<float> scale, shift;
  int channels;
};

AffineArgs affine_args(py::handle src, py::handle out, py::handle scale_seq, py::handle shift_seq) {
  if (!PySequence_Check(scale_seq.ptr()) || !PySequence_Check(shift_seq.ptr())) {
    throw py::type_error("scale and shift: expected sequences of floats, got " + type_name(scale_seq) +
                         " and " + type_name(shift_seq));
  }
  AffineArgs r;
  r.scale = floats(scale_seq);
  r.shift = floats(shift_seq);
  const int64_t channels = static_cast<int64_t>(r.scale.size());
  if (channels < 1 || channels > fastload::kAffineMaxChannels || r.shift.size() != r.scale.size()) {
    throw py::value_error("scale and shift: expected one value per channel (1 to " +
                          std::to_string(fastload::kAffineMaxChannels) + " channels), got " +
                          std::to_string(r.scale.size()) + " and " + std::to_string(r.shift.size()));
  }
  r.channels = static_cast<int>(channels);
  if (!py::isinstance<py::array_t<uint8_t>>(src)) {
    throw py::type_error("src: expected a uint8 numpy array, got " + describe_array(src));
  }
  r.src = py::reinterpret_borrow<py::array>(src);
  if (!(r.src.flags() & py::array::c_style)) throw py::value_error("src: expected a C-contiguous array");
  if (r.src.ndim() < 1 || r.src.shape(r.src.ndim() - 1) != channels) {
    throw py::value_error("src: expected the last dimension to be the " + std::to_string(channels) +
                          " channels of scale and shift, got " + describe_array(src));
  }
  if (!py::isinstance<py::array_t<float>>(out)) {
    throw py::type_error("out: expected a float32 numpy array, got " + describe_array(out));
  }
  r.out = byte_out(out, "float32");
  // numpy allows a float32 array at any byte address (np.frombuffer(..., offset=1)); the kernels store floats
  // through float pointers, which must be aligned (undefined behaviour otherwise; UBSan stops on it)
  if (reinterpret_cast<uintptr_t>(r.out.data()) % alignof(float) != 0) {
    throw py::value_error("out: expected a float32 array aligned to 4 bytes (as np.empty gives), got one at an "
                          "address " + std::to_string(reinterpret_cast<uintptr_t>(r.out.data()) % alignof(float)) +
                          " bytes past that; copy it into np.empty(...) first");
  }
  if (r.out.size() != r.src.size()) {
    throw py::value_error("out: has " + std::to_string(r.out.size()) + " elements (" + describe_array(out) +
                          "), src has " + std::to_string(r.src.size()));
  }
  return r;
}

void affine_u8_f32(py::handle src, py::handle out, py::handle scale_seq, py::handle shift_seq, bool avx2) {
  AffineArgs a = affine_args(src, out, scale_seq, shift_seq);
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::affine_u8_f32(static_cast<const uint8_t*>(a.src.data()), static_cast<float*>(a.out.mutable_data()),
                                 a.src.size(), a.channels, a.scale.data(), a.shift.data(), avx2, &err);
  }
  if (!ok) throw py::value_error("affine_u8_f32: " + err);
}

void mix_affine_u8_f32(py::handle src, py::handle out, py::handle scale_seq, py::handle shift_seq,
                       const std::string& kind, double lam, py::handle box, bool avx2) {
  AffineArgs a = affine_args(src, out, scale_seq, shift_seq);
  if (a.src.ndim() != 4) {
    throw py::value_error("src: expected a batch (N, H, W, channels), got " + describe_array(src));
  }
  for (py::ssize_t d = 0; d < 4; ++d) {
    if (a.out.ndim() != 4 || a.out.shape(d) != a.src.shape(d)) {
      throw py::value_error("out: expected src's shape " + std::string(py::str(a.src.attr("shape"))) + ", got " +
                            describe_array(out));
    }
  }
  fastload::MixSpec mix{fastload::MixKind::kMixUp, lam, 0, 0, 0, 0};
  if (!std::isfinite(lam) || lam < 0.0 || lam > 1.0) {
    throw py::value_error("lam: expected a number in [0, 1], got " + std::to_string(lam));
  }
  if (kind == "cutmix") {
    mix.kind = fastload::MixKind::kCutMix;
    std::vector<int64_t> b;
    if (PySequence_Check(box.ptr()) && !py::isinstance<py::str>(box)) {
      for (py::handle v : py::reinterpret_borrow<py::sequence>(box)) b.push_back(v.cast<int64_t>());
    }
    if (b.size() != 4) {
      throw py::type_error("box: expected CutMix's box (x1, y1, x2, y2), got " + std::string(py::repr(box)));
    }
    mix.x1 = b[0], mix.y1 = b[1], mix.x2 = b[2], mix.y2 = b[3];
  } else if (kind == "mixup") {
    if (!box.is_none()) throw py::value_error("box: MixUp has no box, expected None, got " + std::string(py::repr(box)));
  } else {
    throw py::value_error("kind: expected 'mixup' or 'cutmix', got '" + kind + "'");
  }
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::mix_affine_u8_f32(static_cast<const uint8_t*>(a.src.data()),
                                     static_cast<float*>(a.out.mutable_data()), a.src.shape(0), a.src.shape(1),
                                     a.src.shape(2), a.channels, a.scale.data(), a.shift.data(), mix, avx2, &err);
  }
  if (!ok) throw py::value_error("mix_affine_u8_f32: " + err);
}

void hwc_to_chw_u8(py::handle src, py::handle out) {
  if (!py::isinstance<py::array_t<uint8_t>>(src)) {
    throw py::type_error("src: expected a uint8 numpy array (N, H, W, C), got " + describe_array(src));
  }
  py::array s = py::reinterpret_borrow<py::array>(src);
  if (!(s.flags() & py::array::c_style) || s.ndim() != 4) {
    throw py::value_error("src: expected a C-contiguous array (N, H, W, C), got " + describe_array(src));
  }
  py::array o = byte_out(out, "uint8");
  if (!py::isinstance<py::array_t<uint8_t>>(out) || o.ndim() != 4 || o.shape(0) != s.shape(0) ||
      o.shape(1) != s.shape(3) || o.shape(2) != s.shape(1) || o.shape(3) != s.shape(2)) {
    throw py::value_error("out: expected uint8 (N, C, H, W) for src " + describe_array(src) + ", got " +
                          describe_array(out));
  }
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::hwc_to_chw_u8(static_cast<const uint8_t*>(s.data()), static_cast<uint8_t*>(o.mutable_data()),
                                 s.shape(0), s.shape(1) * s.shape(2), static_cast<int>(s.shape(3)), &err);
  }
  if (!ok) throw py::value_error("hwc_to_chw_u8: " + err);
}

}  // namespace

void register_convert(py::module_& m) {
  m.attr("AFFINE_MAX_CHANNELS") = fastload::kAffineMaxChannels;
  m.def("affine_u8_f32", &affine_u8_f32, py::arg("src"), py::arg("out"), py::arg("scale"), py::arg("shift"),
        py::arg("avx2") = true,
        "affine_u8_f32(src, out, scale, shift, avx2=True) -> None\n"
        "out = float32(src) * scale[c] + shift[c] for channel c = the last dimension of src (uint8,\n"
        "C-contiguous; out: float32, C-contiguous, writable, as many elements, not overlapping src):\n"
        "ToDtype(float32, scale=True) + Normalize in one pass. A multiply then an add (no fused\n"
        "multiply-add), the same bits with AVX2 (avx2=True, where the CPU has it) or without. The GIL\n"
        "is released.");
  m.def("mix_affine_u8_f32", &mix_affine_u8_f32, py::arg("src"), py::arg("out"), py::arg("scale"),
        py::arg("shift"), py::arg("kind"), py::arg("lam"), py::arg("box") = py::none(), py::arg("avx2") = true,
        "mix_affine_u8_f32(src, out, scale, shift, kind, lam, box=None, avx2=True) -> None\n"
        "affine_u8_f32 on a batch src (N, H, W, C) into out (float32, the same shape) with torchvision's\n"
        "MixUp or CutMix fused in: sample i is mixed with sample i - 1 (sample 0 with N - 1, roll(1, 0)),\n"
        "always with its original pixels. kind='mixup': out = float(src_i) * (lam * scale) +\n"
        "float(src_{i-1}) * ((1 - lam) * scale) + shift, lam in [0, 1]; kind='cutmix': the affine of\n"
        "src_{i-1} inside box = (x1, y1, x2, y2) (columns x1..x2-1, rows y1..y2-1), of src_i elsewhere\n"
        "(the same bits as affine_u8_f32 then the paste). The GIL is released.");
  m.def("hwc_to_chw_u8", &hwc_to_chw_u8, py::arg("src"), py::arg("out"),
        "hwc_to_chw_u8(src, out) -> None\n"
        "Copies src (uint8 (N, H, W, C), C-contiguous) into out (uint8 (N, C, H, W), C-contiguous,\n"
        "writable, not overlapping src): torch's contiguous copy of src.permute(0, 3, 1, 2), with SSSE3\n"
        "for 3 channels. The GIL is released.");
}

}  // namespace fastload_bind
