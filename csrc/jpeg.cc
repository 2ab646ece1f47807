#include "jpeg.h"

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>

#include <jpeglib.h>

namespace fastload {
namespace {

// Smooth chroma upsampling treats the edges of a jpeg_crop_scanline window as image edges, so the
// window's first and last columns can differ from a full decode: one column more on each side
// (before libjpeg widens the window to whole iMCUs) keeps them off the requested pixels. Rows need
// no margin: jpeg_skip_scanlines decodes the context rows the first kept row needs.
// tests/native/test_jpeg_window.py checks both against a full decode, byte for byte.
constexpr int kMarginX = 1;

// Whether jpeg_crop_scanline gives a full decode's columns at this scale. libjpeg-turbo's (2.1) sets each
// component's downsampled width to output_width * h / max_h, which holds only where the component's IDCT has the
// smallest scaled size: a scaled decode that upsamples a chroma component partly through a larger IDCT and partly
// through the upsampler (4:1:0 and its transpose, h4v2 / h2v4, at 1/2 and 1/4) upsampled only part of the window,
// leaving the other columns wrong by up to 240 levels. Those decodes read the whole width instead.
bool column_crop_exact(j_decompress_ptr cinfo) {
#if JPEG_LIB_VERSION >= 70
  const int min_h = cinfo->min_DCT_h_scaled_size, min_v = cinfo->min_DCT_v_scaled_size;
#else
  const int min_h = cinfo->min_DCT_scaled_size, min_v = cinfo->min_DCT_scaled_size;
#endif
  for (int c = 0; c < cinfo->num_components; ++c) {
    const jpeg_component_info& comp = cinfo->comp_info[c];
#if JPEG_LIB_VERSION >= 70
    const int sh = comp.DCT_h_scaled_size, sv = comp.DCT_v_scaled_size;
#else
    const int sh = comp.DCT_scaled_size, sv = comp.DCT_scaled_size;
#endif
    const bool fullsize = comp.h_samp_factor * sh == cinfo->max_h_samp_factor * min_h &&
                          comp.v_samp_factor * sv == cinfo->max_v_samp_factor * min_v;
    if ((sh != min_h || sv != min_v) && !fullsize) return false;
  }
  return true;
}

struct ErrorMgr {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  ErrorMgr* e = reinterpret_cast<ErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1) mean corrupt data: fail rather than return gray-filled pixels.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

void on_output(j_common_ptr) {}

inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// As PIL: JPEG CMYK with an Adobe marker is stored inverted ("CMYK;I"); convert("RGB") then
// computes (255 - k) - (255 - k) * c / 255 per channel.
void cmyk_to_rgb(const uint8_t* in, uint8_t* out, int n, bool inverted) {
  const int flip = inverted ? 255 : 0;
  for (int i = 0; i < n; ++i, in += 4, out += 3) {
    const int nk = 255 - (in[3] ^ flip);
    for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(nk - muldiv255(in[c] ^ flip, nk));
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  bool open = false;
};

JpegDecoder::JpegDecoder() : st_(new State) {
  std::memset(&st_->cinfo, 0, sizeof(st_->cinfo));
  st_->cinfo.err = jpeg_std_error(&st_->err.pub);
  st_->err.pub.error_exit = on_error;
  st_->err.pub.emit_message = on_message;
  st_->err.pub.output_message = on_output;
  st_->err.message[0] = '\0';
  // jpeg_create_decompress only fails on out-of-memory; turn that into an exception here.
  if (setjmp(st_->err.jump)) throw std::bad_alloc();
  jpeg_create_decompress(&st_->cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&st_->cinfo); }

void JpegDecoder::close() {
  if (st_->open) jpeg_abort_decompress(&st_->cinfo);
  st_->open = false;
}

bool JpegDecoder::open(const uint8_t* data, size_t size, JpegHeader* header, std::string* err) {
  close();
  State& s = *st_;
  j_decompress_ptr cinfo = &s.cinfo;
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(cinfo);
    s.open = false;
    *err = s.err.message;
    return false;
  }
  s.open = true;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  const int64_t pixels = int64_t{cinfo->image_width} * cinfo->image_height;
  if (pixels > kMaxPixels) {
    *err = "JPEG too large: " + std::to_string(cinfo->image_width) + "x" +
           std::to_string(cinfo->image_height) + " pixels, limit is " +
           std::to_string(kMaxPixels);
    close();
    return false;
  }
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
    case JCS_CMYK:
    case JCS_YCCK:
      break;
    default:
      *err = "unsupported JPEG color space " + std::to_string(cinfo->jpeg_color_space) +
             " with " + std::to_string(cinfo->num_components) + " components";
      close();
      return false;
  }
  header->height = static_cast<int>(cinfo->image_height);
  header->width = static_cast<int>(cinfo->image_width);
  header->components = cinfo->num_components;
  header->max_denom = 8;
  for (int c = 0; c < cinfo->num_components; ++c) {
    const jpeg_component_info& comp = cinfo->comp_info[c];
    if (cinfo->max_h_samp_factor * comp.v_samp_factor !=
        cinfo->max_v_samp_factor * comp.h_samp_factor) {
      header->max_denom = 4;
    }
  }
  return true;
}

bool JpegDecoder::decode_window(int denom, int x0, int y0, int x1, int y1, DecodedWindow* win,
                                std::string* err) {
  return decode_rows(denom, x0, y0, x1, y1, nullptr, 0, win, err);
}

bool JpegDecoder::decode_full(uint8_t* out, ptrdiff_t stride, std::string* err) {
  DecodedWindow win;
  return decode_rows(1, 0, 0, 0, 0, out, stride, &win, err);
}

// With dst == nullptr decodes the window [x0, x1) x [y0, y1) of the 1/denom-scaled image into
// pixels_; otherwise decodes the whole image into dst.
bool JpegDecoder::decode_rows(int denom, int x0, int y0, int x1, int y1, uint8_t* dst,
                              ptrdiff_t stride, DecodedWindow* win, std::string* err) {
  State& s = *st_;
  if (!s.open) {
    *err = "internal error: no JPEG opened";
    return false;
  }
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
    *err = "internal error: bad DCT scale 1/" + std::to_string(denom);
    close();
    return false;
  }
  // libjpeg errors longjmp back here. decode_body (kept out of line) owns every variable that
  // changes after setjmp, and holds no objects with destructors while calling libjpeg.
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    s.open = false;
    *err = s.err.message;
    return false;
  }
  return decode_body(denom, x0, y0, x1, y1, dst, stride, win, err);
}

