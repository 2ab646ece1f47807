#include "augment.h"

#include "pil_enhance.h"
#include "simd.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastload {
namespace {

// Row-wise loops over the tile: fn(row pointer, number of bytes in the row).
template <typename Fn>
inline void for_rows(uint8_t* tile, int h, int w, ptrdiff_t stride, Fn fn) {
  for (int y = 0; y < h; ++y) fn(tile + y * stride, static_cast<int64_t>(w) * 3);
}

// float -> uint8 as torch's finish(): clamp to [0, 255], then the cast truncates. Written with
// comparisons so that a NaN (inf - inf from extreme factors) gives 0 rather than an undefined cast.
inline uint8_t clamp_trunc(float v) {
  v = v > 0.0f ? v : 0.0f;
  v = v < 255.0f ? v : 255.0f;
  return static_cast<uint8_t>(v);
}

// torch's luma on uint8 values: r * 0.2989f, then add(g, alpha=0.587) and add(b, alpha=0.114), which
// torch's vectorised CPU kernel computes as fused multiply-adds. A float times a uint8 is exact in
// double and the sums need at most 36 bits, so double arithmetic rounded once to float is exactly the
// fused result, without needing FMA instructions.
inline float luma(uint8_t r, uint8_t g, uint8_t b) {
  const float a = static_cast<float>(r) * 0.2989f;
  const float ab = static_cast<float>(static_cast<double>(g) * static_cast<double>(0.587f) + static_cast<double>(a));
  return static_cast<float>(static_cast<double>(b) * static_cast<double>(0.114f) + static_cast<double>(ab));
}

// A per-value operation through a 256-entry table: each entry computed by the same float32 operations the
// pixel loop would run, so the bytes are the same; one lookup a byte instead of two conversions and a multiply.
template <typename Fn>
void through_table(uint8_t* t, int h, int w, ptrdiff_t stride, Fn value) {
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = value(static_cast<uint8_t>(v));
  for_rows(t, h, w, stride, [&lut](uint8_t* __restrict p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = lut[p[i]];
  });
}

void brightness(uint8_t* t, int h, int w, ptrdiff_t stride, double factor) {
  const float f = static_cast<float>(factor);
  through_table(t, h, w, stride, [f](uint8_t v) { return clamp_trunc(static_cast<float>(v) * f); });
}

// torchvision's _blend(x, other, r) = x * float(r) + other * float(1 - r), the difference taken in double.
struct BlendFactors {
  float a, b;
  explicit BlendFactors(double r) : a(static_cast<float>(r)), b(static_cast<float>(1.0 - r)) {}
};

// The luma-based kernels, one row at a time: the floored luma of the row into g[0..w) (the luma is
// >= 0, so truncation is the floor: a plain conversion), then what the operation does with it. Compiled
// twice, like convert.cc: for AVX2 (where the compiler vectorises the interleaved RGB loads) and portable;
// the same IEEE operations in both, so the same bytes.
enum LumaUse { kLumaSum, kLumaSaturate, kLumaGray };

// The row's floored luma into g[0..w).
__attribute__((always_inline)) inline void luma_fill(const uint8_t* __restrict p, int w, float* __restrict g) {
  for (int x = 0; x < w; ++x) g[x] = static_cast<float>(static_cast<int>(luma(p[3 * x], p[3 * x + 1], p[3 * x + 2])));
}

// What the operation does with the row's luma g[0..w).
template <int kUse>
__attribute__((always_inline)) inline int64_t luma_use(uint8_t* __restrict p, int w, float* __restrict g, float a,
                                                       float b) {
  int64_t sum = 0;
  if (kUse == kLumaSum) {
    for (int x = 0; x < w; ++x) sum += static_cast<int32_t>(g[x]);
  } else if (kUse == kLumaSaturate) {
    // The blend's luma term spread to the row's bytes first (g[w .. 4w)), so that the blend is one contiguous
    // loop the compiler vectorises; the same float32 products and sums as per pixel.
    float* __restrict other = g + w;
    for (int x = 0; x < w; ++x) other[3 * x] = other[3 * x + 1] = other[3 * x + 2] = g[x] * b;
    for (int i = 0; i < 3 * w; ++i) p[i] = clamp_trunc(static_cast<float>(p[i]) * a + other[i]);
  } else {  // torch's cast truncates the unfloored luma: the same value
    for (int x = 0; x < w; ++x) {
      const uint8_t v = static_cast<uint8_t>(g[x]);
      p[3 * x] = v;
      p[3 * x + 1] = v;
      p[3 * x + 2] = v;
    }
  }
  return sum;
}

template <int kUse>
int64_t luma_portable(uint8_t* p, int w, float* g, float a, float b) {
  luma_fill(p, w, g);
  return luma_use<kUse>(p, w, g, a, b);
}

#if defined(__x86_64__)
// The luma with FMA instructions: torch's two fused multiply-adds as they are, 8 pixels a vector instead of 4
// doubles. The same single rounding of the exact sum as luma()'s double arithmetic, so the same floats. Only
// this function has the fma target: elsewhere the compiler would contract the blends' separate multiply and
// add, which round twice in torch.
__attribute__((target("avx2,fma"))) void luma_fill_fma(const uint8_t* __restrict p, int w, float* __restrict g) {
  // 8 pixels (24 bytes) a step: two loads, each channel's 8 bytes gathered by byte shuffles (-1: zero).
  const __m128i r_lo = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i r_hi = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i g_lo = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i g_hi = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i b_lo = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i b_hi = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256 kr = _mm256_set1_ps(0.2989f), kg = _mm256_set1_ps(0.587f), kb = _mm256_set1_ps(0.114f);
  int x = 0;
  for (; x + 8 <= w; x += 8) {
    const uint8_t* q = p + 3 * x;
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 16));
    const __m256 r = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(lo, r_lo),
                                                                           _mm_shuffle_epi8(hi, r_hi))));
    const __m256 gg = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(lo, g_lo),
                                                                            _mm_shuffle_epi8(hi, g_hi))));
    const __m256 bb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(lo, b_lo),
                                                                            _mm_shuffle_epi8(hi, b_hi))));
    const __m256 a = _mm256_mul_ps(r, kr);
    const __m256 ab = _mm256_fmadd_ps(gg, kg, a);
    const __m256 l = _mm256_fmadd_ps(bb, kb, ab);
    _mm256_storeu_ps(g + x, _mm256_cvtepi32_ps(_mm256_cvttps_epi32(l)));
  }
  for (; x < w; ++x) {
    const float a = static_cast<float>(p[3 * x]) * 0.2989f;
    const float ab = __builtin_fmaf(static_cast<float>(p[3 * x + 1]), 0.587f, a);
    g[x] = static_cast<float>(static_cast<int>(__builtin_fmaf(static_cast<float>(p[3 * x + 2]), 0.114f, ab)));
  }
}

