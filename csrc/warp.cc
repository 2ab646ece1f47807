#include "warp.h"

#include "simd.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#define FASTLOAD_X86 1
#include <immintrin.h>
#endif

namespace fastload {
namespace {

// PIL's COORD (truncation toward zero, anything below 0 is -1) and FLOOR.
inline int coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }
inline int floor_int(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }


inline void put_fill(uint8_t* o, const uint8_t* fill) {
  o[0] = fill[0];
  o[1] = fill[1];
  o[2] = fill[2];
}

// PIL's ImagingScaleAffine: a map without rotation or shear.
void scale_nearest(const uint8_t* src, int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a,
                   const uint8_t* fill) {
  std::vector<int> xin(static_cast<size_t>(w));
  double xo = a[2] + a[0] * 0.5;
  for (int x = 0; x < w; ++x, xo += a[0]) xin[x] = coord(xo);
  double yo = a[5] + a[4] * 0.5;
  for (int y = 0; y < h; ++y, yo += a[4]) {
    const int yi = coord(yo);
    uint8_t* out = tile + y * stride;
    const uint8_t* in = yi >= 0 && yi < h ? src + static_cast<ptrdiff_t>(yi) * w * 3 : nullptr;
    if (in != nullptr && a[0] == 1.0) {  // a translation: runs of consecutive source pixels, copied whole
      for (int x = 0; x < w;) {
        if (xin[x] < 0 || xin[x] >= w) {
          put_fill(out + 3 * x, fill);
          ++x;
          continue;
        }
        int end = x + 1;
        while (end < w && xin[end] == xin[end - 1] + 1 && xin[end] < w) ++end;
        std::memcpy(out + 3 * x, in + 3 * xin[x], static_cast<size_t>(end - x) * 3);
        x = end;
      }
      continue;
    }
    for (int x = 0; x < w; ++x) {
      const int xi = xin[x];
      if (in != nullptr && xi >= 0 && xi < w) {
        std::memcpy(out + 3 * x, in + 3 * xi, 3);
      } else {
        put_fill(out + 3 * x, fill);
      }
    }
  }
}

// PIL's affine_fixed: nearest with 16.16 fixed-point coordinates (tiles are far below its 32768 limit).
void fixed_nearest(const uint8_t* src, int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a,
                   const uint8_t* fill) {
  auto fix = [](double v) { return floor_int(v * 65536.0 + 0.5); };
  const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  int a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
  int a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  for (int y = 0; y < h; ++y) {
    int xx = a2, yy = a5;
    uint8_t* out = tile + y * stride;
    for (int x = 0; x < w; ++x, xx += a0, yy += a3) {
      const int xi = xx >> 16, yi = yy >> 16;  // arithmetic shift: the floor, as PIL's
      if (xi >= 0 && xi < w && yi >= 0 && yi < h) {
        std::memcpy(out + 3 * x, src + (static_cast<ptrdiff_t>(yi) * w + xi) * 3, 3);
      } else {
        put_fill(out + 3 * x, fill);
      }
    }
    a2 += a1;
    a5 += a4;
  }
}

// PIL's generic transform with its bilinear_filter32RGB, one output pixel whose sample point (xin, yin) lies in the
// tile (the caller wrote the fill otherwise).
inline void bilinear_px(const uint8_t* src, int h, int w, double xin, double yin, uint8_t* o) {
  const ptrdiff_t row = static_cast<ptrdiff_t>(w) * 3;
  xin -= 0.5;
  yin -= 0.5;
  const int xi = floor_int(xin), yi = floor_int(yin);
  const double dx = xin - xi, dy = yin - yi;
  const int x0 = (xi < 0 ? 0 : xi < w ? xi : w - 1) * 3;
  const int x1 = (xi + 1 < 0 ? 0 : xi + 1 < w ? xi + 1 : w - 1) * 3;
  const uint8_t* r0 = src + (yi < 0 ? 0 : yi < h ? yi : h - 1) * row;
  const bool below = yi + 1 >= 0 && yi + 1 < h;
  const uint8_t* r1 = below ? src + (yi + 1) * row : nullptr;
  for (int c = 0; c < 3; ++c) {
    const double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
    const double v2 = below ? r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx : v1;
    o[c] = static_cast<uint8_t>(v1 + (v2 - v1) * dy);
  }
}

// PIL's generic transform with its bicubic_filter32RGB: Keys' cubic with a = -1 on the 4x4 neighbours (clamped
// to the tile), rows first, in double; clipped to [0, 255] and truncated.
inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

inline int clip(int v, int n) { return v < 0 ? 0 : v < n ? v : n - 1; }

inline void bicubic_px(const uint8_t* src, int h, int w, double xin, double yin, uint8_t* o) {
  const ptrdiff_t row = static_cast<ptrdiff_t>(w) * 3;
  xin -= 0.5;
  yin -= 0.5;
  int xi = floor_int(xin), yi = floor_int(yin);
  const double dx = xin - xi, dy = yin - yi;
  --xi;
  --yi;
  int xs[4];
  for (int k = 0; k < 4; ++k) xs[k] = clip(xi + k, w) * 3;
  // PIL: the first row clamped; a later row outside the tile repeats the row above (the same as clamping)
  const uint8_t* rows[4];
  rows[0] = src + clip(yi, h) * row;
  for (int k = 1; k < 4; ++k) rows[k] = (yi + k >= 0 && yi + k < h) ? src + (yi + k) * row : rows[k - 1];
  for (int c = 0; c < 3; ++c) {
    double v[4];
    for (int k = 0; k < 4; ++k) {
      const uint8_t* r = rows[k];
      v[k] = cubic(r[xs[0] + c], r[xs[1] + c], r[xs[2] + c], r[xs[3] + c], dx);
    }
    const double o3 = cubic(v[0], v[1], v[2], v[3], dy);
    o[c] = o3 <= 0.0 ? 0 : o3 >= 255.0 ? 255 : static_cast<uint8_t>(o3);
  }
}

// The generic transform's walk over the output (PIL's ImagingGenericTransform with affine_transform): each pixel's
// sample point (x + 0.5, y + 0.5) mapped in double, the fill outside the tile, `px` inside. `from`: the first
// column to do (the SIMD kernels below do the columns before it).
// One output pixel from its sample point in the tile (bilinear_px, bicubic_px).
using PixelFn = void (*)(const uint8_t*, int, int, double, double, uint8_t*);

template <PixelFn px>
inline void generic_row(const uint8_t* src, int h, int w, uint8_t* out, int y, int from, const double* a,
                        const uint8_t* fill) {
  const double yc = y + 0.5;
  for (int x = from; x < w; ++x) {
    const double xc = x + 0.5;
    const double xin = a[0] * xc + a[1] * yc + a[2];
    const double yin = a[3] * xc + a[4] * yc + a[5];
    if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) {
      put_fill(out + 3 * x, fill);
    } else {
      px(src, h, w, xin, yin, out + 3 * x);
    }
  }
}

