// Segmentation masks (the `mask` field kind, fastload/fields/mask.py): one uint8 class id per pixel, stored as
// an 8-bit grayscale PNG, decoded with libpng's simplified API and moved with its image's plan exactly as
// Pillow moves it (the PIL reference, fastload/_augment/engine_pil.py run_pil_mask): crop, NEAREST resize,
// a padded crop window, flips, then an affine warp NEAREST with the mask's fill. Nearest is exact, so the
// native masks equal the reference's bit for bit: the arithmetic below is Pillow's (Geometry.c
// ImagingScaleAffine / ImagingTransformAffine), double for double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pool.h"
#include "region.h"

namespace fastload {

// Decodes an 8-bit grayscale PNG of exactly h x w pixels into *out (h * w bytes). False with a message for
// anything else (not a PNG, another bit depth or colour type, another size, corrupt or truncated data).
bool decode_mask_png(const uint8_t* data, size_t size, int h, int w, std::vector<uint8_t>* out, std::string* err);

// One batch of masks: all arrays of length n (src_hw n x 2, crop n x 4, box_hw n x 2, rows n x out_h, cols
// n x out_w, affine n x 6, fill n x 2); sample k's PNG is regions[region[k]][offset[k]:offset[k]+length[k]].
struct MaskBatchSpec {
  const Region* regions = nullptr;
  int64_t num_regions = 0;
  int64_t n = 0;
  const int64_t* region = nullptr;
  const int64_t* offset = nullptr;
  const int64_t* length = nullptr;
  const int32_t* src_hw = nullptr;  // the stored mask's size (the "meta" column), = its image's
  const int32_t* crop = nullptr;    // top, left, height, width: the image's crop box
  // null, or n x 8 (top, left, height, width, resize_h, resize_w, y, x): the image's Plan.frames, used instead of
  // crop: that box resized whole NEAREST, the tile its window at (y, x) (not with a padded window)
  const int32_t* frames = nullptr;
  const int32_t* box_hw = nullptr;  // the crop box is resized to this (the tile's size, or a padded window's box)
  const uint8_t* padded = nullptr;  // 1: the tile is assembled from the box by rows/cols (-1: fill)
  const int32_t* rows = nullptr;
  const int32_t* cols = nullptr;
  const uint8_t* hflip = nullptr;
  const uint8_t* vflip = nullptr;
  const uint8_t* has_affine = nullptr;
  const double* affine = nullptr;  // output pixel -> tile coordinates, PIL's AFFINE data
  const uint8_t* fill = nullptr;  // n x 2: a padded window's fill, the affine's fill (each transform's mask fill)
  uint8_t* out = nullptr;  // n x out_h x out_w
  int out_h = 0, out_w = 0;
};

struct MaskFailure {
  int64_t index;
  std::string message;
};

// Fills spec.out on the pool's threads; a failed sample's row is zero-filled and reported, never fatal.
std::vector<MaskFailure> decode_mask_batch(ThreadPool* pool, const MaskBatchSpec& spec);

}  // namespace fastload