template <int kUse>
__attribute__((target("avx2"))) int64_t luma_avx2(uint8_t* p, int w, float* g, float a, float b) {
  static const bool fma = __builtin_cpu_supports("fma");
  if (fma) {
    luma_fill_fma(p, w, g);
  } else {
    luma_fill(p, w, g);
  }
  return luma_use<kUse>(p, w, g, a, b);
}

#endif

// Runs a luma kernel over the tile's rows; returns the sum of the floored luma for kLumaSum.
template <int kUse>
int64_t luma_rows(uint8_t* t, int h, int w, ptrdiff_t stride, float a, float b, AugScratch* s) {
  s->a.resize(static_cast<size_t>(w) * 4);  // the luma, then kLumaSaturate's per-byte term
  int64_t sum = 0;
  for (int y = 0; y < h; ++y) {
#if defined(__x86_64__)
    if (use_avx2()) {
      sum += luma_avx2<kUse>(t + y * stride, w, s->a.data(), a, b);
      continue;
    }
#endif
    sum += luma_portable<kUse>(t + y * stride, w, s->a.data(), a, b);
  }
  return sum;
}

void contrast(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, AugScratch* s) {
  // The mean of the floored luma: a sum of integers, exact in torch's float32 while below 2^24
  // (tiles up to 256 x 256); here exact in int64 at any size.
  const int64_t sum = luma_rows<kLumaSum>(t, h, w, stride, 0.0f, 0.0f, s);
  const float mean = static_cast<float>(sum) / static_cast<float>(static_cast<int64_t>(h) * w);
  const BlendFactors bf(factor);
  const float other = mean * bf.b;
  const float a = bf.a;
  through_table(t, h, w, stride, [a, other](uint8_t v) {
    const float scaled = static_cast<float>(v) * a;  // rounded before the add, as torch's separate ops
    return clamp_trunc(scaled + other);
  });
}