#ifdef FASTLOAD_X86
// The same arithmetic four output pixels at a time in AVX2 doubles (each operation the scalar code's, in its order,
// with no fused multiply-add: the same bytes). A group of four whose sample points all lie in the tile is done in
// registers, its neighbours gathered 4 bytes at a time (RGB and one byte past: `src` has 4 bytes of slack after the
// tile); a group all outside takes the fill; a group across the tile's edge goes pixel by pixel (avx2_row).
struct Quad {
  __m256d xin, yin;  // the sample points, half a pixel subtracted
  int inside;        // bit k: pixel k's sample point lies in the tile
};

// A group's cells: the whole pixel below each sample point and the fraction past it (floor_int and xin - xi in the
// scalar code).
struct Cell {
  __m128i xi, yi;
  __m256d dx, dy;
};

// Four output pixels whose sample points all lie in the tile, from their cells, as 12 bytes (bilinear_quad,
// bicubic_quad).
using QuadFn = void (*)(const uint8_t*, int, int, const Cell&, uint8_t*);

__attribute__((target("avx2"))) inline Quad map_quad(const double* a, int x, __m256d a1yc, __m256d a4yc, int h,
                                                     int w) {
  const __m256d half = _mm256_set1_pd(0.5);
  const __m256d xc = _mm256_add_pd(_mm256_set_pd(x + 3, x + 2, x + 1, x), half);
  // a[0] * xc + a[1] * yc + a[2], as the scalar code evaluates it (left to right)
  const __m256d xin = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[0]), xc), a1yc), _mm256_set1_pd(a[2]));
  const __m256d yin = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[3]), xc), a4yc), _mm256_set1_pd(a[5]));
  const __m256d zero = _mm256_setzero_pd();
  const __m256d in = _mm256_and_pd(
      _mm256_and_pd(_mm256_cmp_pd(xin, zero, _CMP_GE_OQ), _mm256_cmp_pd(xin, _mm256_set1_pd(w), _CMP_LT_OQ)),
      _mm256_and_pd(_mm256_cmp_pd(yin, zero, _CMP_GE_OQ), _mm256_cmp_pd(yin, _mm256_set1_pd(h), _CMP_LT_OQ)));
  return {_mm256_sub_pd(xin, half), _mm256_sub_pd(yin, half), _mm256_movemask_pd(in)};
}

