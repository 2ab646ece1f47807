#include "resize.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__SSE2__)
#define FASTLOAD_X86 1
#include <immintrin.h>
#endif

namespace fastload {
namespace {

inline double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// PIL's bicubic_filter (libImaging/Resample.c), a = -0.5.
inline double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

inline uint8_t clip8(int32_t v, int shift) {
  v >>= shift;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// ---- horizontal pass -------------------------------------------------------------------------

// Output pixel xx of one row, portable version. Same integer arithmetic as the SIMD kernel.
inline void horizontal_pixel(const uint8_t* s, const int16_t* c, int cnt, int shift,
                             uint8_t* d) {
  const int32_t half = 1 << (shift - 1);
  int32_t s0 = half, s1 = half, s2 = half;
  for (int k = 0; k < cnt; ++k) {
    s0 += s[3 * k + 0] * c[k];
    s1 += s[3 * k + 1] * c[k];
    s2 += s[3 * k + 2] * c[k];
  }
  d[0] = clip8(s0, shift);
  d[1] = clip8(s1, shift);
  d[2] = clip8(s2, shift);
}

void horizontal_row_scalar(const uint8_t* row, int x0, const AxisPlan& p, bool flip,
                           uint8_t* out) {
  const int n = p.out;
  for (int xx = 0; xx < n; ++xx) {
    const uint8_t* s = row + static_cast<ptrdiff_t>(p.start[xx] - x0) * 3;
    horizontal_pixel(s, &p.coeffs[static_cast<size_t>(xx) * p.ksize], p.count[xx], p.shift,
                     out + static_cast<ptrdiff_t>(flip ? n - 1 - xx : xx) * 3);
  }
}

#ifdef FASTLOAD_X86
// Weights per output pixel and pair of taps as int16 [c0 c1 c0 c1 c0 c1 0 0], matching the
// shuffled pixels [R0 R1 G0 G1 B0 B1 0 0] so one pmaddwd gives the three channel sums.
void expand_xweights(const AxisPlan& p, std::vector<int16_t>* w) {
  const int pairs = p.ksize / 2;
  w->assign(static_cast<size_t>(p.out) * pairs * 8, 0);
  for (int xx = 0; xx < p.out; ++xx) {
    const int16_t* c = &p.coeffs[static_cast<size_t>(xx) * p.ksize];
    for (int g = 0; g < pairs; ++g) {
      int16_t* d = &(*w)[(static_cast<size_t>(xx) * pairs + g) * 8];
      for (int ch = 0; ch < 3; ++ch) {
        d[2 * ch] = c[2 * g];
        d[2 * ch + 1] = c[2 * g + 1];
      }
    }
  }
}

// Shuffle of 8 source bytes (two RGB pixels) into int16 [R0 R1 G0 G1 B0 B1 0 0], matching the weights'
// layout above.
inline __m128i pair_shuffle() {
  return _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
}

// Shuffle of four packed output pixels [R0 G0 B0 0 R1 G1 B1 0 R2 G2 B2 0 R3 G3 B3 0] into their 12
// bytes, in order or mirrored.
inline __m128i pack_shuffle(bool flip) {
  return flip ? _mm_setr_epi8(12, 13, 14, 8, 9, 10, 4, 5, 6, 0, 1, 2, -1, -1, -1, -1)
              : _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
}

// Writes the low 12 bytes of v at d.
inline void store12(uint8_t* d, __m128i v) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(d), v);
  const uint32_t tail = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(v, 8)));
  std::memcpy(d + 8, &tail, 4);
}

// The sums of one output pixel for R rows: (R, G, B, 0) as int32, before the shift.
template <int R>
__attribute__((target("ssse3"))) inline void pixel_sums(const uint8_t* in, ptrdiff_t in_stride,
                                                        ptrdiff_t off, int pairs, const __m128i* c,
                                                        __m128i half, __m128i mask, __m128i* acc) {
  for (int r = 0; r < R; ++r) acc[r] = half;
  for (int g = 0; g < pairs; ++g) {
    const __m128i wg = _mm_loadu_si128(c + g);
    for (int r = 0; r < R; ++r) {
      const uint8_t* s = in + r * in_stride + off + 6 * g;
      const __m128i px = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)), mask);
      acc[r] = _mm_add_epi32(acc[r], _mm_madd_epi16(px, wg));
    }
  }
}

