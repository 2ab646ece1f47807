// See mask.h. Pillow's nearest arithmetic is reproduced exactly: coordinates start half a step in and are
// accumulated by repeated addition in double, truncated toward zero (COORD: negative -> -1).
#include "mask.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

namespace fastload {
namespace {

// a crafted meta (matching a crafted IHDR) cannot make a thread allocate more than this: the images' limit
// (jpeg.h kMaxPixels), as a mask has its image's size
constexpr int64_t kMaxMaskPixels = int64_t{1} << 28;
// deflate shrinks data at most 1032 times (a 258-byte match in two 1-bit codes), so a PNG of `size` bytes holds
// at most this many times as many pixels: a header claiming more is refused before its pixels are allocated
constexpr int64_t kMaxDeflateRatio = 1032;

inline int coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// PIL: img.crop(box).resize((bw, bh), NEAREST), an affine scale from the crop (ImagingScaleAffine, fill=1). With
// a frame (rh > 0): img.crop(box).resize((rw, rh), NEAREST).crop((fx, fy, fx + bw, fy + bh)), the same accumulated
// coordinates run over the whole resize and the window kept.
void crop_resize(const uint8_t* src, int src_w, int top, int left, int ch, int cw, int bh, int bw, uint8_t* dst,
                 std::vector<int>* xtab, int rh = 0, int rw = 0, int fy = 0, int fx = 0) {
  if (rh == 0) rh = bh, rw = bw;
  const double ax = static_cast<double>(cw) / rw, ay = static_cast<double>(ch) / rh;
  xtab->resize(static_cast<size_t>(bw));
  double xo = ax * 0.5;
  for (int x = 0; x < fx + bw; ++x) {
    const int xin = coord(xo);
    if (x >= fx) (*xtab)[x - fx] = xin >= 0 && xin < cw ? xin : -1;
    xo += ax;
  }
  double yo = ay * 0.5;
  for (int y = 0; y < fy + bh; ++y) {
    const int yin = coord(yo);
    yo += ay;
    if (y < fy) continue;
    uint8_t* out = dst + static_cast<size_t>(y - fy) * bw;
    if (yin >= 0 && yin < ch) {
      const uint8_t* in = src + static_cast<size_t>(top + yin) * src_w + left;
      for (int x = 0; x < bw; ++x) out[x] = (*xtab)[x] >= 0 ? in[(*xtab)[x]] : 0;
    } else {
      std::memset(out, 0, static_cast<size_t>(bw));
    }
  }
}

// PIL: img.transform((w, h), AFFINE, a, NEAREST, fillcolor=fill): pixels mapping outside keep the fill. Pillow
// (Geometry.c) picks one of three loops by the matrix, each with its own rounding; so does this.
void warp(const uint8_t* in, int h, int w, const double* a, uint8_t fill, uint8_t* out, std::vector<int>* xtab) {
  std::memset(out, fill, static_cast<size_t>(h) * w);
  if (a[1] == 0 && a[3] == 0) {  // a pure scale (ImagingScaleAffine): a table per column, one row per row
    xtab->assign(static_cast<size_t>(w), -1);
    double xo = a[2] + a[0] * 0.5;
    int xmin = w, xmax = 0;
    for (int x = 0; x < w; ++x) {
      const int xin = coord(xo);
      if (xin >= 0 && xin < w) {
        xmax = x + 1;
        xmin = std::min(xmin, x);
        (*xtab)[x] = xin;
      }
      xo += a[0];
    }
    double yo = a[5] + a[4] * 0.5;
    for (int y = 0; y < h; ++y) {
      const int yin = coord(yo);
      if (yin >= 0 && yin < h) {
        const uint8_t* row = in + static_cast<size_t>(yin) * w;
        uint8_t* o = out + static_cast<size_t>(y) * w;
        for (int x = xmin; x < xmax; ++x) o[x] = row[(*xtab)[x]];
      }
      yo += a[4];
    }
    return;
  }
  // ImagingTransformAffine: 16.16 fixed point when the four corners map within +-32768 (affine_fixed), else double
  const auto fits = [&](int x, int y) {
    return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
  };
  if (fits(0, 0) && fits(w, h) && fits(0, h) && fits(w, 0)) {
    const auto fix = [](double v) -> int64_t {
      v = v * 65536.0 + 0.5;
      const int fixed = v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v);  // Pillow's FLOOR
      return static_cast<int64_t>(fixed);
    };
    const int64_t a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
    int64_t a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5), a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
    for (int y = 0; y < h; ++y) {
      int64_t xx = a2, yy = a5;
      uint8_t* o = out + static_cast<size_t>(y) * w;
      for (int x = 0; x < w; ++x) {
        const int64_t xin = xx >> 16, yin = yy >> 16;  // arithmetic shift: floor, as Pillow's int
        if (xin >= 0 && xin < w && yin >= 0 && yin < h) o[x] = in[static_cast<size_t>(yin) * w + xin];
        xx += a0;
        yy += a3;
      }
      a2 += a1;
      a5 += a4;
    }
    return;
  }
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  for (int y = 0; y < h; ++y) {
    double xx = xo, yy = yo;
    uint8_t* o = out + static_cast<size_t>(y) * w;
    for (int x = 0; x < w; ++x) {
      const int xin = coord(xx), yin = coord(yy);
      if (xin >= 0 && xin < w && yin >= 0 && yin < h) o[x] = in[static_cast<size_t>(yin) * w + xin];
      xx += a[0];
      yy += a[3];
    }
    xo += a[1];
    yo += a[4];
  }
}