__attribute__((target("avx2"))) inline __m128i clamp_epi32(__m128i v, __m128i hi) {
  return _mm_min_epi32(_mm_max_epi32(v, _mm_setzero_si128()), hi);
}

// Channel c of four gathered pixels (lanes of 0x??BBGGRR) as int32, and as doubles.
__attribute__((target("avx2"))) inline __m128i byte_lanes(__m128i px, int c) {
  return _mm_and_si128(_mm_srli_epi32(px, 8 * c), _mm_set1_epi32(0xFF));
}

__attribute__((target("avx2"))) inline __m256d channel(__m128i px, int c) {
  return _mm256_cvtepi32_pd(byte_lanes(px, c));
}

// Four RGB pixels (lanes of 0x00BBGGRR) as 12 bytes at o.
__attribute__((target("avx2"))) inline void store4(__m128i px, uint8_t* o) {
  const __m128i packed = _mm_shuffle_epi8(px, _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o), packed);
  const int tail = _mm_extract_epi32(packed, 2);
  std::memcpy(o + 8, &tail, 4);
}

__attribute__((target("avx2"))) inline __m128i gather(const uint8_t* src, __m128i offsets) {
  return _mm_i32gather_epi32(reinterpret_cast<const int*>(src), offsets, 1);
}

// trunc(v) of three channels' doubles (in [0, 255]) as four 0x00BBGGRR lanes.
__attribute__((target("avx2"))) inline __m128i pack_rgb(__m256d r, __m256d g, __m256d b) {
  const __m128i ri = _mm256_cvttpd_epi32(r), gi = _mm256_cvttpd_epi32(g), bi = _mm256_cvttpd_epi32(b);
  return _mm_or_si128(ri, _mm_or_si128(_mm_slli_epi32(gi, 8), _mm_slli_epi32(bi, 16)));
}

// Four bilinear output pixels from their cells (all sample points in the tile), as 12 bytes at o.
__attribute__((target("avx2"))) inline void bilinear_quad(const uint8_t* src, int h, int w, const Cell& q,
                                                          uint8_t* o) {
  const __m128i wmax = _mm_set1_epi32(w - 1), hmax = _mm_set1_epi32(h - 1), three = _mm_set1_epi32(3);
  const __m128i row = _mm_set1_epi32(w * 3), one = _mm_set1_epi32(1);
  const __m128i x0 = _mm_mullo_epi32(clamp_epi32(q.xi, wmax), three);
  const __m128i x1 = _mm_mullo_epi32(clamp_epi32(_mm_add_epi32(q.xi, one), wmax), three);
  const __m128i r0 = _mm_mullo_epi32(clamp_epi32(q.yi, hmax), row);
  const __m128i r1 = _mm_mullo_epi32(clamp_epi32(_mm_add_epi32(q.yi, one), hmax), row);  // below the tile: r0
  const __m128i p00 = gather(src, _mm_add_epi32(r0, x0)), p01 = gather(src, _mm_add_epi32(r0, x1));
  const __m128i p10 = gather(src, _mm_add_epi32(r1, x0)), p11 = gather(src, _mm_add_epi32(r1, x1));
  __m256d v[3];
  for (int c = 0; c < 3; ++c) {
    // r[x0] + (r[x1] - r[x0]) * dx per row, then v1 + (v2 - v1) * dy
    const __m256d a0 = channel(p00, c), b0 = channel(p10, c);
    const __m256d v1 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_sub_pd(channel(p01, c), a0), q.dx));
    const __m256d v2 = _mm256_add_pd(b0, _mm256_mul_pd(_mm256_sub_pd(channel(p11, c), b0), q.dx));
    v[c] = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), q.dy));
  }
  store4(pack_rgb(v[0], v[1], v[2]), o);
}

