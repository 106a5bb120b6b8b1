// etsdk-aoti kernels: the vector operations every kernel is written in, once per instruction-set level.
//
// The kernels' drivers (qmm.cpp, gemv.cpp, attention.cpp) are the same on every CPU; what differs is how
// sixteen float lanes, sixteen int32 lanes and sixty-four weight bytes are held and multiplied. This file
// defines that vocabulary for each level, side by side, with the same names and meanings in every section:
//
//   F      16 float32 lanes           I      16 int32 lanes          B      64 bytes (4-bit weights unpacked, 0..15)
//   S      64 signed weight bytes made ready for dot4_signed once, for every row of x they multiply
//   L      64 stored weight bytes made ready for dot4_lanes once (lane_bytes), for every row of x they multiply
//
// The int8 prefill tiles (qmm.cpp) hold 16 weight rows in the 16 int32 lanes: dot4_lanes multiplies 4 columns of 16
// rows (64 bytes, row l's 4 at bytes 4l .. 4l + 3) by the same 4 bytes of x. Those bytes are stored as w +
// kLaneOffset: 128 where the product takes its weights unsigned (x86 VNNI: vpdpbusd, x unsigned bytes would need a
// correction per weight row and block; with the offset it is kLaneOffset times x's sum, one per block of a row of x), 0
// where it takes them signed (the sign moved onto x, as dot4_signed; NEON sdot; portable). kIntegerTiles says whether
// the level runs them or the float tiles on the rounded x instead (measured on x86; reasoned on NEON: see there).
//
// Which section compiles follows the compiler's target macros, so one source builds at every level:
//
//   level         flags (kernels/__init__.py: LEVELS)         F is             integer products (dot4_pair, dot4_signed, dot4_lanes)
//   avx512vnni    -march=x86-64-v4 -mavx512vnni               __m512           vpdpbusd, 64 bytes a step
//   avx512        -march=x86-64-v4                            __m512           vpmaddubsw + vpmaddwd
//   avx2vnni      -march=x86-64-v3 -mavxvnni                  2 x __m256       vpdpbusd (VEX), 2 x 32 bytes
//   avx2          -march=x86-64-v3                            2 x __m256       vpmaddubsw + vpmaddwd
//   neon          -march=armv8.2-a+dotprod (aarch64)          4 x float32x4_t  sdot (vdotq_s32)
//   neonv8        -march=armv8-a (aarch64)                    4 x float32x4_t  smull (vmull_s8) + pairwise adds
//   portable      -DETSDK_KERNELS_PORTABLE, any -march          float[16]        plain loops
//
// kRegisters says how
// many F values a kernel may keep live before the compiler spills: register blocking is chosen from it, so
// AVX-512's 32 registers and AVX2's 16 ymm (8 F) both get a block that fits.
//
// Everything here is header-only, inline and free of torch: the level libraries link no torch, and the
// standalone check (kernels/check.cpp) cross-compiles for aarch64 with this file alone.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(ETSDK_KERNELS_PORTABLE)
#define ETSDK_VEC_PORTABLE 1
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define ETSDK_VEC_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ETSDK_VEC_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define ETSDK_VEC_NEON 1
#include <arm_neon.h>
#else
#define ETSDK_VEC_PORTABLE 1
#endif