// The first chunk before the pixels (IDAT) that would make the simplified API change the gray values it returns
// (gAMA: converted to sRGB; tRNS: composited onto whatever the output buffer held, another sample's pixels here;
// the colour-space chunks: gamma in newer libpngs), or nullptr. fastload's packer writes none of them (Pillow's
// plain "L" PNG), so one in a shard is crafted or foreign: refused, since a class id must come back as itself.
const char* converting_chunk(const uint8_t* data, size_t size) {
  static const char* const kConverting[] = {"gAMA", "tRNS", "sRGB", "iCCP", "cHRM", "cICP"};
  size_t at = 8;
  while (size - at >= 8) {  // at <= size throughout
    const uint8_t* type = data + at + 4;
    if (std::memcmp(type, "IDAT", 4) == 0) return nullptr;
    for (const char* kind : kConverting) {
      if (std::memcmp(type, kind, 4) == 0) return kind;
    }
    const size_t len = be32(data + at);
    if (len > size - at - 8 || size - at - 8 - len < 4) return nullptr;  // truncated: libpng says so
    at += 12 + len;
  }
  return nullptr;
}

struct Scratch {
  std::vector<uint8_t> mask, box, tile;
  std::vector<int> xtab;
};

bool one_mask(const MaskBatchSpec& s, int64_t k, Scratch* sc, std::string* err) {
  const int64_t r = s.region[k], off = s.offset[k], len = s.length[k];
  if (r < 0 || r >= s.num_regions || off < 0 || len < 0 || off > s.regions[r].size - len) {
    *err = "mask bytes lie outside their shard region";
    return false;
  }
  const int h = s.src_hw[2 * k], w = s.src_hw[2 * k + 1];
  if (!decode_mask_png(s.regions[r].data + off, static_cast<size_t>(len), h, w, &sc->mask, err)) return false;
  const int32_t* box = s.frames != nullptr ? s.frames + 8 * k : s.crop + 4 * k;
  const int top = box[0], left = box[1], ch = box[2], cw = box[3];
  if (top < 0 || left < 0 || ch < 1 || cw < 1 || top > h - ch || left > w - cw) {
    *err = "crop box (" + std::to_string(top) + ", " + std::to_string(left) + ", " + std::to_string(ch) + ", " +
           std::to_string(cw) + ") is outside the " + std::to_string(h) + "x" + std::to_string(w) + " mask";
    return false;
  }
  const int oh = s.out_h, ow = s.out_w;
  const int bh = s.box_hw[2 * k], bw = s.box_hw[2 * k + 1];
  const bool padded = s.padded[k] != 0;
  if (bh < 1 || bw < 1 || bh > oh || bw > ow || (!padded && (bh != oh || bw != ow))) {
    *err = "resize target " + std::to_string(bh) + "x" + std::to_string(bw) + " does not fit the " +
           std::to_string(oh) + "x" + std::to_string(ow) + " row";
    return false;
  }
  const size_t tile_bytes = static_cast<size_t>(oh) * ow;
  sc->tile.resize(tile_bytes);
  if (padded && s.frames != nullptr) {
    *err = "a frame (Plan.frames) cannot be moved into a padded window";
    return false;
  }
  if (padded) {
    sc->box.resize(static_cast<size_t>(bh) * bw);
    crop_resize(sc->mask.data(), w, top, left, ch, cw, bh, bw, sc->box.data(), &sc->xtab);
    const int32_t* rows = s.rows + k * oh;
    const int32_t* cols = s.cols + k * ow;
    for (int y = 0; y < oh; ++y) {
      uint8_t* o = sc->tile.data() + static_cast<size_t>(y) * ow;
      if (rows[y] >= bh) {
        *err = "padded window row index " + std::to_string(rows[y]) + " is outside the decoded box";
        return false;
      }
      if (rows[y] < 0) {
        std::memset(o, s.fill[2 * k], static_cast<size_t>(ow));
        continue;
      }
      const uint8_t* in = sc->box.data() + static_cast<size_t>(rows[y]) * bw;
      for (int x = 0; x < ow; ++x) {
        if (cols[x] >= bw) {
          *err = "padded window column index " + std::to_string(cols[x]) + " is outside the decoded box";
          return false;
        }
        o[x] = cols[x] < 0 ? s.fill[2 * k] : in[cols[x]];
      }
    }
  } else if (s.frames != nullptr) {
    const int32_t* f = s.frames + 8 * k;
    if (f[4] < 1 || f[5] < 1 || f[6] < 0 || f[7] < 0 || int64_t{f[6]} + oh > f[4] || int64_t{f[7]} + ow > f[5]) {
      *err = "frame: the " + std::to_string(oh) + "x" + std::to_string(ow) + " window at (" + std::to_string(f[6]) +
             ", " + std::to_string(f[7]) + ") is not inside the box's " + std::to_string(f[4]) + "x" +
             std::to_string(f[5]) + " resize";
      return false;
    }
    crop_resize(sc->mask.data(), w, top, left, ch, cw, oh, ow, sc->tile.data(), &sc->xtab, f[4], f[5], f[6], f[7]);
  } else {
    crop_resize(sc->mask.data(), w, top, left, ch, cw, oh, ow, sc->tile.data(), &sc->xtab);
  }
  uint8_t* t = sc->tile.data();
  if (s.hflip[k]) {
    for (int y = 0; y < oh; ++y) std::reverse(t + static_cast<size_t>(y) * ow, t + static_cast<size_t>(y + 1) * ow);
  }
  if (s.vflip[k]) {
    for (int y = 0; y < oh / 2; ++y) {
      std::swap_ranges(t + static_cast<size_t>(y) * ow, t + static_cast<size_t>(y + 1) * ow,
                       t + static_cast<size_t>(oh - 1 - y) * ow);
    }
  }
  uint8_t* dst = s.out + static_cast<size_t>(k) * tile_bytes;
  if (s.has_affine[k]) {
    warp(t, oh, ow, s.affine + 6 * k, s.fill[2 * k + 1], dst, &sc->xtab);
  } else {
    std::memcpy(dst, t, tile_bytes);
  }
  return true;
}

}  // namespace

