// Native kernels for the pixel operations of an augmentation plan (issue 21's third engine), on
// uint8 RGB tiles (HWC, channels interleaved), in place.
//
// The formulas are fastload/_augment/engine_torch.py's (torchvision v2's tensor kernels on uint8),
// with the same float32 roundings, so the two engines write the same bytes wherever the torch
// engine's arithmetic is reproducible (see tests/augment/test_augment_native.py for the figures):
// the blends are float32 multiply then add, torch's luma is a float32 multiply and two fused
// multiply-adds (its vectorised `add(alpha=)`), emulated exactly in double here.
//
// Two levels:
// - apply_ops(): one tile and its ordered operations. It is what the decode threads will call
//   on each output tile right after crop/resize/flip (the fused path); nothing in it allocates
//   once the scratch has grown to the tile.
// - augment_batch(): a plan's steps over a batch (n tiles of h x w), split over samples on the
//   pool. Each sample is processed by one thread, its operations in step order, so the result
//   does not depend on the number of threads.
//
// Every operation and parameter is checked before any pixel is written: on error nothing changed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pool.h"
#include "warp.h"

namespace fastload {

// The pixel operations, the one list: X(id, name). The enum and the names (aug_op_name) are made from it, and
// the binding exports it as _C.AUGMENT_OPS, name -> id; fastload/_augment/engine_native.py maps each operation
// Python defines (define_op) to its id by name and refuses to import when the two sets differ. A new operation:
// a line here, its parameter check (check_aug_op) and kernel (apply_ops) in augment.cc, its row layout in
// engine_native.py. Parameters per row: f[] floats, i[] ints (kAugParams of each).
#define FASTLOAD_AUG_OPS(X)                                                                                   \
  X(kAugBrightness, "brightness")        /* f[0] = factor */                                                  \
  X(kAugContrast, "contrast")            /* f[0] = factor */                                                  \
  X(kAugSaturation, "saturation")        /* f[0] = factor */                                                  \
  X(kAugHue, "hue")                      /* f[0] = hue factor (turns) */                                      \
  X(kAugGrayscale, "grayscale")          /* three equal channels */                                           \
  X(kAugSolarize, "solarize")            /* f[0] = threshold: values >= it are inverted */                    \
  X(kAugPosterize, "posterize")          /* i[0] = bits, 0..8 */                                              \
  X(kAugInvert, "invert")                                                                                     \
  X(kAugEqualize, "equalize")                                                                                 \
  X(kAugAutocontrast, "autocontrast")                                                                         \
  X(kAugSharpness, "sharpness")          /* f[0] = factor */                                                  \
  X(kAugErase, "erase")                  /* i[0..3] = top, left, height, width (clipped to the tile); */      \
                                         /* f[0..2] = value 0..255 */                                         \
  X(kAugGaussianBlur, "gaussian_blur")   /* i[0..1] = kernel size x, y (odd, half < the tile); */             \
                                         /* f[0..1] = sigma x, y > 0 */                                       \
  X(kAugEraseRandom, "erase_random")     /* i[0..3] = box as kAugErase; f[0] = seed, an integer in */         \
                                         /* [0, 2^53): per-pixel noise */                                     \
  X(kAugSolarizeAdd, "solarize_add")     /* i[0] = add 0..255, i[1] = threshold 0..256: values below */      \
                                         /* it get min(255, v + add) (timm's SolarizeAdd) */                  \
  X(kAugPilColor, "pil_color")           /* f[0] = factor; i[0] = luma: 0 Pillow's, 1 pillow-simd's */        \
                                         /* (PIL's ImageEnhance.Color: pil_enhance.h) */                      \
  X(kAugPilContrast, "pil_contrast")     /* f[0] = factor; i[0] = luma as pil_color */                        \
                                         /* (PIL's ImageEnhance.Contrast) */

enum AugOp : int32_t {
#define FASTLOAD_AUG_OP_ID(id, name) id,
  FASTLOAD_AUG_OPS(FASTLOAD_AUG_OP_ID)
#undef FASTLOAD_AUG_OP_ID
  kAugNumOps
};

// RandomErasing(value="random")'s noise: byte k (row-major over the box, 3 per pixel) of the box seeded by
// `seed`: the top 8 bits of splitmix64(seed * 0x9E3779B97F4A7C15 + k) (fastload/_augment/filters.py: the same
// in numpy and torch).
uint8_t erase_noise(uint64_t seed, uint64_t k);

// Parameters per operation row: kAugParams floats and kAugParams ints (unused ones ignored).
constexpr int kAugParams = 4;

struct AugOpParams {
  int32_t op = 0;
  double f[kAugParams] = {0, 0, 0, 0};
  int64_t i[kAugParams] = {0, 0, 0, 0};
};

// The operation's name in FASTLOAD_AUG_OPS, "unknown" outside [0, kAugNumOps).
const char* aug_op_name(int64_t op);

// Per-thread buffers, grown to the largest tile seen.
struct AugScratch {
  std::vector<uint8_t> copy, warp;
  std::vector<float> a, b, taps_x, taps_y;
};

// Checks one operation's parameters for an h x w tile; false with a message (no prefix) if bad.
bool check_aug_op(const AugOpParams& p, int h, int w, std::string* err);

// Runs ops[0..n_ops) in order on the tile (row r starts at tile + r * stride; 3 bytes a pixel).
// Checks every operation first; returns false with a message, tile untouched, if one is bad.
bool apply_ops(uint8_t* tile, int h, int w, ptrdiff_t stride, const AugOpParams* ops, int64_t n_ops,
               AugScratch* scratch, std::string* err);

// A plan's steps over a batch. Step s runs op[s] on the rows offset[s] .. offset[s+1] - 1; row j
// applies to tile sample[j] with the parameters fparam[j * kAugParams ..], iparam[j * kAugParams ..].
struct AugBatchSpec {
  uint8_t* images = nullptr;  // n x h x w x 3, contiguous
  int64_t n = 0;
  int h = 0, w = 0;
  int64_t num_steps = 0;
  const int64_t* op = nullptr;      // num_steps
  const int64_t* offset = nullptr;  // num_steps + 1, from 0 to num_rows, non-decreasing
  int64_t num_rows = 0;
  const int64_t* sample = nullptr;  // num_rows, each in [0, n)
  const double* fparam = nullptr;   // num_rows x kAugParams
  const int64_t* iparam = nullptr;  // num_rows x kAugParams
  // The plan's geometry per tile (all null: none), run before the operations (warp.h):
  const uint8_t* vflip = nullptr;          // n
  const uint8_t* has_affine = nullptr;     // n
  const double* affine = nullptr;          // n x 6
  const uint8_t* interpolation = nullptr;  // n
  const double* fill = nullptr;            // n x 3
  // Padded crop windows (fastload/_augment/padding.py; null: none), assembled before the geometry: tile i with
  // pad_active[i] holds its decoded box (pad_hw[i], rows of pad_hw[i][1] * 3 bytes from the tile's start), and
  // becomes tile[y][x] = box[pad_rows[i][y]][pad_cols[i][x mirrored if hflip[i]]], pad_fill[i] where either is -1.
  const uint8_t* pad_active = nullptr;  // n
  const int32_t* pad_hw = nullptr;      // n x 2, 1 <= each <= the tile's
  const int32_t* pad_rows = nullptr;    // n x h, each in [-1, pad_hw[i][0])
  const int32_t* pad_cols = nullptr;    // n x w, each in [-1, pad_hw[i][1])
  const double* pad_fill = nullptr;     // n x 3, 0..255
  const uint8_t* hflip = nullptr;       // n (required with pad_active)
};

// A batch's augmentation checked once and arranged per tile, so that whoever holds a tile (a
// decode thread right after writing it, or augment_batch) runs that tile's part alone.
class AugPlan {
 public:
  // Checks the whole spec (naming the first bad step/row/sample and the sizes); spec.images unused.
  bool prepare(const AugBatchSpec& spec, std::string* err);
  // Tile i's geometry, then its operations in step order.
  void run(int64_t i, uint8_t* tile, ptrdiff_t stride, AugScratch* scratch) const;
  int h() const { return h_; }
  int w() const { return w_; }

 private:
  int h_ = 0, w_ = 0;
  std::vector<int64_t> count_;  // tile i's operations are by_sample_[count_[i] .. count_[i + 1])
  std::vector<AugOpParams> by_sample_;
  std::vector<AugGeometry> geometry_;  // empty: none
  const AugBatchSpec* pad_ = nullptr;  // its pad_* arrays, checked (the spec outlives the plan's use)
};

// Checks the whole spec (naming the first bad step/row and the sizes), then runs it. On error
// returns false with a message and leaves the images untouched.
bool augment_batch(ThreadPool* pool, const AugBatchSpec& spec, std::string* err);

}  // namespace fastload