namespace etsdk_kernels {

// ---------------------------------------------------------------- scalar pieces shared by every level

// The weight dtypes: W is the stored element, widen() its exact float32 value (portable code).
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// Four bytes of x as one 32-bit word (dot4_lanes broadcasts it to every lane).
inline int32_t four(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}
inline float widen(float v) { return v; }
inline float widen(int8_t v) { return static_cast<float>(v); }
inline float widen(Bf16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline float widen(F16 v) {  // IEEE half: sign, 5-bit exponent (bias 15), 10-bit fraction
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exponent = (v.bits >> 10) & 0x1Fu, fraction = v.bits & 0x3FFu, bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (fraction << 13);  // infinity, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (fraction << 13);
  } else if (fraction == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113u;
    while (!(fraction & 0x400u)) {
      fraction <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((fraction & 0x3FFu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline float half_to_float(uint16_t bits) { return widen(F16{bits}); }

// n clamped to [0, 16]: how many lanes a partial load or store (load_first, store_first, visible_or) touches
inline size_t lanes16(int64_t n) { return static_cast<size_t>(n < 0 ? 0 : n > 16 ? 16 : n); }

// exp(x) for x <= 0: 2^(x log2 e) split into an integer power of two, built in the exponent bits, and a
// degree-6 polynomial for 2^f, f in [0, 1) (a minimax fit: relative error 1.1e-7, as expf's). Below -87 (under
// float's normal range) it is 0, so a masked score (-inf) weighs 0. NaN stays NaN. Every level's exp_nonpositive
// is this arithmetic lane by lane.
constexpr float kExpC[7] = {2.1702154e-4f, 1.2439680e-3f, 9.6788472e-3f, 5.5483337e-2f, 2.4022985e-1f, 6.9314700e-1f, 1.f};
inline float exp_nonpositive(float x) {
  const float t = (x > -87.f ? x : -87.f) * 1.4426950408889634f;
  const float whole = std::floor(t);
  const float f = t - whole;
  float p = kExpC[0];
  for (int i = 1; i < 7; ++i) p = p * f + kExpC[i];
  const int32_t bits = (static_cast<int32_t>(whole) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.f ? 0.f : p * scale;
}

// Weight rows this far ahead are asked for (prefetch) while a decode step multiplies one: measured 9 % less time
// in the :a8 decode products, and float32 decode 37 -> 40-42 tok/s at AVX2 and 40.5 -> 42.5-45 at AVX-512 (135M
// shape, 2 threads), when the weights come from memory, as they do for any model larger than the caches.
constexpr int64_t kAheadRows = 8;

namespace vec {

#if defined(ETSDK_VEC_AVX512)
// ================================================================ AVX-512 (F, BW, VL, DQ; VNNI where built with it)
#if defined(__AVX512VNNI__)
constexpr const char* kLevel = "avx512vnni";
#else
constexpr const char* kLevel = "avx512";
#endif
constexpr int kRegisters = 32;
using F = __m512;
using I = __m512i;
using B = __m512i;

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u); }
inline F zero() { return _mm512_setzero_ps(); }
inline F set1(float v) { return _mm512_set1_ps(v); }
inline F load(const float* p) { return _mm512_loadu_ps(p); }
inline F load(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
inline F load(const Bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline F load(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline F load_half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline F load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first_lanes(n), p); }
inline F load_first(const int8_t* p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(first_lanes(n), p)));
}
inline F load_half_first(const uint16_t* p, int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes(n), p)); }
// any other element type (bfloat16, float16 weights): through a zeroed buffer of sixteen
template <typename T>
inline F load_first(const T* p, int64_t n) {
  T b[16] = {};
  std::memcpy(b, p, sizeof(T) * lanes16(n));
  return load(b);
}
inline void store(float* p, F v) { _mm512_storeu_ps(p, v); }
inline void store_first(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, first_lanes(n), v); }
inline F add(F a, F b) { return _mm512_add_ps(a, b); }
inline F sub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F max(F a, F b) { return _mm512_max_ps(a, b); }
inline F round_even(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
// x where the first n mask bytes are true, `masked` elsewhere (lanes past n too)
inline F visible_or(const bool* m, int64_t n, F x, float masked) {
  const __mmask16 in = first_lanes(n);
  const __m128i bytes = _mm_maskz_loadu_epi8(in, m);
  return _mm512_mask_mov_ps(_mm512_set1_ps(masked), _mm_test_epi8_mask(bytes, bytes) & in, x);
}
// the low / high nibbles of 16 bytes as floats
inline F nibbles_low(const uint8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)), _mm512_set1_epi32(0x0F)));
}
inline F nibbles_high(const uint8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)), 4));
}
inline F exp_nonpositive(F x) {
  const F t = _mm512_mul_ps(_mm512_max_ps(_mm512_set1_ps(-87.f), x), _mm512_set1_ps(1.4426950408889634f));
  const F whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const F f = _mm512_sub_ps(t, whole);
  F p = _mm512_set1_ps(kExpC[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExpC[i]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(whole), _mm512_set1_epi32(127)), 23);
  const F r = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_LT_OQ), _mm512_setzero_ps());
}
// [sum(v[0]), ..., sum(v[15])]: sixteen horizontal sums in 45 shuffles and adds (one alone takes about 10)
inline F reduce16(const F* v) {
  F s[8], u[4];
  for (int i = 0; i < 8; ++i)
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const F x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const F x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}
// dst[i][j] = src[j][i] for a 16 x 16 block of floats
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  F r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i + 0]), _mm512_castps_pd(t[4 * i + 2])));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i + 0]), _mm512_castps_pd(t[4 * i + 2])));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
inline void prefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
// integers
inline I izero() { return _mm512_setzero_si512(); }
inline F to_float(I v) { return _mm512_cvtepi32_ps(v); }
// 32 packed bytes (two 4-bit values each) as 64 bytes: the 32 low nibbles, then the 32 high ones
inline B unpack_nibbles(const uint8_t* q) {
  const __m256i low = _mm256_set1_epi8(0x0F), v = _mm256_loadu_si256((const __m256i*)q);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low)), _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 1);
}
// acc + per lane l the sums of even[4l + i] * x[4l + i] and odd[4l + i] * x[64 + 4l + i], i < 4: a step of 128
// columns (weights unsigned 0..15, x signed -127..127: exact). Where the products are int16 pairs (vpmaddubsw) the
// two halves' pairs are added before they widen (each at most 2 x 15 x 127, so their sum fits) and one vpmaddwd
// serves both.
inline I dot4_pair(I acc, B even, B odd, const int8_t* x) {
  const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64);
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, even, x0), odd, x1);
#else
  const __m512i pairs = _mm512_add_epi16(_mm512_maddubs_epi16(even, x0), _mm512_maddubs_epi16(odd, x1));
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}
// acc + per lane l the sum of w[4l + i] * x[4l + i], i < 4: 64 signed weight bytes times 64 signed x bytes (x in
// -127..127: exact; lanes 0-7 read bytes 0-31, lanes 8-15 bytes 32-63). The x86 products take one unsigned operand,
// so they multiply |w| by x carrying w's sign (llama.cpp's Q8_0 arithmetic). signed_bytes(w) loads w (and on x86
// takes |w| and its signs) once for every row of x it multiplies.
struct S {
  __m512i magnitude;   // |w|
  __mmask64 negative;  // w < 0
};
inline S signed_bytes(const int8_t* w) {
  const __m512i wv = _mm512_loadu_si512(w);
  return {_mm512_abs_epi8(wv), _mm512_movepi8_mask(wv)};
}
inline I dot4_signed(I acc, const S& w, const int8_t* x) {
  const __m512i xv = _mm512_loadu_si512(x);
  const __m512i sx = _mm512_mask_sub_epi8(xv, w.negative, _mm512_setzero_si512(), xv);
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w.magnitude, sx);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w.magnitude, sx), _mm512_set1_epi16(1)));
#endif
}
inline I sub(I a, int32_t c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
// acc + per lane l the sum of w[4l + i] * x[i], i < 4 (x in -127..127: exact; w as stored, see kLaneOffset)
#if defined(__AVX512VNNI__)
constexpr int kLaneOffset = 128;
constexpr bool kIntegerTiles = true;
using L = __m512i;
inline L lane_bytes(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline I dot4_lanes(I acc, const L& w, const int8_t* x) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(four(x))); }
#else
constexpr int kLaneOffset = 0;
// measured 0.8x the float tiles (vpmaddubsw + vpmaddwd against two FMA ports): the float tiles run instead
constexpr bool kIntegerTiles = false;
using L = S;
inline L lane_bytes(const uint8_t* p) { return signed_bytes((const int8_t*)p); }
inline I dot4_lanes(I acc, const L& w, const int8_t* x) {
  const __m512i xv = _mm512_set1_epi32(four(x));
  const __m512i sx = _mm512_mask_sub_epi8(xv, w.negative, _mm512_setzero_si512(), xv);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w.magnitude, sx), _mm512_set1_epi16(1)));
}
#endif

