// The module fastload._C: its doc, the Pool every batched call takes, then each area's functions
// (bind_decode.cc, bind_convert.cc, bind_augment.cc, bind_gather.cc; shared helpers in bind_common.h).
// Only these binding files include Python; the rest of csrc/ is plain C++.
#include <string>

#include "bind_common.h"

using fastload_bind::BatchEngine;

namespace fastload_bind {
void register_mask(py::module_& m);  // bind_mask.cc
}

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "fastload native core: JPEG decode, crop/resize/flip, batched decoding and row gathers.";

  py::class_<BatchEngine>(m, "Pool", "Persistent native thread pool (0 = calling thread only).")
      .def(py::init<int>(), py::arg("num_threads"))
      .def_property_readonly("size", &BatchEngine::size)
      .def_property("copy_helpers", &BatchEngine::copy_helpers, &BatchEngine::set_copy_helpers,
                    "A pool of no threads: how many helper threads copy a row gather of\n"
                    "GATHER_INLINE_BYTES or more with the calling thread (0: none; started at the\n"
                    "first such copy). A pool with threads copies with its own.")
      .def_property_readonly("copy_helpers_started", &BatchEngine::copy_helpers_started,
                             "How many copy helper threads run (0 until a copy needed them).")
      .def("__repr__",
           [](const BatchEngine& p) { return "fastload._C.Pool(" + std::to_string(p.size()) + ")"; });

  fastload_bind::register_decode(m);
  fastload_bind::register_convert(m);
  fastload_bind::register_augment(m);
  fastload_bind::register_gather(m);
  fastload_bind::register_mask(m);
}