// One cubic(v1, v2, v3, v4, d) per lane on four pixels' bytes (exact integers: p2, p3 and p4 computed in int32 are
// the scalar code's doubles), then Horner's form in double as the scalar code.
__attribute__((target("avx2"))) inline __m256d cubic_bytes(__m128i v1, __m128i v2, __m128i v3, __m128i v4,
                                                           __m256d d) {
  const __m256d p1 = _mm256_cvtepi32_pd(v2);
  const __m256d p2 = _mm256_cvtepi32_pd(_mm_sub_epi32(v3, v1));
  const __m128i twice = _mm_slli_epi32(_mm_sub_epi32(v1, v2), 1);
  const __m256d p3 = _mm256_cvtepi32_pd(_mm_sub_epi32(_mm_add_epi32(twice, v3), v4));
  const __m256d p4 = _mm256_cvtepi32_pd(_mm_add_epi32(_mm_sub_epi32(_mm_sub_epi32(v2, v1), v3), v4));
  return _mm256_add_pd(p1, _mm256_mul_pd(d, _mm256_add_pd(p2, _mm256_mul_pd(d, _mm256_add_pd(p3, _mm256_mul_pd(d, p4))))));
}

// cubic() on doubles, each operation the scalar code's: -v1 + v3 is v3 - v1, 2 * (v1 - v2) + v3 - v4 left to right.
__attribute__((target("avx2"))) inline __m256d cubic_pd(__m256d v1, __m256d v2, __m256d v3, __m256d v4, __m256d d) {
  const __m256d p2 = _mm256_sub_pd(v3, v1);
  const __m256d two = _mm256_set1_pd(2.0);
  const __m256d p3 = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(two, _mm256_sub_pd(v1, v2)), v3), v4);
  const __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
  return _mm256_add_pd(v2, _mm256_mul_pd(d, _mm256_add_pd(p2, _mm256_mul_pd(d, _mm256_add_pd(p3, _mm256_mul_pd(d, p4))))));
}

// Four bicubic output pixels from their cells (all sample points in the tile), as 12 bytes at o.
__attribute__((target("avx2"))) inline void bicubic_quad(const uint8_t* src, int h, int w, const Cell& q,
                                                         uint8_t* o) {
  const __m128i wmax = _mm_set1_epi32(w - 1), hmax = _mm_set1_epi32(h - 1), three = _mm_set1_epi32(3);
  const __m128i row = _mm_set1_epi32(w * 3);
  const __m256d zero = _mm256_setzero_pd(), top = _mm256_set1_pd(255.0);
  __m128i xs[4], px[4][4];
  for (int k = 0; k < 4; ++k) {
    xs[k] = _mm_mullo_epi32(clamp_epi32(_mm_add_epi32(q.xi, _mm_set1_epi32(k - 1)), wmax), three);
  }
  for (int r = 0; r < 4; ++r) {  // rows clamped to the tile (PIL's repeat of the row above is the same)
    const __m128i base = _mm_mullo_epi32(clamp_epi32(_mm_add_epi32(q.yi, _mm_set1_epi32(r - 1)), hmax), row);
    for (int k = 0; k < 4; ++k) px[r][k] = gather(src, _mm_add_epi32(base, xs[k]));
  }
  __m256d v[3];
  for (int c = 0; c < 3; ++c) {
    __m256d rows[4];
    for (int r = 0; r < 4; ++r) {
      rows[r] = cubic_bytes(byte_lanes(px[r][0], c), byte_lanes(px[r][1], c), byte_lanes(px[r][2], c),
                            byte_lanes(px[r][3], c), q.dx);
    }
    // o <= 0 ? 0 : o >= 255 ? 255 : trunc(o)
    v[c] = _mm256_min_pd(_mm256_max_pd(cubic_pd(rows[0], rows[1], rows[2], rows[3], q.dy), zero), top);
  }
  store4(pack_rgb(v[0], v[1], v[2]), o);
}