#elif defined(ETSDK_VEC_AVX2)
// ================================================================ AVX2 + FMA + F16C (x86-64-v3; AVX-VNNI where built with it)
#if defined(__AVXVNNI__)
constexpr const char* kLevel = "avx2vnni";
#else
constexpr const char* kLevel = "avx2";
#endif
constexpr int kRegisters = 8;  // 16 ymm registers, two per F
struct F {
  __m256 lo, hi;
};
struct I {
  __m256i lo, hi;
};
struct B {
  __m256i lo, hi;
};

// a lane mask for the first n of 8 lanes (maskload / maskstore read the sign bit)
inline __m256i first8(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 0 ? 0 : n > 8 ? 8 : n)), index);
}
inline F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 load8(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
inline F load(const int8_t* p) { return {load8(p), load8(p + 8)}; }
inline __m256 load8(const Bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline F load(const Bf16* p) { return {load8(p), load8(p + 8)}; }
inline F load(const F16* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
inline F load_half(const uint16_t* p) { return load(reinterpret_cast<const F16*>(p)); }
inline F load_first(const float* p, int64_t n) {
  return {_mm256_maskload_ps(p, first8(n)), n > 8 ? _mm256_maskload_ps(p + 8, first8(n - 8)) : _mm256_setzero_ps()};
}
inline F load_first(const int8_t* p, int64_t n) {
  alignas(16) int8_t b[16] = {0};
  std::memcpy(b, p, lanes16(n));
  return load(b);
}
inline F load_half_first(const uint16_t* p, int64_t n) {
  alignas(32) uint16_t b[16] = {0};
  std::memcpy(b, p, sizeof(uint16_t) * lanes16(n));
  return load_half(b);
}
// any other element type (bfloat16, float16 weights): through a zeroed buffer of sixteen
template <typename T>
inline F load_first(const T* p, int64_t n) {
  T b[16] = {};
  std::memcpy(b, p, sizeof(T) * lanes16(n));
  return load(b);
}
inline void store(float* p, F v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline void store_first(float* p, F v, int64_t n) {
  _mm256_maskstore_ps(p, first8(n), v.lo);
  if (n > 8) _mm256_maskstore_ps(p + 8, first8(n - 8), v.hi);
}
inline F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F sub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F round_even(F a) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, kNearest), _mm256_round_ps(a.hi, kNearest)};
}
inline F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline float reduce_add(F v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
inline float reduce_max(F v) {
  const __m256 m = _mm256_max_ps(v.lo, v.hi);
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}
inline F visible_or(const bool* m, int64_t n, F x, float masked) {
  alignas(16) uint8_t b[16] = {0};
  std::memcpy(b, m, lanes16(n));
  const __m128i bytes = _mm_load_si128((const __m128i*)b);
  // each lane all-ones where its byte is non-zero
  const __m256i lo = _mm256_cvtepi8_epi32(_mm_cmpgt_epi8(_mm_min_epu8(bytes, _mm_set1_epi8(1)), _mm_setzero_si128()));
  const __m256i hi = _mm256_cvtepi8_epi32(_mm_srli_si128(_mm_cmpgt_epi8(_mm_min_epu8(bytes, _mm_set1_epi8(1)), _mm_setzero_si128()), 8));
  const __m256 fill = _mm256_set1_ps(masked);
  return {_mm256_blendv_ps(fill, x.lo, _mm256_castsi256_ps(lo)), _mm256_blendv_ps(fill, x.hi, _mm256_castsi256_ps(hi))};
}
inline F nibbles_low(const uint8_t* q) {
  const __m128i v = _mm_and_si128(_mm_loadu_si128((const __m128i*)q), _mm_set1_epi8(0x0F));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))};
}
inline F nibbles_high(const uint8_t* q) {
  const __m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)q), 4), _mm_set1_epi8(0x0F));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))};
}
inline __m256 exp8(__m256 x) {
  const __m256 t = _mm256_mul_ps(_mm256_max_ps(_mm256_set1_ps(-87.f), x), _mm256_set1_ps(1.4426950408889634f));
  const __m256 whole = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, whole);
  __m256 p = _mm256_set1_ps(kExpC[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpC[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ));
}
inline F exp_nonpositive(F x) { return {exp8(x.lo), exp8(x.hi)}; }
// eight horizontal sums of eight-lane vectors at once
inline __m256 reduce8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
inline F reduce16(const F* v) {
  __m256 s[8];
  for (int i = 0; i < 8; ++i) s[i] = _mm256_add_ps(v[i].lo, v[i].hi);
  __m256 t[8];
  for (int i = 0; i < 8; ++i) t[i] = _mm256_add_ps(v[8 + i].lo, v[8 + i].hi);
  return {reduce8(s), reduce8(t)};
}
// dst[i][j] = src[j][i] for an 8 x 8 block: unpack pairs, shuffle quads, swap 128-bit halves
inline void transpose8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
  }
}
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int bi = 0; bi < 16; bi += 8)
    for (int bj = 0; bj < 16; bj += 8) transpose8(src + bi * lds + bj, lds, dst + bj * ldd + bi, ldd);
}
inline void prefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
inline I izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline F to_float(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
inline B unpack_nibbles(const uint8_t* q) {
  const __m256i low = _mm256_set1_epi8(0x0F), v = _mm256_loadu_si256((const __m256i*)q);
  return {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
}
// acc + per lane l the sums of even[4l + i] * x[4l + i] and odd[4l + i] * x[64 + 4l + i], i < 4: a step of 128
// columns (weights unsigned 0..15, x signed -127..127: exact). Where the products are int16 pairs (vpmaddubsw) the
// two halves' pairs are added before they widen (each at most 2 x 15 x 127, so their sum fits) and one vpmaddwd
// serves both.
inline __m256i dot4_pair8(__m256i acc, __m256i even, __m256i odd, const int8_t* x0, const int8_t* x1) {
  const __m256i a = _mm256_loadu_si256((const __m256i*)x0), b = _mm256_loadu_si256((const __m256i*)x1);
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, even, a), odd, b);
#else
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(even, a), _mm256_maddubs_epi16(odd, b));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}
inline I dot4_pair(I acc, B even, B odd, const int8_t* x) {
  return {dot4_pair8(acc.lo, even.lo, odd.lo, x, x + 64), dot4_pair8(acc.hi, even.hi, odd.hi, x + 32, x + 96)};
}
// acc + per lane l the sum of w[4l + i] * x[4l + i], i < 4: 64 signed weight bytes times 64 signed x bytes (x in
// -127..127: exact; lanes 0-7 read bytes 0-31, lanes 8-15 bytes 32-63). The x86 products take one unsigned operand,
// so they multiply |w| by x carrying w's sign (llama.cpp's Q8_0 arithmetic). signed_bytes(w) loads w (and on x86
// takes |w| and its signs) once for every row of x it multiplies.
struct S {
  __m256i lo, hi;                      // w (its signs, for x)
  __m256i magnitude_lo, magnitude_hi;  // |w|
};
inline S signed_bytes(const int8_t* w) {
  const __m256i lo = _mm256_loadu_si256((const __m256i*)w), hi = _mm256_loadu_si256((const __m256i*)(w + 32));
  return {lo, hi, _mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi)};
}
inline __m256i dot4_signed8(__m256i acc, __m256i w, __m256i magnitude, const int8_t* x) {
  const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)x), w);
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, magnitude, sx);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, sx), _mm256_set1_epi16(1)));
#endif
}
inline I dot4_signed(I acc, const S& w, const int8_t* x) {
  return {dot4_signed8(acc.lo, w.lo, w.magnitude_lo, x), dot4_signed8(acc.hi, w.hi, w.magnitude_hi, x + 32)};
}
inline I sub(I a, int32_t c) {
  const __m256i v = _mm256_set1_epi32(c);
  return {_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}
// acc + per lane l the sum of w[4l + i] * x[i], i < 4 (x in -127..127: exact; w as stored, see kLaneOffset)
#if defined(__AVXVNNI__)
constexpr int kLaneOffset = 128;
constexpr bool kIntegerTiles = true;
using L = B;
inline L lane_bytes(const uint8_t* p) { return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 32))}; }
inline I dot4_lanes(I acc, const L& w, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(four(x));
  return {_mm256_dpbusd_avx_epi32(acc.lo, w.lo, xv), _mm256_dpbusd_avx_epi32(acc.hi, w.hi, xv)};
}
#else
constexpr int kLaneOffset = 0;
constexpr bool kIntegerTiles = true;  // measured 1.1x the float tiles (8 F registers)
using L = S;
inline L lane_bytes(const uint8_t* p) { return signed_bytes((const int8_t*)p); }
inline __m256i dot4_lanes8(__m256i acc, __m256i w, __m256i magnitude, __m256i xv) {
  const __m256i products = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}