// R consecutive rows at once: per output pixel the tap offsets and weights are shared by all
// rows, so the bookkeeping is paid once per R rows. Four output pixels are packed and stored
// together (12 bytes in two stores) wherever their loads stay inside the source.
template <int R>
__attribute__((target("ssse3"))) void horizontal_rows_ssse3(const uint8_t* in,
                                                            ptrdiff_t in_stride, int x0,
                                                            const AxisPlan& p, const int16_t* w,
                                                            const uint8_t* end, bool flip,
                                                            uint8_t* out, ptrdiff_t out_stride,
                                                            int from = 0) {
  const int n = p.out;
  const int shift = p.shift;
  const int ksize = p.ksize;
  const int32_t* start = p.start.data();
  const int32_t* count = p.count.data();
  const int16_t* coeffs = p.coeffs.data();
  const __m128i half = _mm_set1_epi32(1 << (shift - 1));
  const __m128i mask = pair_shuffle();
  const __m128i pack = pack_shuffle(flip);
  const __m128i* wv = reinterpret_cast<const __m128i*>(w);
  const uint8_t* last_row = in + (R - 1) * in_stride;
  const int pairs_max = ksize / 2;
  auto inside = [&](int xx) {
    const ptrdiff_t off = static_cast<ptrdiff_t>(start[xx] - x0) * 3;
    return last_row + off + 6 * ((count[xx] + 1) / 2) + 2 <= end;
  };
  int xx = from;
  for (; xx + 4 <= n && inside(xx) && inside(xx + 1) && inside(xx + 2) && inside(xx + 3); xx += 4) {
    __m128i acc[4][R];
    for (int k = 0; k < 4; ++k) {
      const int x = xx + k;
      pixel_sums<R>(in, in_stride, static_cast<ptrdiff_t>(start[x] - x0) * 3, (count[x] + 1) / 2,
                    wv + static_cast<size_t>(x) * pairs_max, half, mask, acc[k]);
    }
    const ptrdiff_t pos = static_cast<ptrdiff_t>(flip ? n - 4 - xx : xx) * 3;
    for (int r = 0; r < R; ++r) {
      const __m128i a = _mm_packs_epi32(_mm_srai_epi32(acc[0][r], shift), _mm_srai_epi32(acc[1][r], shift));
      const __m128i b = _mm_packs_epi32(_mm_srai_epi32(acc[2][r], shift), _mm_srai_epi32(acc[3][r], shift));
      store12(out + r * out_stride + pos, _mm_shuffle_epi8(_mm_packus_epi16(a, b), pack));
    }
  }
  for (; xx < n; ++xx) {
    const ptrdiff_t off = static_cast<ptrdiff_t>(start[xx] - x0) * 3;
    const int cnt = count[xx];
    const ptrdiff_t pos = static_cast<ptrdiff_t>(flip ? n - 1 - xx : xx) * 3;
    if (!inside(xx)) {  // 8-byte loads would pass the source's end
      for (int r = 0; r < R; ++r) {
        horizontal_pixel(in + r * in_stride + off, coeffs + static_cast<size_t>(xx) * ksize, cnt,
                         shift, out + r * out_stride + pos);
      }
      continue;
    }
    __m128i acc[R];
    pixel_sums<R>(in, in_stride, off, (cnt + 1) / 2, wv + static_cast<size_t>(xx) * pairs_max, half, mask,
                  acc);
    for (int r = 0; r < R; ++r) {
      __m128i v = _mm_srai_epi32(acc[r], shift);
      v = _mm_packs_epi32(v, v);
      v = _mm_packus_epi16(v, v);
      const uint32_t bytes = static_cast<uint32_t>(_mm_cvtsi128_si32(v));
      uint8_t* d = out + r * out_stride + pos;
      const uint16_t rg = static_cast<uint16_t>(bytes);
      std::memcpy(d, &rg, 2);
      d[2] = static_cast<uint8_t>(bytes >> 16);
    }
  }
}

// The largest number of tap pairs any output pixel of the axis uses (1 when upsampling).
int max_pairs(const AxisPlan& p) {
  int m = 0;
  for (int xx = 0; xx < p.out; ++xx) m = std::max(m, (p.count[xx] + 1) / 2);
  return m;
}

// One 256-bit register holding the 8 bytes at s (low lane) and at s + stride (high lane).
__attribute__((target("avx2"))) inline __m256i two_rows(const uint8_t* s, ptrdiff_t stride) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
  const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + stride));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Four rows at once, two per 256-bit register (row r in the low lane, r + 1 in the high lane), with
