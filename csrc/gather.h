// Batch gather of fixed-size rows (labels, token rows, raw uint8 arrays) from caller-owned
// regions (memory-mapped shards) into a caller-owned output buffer: row k of the output is the
// row_bytes bytes at regions[region[k]] + offset[k].
//
// Every row is checked before anything is written, so a bad index never yields a half-filled
// batch. Rows that follow each other in the source (sequential order) are copied with one
// memcpy. Large batches are split into contiguous byte ranges that the pool's threads and the
// calling thread take in turn; small ones run in the calling thread, where the copy costs less
// than waking a thread would.
#pragma once

#include <cstdint>
#include <string>

#include "pool.h"
#include "region.h"

namespace fastload {

// Batches smaller than this (n * row_bytes) are copied in the calling thread. Waking a pool
// thread took 20-60 us on a shared 2-vCPU VM, and threads only paid off from a few MiB on.
constexpr int64_t kGatherInlineBytes = int64_t{2} << 20;
// Larger batches are cut into about this many chunks per copying thread (the pool's and the
// caller's, ThreadPool::run_shared), none smaller than kGatherMinChunkBytes.
constexpr int kGatherChunksPerThread = 4;
constexpr int64_t kGatherMinChunkBytes = int64_t{256} << 10;
// Batches at least this large, of rows of at least 4 KiB, are written with non-temporal
// (cache-bypassing) stores where the CPU has them: they would not stay in the cache anyway.
constexpr int64_t kGatherStreamBytes = int64_t{8} << 20;

struct GatherSpec {
  const Region* regions = nullptr;
  int64_t num_regions = 0;
  int64_t n = 0;
  const int64_t* region = nullptr;  // n region indices
  const int64_t* offset = nullptr;  // n byte offsets into those regions
  int64_t row_bytes = 0;            // >= 0; n * row_bytes must not overflow
  uint8_t* out = nullptr;           // n * row_bytes writable bytes
};

// Copies all n rows into g.out and returns true. If any row is out of bounds, or the output
// overlaps a region, returns false with a message naming the first offending row and its values,
// and leaves g.out untouched. region and offset are read once each, before any copying.
bool gather_rows(ThreadPool* pool, const GatherSpec& g, std::string* err);

// Pieces of any length (variable-length token rows, padded or packed): piece k is the length[k]
// bytes at regions[region[k]] + offset[k], copied to out + dst[k]. The padding around them is
// the caller's (it fills out first).
struct PieceSpec {
  const Region* regions = nullptr;
  int64_t num_regions = 0;
  int64_t n = 0;
  const int64_t* region = nullptr;  // n region indices
  const int64_t* offset = nullptr;  // n byte offsets into those regions
  const int64_t* length = nullptr;  // n byte counts
  const int64_t* dst = nullptr;     // n byte offsets into out
  uint8_t* out = nullptr;
  int64_t out_bytes = 0;
};

// Copies every piece and returns true. If a piece lies outside its region or outside out, or out
// overlaps a region, returns false with a message naming the first offending piece, and leaves
// out untouched. Pieces may overlap each other in out (the later one wins only within a thread:
// callers give disjoint pieces). The spec's arrays are read once each, before any copying.
bool gather_pieces(ThreadPool* pool, const PieceSpec& g, std::string* err);

}  // namespace fastload