inline I dot4_lanes(I acc, const L& w, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(four(x));
  return {dot4_lanes8(acc.lo, w.lo, w.magnitude_lo, xv), dot4_lanes8(acc.hi, w.hi, w.magnitude_hi, xv)};
}
#endif

#elif defined(ETSDK_VEC_NEON)
// ================================================================ aarch64 NEON (dotprod where built with it)
#if defined(__ARM_FEATURE_DOTPROD)
constexpr const char* kLevel = "neon";
#else
constexpr const char* kLevel = "neonv8";
#endif
constexpr int kRegisters = 8;  // 32 q registers, four per F
struct F {
  float32x4_t v[4];
};
struct I {
  int32x4_t v[4];
};
struct B {
  int8x16_t v[4];
};

inline F zero() { return {{vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)}}; }
inline F set1(float s) { return {{vdupq_n_f32(s), vdupq_n_f32(s), vdupq_n_f32(s), vdupq_n_f32(s)}}; }
inline F load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline F load(const int8_t* p) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
  return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
           vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))}};
}
inline F load(const Bf16* p) {
  const uint16x8_t a = vld1q_u16(&p[0].bits), b = vld1q_u16(&p[8].bits);
  return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(a), 16)),
           vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(b), 16))}};
}
inline F load_half(const uint16_t* p) {
  const float16x8_t a = vreinterpretq_f16_u16(vld1q_u16(p)), b = vreinterpretq_f16_u16(vld1q_u16(p + 8));
  return {{vcvt_f32_f16(vget_low_f16(a)), vcvt_f32_f16(vget_high_f16(a)), vcvt_f32_f16(vget_low_f16(b)), vcvt_f32_f16(vget_high_f16(b))}};
}
inline F load(const F16* p) { return load_half(&p[0].bits); }
inline F load_first(const float* p, int64_t n) {
  float b[16] = {0};
  std::memcpy(b, p, sizeof(float) * lanes16(n));
  return load(b);
}
inline F load_first(const int8_t* p, int64_t n) {
  int8_t b[16] = {0};
  std::memcpy(b, p, lanes16(n));
  return load(b);
}
inline F load_half_first(const uint16_t* p, int64_t n) {
  uint16_t b[16] = {0};
  std::memcpy(b, p, sizeof(uint16_t) * lanes16(n));
  return load_half(b);
}
// any other element type (bfloat16, float16 weights): through a zeroed buffer of sixteen
template <typename T>
inline F load_first(const T* p, int64_t n) {
  T b[16] = {};
  std::memcpy(b, p, sizeof(T) * lanes16(n));
  return load(b);
}
inline void store(float* p, F v) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.v[i]);
}
inline void store_first(float* p, F v, int64_t n) {
  float b[16];
  store(b, v);
  std::memcpy(p, b, sizeof(float) * lanes16(n));
}
#define ETSDK_NEON_MAP2(op)                                    \
  F r;                                                         \
  for (int i = 0; i < 4; ++i) r.v[i] = op(a.v[i], b.v[i]);     \
  return r;
