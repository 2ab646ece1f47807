// uint8 pixels to float32 in one pass: out[i] = float(src[i]) * scale[c] + shift[c], c = i % channels.
// ToDtype(float32, scale=True) and Normalize folded into one multiply and one add per element (the CPU
// path of fastload's tensor transforms; on a GPU the same arithmetic runs as torch kernels).
//
// The multiply and the add are separate IEEE operations on every CPU (no fused multiply-add), so the
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

}  // namespace fastload
