#include "convert.h"

#include <array>
#include <cmath>

#include "region.h"

namespace fastload {
namespace {

// The per-channel constants repeated over kPeriod = 8 * channels elements: a whole number of both
// channel groups and 8-float vectors, so the inner loop has one fixed pattern to vectorise. Any run of
// elements starting on a pixel boundary (a multiple of channels) starts on the pattern's channel 0.
struct Constants {
  std::array<float, 8 * kAffineMaxChannels> scale, shift;
  int period;
};

Constants repeat(int channels, const float* scale, const float* shift) {
  Constants c;
  c.period = 8 * channels;
  for (int j = 0; j < c.period; ++j) {
    c.scale[j] = scale[j % channels];
    c.shift[j] = shift[j % channels];
  }
  return c;
}

template <int kPeriod>  // 0: the period is only known at run time (period)
__attribute__((always_inline)) inline void affine_body(const uint8_t* __restrict src, float* __restrict out,
                                                       int64_t n, const float* __restrict a,
                                                       const float* __restrict b, int period_rt) {
  const int period = kPeriod ? kPeriod : period_rt;
  int64_t i = 0;
  for (; i + period <= n; i += period) {
    for (int j = 0; j < period; ++j) out[i + j] = static_cast<float>(src[i + j]) * a[j] + b[j];
  }
  for (int j = 0; i < n; ++i, ++j) out[i] = static_cast<float>(src[i]) * a[j] + b[j];  // i % period == j
}

// MixUp's blend, the weights folded into the scale: wa = lam * scale, wb = (1 - lam) * scale.
template <int kPeriod>
__attribute__((always_inline)) inline void blend_body(const uint8_t* __restrict sa, const uint8_t* __restrict sb,
                                                      float* __restrict out, int64_t n, const float* __restrict wa,
                                                      const float* __restrict wb, const float* __restrict b,
                                                      int period_rt) {
  const int period = kPeriod ? kPeriod : period_rt;
  int64_t i = 0;
  for (; i + period <= n; i += period) {
    for (int j = 0; j < period; ++j) {
      out[i + j] = (static_cast<float>(sa[i + j]) * wa[j] + static_cast<float>(sb[i + j]) * wb[j]) + b[j];
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    out[i] = (static_cast<float>(sa[i]) * wa[j] + static_cast<float>(sb[i]) * wb[j]) + b[j];
  }
}

using AffineFn = void (*)(const uint8_t*, float*, int64_t, const float*, const float*, int);
using BlendFn = void (*)(const uint8_t*, const uint8_t*, float*, int64_t, const float*, const float*, const float*,
                         int);

template <int kPeriod>
__attribute__((target("avx2"))) void affine_avx2(const uint8_t* src, float* out, int64_t n, const float* a,
                                                 const float* b, int period) {
  affine_body<kPeriod>(src, out, n, a, b, period);
}

template <int kPeriod>
void affine_portable(const uint8_t* src, float* out, int64_t n, const float* a, const float* b, int period) {
  affine_body<kPeriod>(src, out, n, a, b, period);
}

template <int kPeriod>
__attribute__((target("avx2"))) void blend_avx2(const uint8_t* sa, const uint8_t* sb, float* out, int64_t n,
                                                const float* wa, const float* wb, const float* b, int period) {
  blend_body<kPeriod>(sa, sb, out, n, wa, wb, b, period);
}

template <int kPeriod>
void blend_portable(const uint8_t* sa, const uint8_t* sb, float* out, int64_t n, const float* wa, const float* wb,
                    const float* b, int period) {
  blend_body<kPeriod>(sa, sb, out, n, wa, wb, b, period);
}

// RGB (the case that matters) with the period known to the compiler; AVX2 where the CPU has it.
AffineFn pick_affine(int channels, bool allow_avx2) {
  const bool avx2 = allow_avx2 && __builtin_cpu_supports("avx2");
  if (channels == 3) return avx2 ? affine_avx2<24> : affine_portable<24>;
  return avx2 ? affine_avx2<0> : affine_portable<0>;
}

BlendFn pick_blend(int channels, bool allow_avx2) {
  const bool avx2 = allow_avx2 && __builtin_cpu_supports("avx2");
  if (channels == 3) return avx2 ? blend_avx2<24> : blend_portable<24>;
  return avx2 ? blend_avx2<0> : blend_portable<0>;
}

bool overlapping(const uint8_t* src, float* out, int64_t n, std::string* err) {
  if (overlaps(src, n, reinterpret_cast<const uint8_t*>(out), n * static_cast<int64_t>(sizeof(float)))) {
    *err = "out overlaps src; write into a separate buffer";
    return true;
  }
  return false;
}

}  // namespace

bool affine_u8_f32(const uint8_t* src, float* out, int64_t n, int channels, const float* scale,
                   const float* shift, bool allow_avx2, std::string* err) {
  if (overlapping(src, out, n, err)) return false;
  const Constants c = repeat(channels, scale, shift);
  pick_affine(channels, allow_avx2)(src, out, n, c.scale.data(), c.shift.data(), c.period);
  return true;
}

bool mix_affine_u8_f32(const uint8_t* src, float* out, int64_t n, int64_t h, int64_t w, int channels,
                       const float* scale, const float* shift, const MixSpec& mix, bool allow_avx2,
                       std::string* err) {
  const int64_t row = w * channels, sample = h * row;
  if (overlapping(src, out, n * sample, err)) return false;
  if (!(mix.lam >= 0.0 && mix.lam <= 1.0)) {  // NaN too
    *err = "lam=" + std::to_string(mix.lam) + " should be in [0, 1]";
    return false;
  }
  if (mix.kind == MixKind::kCutMix &&
      !(0 <= mix.x1 && mix.x1 <= mix.x2 && mix.x2 <= w && 0 <= mix.y1 && mix.y1 <= mix.y2 && mix.y2 <= h)) {
    *err = "box (" + std::to_string(mix.x1) + ", " + std::to_string(mix.y1) + ", " + std::to_string(mix.x2) + ", " +
           std::to_string(mix.y2) + ") should satisfy 0 <= x1 <= x2 <= " + std::to_string(w) +
           " and 0 <= y1 <= y2 <= " + std::to_string(h);
    return false;
  }
  const Constants c = repeat(channels, scale, shift);
  const float* a = c.scale.data();
  const float* b = c.shift.data();
  if (mix.kind == MixKind::kMixUp) {
    // the weights rounded once from double: lam * scale and (1 - lam) * scale
    std::array<float, 8 * kAffineMaxChannels> wa, wb;
    for (int j = 0; j < c.period; ++j) {
      wa[j] = static_cast<float>(mix.lam * static_cast<double>(a[j]));
      wb[j] = static_cast<float>((1.0 - mix.lam) * static_cast<double>(a[j]));
    }
    const BlendFn blend = pick_blend(channels, allow_avx2);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t neighbour = i == 0 ? n - 1 : i - 1;
      blend(src + i * sample, src + neighbour * sample, out + i * sample, sample, wa.data(), wb.data(), b, c.period);
    }
    return true;
  }
  // CutMix: every run starts on a pixel, so on the constants' channel 0 (see Constants)
  const AffineFn affine = pick_affine(channels, allow_avx2);
  const int64_t left = mix.x1 * channels, inside = (mix.x2 - mix.x1) * channels, right = row - mix.x2 * channels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* own = src + i * sample;
    const uint8_t* other = src + (i == 0 ? n - 1 : i - 1) * sample;
    float* o = out + i * sample;
    affine(own, o, mix.y1 * row, a, b, c.period);  // the rows above the box
    for (int64_t y = mix.y1; y < mix.y2; ++y) {
      const int64_t at = y * row;
      affine(own + at, o + at, left, a, b, c.period);
      affine(other + at + left, o + at + left, inside, a, b, c.period);
      affine(own + at + left + inside, o + at + left + inside, right, a, b, c.period);
    }
    affine(own + mix.y2 * row, o + mix.y2 * row, (h - mix.y2) * row, a, b, c.period);  // and below
  }
  return true;
}

}  // namespace fastload
