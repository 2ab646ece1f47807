// The geometric part of an augmentation plan on an output tile (uint8 RGB, HWC, in place): a
// vertical flip, then an inverse affine map (output pixel -> input pixel of the tile) with
// nearest, bilinear or bicubic sampling and a fill colour outside the tile.
//
// The maps follow PIL's Image.transform(size, AFFINE, data, resample, fillcolor=...), the
// reference engine (fastload/_augment/engine_pil.py), so the native engine writes the same bytes:
// - nearest, a map with a rotation or shear part: PIL's 16.16 fixed-point walk (affine_fixed);
// - nearest, a map that only scales and translates (a[1] == a[3] == 0): PIL's per-row and per-column
//   tables in double (ImagingScaleAffine), where COORD truncates toward zero and -1 below 0;
// - bilinear: PIL's generic transform, the sample point (x + 0.5, y + 0.5) mapped in double, half a
//   pixel subtracted, the four neighbours clamped to the tile, the blend truncated to uint8;
// - bicubic: the same sample point, PIL's cubic (a = -1) over the 4x4 neighbours clamped to the tile, clipped
//   to [0, 255] and truncated (timm's policies resample so).
// Pixels whose sample point falls outside the tile take the fill. Bilinear and bicubic run four pixels at a time
// in AVX2 doubles where the CPU has it (the same operations in the same order: the same bytes; 2.3x and 2.8x less
// CPU on a 224 x 224 tile), FASTLOAD_SIMD=scalar the scalar walk (tests/augment/test_warp_simd.py compares them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

struct AugGeometry {
  bool vflip = false;
  bool affine = false;
  int interpolation = 0;  // 0: nearest, 1: bilinear, 2: bicubic
  double m[6] = {1, 0, 0, 0, 1, 0};  // x_in = m0 x + m1 y + m2, y_in = m3 x + m4 y + m5 (pixel centres at +0.5)
  double fill[3] = {0, 0, 0};        // 0..255 per channel (truncated to uint8 as PIL's fillcolor ints)
};

// Checks the interpolation, that the matrix is finite and the fill in [0, 255]; false with a message if not.
bool check_geometry(const AugGeometry& g, std::string* err);

// Runs the vertical flip and the affine map on the tile (rows at tile + r * stride). `copy` is scratch,
// grown to the tile's size.
void apply_geometry(uint8_t* tile, int h, int w, ptrdiff_t stride, const AugGeometry& g, std::vector<uint8_t>* copy);

}  // namespace fastload