inline F add(F a, F b) { ETSDK_NEON_MAP2(vaddq_f32) }
inline F sub(F a, F b) { ETSDK_NEON_MAP2(vsubq_f32) }
inline F mul(F a, F b) { ETSDK_NEON_MAP2(vmulq_f32) }
inline F max(F a, F b) { ETSDK_NEON_MAP2(vmaxq_f32) }
#undef ETSDK_NEON_MAP2
inline F round_even(F a) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = vrndnq_f32(a.v[i]);
  return r;
}
inline F fma(F a, F b, F c) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
  return r;
}
inline float reduce_add(F v) { return vaddvq_f32(vaddq_f32(vaddq_f32(v.v[0], v.v[1]), vaddq_f32(v.v[2], v.v[3]))); }
inline float reduce_max(F v) { return vmaxvq_f32(vmaxq_f32(vmaxq_f32(v.v[0], v.v[1]), vmaxq_f32(v.v[2], v.v[3]))); }
inline F visible_or(const bool* m, int64_t n, F x, float masked) {
  uint8_t b[16] = {0};
  std::memcpy(b, m, lanes16(n));
  const uint8x16_t seen = vtstq_u8(vld1q_u8(b), vld1q_u8(b));  // 0xFF where non-zero
  const uint16x8_t lo = vmovl_u8(vget_low_u8(seen)), hi = vmovl_u8(vget_high_u8(seen));
  const uint32x4_t s[4] = {vtstq_u32(vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_low_u16(lo))),
                           vtstq_u32(vmovl_u16(vget_high_u16(lo)), vmovl_u16(vget_high_u16(lo))),
                           vtstq_u32(vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_low_u16(hi))),
                           vtstq_u32(vmovl_u16(vget_high_u16(hi)), vmovl_u16(vget_high_u16(hi)))};
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = vbslq_f32(s[i], x.v[i], vdupq_n_f32(masked));
  return r;
}
inline F nibbles_from(uint8x16_t v) {
  const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_u8(vget_high_u8(v));
  return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))),
           vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)))}};
}
inline F nibbles_low(const uint8_t* q) { return nibbles_from(vandq_u8(vld1q_u8(q), vdupq_n_u8(0x0F))); }
inline F nibbles_high(const uint8_t* q) { return nibbles_from(vshrq_n_u8(vld1q_u8(q), 4)); }
inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t t = vmulq_f32(vmaxq_f32(vdupq_n_f32(-87.f), x), vdupq_n_f32(1.4426950408889634f));
  const float32x4_t whole = vrndmq_f32(t);
  const float32x4_t f = vsubq_f32(t, whole);
  float32x4_t p = vdupq_n_f32(kExpC[0]);
  for (int i = 1; i < 7; ++i) p = vfmaq_f32(vdupq_n_f32(kExpC[i]), p, f);
  const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(whole), vdupq_n_s32(127)), 23);
  const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(bits));
  return vbslq_f32(vcltq_f32(x, vdupq_n_f32(-87.f)), vdupq_n_f32(0.f), r);
}
inline F exp_nonpositive(F x) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = exp4(x.v[i]);
  return r;
}
inline F reduce16(const F* v) {
  float s[16];
  for (int i = 0; i < 16; ++i) s[i] = reduce_add(v[i]);
  return load(s);
}
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  // bits copied, not float values: the int8 tiles move weight bytes through it (an x87 copy could quiet a NaN)
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) std::memcpy(dst + j * ldd + i, src + i * lds + j, sizeof(float));
}
inline void prefetch(const void* p) { __builtin_prefetch(p); }
inline I izero() { return {{vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}}; }
inline F to_float(I v) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = vcvtq_f32_s32(v.v[i]);
  return r;
}
inline B unpack_nibbles(const uint8_t* q) {
  const uint8x16_t a = vld1q_u8(q), b = vld1q_u8(q + 16), low = vdupq_n_u8(0x0F);
  return {{vreinterpretq_s8_u8(vandq_u8(a, low)), vreinterpretq_s8_u8(vandq_u8(b, low)), vreinterpretq_s8_u8(vshrq_n_u8(a, 4)),
           vreinterpretq_s8_u8(vshrq_n_u8(b, 4))}};
}
inline int32x4_t dot4_4(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, w, x);
#else
  const int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
  const int32x4_t b = vpaddlq_s16(vmull_s8(vget_high_s8(w), vget_high_s8(x)));
  return vaddq_s32(acc, vpaddq_s32(a, b));
