/* A session's frame into its shared slot, checked on the way (autodice/backend/session/frame_copy.py).
 *
 * The session's feeder copies each frame into the slot the ranks read it from, and refuses one
 * holding NaN or infinity. numpy does that in two passes over the caller's array (np.isfinite
 * makes a temporary, np.copyto reads the frame again) with ordinary stores, and the slot's lines
 * then fill the cache of the core the feeder ran on: a rank's core, on a board whose ranks use
 * every core. Here it is one pass, and on x86-64 the stores stream past the cache (the ranks read
 * the slot from memory either way: it is written on one core and read on another). SqueezeNet
 * on this project's 2-core VM, in turns against numpy's feed: 1.018x frames/s (7 of 12 rounds),
 * 0.995x in a slower hour; the session's Python 0.45-0.47 ms of CPU a frame against 0.56-0.59
 * (bench/RESULTS.md). Elsewhere each piece is checked, then copied while still in cache.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { kExponent = 0x7f800000 }; /* a float32 with every exponent bit set is NaN or infinite */

static int finite_f32(const unsigned char* p, size_t bytes) {
  uint32_t bad = 0;
  for (size_t k = 0; k + 4 <= bytes; k += 4) {
    uint32_t u;
    memcpy(&u, p + k, 4);
    bad |= (u & kExponent) == kExponent;
  }
  return !bad;
}

#if defined(__x86_64__)
/* 64 bytes a step into a 32-byte aligned `dst`, streamed; nonzero if a float32 was not finite.
 * AVX2's 32-byte stores where the CPU has them: with the 16-byte ones of SSE2, which every x86-64
 * has, the same session made 0.98-1.00x numpy's feed in four runs. */
__attribute__((target("avx2"))) static int body_avx2(unsigned char* dst,
                                                     const unsigned char* src, size_t bytes,
                                                     int f32) {
  const __m256i exponent = _mm256_set1_epi32(kExponent);
  __m256i bad = _mm256_setzero_si256();
  for (size_t i = 0; i < bytes; i += 64) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(src + i));
    const __m256i b = _mm256_loadu_si256((const __m256i*)(src + i + 32));
    if (f32) {
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(a, exponent), exponent));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(b, exponent), exponent));
    }
    _mm256_stream_si256((__m256i*)(dst + i), a);
    _mm256_stream_si256((__m256i*)(dst + i + 32), b);
  }
  return !_mm256_testz_si256(bad, bad);
}

static int body_sse2(unsigned char* dst, const unsigned char* src, size_t bytes, int f32) {
  const __m128i exponent = _mm_set1_epi32(kExponent);
  __m128i bad = _mm_setzero_si128();
  for (size_t i = 0; i < bytes; i += 64) {
    for (size_t j = i; j < i + 64; j += 16) {
      const __m128i a = _mm_loadu_si128((const __m128i*)(src + j));
      if (f32) bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(a, exponent), exponent));
      _mm_stream_si128((__m128i*)(dst + j), a);
    }
  }
  return _mm_movemask_epi8(bad) != 0;
}
#endif

/* Copy `bytes` from `src` to `dst`. With `f32` (a float32 tensor, `bytes` a multiple of 4 and
 * `dst` 4-aligned), also say whether every value is finite: 1 yes, 0 no (copied all the same). */
int autodice_copy_frame(void* dst_, const void* src_, size_t bytes, int f32) {
  unsigned char* dst = (unsigned char*)dst_;
  const unsigned char* src = (const unsigned char*)src_;
  int ok = 1;
#if defined(__x86_64__)
  __builtin_cpu_init(); /* idempotent: what the CPU has, for __builtin_cpu_supports */
  size_t head = (32 - ((uintptr_t)dst & 31)) & 31; /* to where aligned streaming stores start */
  if (head > bytes) head = bytes;
  if (f32) ok = finite_f32(src, head);
  memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  const size_t n = bytes & ~(size_t)63;
  if ((__builtin_cpu_supports("avx2") ? body_avx2 : body_sse2)(dst, src, n, f32)) ok = 0;
  _mm_sfence(); /* the streamed stores are visible before the session says the slot is full */
  if (f32) ok = finite_f32(src + n, bytes - n) && ok;
  memcpy(dst + n, src + n, bytes - n);
#else
  for (size_t at = 0; at < bytes; at += 16384) {
    const size_t n = bytes - at < 16384 ? bytes - at : 16384;
    if (f32) ok = finite_f32(src + at, n) && ok;
    memcpy(dst + at, src + at, n);
  }
#endif
  return ok;
}