void saturation(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, AugScratch* s) {
  const BlendFactors bf(factor);
  luma_rows<kLumaSaturate>(t, h, w, stride, bf.a, bf.b, s);
}

void grayscale(uint8_t* t, int h, int w, ptrdiff_t stride, AugScratch* s) {
  luma_rows<kLumaGray>(t, h, w, stride, 0.0f, 0.0f, s);
}

// torch's remainder(a, 1) for floats: fmod, moved into [0, 1) when negative.
inline float remainder1(float a) {
  float m = std::fmod(a, 1.0f);
  if (m != 0.0f && m < 0.0f) m += 1.0f;
  return m;
}

// engine_torch's _rgb_to_hsv -> hue shift -> _hsv_to_rgb on one pixel, operation by operation in float32.
inline void hue_pixel(uint8_t* q, float shift) {
  const float inv255 = static_cast<float>(1.0 / 255.0);
  const float r = static_cast<float>(q[0]) * inv255, g = static_cast<float>(q[1]) * inv255,
              b = static_cast<float>(q[2]) * inv255;
  const float maxc = std::max(std::max(r, g), b), minc = std::min(std::min(r, g), b);
  const bool eqc = maxc == minc;
  const float cr = maxc - minc;
  const float s = cr / (eqc ? 1.0f : maxc);
  const float crd = eqc ? 1.0f : cr;
  const float rc = (maxc - r) / crd, gc = (maxc - g) / crd, bc = (maxc - b) / crd;
  const bool not_r = maxc != r, is_g = maxc == g;
  float hsum;  // only one of torch's three masked terms is non-zero
  if (!not_r) {
    hsum = bc - gc;
  } else if (is_g) {
    hsum = (2.0f + rc) - bc;
  } else {
    hsum = (4.0f + gc) - rc;
  }
  float hh = std::fmod(hsum / 6.0f + 1.0f, 1.0f);
  hh = remainder1(hh + shift);
  const float v = maxc;
  const float h6 = hh * 6.0f;
  const float fi = std::floor(h6);
  const float f = h6 - fi;
  int i = static_cast<int>(fi) % 6;
  if (i < 0) i += 6;
  const float p = std::min(std::max(v * (1.0f - s), 0.0f), 1.0f);
  const float qq = std::min(std::max(v * (1.0f - s * f), 0.0f), 1.0f);
  const float tt = std::min(std::max(v * (1.0f - s * (1.0f - f)), 0.0f), 1.0f);
  float o[3];
  switch (i) {
    case 0: o[0] = v, o[1] = tt, o[2] = p; break;
    case 1: o[0] = qq, o[1] = v, o[2] = p; break;
    case 2: o[0] = p, o[1] = v, o[2] = tt; break;
    case 3: o[0] = p, o[1] = qq, o[2] = v; break;
    case 4: o[0] = tt, o[1] = p, o[2] = v; break;
    default: o[0] = v, o[1] = p, o[2] = qq; break;
  }
  const float scale = static_cast<float>(255.0 + 1.0 - 1e-3);  // torchvision's float -> uint8
  for (int c = 0; c < 3; ++c) q[c] = static_cast<uint8_t>(o[c] * scale);
}

void hue(uint8_t* t, int h, int w, ptrdiff_t stride, double factor) {
  const float shift = static_cast<float>(factor);
  for (int y = 0; y < h; ++y) {
    uint8_t* p = t + y * stride;
    for (int x = 0; x < w; ++x) hue_pixel(p + 3 * x, shift);
  }
}

void solarize(uint8_t* t, int h, int w, ptrdiff_t stride, double threshold) {
  const float thr = static_cast<float>(threshold);
  for_rows(t, h, w, stride, [thr](uint8_t* __restrict p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i]) >= thr ? static_cast<uint8_t>(255 - p[i]) : p[i];
  });
}

