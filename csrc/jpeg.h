// JPEG decoding with libjpeg-turbo: RGB output (grayscale replicated, Adobe CMYK/YCCK converted
// like PIL's convert("RGB")), optional DCT-domain downscaling (1/2, 1/4, 1/8) and decoding of a
// sub-window only (jpeg_crop_scanline / jpeg_skip_scanlines).
//
// A JpegDecoder is used by one thread at a time. It keeps the libjpeg state and its output
// buffers between images so steady-state decoding allocates nothing. Every libjpeg warning
// (premature end of data, extraneous bytes, ...) is treated as an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "buffer.h"

namespace fastload {

// Images with more pixels than this are refused before anything is allocated for them.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

struct JpegHeader {
  int height = 0;
  int width = 0;
  int components = 0;
  // Largest DCT scale denominator worth using: 8, or 4 where chroma is subsampled in one
  // direction only (4:2:2, 4:4:0), whose 1/8-scaled chroma is visibly off in libjpeg-turbo.
  int max_denom = 8;
};

// A decoded window of a (possibly DCT-scaled) image: pixel (x, y) of the scaled image, for
// x in [x0, x0 + width) and y in [y0, y0 + height), is at data + (y - y0) * stride + (x - x0) * 3.
struct DecodedWindow {
  const uint8_t* data = nullptr;
  ptrdiff_t stride = 0;
  int x0 = 0, y0 = 0, width = 0, height = 0;
};

// Size of an image dimension after DCT scaling by 1/denom (libjpeg rounds up).
inline int scaled_dim(int full, int denom) { return (full + denom - 1) / denom; }

class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header of data[0:size). On success the decoder holds the image open for one
  // decode_*() call (or close()). On failure returns false with libjpeg's message in *err.
  bool open(const uint8_t* data, size_t size, JpegHeader* header, std::string* err);

  // Decodes the opened image scaled by 1/denom (denom in {1, 2, 4, 8}) into the decoder's own
  // buffer; at least the scaled-image window [x0, x1) x [y0, y1) is produced (a little more
  // where libjpeg works in whole blocks). The image is closed afterwards.
  bool decode_window(int denom, int x0, int y0, int x1, int y1, DecodedWindow* win,
                     std::string* err);

  // Decodes the whole opened image at full size into out (height rows of width*3 bytes).
  bool decode_full(uint8_t* out, ptrdiff_t stride, std::string* err);

  // Drops the opened image, if any.
  void close();

  // Frees scratch memory beyond max_bytes (kept otherwise, for the next image).
  void shrink_to(size_t max_bytes) {
    pixels_.shrink_to(max_bytes);
    cmyk_.shrink_to(max_bytes);
  }

 private:
  struct State;
  bool decode_rows(int denom, int x0, int y0, int x1, int y1, uint8_t* dst, ptrdiff_t stride,
                   DecodedWindow* win, std::string* err);
  __attribute__((noinline)) bool decode_body(int denom, int x0, int y0, int x1, int y1,
                                             uint8_t* dst, ptrdiff_t stride, DecodedWindow* win,
                                             std::string* err);
  std::unique_ptr<State> st_;
  GrowBuffer<uint8_t> pixels_;  // decoded window
  GrowBuffer<uint8_t> cmyk_;    // one CMYK scanline before conversion
};

}  // namespace fastload