bool decode_mask_png(const uint8_t* data, size_t size, int h, int w, std::vector<uint8_t>* out, std::string* err) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  // the header says what the pixels are before libpng converts anything: 8-bit grayscale only (what the
  // packer writes), so no bit-depth scaling or palette lookup can change a class id
  if (size < 33 || std::memcmp(data, kSignature, 8) != 0 || std::memcmp(data + 12, "IHDR", 4) != 0) {
    *err = "mask is not a PNG (no signature and IHDR header)";
    return false;
  }
  if (data[24] != 8 || data[25] != 0) {
    *err = "mask PNG has bit depth " + std::to_string(data[24]) + " and colour type " + std::to_string(data[25]) +
           ", not 8-bit grayscale";
    return false;
  }
  const uint32_t pw = be32(data + 16), ph = be32(data + 20);
  if (h < 1 || w < 1 || ph != static_cast<uint32_t>(h) || pw != static_cast<uint32_t>(w)) {
    *err = "mask PNG is " + std::to_string(pw) + "x" + std::to_string(ph) + ", the shard records " +
           std::to_string(w) + "x" + std::to_string(h);
    return false;
  }
  const int64_t pixels = static_cast<int64_t>(h) * w;
  if (pixels > kMaxMaskPixels) {
    *err = "mask of " + std::to_string(w) + "x" + std::to_string(h) + " pixels is more than fastload decodes (2^28 "
           "pixels, as for images)";
    return false;
  }
  if (pixels > kMaxDeflateRatio * static_cast<int64_t>(size)) {
    *err = "mask PNG of " + std::to_string(size) + " bytes cannot hold " + std::to_string(w) + "x" +
           std::to_string(h) + " pixels (deflate shrinks data at most 1032 times)";
    return false;
  }
  if (const char* kind = converting_chunk(data, size)) {
    *err = std::string("mask PNG has a ") + kind + " chunk (gamma, transparency or colour space), which would "
           "change its class ids in decoding; a packed mask has none";
    return false;
  }
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size)) {
    *err = std::string("mask PNG does not decode: ") + image.message;
    png_image_free(&image);
    return false;
  }
  image.format = PNG_FORMAT_GRAY;
  out->resize(static_cast<size_t>(h) * w);
  if (!png_image_finish_read(&image, nullptr, out->data(), 0, nullptr) || PNG_IMAGE_FAILED(image)) {
    *err = std::string("mask PNG does not decode: ") + image.message;
    png_image_free(&image);
    return false;
  }
  png_image_free(&image);
  return true;
}

std::vector<MaskFailure> decode_mask_batch(ThreadPool* pool, const MaskBatchSpec& spec) {
  std::vector<Scratch> scratch(static_cast<size_t>(pool->num_slots()));
  std::vector<MaskFailure> failures;
  std::mutex mu;
  const size_t tile_bytes = static_cast<size_t>(spec.out_h) * spec.out_w;
  pool->run(spec.n, [&](int64_t k, int worker) {
    std::string err;
    bool ok;
    try {
      ok = one_mask(spec, k, &scratch[static_cast<size_t>(worker)], &err);
    } catch (const std::bad_alloc&) {
      ok = false;
      err = "out of memory decoding the mask";
    }
    if (!ok) {
      std::memset(spec.out + static_cast<size_t>(k) * tile_bytes, 0, tile_bytes);
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back({k, err});
    }
  });
  std::sort(failures.begin(), failures.end(),
            [](const MaskFailure& a, const MaskFailure& b) { return a.index < b.index; });
  return failures;
}

}  // namespace fastload
