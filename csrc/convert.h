// uint8 pixels to float32 in one pass: out[i] = float(src[i]) * scale[c] + shift[c], c = i % channels.
// ToDtype(float32, scale=True) and Normalize folded into one multiply and one add per element (the CPU
// path of fastload's tensor transforms; on a GPU the same arithmetic runs as torch kernels).
//
// The multiplies and adds are separate IEEE operations on every CPU (no fused multiply-add), so the
// AVX2 and the portable loop write the same bits.
#pragma once

#include <cstdint>
#include <string>

namespace fastload {

constexpr int kAffineMaxChannels = 16;

// n: the number of elements (pixels * channels); channels in 1..kAffineMaxChannels. Returns true, or
// false with a message in *err (and out untouched) when src and out overlap. Uses AVX2 where the CPU
// has it and allow_avx2 is set (false: the portable loop).
bool affine_u8_f32(const uint8_t* src, float* out, int64_t n, int channels, const float* scale,
                   const float* shift, bool allow_avx2, std::string* err);

// MixUp / CutMix (torchvision v2's batch transforms) fused into the same pass, so that the blend costs no
// pass over the float batch of its own (issue 21: "MixUp/CutMix add < 2% to the loop"). Sample i is mixed
// with its neighbour i - 1 and sample 0 with sample n - 1 (torchvision's batch.roll(1, 0)); the neighbour's
// pixels are always its original ones, read from src (no chain of pastes):
//   kMixUp:  out = float(src_i) * (lam * scale) + float(src_{i-1}) * ((1 - lam) * scale) + shift, which is
//            affine(lam * src_i + (1 - lam) * src_{i-1}) = lam * affine(src_i) + (1 - lam) * affine(src_{i-1})
//            (the affine is linear and the weights sum to 1), within float32 rounding;
//   kCutMix: affine(src_{i-1}) inside the box [x1, x2) x [y1, y2), affine(src_i) elsewhere: the same bits
//            as affine_u8_f32 followed by the paste.
enum class MixKind { kMixUp, kCutMix };

struct MixSpec {
  MixKind kind;
  double lam;              // kMixUp's weight of sample i, in [0, 1]
  int64_t x1, y1, x2, y2;  // kCutMix's box: 0 <= x1 <= x2 <= w, 0 <= y1 <= y2 <= h
};

// src, out: n samples of h * w pixels of `channels` values each (NHWC, contiguous). Returns true, or false
// with a message in *err (and out untouched) for overlapping buffers, lam outside [0, 1] or a box outside
// the image.
bool mix_affine_u8_f32(const uint8_t* src, float* out, int64_t n, int64_t h, int64_t w, int channels,
                       const float* scale, const float* shift, const MixSpec& mix, bool allow_avx2,
                       std::string* err);

// Channels-last pixels to planes: src holds n images of hw pixels of `channels` uint8 values each (NHWC,
// contiguous), out the same values as n images of `channels` planes of hw values (NCHW, contiguous): what
// torch's contiguous copy of the NCHW view of src gives, without its generic strided loop (about 5x slower
// for 3 channels). Uses SSSE3 for 3 channels where the CPU has it. Returns false with a message in *err
// (and out untouched) when src and out overlap.
bool hwc_to_chw_u8(const uint8_t* src, uint8_t* out, int64_t n, int64_t hw, int channels, std::string* err);

}  // namespace fastload
