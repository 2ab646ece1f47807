#include "pil_enhance.h"

#include "simd.h"

namespace fastload {
namespace {

// float -> uint8 as PIL's blend: 0 at or below 0, 255 at or above 255, else truncated (a NaN gives 0).
inline uint8_t pil_clip(float v) {
  v = v > 0.0f ? v : 0.0f;
  v = v < 255.0f ? v : 255.0f;
  return static_cast<uint8_t>(v);
}

// PIL's blend of one byte v toward its degenerate d (an integer-valued float): d + a * (v - d), rounded after
// the product and after the sum (v - d is exact in float).
inline uint8_t pil_blend(float d, float a, uint8_t v) { return pil_clip(d + a * (static_cast<float>(v) - d)); }

// The row's luma as PIL computes it (pil_enhance.h), as integer-valued floats into g[0..w).
__attribute__((always_inline)) inline void pil_luma_fill(const uint8_t* __restrict p, int w, bool simd,
                                                         float* __restrict g) {
  const int body = simd ? w / 4 * 4 : 0;
  for (int x = 0; x < body; ++x) {
    const int32_t l = (p[3 * x] * 9798 + p[3 * x + 1] * 19235 + p[3 * x + 2] * 3735 + 0x4000) >> 15;
    g[x] = static_cast<float>(l);
  }
  for (int x = body; x < w; ++x) {
    const int32_t l = (p[3 * x] * 19595 + p[3 * x + 1] * 38470 + p[3 * x + 2] * 7471 + 0x8000) >> 16;
    g[x] = static_cast<float>(l);
  }
}

// One row: its luma summed (kSum, for Contrast's mean), or each byte blended toward its pixel's luma (Color).
template <bool kSum>
__attribute__((always_inline)) inline int64_t pil_row(uint8_t* __restrict p, int w, bool simd, float a,
                                                      float* __restrict g) {
  pil_luma_fill(p, w, simd, g);
  int64_t sum = 0;
  if (kSum) {
    for (int x = 0; x < w; ++x) sum += static_cast<int32_t>(g[x]);
  } else {
    // the luma spread to the row's bytes first (g[w .. 4w)), so that the blend is one contiguous loop
    float* __restrict d = g + w;
    for (int x = 0; x < w; ++x) d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = g[x];
    for (int i = 0; i < 3 * w; ++i) p[i] = pil_blend(d[i], a, p[i]);
  }
  return sum;
}

template <bool kSum>
int64_t pil_row_portable(uint8_t* p, int w, bool simd, float a, float* g) {
  return pil_row<kSum>(p, w, simd, a, g);
}

#if defined(__x86_64__)
// avx2 only, not fma: the compiler may not fuse the blend's multiply and add, which PIL rounds apart.
template <bool kSum>
__attribute__((target("avx2"))) int64_t pil_row_avx2(uint8_t* p, int w, bool simd, float a, float* g) {
  return pil_row<kSum>(p, w, simd, a, g);
}
#endif

template <bool kSum>
int64_t pil_rows(uint8_t* t, int h, int w, ptrdiff_t stride, bool simd, float a, AugScratch* s) {
  s->a.resize(static_cast<size_t>(w) * 4);  // the luma, then its spread to the bytes
  int64_t sum = 0;
  for (int y = 0; y < h; ++y) {
#if defined(__x86_64__)
    if (use_avx2()) {
      sum += pil_row_avx2<kSum>(t + y * stride, w, simd, a, s->a.data());
      continue;
    }
#endif
    sum += pil_row_portable<kSum>(t + y * stride, w, simd, a, s->a.data());
  }
  return sum;
}

}  // namespace

void pil_color(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, bool simd, AugScratch* s) {
  pil_rows<false>(t, h, w, stride, simd, static_cast<float>(factor), s);  // PIL's blend takes a C float
}

void pil_contrast(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, bool simd, AugScratch* s) {
  const int64_t sum = pil_rows<true>(t, h, w, stride, simd, 0.0f, s);
  // ImageStat's mean: the histogram's sum (exact in a double) over the count, then int(mean + 0.5)
  const double mean = static_cast<double>(sum) / static_cast<double>(static_cast<int64_t>(h) * w);
  const float d = static_cast<float>(static_cast<int64_t>(mean + 0.5));
  const float a = static_cast<float>(factor);
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = pil_blend(d, a, static_cast<uint8_t>(v));
  for (int y = 0; y < h; ++y) {
    uint8_t* __restrict p = t + y * stride;
    for (int64_t i = 0; i < static_cast<int64_t>(w) * 3; ++i) p[i] = lut[p[i]];
  }
}

}  // namespace fastload
