#include "convert.h"

#include <immintrin.h>

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

// RGB with AVX2 written out: 24 values (8 pixels) are three vectors, each with its own constants. GCC's
// vectorisation of the period-24 loops above took 1.4x (affine) and 2x (blend) the CPU time of these on a
// 64x224x224x3 batch, the blend's extra work then costing as much as the rest of the pass. The same
// operations in the same order as the loops above (multiply, then add; no fused multiply-add): the same bits.
__attribute__((target("avx2"))) inline __m256 load8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Outputs at least this many floats (a batch of images, far past the caches) are written with streaming stores
// when 32-byte aligned: the cache lines are not read before they are overwritten, half the memory traffic.
constexpr int64_t kStreamFloats = int64_t{1} << 20;

__attribute__((target("avx2"))) void affine_rgb_avx2(const uint8_t* src, float* out, int64_t n, const float* a,
                                                     const float* b, int) {
  const __m256 va[3] = {_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8), _mm256_loadu_ps(a + 16)};
  const __m256 vb[3] = {_mm256_loadu_ps(b), _mm256_loadu_ps(b + 8), _mm256_loadu_ps(b + 16)};
  int64_t i = 0;
  if (n >= kStreamFloats && (reinterpret_cast<uintptr_t>(out) & 31) == 0) {
    for (; i + 24 <= n; i += 24) {  // 24 floats are 96 bytes: every store stays 32-byte aligned
      for (int q = 0; q < 3; ++q) {
        _mm256_stream_ps(out + i + 8 * q, _mm256_add_ps(_mm256_mul_ps(load8(src + i + 8 * q), va[q]), vb[q]));
      }
    }
    _mm_sfence();  // the streamed stores ordered before whatever the caller does next
  }
  for (; i + 24 <= n; i += 24) {
    for (int q = 0; q < 3; ++q) {
      _mm256_storeu_ps(out + i + 8 * q, _mm256_add_ps(_mm256_mul_ps(load8(src + i + 8 * q), va[q]), vb[q]));
    }
  }
  int j = 0;  // i % 24 == j from here
  for (; i + 8 <= n; i += 8, j += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(load8(src + i), va[j / 8]), vb[j / 8]));
  }
  for (; i < n; ++i, ++j) out[i] = static_cast<float>(src[i]) * a[j] + b[j];
}

__attribute__((target("avx2"))) inline void blend8(const uint8_t* sa, const uint8_t* sb, float* out, __m256 wa,
                                                   __m256 wb, __m256 b) {
  const __m256 sum = _mm256_add_ps(_mm256_mul_ps(load8(sa), wa), _mm256_mul_ps(load8(sb), wb));
  _mm256_storeu_ps(out, _mm256_add_ps(sum, b));
}

__attribute__((target("avx2"))) void blend_rgb_avx2(const uint8_t* sa, const uint8_t* sb, float* out, int64_t n,
                                                    const float* wa, const float* wb, const float* b, int) {
  const __m256 va[3] = {_mm256_loadu_ps(wa), _mm256_loadu_ps(wa + 8), _mm256_loadu_ps(wa + 16)};
  const __m256 vw[3] = {_mm256_loadu_ps(wb), _mm256_loadu_ps(wb + 8), _mm256_loadu_ps(wb + 16)};
  const __m256 vb[3] = {_mm256_loadu_ps(b), _mm256_loadu_ps(b + 8), _mm256_loadu_ps(b + 16)};
  int64_t i = 0;
  for (; i + 24 <= n; i += 24) {
    for (int q = 0; q < 3; ++q) blend8(sa + i + 8 * q, sb + i + 8 * q, out + i + 8 * q, va[q], vw[q], vb[q]);
  }
  int j = 0;  // i % 24 == j from here
  for (; i + 8 <= n; i += 8, j += 8) blend8(sa + i, sb + i, out + i, va[j / 8], vw[j / 8], vb[j / 8]);
  for (; i < n; ++i, ++j) {
    out[i] = (static_cast<float>(sa[i]) * wa[j] + static_cast<float>(sb[i]) * wb[j]) + b[j];
  }
}

// RGB (the case that matters) with the period known; AVX2 where the CPU has it.
AffineFn pick_affine(int channels, bool allow_avx2) {
  const bool avx2 = allow_avx2 && __builtin_cpu_supports("avx2");
  if (channels == 3) return avx2 ? affine_rgb_avx2 : affine_portable<24>;
  return avx2 ? affine_avx2<0> : affine_portable<0>;
}

BlendFn pick_blend(int channels, bool allow_avx2) {
  const bool avx2 = allow_avx2 && __builtin_cpu_supports("avx2");
  if (channels == 3) return avx2 ? blend_rgb_avx2 : blend_portable<24>;
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
  // CutMix: every run starts on a pixel, so on the constants' channel 0 (see Constants). Three runs per box row
  // cost about 40 ns a row over a plain pass (their remainders and loop exits; a row kernel selecting the source
  // per vector was no faster): under 0.5 ms on a 64x224x224 batch with a half-size box.
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

namespace {

void planes_portable(const uint8_t* s, uint8_t* d, int64_t hw, int channels) {
  for (int c = 0; c < channels; ++c) {
    uint8_t* plane = d + c * hw;
    for (int64_t p = 0; p < hw; ++p) plane[p] = s[p * channels + c];
  }
}

// 16 pixels (48 bytes) per step: each of the three 16-byte loads shuffled into the lanes of each channel.
__attribute__((target("ssse3"))) void planes_rgb_ssse3(const uint8_t* s, uint8_t* d, int64_t hw) {
  uint8_t* d0 = d;
  uint8_t* d1 = d + hw;
  uint8_t* d2 = d + 2 * hw;
  // mask[c][k]: where load k's bytes of channel c go in the 16 output lanes (-1: zero)
  const __m128i m00 = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m01 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
  const __m128i m02 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
  const __m128i m10 = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m11 = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
  const __m128i m12 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
  const __m128i m20 = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i m21 = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
  const __m128i m22 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
  int64_t p = 0;
  for (; p + 16 <= hw; p += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * p));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * p + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * p + 32));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d0 + p),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m00), _mm_shuffle_epi8(b, m01)),
                                  _mm_shuffle_epi8(c, m02)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d1 + p),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m10), _mm_shuffle_epi8(b, m11)),
                                  _mm_shuffle_epi8(c, m12)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d2 + p),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m20), _mm_shuffle_epi8(b, m21)),
                                  _mm_shuffle_epi8(c, m22)));
  }
  for (; p < hw; ++p) {
    d0[p] = s[3 * p];
    d1[p] = s[3 * p + 1];
    d2[p] = s[3 * p + 2];
  }
}

}  // namespace

bool hwc_to_chw_u8(const uint8_t* src, uint8_t* out, int64_t n, int64_t hw, int channels, std::string* err) {
  const int64_t per = hw * channels;
  if (overlaps(src, n * per, out, n * per)) {
    *err = "out overlaps src; write into a separate buffer";
    return false;
  }
  const bool ssse3 = channels == 3 && __builtin_cpu_supports("ssse3");
  for (int64_t i = 0; i < n; ++i) {
    if (ssse3) {
      planes_rgb_ssse3(src + i * per, out + i * per, hw);
    } else {
      planes_portable(src + i * per, out + i * per, hw, channels);
    }
  }
  return true;
}

}  // namespace fastload