void posterize(uint8_t* t, int h, int w, ptrdiff_t stride, int64_t bits) {
  const uint8_t mask = static_cast<uint8_t>((255u << (8 - bits)) & 255u);
  for_rows(t, h, w, stride, [mask](uint8_t* __restrict p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] &= mask;
  });
}

// timm's solarize_add: img.point(lut), lut[v] = min(255, v + add) for v < threshold, else v.
void solarize_add(uint8_t* t, int h, int w, ptrdiff_t stride, int64_t add, int64_t threshold) {
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<uint8_t>(v < threshold ? std::min<int64_t>(255, v + add) : v);
  for_rows(t, h, w, stride, [&lut](uint8_t* __restrict p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = lut[p[i]];
  });
}

void invert(uint8_t* t, int h, int w, ptrdiff_t stride) {
  for_rows(t, h, w, stride, [](uint8_t* __restrict p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(~p[i]);
  });
}

// Three-channel lookups, one table per channel: p[3x + c] = lut[c][p[3x + c]].
void apply_luts3(uint8_t* t, int h, int w, ptrdiff_t stride, const uint8_t (*lut)[256]) {
  for (int y = 0; y < h; ++y) {
    uint8_t* __restrict p = t + y * stride;
    for (int x = 0; x < w; ++x) {
      p[3 * x] = lut[0][p[3 * x]];
      p[3 * x + 1] = lut[1][p[3 * x + 1]];
      p[3 * x + 2] = lut[2][p[3 * x + 2]];
    }
  }
}

// Per-channel histograms of the tile. Photos repeat values between neighbours, so one table per channel would
// make each increment wait for the previous one to the same counter; even and odd pixels count into separate
// tables, summed at the end (a tile has far fewer than 2^32 pixels: check_aug_op's callers keep h, w in int).
void histogram3(const uint8_t* t, int h, int w, ptrdiff_t stride, int64_t (*hist)[256]) {
  uint32_t part[2][3][256] = {};
  for (int y = 0; y < h; ++y) {
    const uint8_t* __restrict p = t + y * stride;
    int x = 0;
    for (; x + 1 < w; x += 2, p += 6) {
      ++part[0][0][p[0]];
      ++part[0][1][p[1]];
      ++part[0][2][p[2]];
      ++part[1][0][p[3]];
      ++part[1][1][p[4]];
      ++part[1][2][p[5]];
    }
    if (x < w) {
      ++part[0][0][p[0]];
      ++part[0][1][p[1]];
      ++part[0][2][p[2]];
    }
  }
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) hist[c][v] = static_cast<int64_t>(part[0][c][v]) + part[1][c][v];
}

// PIL's equalize, per channel: lut[v] = (pixels below v + step / 2) / step, step = (pixels - count of
// the largest value) / 255; a channel with step 0 (one or two values) is left as it is.
void equalize(uint8_t* t, int h, int w, ptrdiff_t stride) {
  int64_t hist[3][256];
  histogram3(t, h, w, stride, hist);
  const int64_t total = static_cast<int64_t>(h) * w;
  uint8_t lut[3][256];
  bool change[3];
  for (int c = 0; c < 3; ++c) {
    int last = 255;
    while (last > 0 && hist[c][last] == 0) --last;
    const int64_t step = (total - hist[c][last]) / 255;
    change[c] = step != 0;
    int64_t cum = 0;
    lut[c][0] = 0;
    for (int v = 1; v < 256; ++v) {
      cum += hist[c][v - 1];
      lut[c][v] = static_cast<uint8_t>(std::min<int64_t>((cum + step / 2) / std::max<int64_t>(step, 1), 255));
    }
  }
  if (!change[0] && !change[1] && !change[2]) return;
  for (int c = 0; c < 3; ++c)
    if (!change[c])
      for (int v = 0; v < 256; ++v) lut[c][v] = static_cast<uint8_t>(v);
  apply_luts3(t, h, w, stride, lut);
}