// A row's groups of four: a group whose sample points all lie in the tile through `quad`, from its cells (the
// whole pixel below each point and the fraction past it, as floor_int and xin - xi in the scalar code); a group
// all outside takes the fill; a group across the tile's edge goes pixel by pixel through `px`. Returns the first
// column it did not do (the rest of the row goes through generic_row).
template <PixelFn px, QuadFn quad>
__attribute__((target("avx2"))) int avx2_row(const uint8_t* src, int h, int w, uint8_t* out, int y, const double* a,
                                             const uint8_t* fill) {
  const double yc = y + 0.5;
  const __m256d a1yc = _mm256_set1_pd(a[1] * yc), a4yc = _mm256_set1_pd(a[4] * yc);
  int x = 0;
  for (; x + 4 <= w; x += 4) {
    const Quad q = map_quad(a, x, a1yc, a4yc, h, w);
    if (q.inside != 0xF) {
      for (int k = 0; k < 4; ++k) {  // the edge of the tile (or all outside)
        if (!(q.inside >> k & 1)) {
          put_fill(out + 3 * (x + k), fill);
        } else {
          const double xc = x + k + 0.5;
          px(src, h, w, a[0] * xc + a[1] * yc + a[2], a[3] * xc + a[4] * yc + a[5], out + 3 * (x + k));
        }
      }
      continue;
    }
    const __m256d fx = _mm256_floor_pd(q.xin), fy = _mm256_floor_pd(q.yin);
    const Cell cell = {_mm256_cvttpd_epi32(fx), _mm256_cvttpd_epi32(fy), _mm256_sub_pd(q.xin, fx),
                       _mm256_sub_pd(q.yin, fy)};
    quad(src, h, w, cell, out + 3 * x);
  }
  return x;
}
#endif

// The affine warp of a tile (`src`, a copy of it) into `tile`: each row's groups of four through the AVX2 kernels
// where the CPU has them, the rest (or all) through the scalar walk.
struct Bilinear {
  static constexpr PixelFn px = bilinear_px;
#ifdef FASTLOAD_X86
  static constexpr QuadFn quad = bilinear_quad;
#endif
};

struct Bicubic {
  static constexpr PixelFn px = bicubic_px;
#ifdef FASTLOAD_X86
  static constexpr QuadFn quad = bicubic_quad;
#endif
};

template <class Kernel>
void warp(const uint8_t* src, int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a, const uint8_t* fill) {
  for (int y = 0; y < h; ++y) {
    uint8_t* out = tile + y * stride;
    int from = 0;
#ifdef FASTLOAD_X86
    if (use_avx2()) from = avx2_row<Kernel::px, Kernel::quad>(src, h, w, out, y, a, fill);
#endif
    generic_row<Kernel::px>(src, h, w, out, y, from, a, fill);
  }
}

}  // namespace

bool check_geometry(const AugGeometry& g, std::string* err) {
  if (g.interpolation < 0 || g.interpolation > 2) {
    *err = "interpolation " + std::to_string(g.interpolation) + " is not 0 (nearest), 1 (bilinear) or 2 (bicubic)";
    return false;
  }
  for (int k = 0; k < 6; ++k) {
    if (!std::isfinite(g.m[k]) || std::fabs(g.m[k]) > 1e6) {
      *err = "affine matrix entry " + std::to_string(k) + " (" + std::to_string(g.m[k]) +
             ") is not a finite number of magnitude <= 1e6";
      return false;
    }
  }
  for (int c = 0; c < 3; ++c) {
    if (!(g.fill[c] >= 0.0 && g.fill[c] <= 255.0)) {
      *err = "fill " + std::to_string(g.fill[c]) + " (channel " + std::to_string(c) + ") is outside [0, 255]";
      return false;
    }
  }
  return true;
}

void apply_geometry(uint8_t* tile, int h, int w, ptrdiff_t stride, const AugGeometry& g, std::vector<uint8_t>* copy) {
  const size_t row = static_cast<size_t>(w) * 3;
  if (g.vflip) {
    if (copy->size() < row) copy->resize(row);
    for (int y = 0, r = h - 1; y < r; ++y, --r) {
      std::memcpy(copy->data(), tile + y * stride, row);
      std::memcpy(tile + y * stride, tile + r * stride, row);
      std::memcpy(tile + r * stride, copy->data(), row);
    }
  }
  if (!g.affine) return;
  // 4 bytes of slack after the tile's copy: the AVX2 kernels read each neighbour's RGB as 4 bytes
  if (copy->size() < row * h + 4) copy->resize(row * h + 4);
  uint8_t* src = copy->data();
  for (int y = 0; y < h; ++y) std::memcpy(src + y * row, tile + y * stride, row);
  uint8_t fill[3];
  for (int c = 0; c < 3; ++c) fill[c] = static_cast<uint8_t>(g.fill[c]);
  if (g.interpolation == 2) {
    warp<Bicubic>(src, h, w, tile, stride, g.m, fill);
  } else if (g.interpolation == 1) {
    warp<Bilinear>(src, h, w, tile, stride, g.m, fill);
  } else if (g.m[1] == 0.0 && g.m[3] == 0.0) {
    scale_nearest(src, h, w, tile, stride, g.m, fill);
  } else {
    fixed_nearest(src, h, w, tile, stride, g.m, fill);
  }
}

}  // namespace fastload
