// One batch job: gather each sample's bytes from caller-owned regions, decode (JPEG) or view
// (raw RGB), crop, resize and flip straight into the caller's NHWC uint8 output.
//
// Nothing here allocates per sample in steady state: each pool thread owns a Worker whose
// decoder state and buffers live as long as the BatchEngine. A sample that fails (bad bounds,
// corrupt data, bad crop, ...) is zero-filled and reported; it never stops the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jpeg.h"
#include "pool.h"
#include "region.h"
#include "resize.h"

namespace fastload {

// The "meta" column's encodings; the one definition (exported to Python as _C.IMAGE_JPEG, _C.IMAGE_RAW).
enum Encoding : uint8_t { kEncodingJpeg = 0, kEncodingRawRgb = 1 };

// Per-thread scratch state, reused across samples and batches. Buffers grow to the largest
// sample seen but are freed after a sample that needed more than kKeepScratchBytes.
constexpr size_t kKeepScratchBytes = size_t{32} << 20;

struct Worker {
  JpegDecoder jpeg;
  ResizeScratch resize;
};

// One sample: source bytes, crop box in source pixels, output size and place.
struct SampleJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  int encoding = kEncodingJpeg;
  int src_h = 0, src_w = 0;  // JPEG: 0, 0 means "take from the header"; else must match it
  int top = 0, left = 0, height = 0, width = 0;
  // resize_h > 0: the box above is resized whole to resize_h x resize_w and the output is its out_h x out_w window
  // at (frame_y, frame_x), PIL's crop(box).resize(...).crop(window) (transforms.Plan.frames); else the box is
  // resized to the output.
  int resize_h = 0, resize_w = 0, frame_y = 0, frame_x = 0;
  bool flip = false;
  int interpolation = kResizeBilinear;  // a ResizeFilter (resize.h)
  int out_h = 0, out_w = 0;
  bool dct_scaling = true;
  uint8_t* out = nullptr;  // out_h * out_w * 3 contiguous bytes
};

// Runs one sample. On failure returns false with a message; *out is then unspecified.
bool process_sample(Worker* w, const SampleJob& job, std::string* err);

// Largest DCT scale denominator (1, 2, 4 or 8, at most max_denom) such that the crop, scaled
// down by it, is still at least the output size in both dimensions.
int choose_dct_denom(int crop_h, int crop_w, int out_h, int out_w, int max_denom);

// A batch as described by the caller's arrays (all of length n; src_hw is n x 2, crop n x 4).
struct BatchSpec {
  const Region* regions = nullptr;
  int64_t num_regions = 0;
  int64_t n = 0;
  const int64_t* region = nullptr;
  const int64_t* offset = nullptr;
  const int64_t* length = nullptr;
  const uint8_t* encoding = nullptr;
  const int32_t* src_hw = nullptr;
  const int32_t* crop = nullptr;
  // Null, or n x 8 (top, left, height, width, resize_h, resize_w, y, x): sample k's box resized whole, the output
  // its window at (y, x) (SampleJob's resize_h ...); the crop above is then not read.
  const int32_t* frames = nullptr;
  const uint8_t* flip = nullptr;
  const uint8_t* interpolation = nullptr;  // n ResizeFilter values (resize.h); null: all bilinear
  uint8_t* out = nullptr;  // n x out_h x out_w x 3, contiguous
  int out_h = 0, out_w = 0;
  bool dct_scaling = true;
  // Only for run(spec, then): sample k with decode_hw[k] != (0, 0) is decoded at that size, unflipped, into
  // the start of its row (a padded crop window's box; `then` assembles the tile). Null: none.
  const int32_t* decode_hw = nullptr;
};

struct Failure {
  int64_t index;
  std::string message;
};

class BatchEngine {
 public:
  explicit BatchEngine(int num_threads);
  int size() const { return pool_.size(); }
  // The threads, for other batch-wide jobs (gather_rows) that need no per-worker state.
  ThreadPool& pool() { return pool_; }
  // A pool of no threads (num_workers=0) may copy large row gathers with helper threads: at most
  // this many, made at the first copy that asks (copy_pool). 0: the calling thread alone.
  void set_copy_helpers(int n);
  int copy_helpers() const { return copy_helpers_; }
  // How many helper threads run (0 until a copy needed them).
  int copy_helpers_started();
  // The helpers' pool a copy of `bytes` runs on, for a pool of no threads with copy helpers and a
  // copy of at least `from` bytes (made here the first time; held by the copy, so that
  // set_copy_helpers meanwhile does not take it away); else null: run it on pool().
  std::shared_ptr<ThreadPool> copy_pool(int64_t bytes, int64_t from);
  // Fills spec.out; returns the failed samples in index order.
  std::vector<Failure> run(const BatchSpec& spec);
  // run(), and then(k, worker, tile) for each sample written without failure, on the thread that
  // wrote it, right after (the tile is still in that core's cache): the fused augmentation.
  using AfterSample = std::function<void(int64_t k, int worker, uint8_t* tile)>;
  std::vector<Failure> run(const BatchSpec& spec, const AfterSample& then);

 private:
  ThreadPool pool_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex helpers_mu_;
  int copy_helpers_ = 0;
  std::shared_ptr<ThreadPool> helpers_;
};

}  // namespace fastload
