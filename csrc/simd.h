// Which SIMD kernels the x86 code may run: AVX2 where the CPU has it, unless the environment variable
// FASTLOAD_SIMD names a narrower set ("scalar", "ssse3", ...). The tests compare both paths' bytes this way
// (tests/augment/test_warp_simd.py, test_augment_native.py). resize.cc picks among more levels with its own rule.
#pragma once

#include <cstdlib>
#include <string>

namespace fastload {

#if defined(__x86_64__)
// One answer per process: read once, on the first call (a function-local static, initialised thread-safely).
inline bool use_avx2() {
  static const bool avx2 = [] {
    const char* env = std::getenv("FASTLOAD_SIMD");
    const std::string want = env ? env : "";
    return (want.empty() || want == "avx2") && __builtin_cpu_supports("avx2");
  }();
  return avx2;
}
#endif

}  // namespace fastload