bool JpegDecoder::decode_body(int denom, int x0, int y0, int x1, int y1, uint8_t* dst,
                              ptrdiff_t stride, DecodedWindow* win, std::string* err) {
  State& s = *st_;
  j_decompress_ptr cinfo = &s.cinfo;
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(denom);
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  jpeg_start_decompress(cinfo);

  const int out_w = static_cast<int>(cinfo->output_width);
  const int out_h = static_cast<int>(cinfo->output_height);
  JDIMENSION col0 = 0, cols = cinfo->output_width;
  int row0 = 0, rows = out_h;
  if (dst == nullptr) {
    if (x0 < 0 || y0 < 0 || x1 > out_w || y1 > out_h || x0 >= x1 || y0 >= y1) {
      *err = "internal error: decode window out of range";
      jpeg_abort_decompress(cinfo);
      s.open = false;
      return false;
    }
    // jpeg_crop_scanline moves the window's start down to an iMCU boundary and keeps its end. A window of at most
    // one iMCU's columns can leave a chroma component one sample wide, which libjpeg-turbo's fancy upsampling
    // (4:2:0) gets wrong by tens of levels (a box one column wide at the image's first column): such a window
    // takes one more iMCU, on the right where the image has it, else on the left.
#if JPEG_LIB_VERSION >= 70
    const int align = cinfo->max_h_samp_factor * cinfo->min_DCT_h_scaled_size;
#else
    const int align = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
#endif
    int m0 = x0 > kMarginX ? x0 - kMarginX : 0;
    int m1 = x1 + kMarginX < out_w ? x1 + kMarginX : out_w;
    m0 = m0 / align * align;
    if (m1 - m0 <= align) m1 = m0 + 2 * align < out_w ? m0 + 2 * align : out_w;
    if (m1 - m0 <= align) m0 = m0 > align ? m0 - align : 0;
    if (m1 - m0 < out_w && column_crop_exact(cinfo)) {
      col0 = static_cast<JDIMENSION>(m0);
      cols = static_cast<JDIMENSION>(m1 - m0);
      jpeg_crop_scanline(cinfo, &col0, &cols);  // widens to whole iMCU columns
    }
    row0 = y0;
    rows = y1 - row0;
    if (row0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(row0));
    stride = static_cast<ptrdiff_t>(cinfo->output_width) * 3;
    dst = pixels_.reserve(static_cast<size_t>(stride) * rows);
  }
  const int width = static_cast<int>(cinfo->output_width);
  uint8_t* cmyk_row = cmyk ? cmyk_.reserve(static_cast<size_t>(width) * 4) : nullptr;

  for (int r = 0; r < rows;) {
    JSAMPROW ptrs[16];
    int want = 1;
    if (cmyk) {
      ptrs[0] = cmyk_row;
    } else {
      want = rows - r < 16 ? rows - r : 16;
      for (int i = 0; i < want; ++i) ptrs[i] = dst + static_cast<ptrdiff_t>(r + i) * stride;
    }
    const int got = static_cast<int>(jpeg_read_scanlines(cinfo, ptrs, want));
    if (got <= 0) {
      *err = "JPEG decoder returned no scanline";
      jpeg_abort_decompress(cinfo);
      s.open = false;
      return false;
    }
    if (cmyk) {
      cmyk_to_rgb(cmyk_row, dst + static_cast<ptrdiff_t>(r) * stride, width,
                  cinfo->saw_Adobe_marker != 0);
    }
    r += got;
  }
  if (cinfo->output_scanline == cinfo->output_height) {
    jpeg_finish_decompress(cinfo);  // reads to EOI, so truncation after the last row is caught
  } else {
    jpeg_abort_decompress(cinfo);
  }
  s.open = false;
  win->data = dst;
  win->stride = stride;
  win->x0 = static_cast<int>(col0);
  win->y0 = row0;
  win->width = width;
  win->height = rows;
  return true;
}

}  // namespace fastload