// P tap pairs per output pixel fixed at compile time so the sums stay in registers; a pixel with
// fewer taps has zero weights there, and adding 0 * pixel keeps the sums, so the bytes are the SSSE3
// kernel's. Returns how many output pixels it wrote: it stops before the first pixel whose loads
// would pass the source's end, and the SSSE3 kernel goes on from there.
template <int P>
__attribute__((target("avx2"))) int horizontal_rows4_avx2(const uint8_t* in, ptrdiff_t in_stride, int x0,
                                                          const AxisPlan& p, const int16_t* w,
                                                          const uint8_t* end, bool flip, uint8_t* out,
                                                          ptrdiff_t out_stride) {
  const int n = p.out;
  const int shift = p.shift;
  const int32_t* start = p.start.data();
  const int pairs_max = p.ksize / 2;
  const __m128i* wv = reinterpret_cast<const __m128i*>(w);
  // start[] never decreases, so the pixels whose loads stay inside the source are a prefix.
  const uint8_t* last_row = in + 3 * in_stride;
  int limit = n;
  while (limit > 0 && last_row + static_cast<ptrdiff_t>(start[limit - 1] - x0) * 3 + 6 * P + 2 > end) --limit;
  const __m256i half = _mm256_set1_epi32(1 << (shift - 1));
  const __m256i mask = _mm256_broadcastsi128_si256(pair_shuffle());  // the SSSE3 shuffles, in both lanes
  const __m256i pack = _mm256_broadcastsi128_si256(pack_shuffle(flip));
  int xx = 0;
  for (; xx + 4 <= limit; xx += 4) {
    __m256i a[4], b[4];  // per output pixel: rows 0 and 1, rows 2 and 3
    for (int k = 0; k < 4; ++k) {
      const uint8_t* s = in + static_cast<ptrdiff_t>(start[xx + k] - x0) * 3;
      const __m128i* c = wv + static_cast<size_t>(xx + k) * pairs_max;
      a[k] = b[k] = half;
      for (int g = 0; g < P; ++g) {
        const __m256i wg = _mm256_broadcastsi128_si256(_mm_loadu_si128(c + g));
        const uint8_t* t = s + 6 * g;
        a[k] = _mm256_add_epi32(a[k], _mm256_madd_epi16(_mm256_shuffle_epi8(two_rows(t, in_stride), mask), wg));
        b[k] = _mm256_add_epi32(
            b[k], _mm256_madd_epi16(_mm256_shuffle_epi8(two_rows(t + 2 * in_stride, in_stride), mask), wg));
      }
    }
    const ptrdiff_t pos = static_cast<ptrdiff_t>(flip ? n - 4 - xx : xx) * 3;
    for (int q = 0; q < 2; ++q) {
      const __m256i* acc = q ? b : a;
      const __m256i lo = _mm256_packs_epi32(_mm256_srai_epi32(acc[0], shift), _mm256_srai_epi32(acc[1], shift));
      const __m256i hi = _mm256_packs_epi32(_mm256_srai_epi32(acc[2], shift), _mm256_srai_epi32(acc[3], shift));
      const __m256i v = _mm256_shuffle_epi8(_mm256_packus_epi16(lo, hi), pack);
      store12(out + 2 * q * out_stride + pos, _mm256_castsi256_si128(v));
      store12(out + (2 * q + 1) * out_stride + pos, _mm256_extracti128_si256(v, 1));
    }
  }
  return xx;
}

// The AVX2 kernel for P tap pairs, or none (returns 0) for filters longer than it is compiled for.
int horizontal_rows4_avx2(int pairs, const uint8_t* in, ptrdiff_t in_stride, int x0, const AxisPlan& p,
                          const int16_t* w, const uint8_t* end, bool flip, uint8_t* out,
                          ptrdiff_t out_stride) {
  switch (pairs) {
    case 1: return horizontal_rows4_avx2<1>(in, in_stride, x0, p, w, end, flip, out, out_stride);
    case 2: return horizontal_rows4_avx2<2>(in, in_stride, x0, p, w, end, flip, out, out_stride);
    case 3: return horizontal_rows4_avx2<3>(in, in_stride, x0, p, w, end, flip, out, out_stride);
    case 4: return horizontal_rows4_avx2<4>(in, in_stride, x0, p, w, end, flip, out, out_stride);
    default: return 0;
  }
}