// The per-channel minimum and maximum of one row's n = 3 w bytes, folded into lo[3], hi[3]. On x86-64, SSE2
// (always there) keeps the running minima and maxima of 48-byte blocks in three 16-byte registers each: 48 is a
// multiple of 3, so byte k of a block is always channel k % 3; folded per channel once per row.
void row_minmax(const uint8_t* p, int64_t n, uint8_t* lo, uint8_t* hi) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (n >= 48) {
    __m128i l0 = _mm_set1_epi8(-1), l1 = l0, l2 = l0, h0 = _mm_setzero_si128(), h1 = h0, h2 = h0;
    for (; i + 48 <= n; i += 48) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 32));
      l0 = _mm_min_epu8(l0, a), l1 = _mm_min_epu8(l1, b), l2 = _mm_min_epu8(l2, c);
      h0 = _mm_max_epu8(h0, a), h1 = _mm_max_epu8(h1, b), h2 = _mm_max_epu8(h2, c);
    }
    alignas(16) uint8_t vlo[48], vhi[48];
    _mm_store_si128(reinterpret_cast<__m128i*>(vlo), l0);
    _mm_store_si128(reinterpret_cast<__m128i*>(vlo + 16), l1);
    _mm_store_si128(reinterpret_cast<__m128i*>(vlo + 32), l2);
    _mm_store_si128(reinterpret_cast<__m128i*>(vhi), h0);
    _mm_store_si128(reinterpret_cast<__m128i*>(vhi + 16), h1);
    _mm_store_si128(reinterpret_cast<__m128i*>(vhi + 32), h2);
    for (int k = 0; k < 48; ++k) {
      lo[k % 3] = std::min(lo[k % 3], vlo[k]);
      hi[k % 3] = std::max(hi[k % 3], vhi[k]);
    }
  }
#endif
  for (int c = 0; i < n; ++i, c = c == 2 ? 0 : c + 1) {  // i is a multiple of 3 here: c is the channel
    lo[c] = std::min(lo[c], p[i]);
    hi[c] = std::max(hi[c], p[i]);
  }
}

// Per channel (x - lo) / ((hi - lo) / 255) in float32, truncated; a flat channel stays.
void autocontrast(uint8_t* t, int h, int w, ptrdiff_t stride) {
  uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
  const int64_t row = static_cast<int64_t>(w) * 3;
  for (int y = 0; y < h; ++y) row_minmax(t + y * stride, row, lo, hi);
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const bool same = hi[c] == lo[c];
    const float inv_scale = same ? 1.0f : (static_cast<float>(hi[c]) - static_cast<float>(lo[c])) / 255.0f;
    const float low = same ? 0.0f : static_cast<float>(lo[c]);
    // 256 values per channel: a table computes each division once, with the same float32 operations.
    for (int v = 0; v < 256; ++v) lut[c][v] = clamp_trunc((static_cast<float>(v) - low) / inv_scale);
  }
  apply_luts3(t, h, w, stride, lut);
}

// Blend with the 3x3 smoothing (1 around, 5 in the middle, over 13) on the interior; borders stay.
// The smoothed value is round(S / 13) for the integer S: never a tie, so computed exactly in integers
// ((2 S + 13) / 26), which is what torch's float32 convolution rounds to.
// One interior row of sharpness (bytes 3 .. row - 3), compiled portable and for AVX2 as the luma kernels are:
// the same integer and float32 operations in both, so the same bytes.
__attribute__((always_inline)) inline void sharpen_body(const uint8_t* __restrict up, const uint8_t* __restrict mid,
                                                        const uint8_t* __restrict dn, uint8_t* __restrict out,
                                                        int64_t row, float g) {
  for (int64_t i = 3; i < row - 3; ++i) {
    const int sum = up[i - 3] + up[i] + up[i + 3] + mid[i - 3] + 5 * mid[i] + mid[i + 3] + dn[i - 3] + dn[i] +
                    dn[i + 3];
    // (2 S + 13) / 26 as a multiply and a shift, which vectorises where the division does not: exact for
    // every 0 <= 2 S + 13 <= 2 * 13 * 255 + 13 (checked exhaustively; 10083 = ceil(2^18 / 26)).
    const int blurred = ((2 * sum + 13) * 10083) >> 18;
    const float in = static_cast<float>(mid[i]);
    out[i] = clamp_trunc(in + g * static_cast<float>(blurred - mid[i]));
  }
}