#endif
}
// acc + per lane l the sums of even[4l + i] * x[4l + i] and odd[4l + i] * x[64 + 4l + i], i < 4: a step of 128
// columns (weights unsigned 0..15, x signed -127..127: exact). Where the products are int16 pairs (vpmaddubsw) the
// two halves' pairs are added before they widen (each at most 2 x 15 x 127, so their sum fits) and one vpmaddwd
// serves both.
inline I dot4_pair(I acc, B even, B odd, const int8_t* x) {
  I r;
  for (int i = 0; i < 4; ++i) r.v[i] = dot4_4(dot4_4(acc.v[i], even.v[i], vld1q_s8(x + 16 * i)), odd.v[i], vld1q_s8(x + 64 + 16 * i));
  return r;
}
// acc + per lane l the sum of w[4l + i] * x[4l + i], i < 4: 64 signed weight bytes times 64 signed x bytes (x in
// -127..127: exact; lanes 0-7 read bytes 0-31, lanes 8-15 bytes 32-63). The x86 products take one unsigned operand,
// so they multiply |w| by x carrying w's sign (llama.cpp's Q8_0 arithmetic). signed_bytes(w) loads w (and on x86
// takes |w| and its signs) once for every row of x it multiplies.
struct S {
  int8x16_t v[4];
};
inline S signed_bytes(const int8_t* w) { return {{vld1q_s8(w), vld1q_s8(w + 16), vld1q_s8(w + 32), vld1q_s8(w + 48)}}; }
inline I dot4_signed(I acc, const S& w, const int8_t* x) {
  I r;
  for (int i = 0; i < 4; ++i) r.v[i] = dot4_4(acc.v[i], w.v[i], vld1q_s8(x + 16 * i));
  return r;
}

