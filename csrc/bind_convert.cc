// The conversion binding: affine_u8_f32 (ToDtype(float32, scale=True) + Normalize in one pass).
#include "bind_common.h"

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
}

}  // namespace fastload_bind