void sharpen_portable(const uint8_t* up, const uint8_t* mid, const uint8_t* dn, uint8_t* out, int64_t row, float g) {
  sharpen_body(up, mid, dn, out, row, g);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void sharpen_avx2(const uint8_t* up, const uint8_t* mid, const uint8_t* dn,
                                                  uint8_t* out, int64_t row, float g) {
  sharpen_body(up, mid, dn, out, row, g);
}
#endif

void sharpness(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, AugScratch* s) {
  if (h <= 2 || w <= 2) return;
  const int64_t row = static_cast<int64_t>(w) * 3;
  s->copy.resize(static_cast<size_t>(row * h));
  uint8_t* src = s->copy.data();
  for (int y = 0; y < h; ++y) std::memcpy(src + y * row, t + y * stride, static_cast<size_t>(row));
  const float g = 1.0f - static_cast<float>(factor);
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* up = src + (y - 1) * row;
    const uint8_t* mid = src + y * row;
    const uint8_t* dn = src + (y + 1) * row;
#if defined(__x86_64__)
    if (use_avx2()) {
      sharpen_avx2(up, mid, dn, t + y * stride, row, g);
      continue;
    }
#endif
    sharpen_portable(up, mid, dn, t + y * stride, row, g);
  }
}

void erase(uint8_t* t, int h, int w, ptrdiff_t stride, const int64_t* box, const double* value) {
  const int64_t top = std::max<int64_t>(box[0], 0), left = std::max<int64_t>(box[1], 0);
  const int64_t bottom = std::min<int64_t>(box[0] + box[2], h), right = std::min<int64_t>(box[1] + box[3], w);
  uint8_t v[3];
  for (int c = 0; c < 3; ++c) v[c] = static_cast<uint8_t>(std::trunc(static_cast<float>(value[c])));
  for (int64_t y = top; y < bottom; ++y) {
    uint8_t* p = t + y * stride;
    for (int64_t x = left; x < right; ++x)
      for (int c = 0; c < 3; ++c) p[3 * x + c] = v[c];
  }
}

void erase_random(uint8_t* t, int h, int w, ptrdiff_t stride, const int64_t* box, double seed) {
  const int64_t top = std::max<int64_t>(box[0], 0), left = std::max<int64_t>(box[1], 0);
  const int64_t bottom = std::min<int64_t>(box[0] + box[2], h), right = std::min<int64_t>(box[1] + box[3], w);
  const uint64_t s = static_cast<uint64_t>(seed);
  for (int64_t y = top; y < bottom; ++y) {
    uint8_t* p = t + y * stride;
    const uint64_t row = static_cast<uint64_t>((y - box[0]) * box[3]);
    for (int64_t x = left; x < right; ++x) {
      const uint64_t k = (row + static_cast<uint64_t>(x - box[1])) * 3;
      for (int c = 0; c < 3; ++c) p[3 * x + c] = erase_noise(s, k + c);
    }
  }
}

// torchvision's normalised Gaussian taps at -(k-1)/2 .. (k-1)/2, in float32.
void gaussian_taps(int k, double sigma, std::vector<float>* taps) {
  taps->resize(static_cast<size_t>(k));
  const float sg = static_cast<float>(sigma);
  float total = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float x = static_cast<float>(j - (k - 1) / 2) / sg;
    (*taps)[j] = std::exp(-0.5f * (x * x));
    total += (*taps)[j];
  }
  for (float& v : *taps) v /= total;
}

inline int reflect(int i, int n) { return i < 0 ? -i : (i >= n ? 2 * n - 2 - i : i); }