inline I sub(I a, int32_t c) {
  const int32x4_t v = vdupq_n_s32(c);
  return {{vsubq_s32(a.v[0], v), vsubq_s32(a.v[1], v), vsubq_s32(a.v[2], v), vsubq_s32(a.v[3], v)}};
}
// acc + per lane l the sum of w[4l + i] * x[i], i < 4 (x in -127..127: exact; w signed: kLaneOffset 0)
constexpr int kLaneOffset = 0;
// not measured (no aarch64 host here): sdot multiplies 16 byte pairs an instruction against an FMA's 4 floats; without
// dotprod, vmull_s8 and three adds take 16 products, no fewer instructions than the float tiles: those run there
#if defined(__ARM_FEATURE_DOTPROD)
constexpr bool kIntegerTiles = true;
#else
constexpr bool kIntegerTiles = false;
#endif
using L = S;
inline L lane_bytes(const uint8_t* p) { return signed_bytes((const int8_t*)p); }
inline I dot4_lanes(I acc, const L& w, const int8_t* x) {
  const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(four(x)));
  I r;
  for (int i = 0; i < 4; ++i) r.v[i] = dot4_4(acc.v[i], w.v[i], xv);
  return r;
}

#else
// ================================================================ portable C++ (any CPU; the compiler vectorizes what it can)
constexpr const char* kLevel = "portable";
constexpr int kRegisters = 8;
struct F {
  float v[16];
};
struct I {
  int32_t v[16];
};
struct B {
  uint8_t v[64];
};

