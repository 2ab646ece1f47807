// The gather bindings: fixed-size rows (gather_rows) and variable-length pieces (gather_pieces) of a batch.
#include "bind_common.h"

#include <string>
#include <vector>

#include "gather.h"

namespace fastload_bind {
namespace {

void gather_rows(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                 int64_t row_bytes, py::handle out) {
  const Sources sources(regions, region, offset);
  int64_t n = sources.n();
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
  sources.set(&spec);
  spec.row_bytes = row_bytes;
  spec.out = static_cast<uint8_t*>(out_a.mutable_data());
  std::string err;
  bool ok;
  {
    py::gil_scoped_release nogil;
    // a pool of no threads with copy helpers (num_workers=0) copies a large batch with them
    const auto helpers = pool.copy_pool(want, fastload::kGatherInlineBytes);
    ok = fastload::gather_rows(helpers ? helpers.get() : &pool.pool(), spec, &err);
  }
  if (!ok) throw py::value_error("gather_rows: " + err);
}

void gather_pieces(BatchEngine& pool, py::handle regions, py::handle region, py::handle offset,
                   py::handle length, py::handle dst, py::handle out) {
  const Sources sources(regions, region, offset);
  int64_t n = sources.n();
  auto length_a = int_array(length, "length", &n, 0);
  auto dst_a = int_array(dst, "dst", &n, 0);
  py::array out_a = byte_out(out, "any size");
  fastload::PieceSpec spec;
  sources.set(&spec);
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

}  // namespace

void register_gather(py::module_& m) {
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
        "untouched. Batches of GATHER_INLINE_BYTES (2 MiB) and more are split across the pool's\n"
        "threads and the calling thread (a pool of no threads: its copy_helpers, if any); smaller\n"
        "ones are copied in the calling thread. The GIL is released.");
  m.attr("GATHER_INLINE_BYTES") = fastload::kGatherInlineBytes;
}

}  // namespace fastload_bind