// Separable, reflect-padded, vertical pass then horizontal, float32, rounded half to even.
void gaussian_blur(uint8_t* t, int h, int w, ptrdiff_t stride, const int64_t* ksize, const double* sigma,
                   AugScratch* s) {
  const int kx = static_cast<int>(ksize[0]), ky = static_cast<int>(ksize[1]);
  gaussian_taps(kx, sigma[0], &s->taps_x);
  gaussian_taps(ky, sigma[1], &s->taps_y);
  const float* tx = s->taps_x.data();
  const float* ty = s->taps_y.data();
  const int64_t row = static_cast<int64_t>(w) * 3;
  const int px = kx / 2, py = ky / 2;
  const int64_t padded = (static_cast<int64_t>(w) + 2 * px) * 3;
  s->a.assign(static_cast<size_t>(row * h), 0.0f);
  s->b.resize(static_cast<size_t>(padded));
  float* vert = s->a.data();
  for (int y = 0; y < h; ++y) {
    float* __restrict out = vert + y * row;
    for (int k = 0; k < ky; ++k) {
      const uint8_t* __restrict in = t + reflect(y - py + k, h) * stride;
      const float wk = ty[k];
      for (int64_t i = 0; i < row; ++i) out[i] += wk * static_cast<float>(in[i]);
    }
  }
  float* pad = s->b.data();
  for (int y = 0; y < h; ++y) {
    const float* in = vert + y * row;
    for (int x = -px; x < w + px; ++x) std::memcpy(pad + (x + px) * 3, in + reflect(x, w) * 3, 3 * sizeof(float));
    uint8_t* out = t + y * stride;
    for (int64_t i = 0; i < row; ++i) {
      float acc = 0.0f;
      for (int k = 0; k < kx; ++k) acc += tx[k] * pad[i + 3 * k];
      out[i] = static_cast<uint8_t>(std::min(std::max(std::nearbyint(acc), 0.0f), 255.0f));
    }
  }
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

uint8_t erase_noise(uint64_t seed, uint64_t k) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + k + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint8_t>((z ^ (z >> 31)) >> 56);
}

const char* aug_op_name(int64_t op) {
  static const char* const names[kAugNumOps] = {
#define FASTLOAD_AUG_OP_NAME(id, name) name,
      FASTLOAD_AUG_OPS(FASTLOAD_AUG_OP_NAME)
#undef FASTLOAD_AUG_OP_NAME
  };
  return op >= 0 && op < kAugNumOps ? names[op] : "unknown";
}

bool check_aug_op(const AugOpParams& p, int h, int w, std::string* err) {
  if (p.op < 0 || p.op >= kAugNumOps) {
    *err = "operation id " + std::to_string(p.op) + " is outside [0, " + std::to_string(kAugNumOps - 1) + "]";
    return false;
  }
  switch (p.op) {
    case kAugPilColor: case kAugPilContrast:
      if (p.i[0] != 0 && p.i[0] != 1) {
        *err = "luma " + std::to_string(p.i[0]) + " should be 0 (Pillow's) or 1 (pillow-simd's)";
        return false;
      }
      [[fallthrough]];
    case kAugBrightness: case kAugContrast: case kAugSaturation: case kAugHue: case kAugSharpness:
    case kAugSolarize:
      if (!std::isfinite(static_cast<float>(p.f[0]))) {  // the kernels compute in float32
        *err = std::string(p.op == kAugSolarize ? "threshold " : "factor ") + num(p.f[0]) +
               " is not finite in float32";
        return false;
      }
      return true;
    case kAugSolarizeAdd:
      if (p.i[0] < 0 || p.i[0] > 255 || p.i[1] < 0 || p.i[1] > 256) {
        *err = "add " + std::to_string(p.i[0]) + " / threshold " + std::to_string(p.i[1]) +
               " is outside [0, 255] / [0, 256]";
        return false;
      }
      return true;
    case kAugPosterize:
      if (p.i[0] < 0 || p.i[0] > 8) {
        *err = "bits " + std::to_string(p.i[0]) + " is outside [0, 8]";
        return false;
      }
      return true;
    case kAugErase:
      for (int c = 0; c < 4; ++c) {  // int32 range: top + height cannot overflow
        if (p.i[c] < INT32_MIN || p.i[c] > INT32_MAX) {
          *err = "box " + std::to_string(p.i[c]) + " (position " + std::to_string(c) +
                 " of top, left, height, width) is outside the int32 range";
          return false;
        }
      }
      for (int c = 0; c < 3; ++c) {
        if (!(p.f[c] >= 0.0 && p.f[c] <= 255.0)) {
          *err = "value " + num(p.f[c]) + " (channel " + std::to_string(c) +
                 ") is outside [0, 255], the range of uint8 tiles";
          return false;
        }
      }
      return true;
    case kAugEraseRandom:
      for (int c = 0; c < 4; ++c) {
        if (p.i[c] < INT32_MIN || p.i[c] > INT32_MAX) {
          *err = "box " + std::to_string(p.i[c]) + " (position " + std::to_string(c) +
                 " of top, left, height, width) is outside the int32 range";
          return false;
        }
      }
      if (!(p.f[0] >= 0.0 && p.f[0] < 9007199254740992.0) || p.f[0] != std::floor(p.f[0])) {
        *err = "seed " + num(p.f[0]) + " should be an integer in [0, 2^53)";
        return false;
      }
      return true;
    case kAugGaussianBlur:
      for (int a = 0; a < 2; ++a) {
        const int64_t k = p.i[a], size = a == 0 ? w : h;
        if (k <= 0 || k % 2 == 0 || k / 2 >= size) {
          *err = std::string("kernel size ") + (a == 0 ? "x " : "y ") + std::to_string(k) +
                 " should be odd, positive and with half of it below the tile's " + (a == 0 ? "width " : "height ") +
                 std::to_string(size) + " (reflect padding)";
          return false;
        }
        if (!(p.f[a] > 0.0) || !std::isfinite(p.f[a])) {
          *err = std::string("sigma ") + (a == 0 ? "x " : "y ") + num(p.f[a]) + " should be positive and finite";
          return false;
        }
      }
      return true;
    default:
      return true;
  }
}