#define ETSDK_LANES for (int l = 0; l < 16; ++l)
inline F zero() { return F{}; }
inline F set1(float s) {
  F r;
  ETSDK_LANES r.v[l] = s;
  return r;
}
inline F load(const float* p) {
  F r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
template <typename T>
inline F load(const T* p) {
  F r;
  ETSDK_LANES r.v[l] = widen(p[l]);
  return r;
}
inline F load_half(const uint16_t* p) {
  F r;
  ETSDK_LANES r.v[l] = half_to_float(p[l]);
  return r;
}
template <typename T>
inline F load_first(const T* p, int64_t n) {
  F r{};
  for (int64_t l = 0; l < n && l < 16; ++l) r.v[l] = widen(p[l]);
  return r;
}
inline F load_half_first(const uint16_t* p, int64_t n) {
  F r{};
  for (int64_t l = 0; l < n && l < 16; ++l) r.v[l] = half_to_float(p[l]);
  return r;
}
inline void store(float* p, F v) { std::memcpy(p, v.v, sizeof v.v); }
inline void store_first(float* p, F v, int64_t n) {
  for (int64_t l = 0; l < n && l < 16; ++l) p[l] = v.v[l];
}
#define ETSDK_MAP2(expr) \
  F r;                   \
  ETSDK_LANES r.v[l] = expr; \
  return r;
inline F add(F a, F b) { ETSDK_MAP2(a.v[l] + b.v[l]) }
inline F sub(F a, F b) { ETSDK_MAP2(a.v[l] - b.v[l]) }
inline F round_even(F a) {
  F r;
  ETSDK_LANES r.v[l] = std::nearbyint(a.v[l]);  // the default rounding mode: to nearest, ties to even
  return r;
}
inline F mul(F a, F b) { ETSDK_MAP2(a.v[l] * b.v[l]) }
inline F max(F a, F b) { ETSDK_MAP2(a.v[l] > b.v[l] ? a.v[l] : b.v[l]) }
inline F fma(F a, F b, F c) { ETSDK_MAP2(a.v[l] * b.v[l] + c.v[l]) }
#undef ETSDK_MAP2
inline float reduce_add(F v) {
  float s = 0.f;
  ETSDK_LANES s += v.v[l];
  return s;
}
inline float reduce_max(F v) {
  float s = v.v[0];
  ETSDK_LANES s = v.v[l] > s ? v.v[l] : s;
  return s;
}
inline F visible_or(const bool* m, int64_t n, F x, float masked) {
  F r;
  ETSDK_LANES r.v[l] = (l < n && m[l]) ? x.v[l] : masked;
  return r;
}
inline F nibbles_low(const uint8_t* q) {
  F r;
  ETSDK_LANES r.v[l] = (float)(q[l] & 0x0F);
  return r;
}
inline F nibbles_high(const uint8_t* q) {
  F r;
  ETSDK_LANES r.v[l] = (float)(q[l] >> 4);
  return r;
}
inline F exp_nonpositive(F x) {
  F r;
  ETSDK_LANES r.v[l] = etsdk_kernels::exp_nonpositive(x.v[l]);
  return r;
}
inline F reduce16(const F* v) {
  F r;
  ETSDK_LANES r.v[l] = reduce_add(v[l]);
  return r;
}
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  // bits copied, not float values: the int8 tiles move weight bytes through it (an x87 copy could quiet a NaN)
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) std::memcpy(dst + j * ldd + i, src + i * lds + j, sizeof(float));
}
inline void prefetch(const void*) {}
inline I izero() { return I{}; }
inline F to_float(I v) {
  F r;
  ETSDK_LANES r.v[l] = (float)v.v[l];
  return r;
}
inline B unpack_nibbles(const uint8_t* q) {
  B r;
  for (int i = 0; i < 32; ++i) {
    r.v[i] = q[i] & 0x0F;
    r.v[32 + i] = q[i] >> 4;
  }
  return r;
}
// acc + per lane l the sums of even[4l + i] * x[4l + i] and odd[4l + i] * x[64 + 4l + i], i < 4: a step of 128
// columns (weights unsigned 0..15, x signed -127..127: exact). Where the products are int16 pairs (vpmaddubsw) the
// two halves' pairs are added before they widen (each at most 2 x 15 x 127, so their sum fits) and one vpmaddwd
// serves both.
inline I dot4_pair(I acc, B even, B odd, const int8_t* x) {
  ETSDK_LANES for (int i = 0; i < 4; ++i) acc.v[l] += even.v[4 * l + i] * x[4 * l + i] + odd.v[4 * l + i] * x[64 + 4 * l + i];
  return acc;
}
// acc + per lane l the sum of w[4l + i] * x[4l + i], i < 4: 64 signed weight bytes times 64 signed x bytes (x in
// -127..127: exact; lanes 0-7 read bytes 0-31, lanes 8-15 bytes 32-63). The x86 products take one unsigned operand,
// so they multiply |w| by x carrying w's sign (llama.cpp's Q8_0 arithmetic). signed_bytes(w) loads w (and on x86
// takes |w| and its signs) once for every row of x it multiplies.
struct S {
  int8_t v[64];
};
inline S signed_bytes(const int8_t* w) {
  S r;
  std::memcpy(r.v, w, 64);
  return r;
}
inline I dot4_signed(I acc, const S& w, const int8_t* x) {
  ETSDK_LANES for (int i = 0; i < 4; ++i) acc.v[l] += w.v[4 * l + i] * x[4 * l + i];
  return acc;
}
inline I sub(I a, int32_t c) {
  ETSDK_LANES a.v[l] -= c;
  return a;
}
// acc + per lane l the sum of w[4l + i] * x[i], i < 4 (w signed: kLaneOffset 0)
constexpr int kLaneOffset = 0;
constexpr bool kIntegerTiles = true;  // plain loops: 4.7x the float tiles measured
using L = S;
inline L lane_bytes(const uint8_t* p) { return signed_bytes((const int8_t*)p); }
inline I dot4_lanes(I acc, const L& w, const int8_t* x) {
  ETSDK_LANES for (int i = 0; i < 4; ++i) acc.v[l] += w.v[4 * l + i] * x[i];
  return acc;
}
#undef ETSDK_LANES
#endif

// One step's weights times one row of x (the same on every level: the weights made ready, then multiplied).
inline I dot4_signed(I acc, const int8_t* w, const int8_t* x) { return dot4_signed(acc, signed_bytes(w), x); }

}  // namespace vec
}  // namespace etsdk_kernels