// Which kernels run: the widest the CPU has, unless FASTLOAD_SIMD names a narrower set ("ssse3": SSSE3
// horizontal and SSE2 vertical passes; "scalar": no SIMD horizontally). Tests compare the kernels' bytes
// this way. (An AVX2 horizontal kernel over pairs of taps, looping over each pixel's own tap count, was
// no faster than SSSE3: the per-pixel bookkeeping dominated. Two rows per register with the pair count
// fixed per image, horizontal_rows4_avx2, cuts a 224x224 resize's time by about 40%.)
enum class Simd { kScalar, kSsse3, kAvx2 };

Simd simd_level() {
  static const Simd level = [] {
    const char* env = std::getenv("FASTLOAD_SIMD");
    const std::string want = env ? env : "";
    if (want == "scalar") return Simd::kScalar;
    if (want != "ssse3" && __builtin_cpu_supports("avx2")) return Simd::kAvx2;
    return __builtin_cpu_supports("ssse3") ? Simd::kSsse3 : Simd::kScalar;
  }();
  return level;
}
#endif

// ---- vertical pass ---------------------------------------------------------------------------

// out[i] = sum_k rows[k][i] * c[k] for i in [0, n).
#ifdef FASTLOAD_X86
// The SSE2 loop below on 256-bit registers, 32 bytes at a time; returns how many bytes it wrote. The
// unpacks and packs work per 128-bit lane, so the lanes come back in order, and the arithmetic is
// the SSE2 loop's, so are the bytes.
__attribute__((target("avx2"))) int vertical_avx2(const uint8_t* const* rows, const int16_t* c, int cnt,
                                                  int shift, int n, uint8_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i half = _mm256_set1_epi32(1 << (shift - 1));
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int k = 0; k < cnt; k += 2) {
      const bool pair = k + 1 < cnt;
      const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + i));
      const __m256i r1 =
          pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k + 1] + i)) : zero;
      const int32_t c1 = pair ? c[k + 1] : 0;
      const __m256i w = _mm256_set1_epi32((c1 << 16) | static_cast<uint16_t>(c[k]));
      const __m256i lo0 = _mm256_unpacklo_epi8(r0, zero), hi0 = _mm256_unpackhi_epi8(r0, zero);
      const __m256i lo1 = _mm256_unpacklo_epi8(r1, zero), hi1 = _mm256_unpackhi_epi8(r1, zero);
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi16(lo0, lo1), w));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi16(lo0, lo1), w));
      a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi16(hi0, hi1), w));
      a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi16(hi0, hi1), w));
    }
    a0 = _mm256_srai_epi32(a0, shift);
    a1 = _mm256_srai_epi32(a1, shift);
    a2 = _mm256_srai_epi32(a2, shift);
    a3 = _mm256_srai_epi32(a3, shift);
    const __m256i v = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
  }
  return i;
}
#endif

void vertical_row(const uint8_t* const* rows, const int16_t* c, int cnt, int shift, int n,
                  uint8_t* out, bool avx2) {
  int i = 0;
#ifdef FASTLOAD_X86
  if (avx2) i = vertical_avx2(rows, c, cnt, shift, n, out);
  const __m128i zero = _mm_setzero_si128();
  const __m128i half = _mm_set1_epi32(1 << (shift - 1));
  for (; i + 16 <= n; i += 16) {
    __m128i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int k = 0; k < cnt; k += 2) {
      const bool pair = k + 1 < cnt;
      const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k] + i));
      const __m128i r1 =
          pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k + 1] + i)) : zero;
      const int32_t c1 = pair ? c[k + 1] : 0;
      const __m128i w = _mm_set1_epi32((c1 << 16) | static_cast<uint16_t>(c[k]));
      const __m128i lo0 = _mm_unpacklo_epi8(r0, zero), hi0 = _mm_unpackhi_epi8(r0, zero);
      const __m128i lo1 = _mm_unpacklo_epi8(r1, zero), hi1 = _mm_unpackhi_epi8(r1, zero);
      a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi16(lo0, lo1), w));
      a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi16(lo0, lo1), w));
      a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi16(hi0, hi1), w));
      a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi16(hi0, hi1), w));
    }
    a0 = _mm_srai_epi32(a0, shift);
    a1 = _mm_srai_epi32(a1, shift);
    a2 = _mm_srai_epi32(a2, shift);
    a3 = _mm_srai_epi32(a3, shift);
    const __m128i v = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), v);
  }
#endif
  const int32_t half_s = 1 << (shift - 1);
  for (; i < n; ++i) {
    int32_t acc = half_s;
    for (int k = 0; k < cnt; ++k) acc += rows[k][i] * c[k];
    out[i] = clip8(acc, shift);
  }
}