bool apply_ops(uint8_t* tile, int h, int w, ptrdiff_t stride, const AugOpParams* ops, int64_t n_ops,
               AugScratch* scratch, std::string* err) {
  for (int64_t k = 0; k < n_ops; ++k) {
    if (!check_aug_op(ops[k], h, w, err)) {
      *err = "operation " + std::to_string(k) + " (" + aug_op_name(ops[k].op) + "): " + *err;
      return false;
    }
  }
  for (int64_t k = 0; k < n_ops; ++k) {
    const AugOpParams& p = ops[k];
    switch (p.op) {
      case kAugBrightness: brightness(tile, h, w, stride, p.f[0]); break;
      case kAugContrast: contrast(tile, h, w, stride, p.f[0], scratch); break;
      case kAugSaturation: saturation(tile, h, w, stride, p.f[0], scratch); break;
      case kAugHue: hue(tile, h, w, stride, p.f[0]); break;
      case kAugGrayscale: grayscale(tile, h, w, stride, scratch); break;
      case kAugSolarize: solarize(tile, h, w, stride, p.f[0]); break;
      case kAugPosterize: posterize(tile, h, w, stride, p.i[0]); break;
      case kAugSolarizeAdd: solarize_add(tile, h, w, stride, p.i[0], p.i[1]); break;
      case kAugInvert: invert(tile, h, w, stride); break;
      case kAugEqualize: equalize(tile, h, w, stride); break;
      case kAugAutocontrast: autocontrast(tile, h, w, stride); break;
      case kAugSharpness: sharpness(tile, h, w, stride, p.f[0], scratch); break;
      case kAugErase: erase(tile, h, w, stride, p.i, p.f); break;
      case kAugGaussianBlur: gaussian_blur(tile, h, w, stride, p.i, p.f, scratch); break;
      case kAugEraseRandom: erase_random(tile, h, w, stride, p.i, p.f[0]); break;
      case kAugPilColor: pil_color(tile, h, w, stride, p.f[0], p.i[0] == 1, scratch); break;
      case kAugPilContrast: pil_contrast(tile, h, w, stride, p.f[0], p.i[0] == 1, scratch); break;
      default: break;  // unreachable: checked above
    }
  }
  return true;
}

bool augment_batch(ThreadPool* pool, const AugBatchSpec& b, std::string* err) {
  AugPlan plan;
  if (!plan.prepare(b, err)) return false;
  const ptrdiff_t stride = static_cast<ptrdiff_t>(b.w) * 3;
  const int64_t tile_bytes = static_cast<int64_t>(b.h) * stride;
  std::vector<AugScratch> scratch(static_cast<size_t>(pool->num_slots()));
  pool->run(b.n, [&](int64_t i, int worker) {
    plan.run(i, b.images + i * tile_bytes, stride, &scratch[static_cast<size_t>(worker)]);
  });
  return true;
}

}  // namespace fastload
