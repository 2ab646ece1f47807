// PIL's ImageEnhance.Color and ImageEnhance.Contrast on uint8 RGB tiles, in place, byte for byte as PIL
// (timm's Color/Contrast ops run them; torchvision's tensor kernels, augment.cc's saturation/contrast, floor
// another luma and blend in another order, so they differ from PIL by levels that grow with the factor).
//
// PIL: `Image.blend(degenerate, image, factor)`, each byte `(uint8)(d + (float)factor * (v - d))` in float32
// (clamped to [0, 255] outside [0, 1]; the cast truncates), where the degenerate d is the pixel's luma
// (`convert("L")`, Color) or the luma's mean over the image, `int(mean + 0.5)` (Contrast). The luma is Pillow's
// rounded 16-bit fixed point `(19595 R + 38470 G + 7471 B + 0x8000) >> 16`; pillow-simd computes a row's whole
// groups of 4 pixels (from the row's start) with 15-bit weights `(9798 R + 19235 G + 3735 B + 0x4000) >> 15`
// and the last w % 4 with Pillow's: `simd` says which (fastload/_augment/pil_enhance.py probes the installed
// PIL). Compiled for AVX2 and portable, with the same IEEE operations (no fused multiply-add), so the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "augment.h"

namespace fastload {

void pil_color(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, bool simd, AugScratch* s);
void pil_contrast(uint8_t* t, int h, int w, ptrdiff_t stride, double factor, bool simd, AugScratch* s);

}  // namespace fastload