void mirror_row(uint8_t* row, int n) {
  for (int a = 0, b = n - 1; a < b; ++a, --b) {
    for (int c = 0; c < 3; ++c) std::swap(row[3 * a + c], row[3 * b + c]);
  }
}

}  // namespace

bool plan_axis(double in0, double in1, int lo, int hi, int out, AxisPlan* p, std::string* err, int filter,
               int offset, int total) {
  if (total == 0) total = out;
  if (filter != kResizeBilinear && filter != kResizeBicubic) {
    *err = "unknown resize interpolation " + std::to_string(filter) + " (expected 0 = bilinear or 1 = bicubic)";
    return false;
  }
  if (out <= 0 || hi <= lo || !(in1 > in0) || in0 < lo || in1 > hi || offset < 0 || total < out ||
      offset > total - out) {
    *err = "invalid resample axis: box [" + std::to_string(in0) + ", " + std::to_string(in1) +
           ") window [" + std::to_string(lo) + ", " + std::to_string(hi) + ") out " + std::to_string(out) +
           " from " + std::to_string(offset) + " of " + std::to_string(total);
    return false;
  }
  // Work in coordinates relative to lo so integer crops reproduce PIL's crop().resize().
  const int in_size = hi - lo;
  const double b0 = in0 - lo;
  const double scale = (in1 - in0) / total;
  const double filterscale = std::max(scale, 1.0);
  const bool cubic = filter == kResizeBicubic;
  const double support = (cubic ? 2.0 : 1.0) * filterscale;  // the triangle's support is 1, the cubic's 2
  const double taps = std::ceil(support) * 2 + 2;  // PIL's ceil(support) * 2 + 1, made even
  if (taps * total > 1e9) {
    *err = "resample filter too large: " + std::to_string(total) + " outputs x " +
           std::to_string(taps) + " taps";
    return false;
  }
  const int ksize = static_cast<int>(taps);
  p->out = out;
  p->ksize = ksize;
  p->identity = (out == in_size && total == out && in0 == lo && in1 == hi);
  p->start.resize(out);
  p->count.resize(out);
  p->weights.resize(static_cast<size_t>(out) * ksize);
  const double ss = 1.0 / filterscale;
  // PIL's precompute_coeffs for output xx of the whole resize (0 <= xx < total): the weights into w (ksize,
  // zero past the taps), the first tap into *xmin_out (relative to lo); returns the number of taps.
  auto weights = [&](int xx, double* w, int* xmin_out) {
    const double center = b0 + (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    int cnt = std::min(xmax - xmin, ksize - 1);
    if (cnt < 1) {  // cannot happen for a box inside the window; keep one tap to stay defined
      xmin = std::min(std::max(static_cast<int>(center), 0), in_size - 1);
      cnt = 1;
    }
    double ww = 0.0;
    for (int k = 0; k < ksize; ++k) {
      const double x = (k + xmin - center + 0.5) * ss;
      w[k] = k < cnt ? (cubic ? bicubic(x) : triangle(x)) : 0.0;
      ww += w[k];
    }
    for (int k = 0; k < cnt; ++k) {
      if (ww != 0.0) w[k] /= ww;
    }
    *xmin_out = xmin;
    return cnt;
  };
  int first = hi, last = lo;
  double wmax = 0.0;  // Pillow-SIMD's maxkk: the largest weight (signed) of the whole resize
  for (int xx = 0; xx < out; ++xx) {
    double* w = &p->weights[static_cast<size_t>(xx) * ksize];
    int xmin = 0;
    const int cnt = weights(offset + xx, w, &xmin);
    for (int k = 0; k < ksize; ++k) wmax = std::max(wmax, w[k]);
    p->start[xx] = lo + xmin;
    p->count[xx] = cnt;
    first = std::min(first, lo + xmin);
    last = std::max(last, lo + xmin + cnt);
  }
  if (total != out) {  // the precision is the whole resize's: the weights of the outputs not produced count too
    std::vector<double> w(ksize);
    for (int xx = 0; xx < total; ++xx) {
      if (xx >= offset && xx < offset + out) continue;
      int xmin = 0;
      weights(xx, w.data(), &xmin);
      for (int k = 0; k < ksize; ++k) wmax = std::max(wmax, w[k]);
    }
  }
  // As many fractional bits as int16 weights allow, at most 22 (Pillow-SIMD's normalize_coeffs_8bpc: PIL's
  // PRECISION_BITS, 32 - 8 - 2), so that its bytes come out.
  int shift = 22;
  while (shift > 1 && std::floor(0.5 + wmax * (1 << shift)) > 32767) --shift;
  p->shift = shift;
  p->coeffs.resize(p->weights.size());
  for (size_t i = 0; i < p->weights.size(); ++i) {
    const double w = p->weights[i] * (1 << shift);
    p->coeffs[i] = static_cast<int16_t>(w < 0 ? -std::floor(0.5 - w) : std::floor(0.5 + w));
  }
  p->first = first;
  p->last = last;
  return true;
}

void resample(const SourceView& src, bool flip, uint8_t* out, ptrdiff_t out_stride,
              ResizeScratch* s) {
  const AxisPlan& px = s->x;
  const AxisPlan& py = s->y;
  const int W = px.out;
  const int H = py.out;
  const size_t row_bytes = static_cast<size_t>(W) * 3;

  // Horizontal pass over the rows the vertical pass reads, unless it is a plain copy.
  const uint8_t* rows;
  ptrdiff_t rows_stride;
  int rows_y0;
  bool mirrored = false;
  if (px.identity) {
    rows = src.data + static_cast<ptrdiff_t>(px.first - src.x0) * 3;
    rows_stride = src.stride;
    rows_y0 = src.y0;
  } else {
    const int n_rows = py.last - py.first;
    uint8_t* tmp = s->rows.reserve(row_bytes * n_rows);
#ifdef FASTLOAD_X86
    const bool simd = simd_level() != Simd::kScalar;
    const int pairs = simd_level() == Simd::kAvx2 ? max_pairs(px) : 0;  // 0: no AVX2 kernel
    if (simd) expand_xweights(px, &s->xweights);
#endif
    for (int r = 0; r < n_rows;) {
      const uint8_t* in = src.data + static_cast<ptrdiff_t>(py.first + r - src.y0) * src.stride;
      uint8_t* o = tmp + row_bytes * r;
#ifdef FASTLOAD_X86
      if (simd) {
        const ptrdiff_t ob = static_cast<ptrdiff_t>(row_bytes);
        const int16_t* w = s->xweights.data();
        if (r + 4 <= n_rows) {
          const int done = pairs ? horizontal_rows4_avx2(pairs, in, src.stride, src.x0, px, w, src.end, flip, o, ob) : 0;
          horizontal_rows_ssse3<4>(in, src.stride, src.x0, px, w, src.end, flip, o, ob, done);
          r += 4;
        } else {
          horizontal_rows_ssse3<1>(in, src.stride, src.x0, px, w, src.end, flip, o, ob);
          r += 1;
        }
        continue;
      }
#endif
      horizontal_row_scalar(in, src.x0, px, flip, o);
      ++r;
    }
    rows = tmp;
    rows_stride = static_cast<ptrdiff_t>(row_bytes);
    rows_y0 = py.first;
    mirrored = flip;
  }

#ifdef FASTLOAD_X86
  const bool avx2 = simd_level() == Simd::kAvx2;
#else
  const bool avx2 = false;
#endif
  if (py.identity) {
    for (int yy = 0; yy < H; ++yy) {
      std::memcpy(out + yy * out_stride, rows + (py.first + yy - rows_y0) * rows_stride,
                  row_bytes);
    }
  } else {
    const uint8_t* taps[64];
    for (int yy = 0; yy < H; ++yy) {
      const int16_t* c = &py.coeffs[static_cast<size_t>(yy) * py.ksize];
      const uint8_t* r0 = rows + (py.start[yy] - rows_y0) * rows_stride;
      uint8_t* o = out + yy * out_stride;
      // Filters longer than 64 taps (vertical downscale beyond ~32x) take the plain loop.
      const int cnt = py.count[yy];
      if (cnt <= 64) {
        for (int k = 0; k < cnt; ++k) taps[k] = r0 + k * rows_stride;
        vertical_row(taps, c, cnt, py.shift, static_cast<int>(row_bytes), o, avx2);
        continue;
      }
      const int32_t half = 1 << (py.shift - 1);
      for (size_t i = 0; i < row_bytes; ++i) {
        int32_t acc = half;
        for (int k = 0; k < cnt; ++k) acc += r0[k * rows_stride + i] * c[k];
        o[i] = clip8(acc, py.shift);
      }
    }
  }
  if (flip && !mirrored) {
    for (int yy = 0; yy < H; ++yy) mirror_row(out + yy * out_stride, W);
  }
}

}  // namespace fastload
