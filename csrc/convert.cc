#include "convert.h"

#include <array>

#include "region.h"

namespace fastload {
namespace {

// The per-channel constants repeated over kPeriod = 8 * channels elements: a whole number of both
// channel groups and 8-float vectors, so the inner loop has one fixed pattern to vectorise.
struct Constants {
  std::array<float, 8 * kAffineMaxChannels> scale, shift;
  int period;
};

template <int kPeriod>  // 0: the period is only known at run time (c.period)
__attribute__((always_inline)) inline void affine_body(const uint8_t* __restrict src, float* __restrict out,
                                                       int64_t n, const Constants& c) {
  const int period = kPeriod ? kPeriod : c.period;
  const float* __restrict a = c.scale.data();
  const float* __restrict b = c.shift.data();
  int64_t i = 0;
  for (; i + period <= n; i += period) {
    for (int j = 0; j < period; ++j) out[i + j] = static_cast<float>(src[i + j]) * a[j] + b[j];
  }
  for (int j = 0; i < n; ++i, ++j) out[i] = static_cast<float>(src[i]) * a[j] + b[j];  // i % period == j
}

template <int kPeriod>
__attribute__((target("avx2"))) void affine_avx2(const uint8_t* src, float* out, int64_t n, const Constants& c) {
  affine_body<kPeriod>(src, out, n, c);
}

template <int kPeriod>
void affine_portable(const uint8_t* src, float* out, int64_t n, const Constants& c) {
  affine_body<kPeriod>(src, out, n, c);
}

}  // namespace

bool affine_u8_f32(const uint8_t* src, float* out, int64_t n, int channels, const float* scale,
                   const float* shift, bool allow_avx2, std::string* err) {
  if (overlaps(src, n, reinterpret_cast<const uint8_t*>(out), n * static_cast<int64_t>(sizeof(float)))) {
    *err = "out overlaps src; write into a separate buffer";
    return false;
  }
  Constants c;
  c.period = 8 * channels;
  for (int j = 0; j < c.period; ++j) {
    c.scale[j] = scale[j % channels];
    c.shift[j] = shift[j % channels];
  }
  const bool avx2 = allow_avx2 && __builtin_cpu_supports("avx2");
  if (channels == 3) {  // RGB: the case that matters, with the period known to the compiler
    avx2 ? affine_avx2<24>(src, out, n, c) : affine_portable<24>(src, out, n, c);
  } else {
    avx2 ? affine_avx2<0>(src, out, n, c) : affine_portable<0>(src, out, n, c);
  }
  return true;
}

}  // namespace fastload
