// Antialiased separable resampling of RGB uint8 images, following PIL's
// Image.resize(size, Image.BILINEAR or Image.BICUBIC, box=...) (libImaging/Resample.c): a triangle
// filter (bilinear, support 1) or Keys' cubic with a = -0.5 (bicubic, support 2, negative lobes) whose
// support grows with the downscale factor, a horizontal pass first (rounded to uint8) and then a
// vertical pass. Weights are int16 fixed point with as many fractional bits as int16 allows, up to 22 (Pillow-SIMD's
// rule, normalize_coeffs_8bpc: 14 bits for a weight of 1, 16 for a downscale past 2x), instead of plain PIL's int32
// with 22 bits, so that SIMD multiply-adds apply: Pillow-SIMD's bytes; plain Pillow's differ by at most 1 in rare
// pixels (bicubic: 2 in very rare ones, where its overshoot amplifies a 1-level difference of the rounded
// horizontal pass). SSSE3/SSE2 kernels and the portable scalar code give identical bytes.
//
// Unlike PIL's `box`, the filter is clamped to a source window [lo, hi) per axis, so an
// integer crop box with lo/hi equal to the box gives PIL's crop(...).resize(...); a fractional box
// (DCT-scaled source) uses the pixels it overlaps. `offset`/`total`: outputs offset .. offset+out-1 of a resize
// to `total` samples, PIL's crop(box).resize(total).crop(window) (what torchvision's Resize then a crop
// computes): the weights, the taps and the fixed-point precision are those of the whole resize.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "buffer.h"

namespace fastload {

// The resampling filter of an axis plan (the per-sample `interpolation` of a batch: 0 or 1).
enum ResizeFilter : int { kResizeBilinear = 0, kResizeBicubic = 1 };

// Filter taps for one axis. Buffers are reused across calls (they only grow).
struct AxisPlan {
  int out = 0;       // output size
  int ksize = 0;     // taps stored per output position (even, zero-padded)
  int shift = 0;     // fractional bits of the fixed-point weights
  int first = 0;     // first source index read (absolute coordinates)
  int last = 0;      // one past the last source index read
  bool identity = false;
  std::vector<int32_t> start;   // per output: first source index (absolute)
  std::vector<int32_t> count;   // per output: number of taps
  std::vector<int16_t> coeffs;  // out * ksize fixed-point weights
  std::vector<double> weights;  // scratch for the double-precision weights
};

// Plans resampling of the source interval [in0, in1) to `total` samples (0: `out`) with `filter` (a
// ResizeFilter), of which it produces the `out` samples from `offset` on, reading only source indices in [lo, hi).
// Returns false with a message if the arguments are invalid.
bool plan_axis(double in0, double in1, int lo, int hi, int out, AxisPlan* plan, std::string* err,
               int filter = kResizeBilinear, int offset = 0, int total = 0);

struct ResizeScratch {
  AxisPlan x, y;
  GrowBuffer<uint8_t> rows;       // horizontally resampled rows
  std::vector<int16_t> xweights;  // horizontal weights laid out for the SIMD kernel
};

// Source image view: pixel (x, y) in absolute coordinates is at
// data + (y - y0) * stride + (x - x0) * 3. Only rows [plan.y.first, plan.y.last) and columns
// [plan.x.first, plan.x.last) are used; SIMD loads may read a few bytes past a row's last used
// pixel but never at or past `end`.
struct SourceView {
  const uint8_t* data;
  ptrdiff_t stride;
  int x0, y0;
  const uint8_t* end;
};

// Resamples with the plans in s.x / s.y into out (s.y.out rows of s.x.out RGB pixels, row
// stride out_stride), mirroring horizontally if flip.
void resample(const SourceView& src, bool flip, uint8_t* out, ptrdiff_t out_stride,
              ResizeScratch* s);

}  // namespace fastload
