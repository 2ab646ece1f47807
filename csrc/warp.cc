#include "warp.h"

#include <cmath>
#include <cstring>

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

// PIL's generic transform: the sample point (x + 0.5, y + 0.5) mapped in double; a point outside the tile takes
// the fill, any other has half a pixel subtracted and `sample(out, xi, yi, dx, dy)` writes the pixel at `out` from
// the point's floor (xi, yi) and fraction (dx, dy). One loop for both filters (a template, so each filter is
// inlined into its own copy of it, as when the loop was written out twice).
template <class Sample>
void generic_transform(int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a, const uint8_t* fill,
                       Sample sample) {
  for (int y = 0; y < h; ++y) {
    uint8_t* out = tile + y * stride;
    const double yc = y + 0.5;
    for (int x = 0; x < w; ++x) {
      const double xc = x + 0.5;
      double xin = a[0] * xc + a[1] * yc + a[2];
      double yin = a[3] * xc + a[4] * yc + a[5];
      if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) {
        put_fill(out + 3 * x, fill);
        continue;
      }
      xin -= 0.5;
      yin -= 0.5;
      const int xi = floor_int(xin), yi = floor_int(yin);
      sample(out + 3 * x, xi, yi, xin - xi, yin - yi);
    }
  }
}

// PIL's bilinear_filter32RGB: the four neighbours clamped to the tile, the blend truncated to uint8.
void bilinear(const uint8_t* src, int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a,
              const uint8_t* fill) {
  const ptrdiff_t row = static_cast<ptrdiff_t>(w) * 3;
  generic_transform(h, w, tile, stride, a, fill, [=](uint8_t* out, int xi, int yi, double dx, double dy) {
    const int x0 = (xi < 0 ? 0 : xi < w ? xi : w - 1) * 3;
    const int x1 = (xi + 1 < 0 ? 0 : xi + 1 < w ? xi + 1 : w - 1) * 3;
    const uint8_t* r0 = src + (yi < 0 ? 0 : yi < h ? yi : h - 1) * row;
    const bool below = yi + 1 >= 0 && yi + 1 < h;
    const uint8_t* r1 = below ? src + (yi + 1) * row : nullptr;
    for (int c = 0; c < 3; ++c) {
      const double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
      const double v2 = below ? r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx : v1;
      out[c] = static_cast<uint8_t>(v1 + (v2 - v1) * dy);
    }
  });
}

// PIL's bicubic_filter32RGB: Keys' cubic with a = -1 on the 4x4 neighbours (clamped to the tile), rows first, in
// double; clipped to [0, 255] and truncated.
inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

void bicubic(const uint8_t* src, int h, int w, uint8_t* tile, ptrdiff_t stride, const double* a,
             const uint8_t* fill) {
  const ptrdiff_t row = static_cast<ptrdiff_t>(w) * 3;
  auto clip = [](int v, int n) { return v < 0 ? 0 : v < n ? v : n - 1; };
  generic_transform(h, w, tile, stride, a, fill, [=](uint8_t* out, int xi, int yi, double dx, double dy) {
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
      const double o = cubic(v[0], v[1], v[2], v[3], dy);
      out[c] = o <= 0.0 ? 0 : o >= 255.0 ? 255 : static_cast<uint8_t>(o);
    }
  });
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
  if (copy->size() < row * h) copy->resize(row * h);
  uint8_t* src = copy->data();
  for (int y = 0; y < h; ++y) std::memcpy(src + y * row, tile + y * stride, row);
  uint8_t fill[3];
  for (int c = 0; c < 3; ++c) fill[c] = static_cast<uint8_t>(g.fill[c]);
  if (g.interpolation == 2) {
    bicubic(src, h, w, tile, stride, g.m, fill);
  } else if (g.interpolation == 1) {
    bilinear(src, h, w, tile, stride, g.m, fill);
  } else if (g.m[1] == 0.0 && g.m[3] == 0.0) {
    scale_nearest(src, h, w, tile, stride, g.m, fill);
  } else {
    fixed_nearest(src, h, w, tile, stride, g.m, fill);
  }
}

}  // namespace fastload
