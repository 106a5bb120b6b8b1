// etsdk-aoti kernels: matrix multiplication by quantized weights, at every instruction-set level (vec.h).
//
// y[M, N] = x[M, K] @ w[N, K]^T (+ bias), where w is stored in one of etsdk's planes formats
// (etsdk._format.weight_format; table.h: Weights):
//
//   bits 8, group 0 : q8 int8 [N, K], scales float32 [N]           w = q * s
//   bits 8, group G : q8 int8 [N, K], scales float32 [N, K/G]      w = q * s
//   bits 4, group G : q4 uint8 [N, K/2] (value 2i in the low nibble of byte i,
//                     2i+1 in the high one), scales float32 [N, K/G],
//                     mins float32 [N, K/G] or none:  w = q * s + m,  or (q - 8) * s
//
// qmm() computes it in float32 (the format's reference: dequantize, then linear). qmm_a8() is the same product for
// the ``:a8`` formats: 4-bit weights (scales and minimums float32 or float16, read as stored), x rounded to int8 per
// block of 32 (d = max|x| / 127, q = round-half-even(x * (1 / d)), the same integers on every level). It multiplies
// integers on every level, decode and prefill alike: unsigned weight bytes times signed x bytes, four to an int32
// lane (vec::dot4_pair: AVX-512 VNNI and AVX-VNNI vpdpbusd; AVX-512 and AVX2 vpmaddubsw + vpmaddwd, as llama.cpp's Q4 x Q8
// products; NEON sdot, vmull_s8 without dotprod), 128 columns a step whose lanes each sum one block's products
// exactly; d times the weight's scale is applied once per lane and step: no 4-bit value is widened to float.
// int8 weights with int8 activations (int8[:gG]:a8, llama.cpp's Q8_0 arithmetic; float32 scales) take q8_products:
// a decode row multiplies signed bytes by signed bytes 64 columns a step (vec::dot4_signed, a step's weights made
// ready once for up to kFewRows rows of x), each block's sum exact; prefill rows run integer tiles, 16 weight rows
// to the 16 lanes (vec::dot4_lanes), each lane's sum over a block exact, converted and scaled once per block (the
// float tiles on the rounded values q * d where the level's integer products are the slower: vec::kIntegerTiles).
//
// Every packed byte is read once per call. Small M (decode) takes a dot-product path straight from the packed
// bytes; larger M (prefill) dequantizes NR weight rows at a time into a float tile and runs an MR x NR register-
// blocked micro-kernel over all rows of x (the 4-bit :a8 prefill multiplies kA8Rows weight rows by MB rows of x per
// step, the int8 one packs kTileRows x 16 weight rows for kTileX rows of x, integers still), so each weight is
// decoded once per call whatever M is. The blocking follows the level's register
// count (vec::kRegisters: 32 F at AVX-512, 8 at AVX2, NEON and portable). Work is split over output rows, 16 a task,
// with OpenMP (torch's own runtime in the process, so the team size torch is given applies here too). The per-level
// code is a few small functions side by side (unpack_step, step_dot, spread, block_scales, first_halves,
// round_block, half); everything else is one driver in vec.h's operations.
//
// Called through the level table (table.h) by entry.cpp's aoti_torch_cpu_etsdk_qmm / _qmm_a8 / _qmm_a8_fused,
// which checked every operand; nothing here fails.

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "table.h"
#include "vec.h"

namespace etsdk_kernels {
namespace {

namespace v = vec;

// ---------------------------------------------------------------- register blocking, from the level's registers

// The level's F registers: 32 at AVX-512, 8 at AVX2 (16 ymm) and NEON (32 q), fewer where vec.h says so.
constexpr int kRegisters = v::kRegisters;
// float prefill: NR weight rows per tile (NR / 16 F of outputs per row of x), MR rows of x per micro-kernel call:
// MR * NR / 16 accumulators, NR / 16 tile values and one broadcast live (AVX-512 8 x 32: 19 of 32 F; 8 F: 6 x 16)
constexpr int NR = kRegisters >= 32 ? 32 : 16;
constexpr int NF = NR / 16;
constexpr int MR = kRegisters >= 32 ? 8 : kRegisters >= 8 ? 6 : 2;
// rows of x up to which a product takes the dot-product (decode) path; more take the prefill tiles
constexpr int64_t kFewRows = 4;
// float decode: rows of x per pass over the weights (2 * rows + 2 F live)
constexpr int kGemvRows = kRegisters >= 32 ? 4 : kRegisters >= 8 ? 2 : 1;
// :a8: weight rows multiplied together (independent chains, each step of x loaded once for all of them: 2 at
// AVX-512; with 8 F a second row's unpacked weights and scales spill, measured 4-8 % slower at AVX2), and rows of x
// per prefill step (each step of weights unpacked once for all of them): MB * kA8Rows accumulators, kA8Rows steps
// of unpacked weights (2 B each) and their scales live (AVX-512 8 + 4 + 2 of 32 F; 8 F: 4 + 2 + 1, MB 4 measured
// 10 % faster than 2 at AVX2)
constexpr int kA8Rows = kRegisters >= 32 ? 2 : 1;
constexpr int MB = kRegisters >= 8 ? 4 : 2;

// ---------------------------------------------------------------- the per-level pieces of the :a8 products

// The :a8 products go a step of 128 columns (four blocks of 32) at a time. The step's 64 packed bytes unpack to their
// 64 low nibbles (the even columns of the four blocks, in order), then their 64 high ones (the odd columns), and x is
// laid out the same way (QuantizedX: the step's 64 even columns, then its 64 odd ones). vec::dot4_pair sums four products
// per int32 lane, and the four-byte groups of one lane fall in one block for both halves, so one accumulation of the
// even and odd products gives 16 lanes [b0 x4, b1 x4, b2 x4, b3 x4]: a block's sums stay exact integers until one
// conversion, one scale and one accumulation per step serve 128 columns.
constexpr int kStepColumns = 128;
constexpr int kStepBlocks = 4;

// A step's weights: the 64 low nibbles of its packed bytes, then the 64 high ones (values 0 .. 15).
struct StepWeights {
  v::B even, odd;
};

inline StepWeights unpack_step(const uint8_t* q) {
#if defined(ETSDK_VEC_AVX512)
  const __m512i bytes = _mm512_loadu_si512(q), low = _mm512_set1_epi8(0x0F);
  return {_mm512_and_si512(bytes, low), _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low)};
#elif defined(ETSDK_VEC_AVX2)
  const v::B a = v::unpack_nibbles(q), b = v::unpack_nibbles(q + 32);  // each: 32 low nibbles, 32 high ones
  return {{a.lo, b.lo}, {a.hi, b.hi}};
#elif defined(ETSDK_VEC_NEON)
  const v::B a = v::unpack_nibbles(q), b = v::unpack_nibbles(q + 32);  // each: 2 x 16 low nibbles, 2 x 16 high ones
  return {{{a.v[0], a.v[1], b.v[0], b.v[1]}}, {{a.v[2], a.v[3], b.v[2], b.v[3]}}};
#else
  StepWeights w;
  for (int i = 0; i < 64; ++i) {
    w.even.v[i] = q[i] & 0x0F;
    w.odd.v[i] = q[i] >> 4;
  }
  return w;
#endif
}

// acc + per lane the products of a step's weights w and its 128 bytes of rounded x (even columns, then odd)
inline v::I step_dot(v::I acc, const StepWeights& w, const int8_t* x) { return v::dot4_pair(acc, w.even, w.odd, x); }

// Per lane the value of its block: b[0 .. 4), one per block of the step.
inline v::F spread(const float* b) {
#if defined(ETSDK_VEC_AVX512)
  const __m512i pattern = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(pattern, _mm512_castps128_ps512(_mm_setr_ps(b[0], b[1], b[2], b[3])));
#elif defined(ETSDK_VEC_AVX2)
  return {_mm256_set_m128(_mm_set1_ps(b[1]), _mm_set1_ps(b[0])), _mm256_set_m128(_mm_set1_ps(b[3]), _mm_set1_ps(b[2]))};
#elif defined(ETSDK_VEC_NEON)
  return {{vdupq_n_f32(b[0]), vdupq_n_f32(b[1]), vdupq_n_f32(b[2]), vdupq_n_f32(b[3])}};
#else
  float lanes[16];
  for (int l = 0; l < 16; ++l) lanes[l] = b[l / 4];
  return v::load(lanes);
#endif
}

// A float16 value (a scale or minimum plane read as stored) as float: one conversion instruction where the level has
// one (F16C, NEON), vec.h's portable half_to_float elsewhere.
inline float half(uint16_t bits) {
#if defined(ETSDK_VEC_AVX512) || defined(ETSDK_VEC_AVX2)
  return _cvtsh_ss(bits);
#elif defined(ETSDK_VEC_NEON)
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(bits))), 0);
#else
  return half_to_float(bits);
#endif
}
inline float scale(const float* s) { return *s; }
inline float scale(const uint16_t* s) { return half(*s); }

// spread(s[0 .. 4)) from a plane of one scale per block (groups of 32), the four loaded and converted together.
inline v::F block_scales(const float* s) {
#if defined(ETSDK_VEC_AVX512)
  const __m512i pattern = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(pattern, _mm512_castps128_ps512(_mm_loadu_ps(s)));
#elif defined(ETSDK_VEC_AVX2)
  const __m256 four = _mm256_castps128_ps256(_mm_loadu_ps(s));
  return {_mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)),
          _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3))};
#elif defined(ETSDK_VEC_NEON)
  const float32x4_t f = vld1q_f32(s);
  return {{vdupq_laneq_f32(f, 0), vdupq_laneq_f32(f, 1), vdupq_laneq_f32(f, 2), vdupq_laneq_f32(f, 3)}};
#else
  return spread(s);
#endif
}
inline v::F block_scales(const uint16_t* s) {
#if defined(ETSDK_VEC_AVX512)
  const __m512i pattern = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(pattern, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)s))));
#elif defined(ETSDK_VEC_AVX2)
  const __m256 four = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)s)));
  return {_mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)),
          _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3))};
#elif defined(ETSDK_VEC_NEON)
  const float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s)));
  return {{vdupq_laneq_f32(f, 0), vdupq_laneq_f32(f, 1), vdupq_laneq_f32(f, 2), vdupq_laneq_f32(f, 3)}};
#else
  const float b[4] = {half_to_float(s[0]), half_to_float(s[1]), half_to_float(s[2]), half_to_float(s[3])};
  return spread(b);
#endif
}

// The first n < 16 values of a float16 plane as floats, zeros after them: vec::load_half_first, but without a
// buffer at AVX2 (a copy of n bytes, then a wide load of them, measured 50 % slower per :a8 prefill there).
inline v::F first_halves(const uint16_t* s, int64_t n) {
#if defined(ETSDK_VEC_AVX2)
  // the whole pairs as int32 (masked loads never touch the lanes they skip), then an odd last one put in place
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i h = _mm256_maskload_epi32((const int*)s, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n / 2)), lane));
  if (n % 2) {
    const __m256i at = _mm256_cmpeq_epi16(_mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm256_set1_epi16((short)(n - 1)));
    h = _mm256_blendv_epi8(h, _mm256_set1_epi16((short)s[n - 1]), at);
  }
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
#else
  return v::load_half_first(s, n);
#endif
}

// The 32 values of a block times id, rounded half to even (the default rounding of every level's conversion), as
// int8: the 16 even columns at even[0 .. 16), the 16 odd ones at odd[0 .. 16). |x * id| <= 127, so every packing
// is exact.
inline void round_block(const float* xb, float id, int8_t* even, int8_t* odd) {
#if defined(ETSDK_VEC_AVX512)
  const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), vid));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), vid));
  _mm_storeu_si128((__m128i*)even, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, evens, q1)));
  _mm_storeu_si128((__m128i*)odd, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, odds, q1)));
#elif defined(ETSDK_VEC_AVX2)
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), vid));
  const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), vid));
  const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), vid));
  const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), vid));
  // packs work per 128-bit lane: the bytes come as columns [0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31]
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // 0 .. 31
  const __m256i split = _mm256_shuffle_epi8(  // per lane of 16 columns: its 8 even ones, then its 8 odd ones
      ordered, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
                                7, 9, 11, 13, 15));
  const __m256i both = _mm256_permute4x64_epi64(split, _MM_SHUFFLE(3, 1, 2, 0));  // evens 0 .. 30, odds 1 .. 31
  _mm_storeu_si128((__m128i*)even, _mm256_castsi256_si128(both));
  _mm_storeu_si128((__m128i*)odd, _mm256_extracti128_si256(both, 1));
#elif defined(ETSDK_VEC_NEON)
  const float32x4_t vid = vdupq_n_f32(id);
  int16x4_t e[4], o[4];
  for (int i = 0; i < 4; ++i) {
    const float32x4x2_t pair = vld2q_f32(xb + 8 * i);  // val[0]: 4 even columns, val[1]: the 4 odd ones
    e[i] = vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(pair.val[0], vid)));
    o[i] = vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(pair.val[1], vid)));
  }
  vst1q_s8(even, vcombine_s8(vqmovn_s16(vcombine_s16(e[0], e[1])), vqmovn_s16(vcombine_s16(e[2], e[3]))));
  vst1q_s8(odd, vcombine_s8(vqmovn_s16(vcombine_s16(o[0], o[1])), vqmovn_s16(vcombine_s16(o[2], o[3]))));
#else
  for (int i = 0; i < 16; ++i) {
    even[i] = (int8_t)std::nearbyint(xb[2 * i] * id);
    odd[i] = (int8_t)std::nearbyint(xb[2 * i + 1] * id);
  }
#endif
}

// ---------------------------------------------------------------- dequantize one row (prefill tiles)

// Row r of w as floats. For 4-bit weights the row comes out permuted: the even columns first, then the odd ones
// (x is permuted the same way), so no interleaving is needed.
void dequantize_row(const Weights& w, int64_t r, float* out) {
  const int64_t k = w.k;
  if (w.bits == 8) {
    const int8_t* q = w.q8 + r * k;
    const int64_t group = w.group ? w.group : k;
    for (int64_t g0 = 0, gi = 0; g0 < k; g0 += group, ++gi) {
      const v::F s = v::set1(w.scales[r * w.groups + gi]);
      const int64_t end = g0 + group < k ? g0 + group : k;
      int64_t i = g0;
      for (; i + 16 <= end; i += 16) v::store(out + i, v::mul(v::load(q + i), s));
      if (i < end) v::store_first(out + i, v::mul(v::load_first(q + i, end - i), s), end - i);
    }
    return;
  }
  const uint8_t* q = w.q4 + r * (k / 2);
  const int64_t half = w.group / 2;  // bytes per group, a multiple of 16
  float* even = out;
  float* odd = out + k / 2;
  for (int64_t gi = 0; gi < w.groups; ++gi) {
    const float s = w.scales[r * w.groups + gi];
    const v::F vs = v::set1(s), vm = v::set1(w.mins ? w.mins[r * w.groups + gi] : -8.0f * s);
    for (int64_t i = gi * half; i < (gi + 1) * half; i += 16) {
      v::store(even + i, v::fma(v::nibbles_low(q + i), vs, vm));
      v::store(odd + i, v::fma(v::nibbles_high(q + i), vs, vm));
    }
  }
}

// ---------------------------------------------------------------- decode: dot products from the packed bytes

// y[m][r] for rows r in [r0, r1) and every m < M, x rows of length k (for 4 bits: xe / xo, the even and odd
// columns, and xs, the sums of x per group).
template <int M>
void gemv_rows(const Weights& w, const float* x, const float* xe, const float* xo, const float* xs, float* y,
               int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = w.k;
  for (int64_t r = r0; r < r1; ++r) {
    float total[M];
    if (w.bits == 8 && w.group == 0) {
      // one scale per row: the whole row is one group, so split its sum over two chains (a multiply-add then
      // waits on every other one, not on the one before it: measured 11 % faster on AVX-512). Groups of 32-64
      // values are short chains already, and their extra addition measured slower there.
      const int8_t* q = w.q8 + r * k;
      v::F acc[M], acc1[M];
      for (int m = 0; m < M; ++m) acc[m] = acc1[m] = v::zero();
      int64_t i = 0;
      for (; i + 32 <= k; i += 32) {
        const v::F w0 = v::load(q + i), w1 = v::load(q + i + 16);
        for (int m = 0; m < M; ++m) {
          acc[m] = v::fma(v::load(x + m * k + i), w0, acc[m]);
          acc1[m] = v::fma(v::load(x + m * k + i + 16), w1, acc1[m]);
        }
      }
      for (; i < k; i += 16) {  // the columns past the last whole 32, sixteen (or fewer) at a time
        const v::F w0 = v::load_first(q + i, k - i);
        for (int m = 0; m < M; ++m) acc[m] = v::fma(v::load_first(x + m * k + i, k - i), w0, acc[m]);
      }
      const float s = w.scales[r];
      for (int m = 0; m < M; ++m) total[m] = s * v::reduce_add(v::add(acc[m], acc1[m]));
    } else if (w.bits == 8) {
      const int8_t* q = w.q8 + r * k;
      v::F sum[M];
      for (int m = 0; m < M; ++m) sum[m] = v::zero();
      for (int64_t g0 = 0, gi = 0; g0 < k; g0 += w.group, ++gi) {  // groups are multiples of 32: no tail
        v::F acc[M];
        for (int m = 0; m < M; ++m) acc[m] = v::zero();
        for (int64_t i = g0; i < g0 + w.group; i += 16) {
          const v::F wv = v::load(q + i);
          for (int m = 0; m < M; ++m) acc[m] = v::fma(v::load(x + m * k + i), wv, acc[m]);
        }
        const v::F vs = v::set1(w.scales[r * w.groups + gi]);
        for (int m = 0; m < M; ++m) sum[m] = v::fma(vs, acc[m], sum[m]);
      }
      for (int m = 0; m < M; ++m) total[m] = v::reduce_add(sum[m]);
    } else {
      const uint8_t* q = w.q4 + r * (k / 2);
      const int64_t half = w.group / 2;  // bytes per group, a multiple of 16
      const int64_t kh = k / 2;
      v::F sum[M];
      for (int m = 0; m < M; ++m) {
        sum[m] = v::zero();
        total[m] = 0.0f;
      }
      for (int64_t gi = 0; gi < w.groups; ++gi) {
        const float s = w.scales[r * w.groups + gi];
        const float c = w.mins ? w.mins[r * w.groups + gi] : -8.0f * s;  // w = q * s + c
        const int64_t b0 = gi * half;
        v::F acc[M];
        for (int m = 0; m < M; ++m) acc[m] = v::zero();
        for (int64_t i = b0; i < b0 + half; i += 16) {
          const v::F lo = v::nibbles_low(q + i), hi = v::nibbles_high(q + i);
          for (int m = 0; m < M; ++m) {
            acc[m] = v::fma(v::load(xe + m * kh + i), lo, acc[m]);
            acc[m] = v::fma(v::load(xo + m * kh + i), hi, acc[m]);
          }
        }
        const v::F vs = v::set1(s);
        for (int m = 0; m < M; ++m) {
          sum[m] = v::fma(vs, acc[m], sum[m]);
          total[m] += c * xs[m * w.groups + gi];
        }
      }
      for (int m = 0; m < M; ++m) total[m] += v::reduce_add(sum[m]);
    }
    const float b = w.bias ? w.bias[r] : 0.0f;
    for (int m = 0; m < M; ++m) y[m * ldy + r] = total[m] + b;
  }
}

void gemv(const Weights& w, const float* x, int64_t m_rows, float* y) {
  const int64_t k = w.k;
  std::vector<float> xe, xo, xs;
  if (w.bits == 4) {
    xe.resize(m_rows * k / 2);
    xo.resize(m_rows * k / 2);
    xs.resize(m_rows * w.groups);
    for (int64_t m = 0; m < m_rows; ++m) {
      for (int64_t i = 0; i < k / 2; ++i) {
        xe[m * k / 2 + i] = x[m * k + 2 * i];
        xo[m * k / 2 + i] = x[m * k + 2 * i + 1];
      }
      for (int64_t g = 0; g < w.groups; ++g) {
        float s = 0.0f;
        for (int64_t i = g * w.group; i < (g + 1) * w.group; ++i) s += x[m * k + i];
        xs[m * w.groups + g] = s;
      }
    }
  }
  // rows per chunk: enough work per chunk that the team's start-up is amortized, small enough to balance
  const int64_t chunk = 16;
  const int64_t chunks = (w.n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * chunk, r1 = r0 + chunk < w.n ? r0 + chunk : w.n;
    for (int64_t m0 = 0; m0 < m_rows; m0 += kGemvRows) {  // kGemvRows rows of x per pass over the chunk's weights
      const float* xm = x + m0 * k;
      const float* pe = xe.data() + m0 * k / 2;
      const float* po = xo.data() + m0 * k / 2;
      const float* ps = xs.data() + m0 * w.groups;
      float* ym = y + m0 * w.n;
      switch (m_rows - m0 < kGemvRows ? m_rows - m0 : kGemvRows) {
        case 1: gemv_rows<1>(w, xm, pe, po, ps, ym, w.n, r0, r1); break;
        case 2: gemv_rows<2>(w, xm, pe, po, ps, ym, w.n, r0, r1); break;
        case 3: gemv_rows<3>(w, xm, pe, po, ps, ym, w.n, r0, r1); break;
        default: gemv_rows<kGemvRows>(w, xm, pe, po, ps, ym, w.n, r0, r1); break;
      }
    }
  }
}

// ---------------------------------------------------------------- prefill: float tiles and a register-blocked kernel

// y[i][n0 + j] (+ bias) for i < R, j < nr: tile is [k][NR] (tile[p * NR + j] = w[n0 + j][p]), so each step of p
// broadcasts one x value per row against NF vectors of 16 outputs: no horizontal sums.
template <int R>
void micro(const float* x, int64_t ldx, const float* tile, int64_t k, int nr, float* y, int64_t ldy, int64_t n0,
           const float* bias) {
  v::F acc[R][NF];
  for (int i = 0; i < R; ++i)
    for (int f = 0; f < NF; ++f) acc[i][f] = v::zero();
  for (int64_t p = 0; p < k; ++p) {
    v::F t[NF];
    for (int f = 0; f < NF; ++f) t[f] = v::load(tile + p * NR + 16 * f);
    for (int i = 0; i < R; ++i) {
      const v::F xv = v::set1(x[i * ldx + p]);
      for (int f = 0; f < NF; ++f) acc[i][f] = v::fma(xv, t[f], acc[i][f]);
    }
  }
  v::F b[NF];
  for (int f = 0; f < NF; ++f) b[f] = bias ? v::load_first(bias + n0 + 16 * f, nr - 16 * f) : v::zero();
  for (int i = 0; i < R; ++i)
    for (int f = 0; f < NF; ++f) v::store_first(y + i * ldy + n0 + 16 * f, v::add(acc[i][f], b[f]), nr - 16 * f);
}

// micro<rows> for any rows in 1 .. R
template <int R>
void micro_rows(int rows, const float* x, int64_t ldx, const float* tile, int64_t k, int nr, float* y, int64_t ldy,
                int64_t n0, const float* bias) {
  if constexpr (R > 1) {
    if (rows < R) return micro_rows<R - 1>(rows, x, ldx, tile, k, nr, y, ldy, n0, bias);
  }
  micro<R>(x, ldx, tile, k, nr, y, ldy, n0, bias);
}

void gemm(const Weights& w, const float* x, int64_t m_rows, float* y, int64_t ldy) {
  const int64_t k = w.k;
  const float* xs = x;
  std::vector<float> permuted;
  if (w.bits == 4) {  // dequantized rows hold the even columns, then the odd ones: permute x the same way
    permuted.resize(m_rows * k);
    for (int64_t m = 0; m < m_rows; ++m)
      for (int64_t i = 0; i < k / 2; ++i) {
        permuted[m * k + i] = x[m * k + 2 * i];
        permuted[m * k + k / 2 + i] = x[m * k + 2 * i + 1];
      }
    xs = permuted.data();
  }
  const int64_t blocks = (w.n + NR - 1) / NR;
#pragma omp parallel
  {
    std::vector<float> tile(NR * k);
    std::vector<float> rows(16 * k);  // 16 dequantized weight rows, transposed into the tile 16 x 16 at a time
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * NR;
      const int nr = (int)(w.n - n0 < NR ? w.n - n0 : NR);
      for (int half = 0; half < NR; half += 16) {
        for (int j = 0; j < 16; ++j) {
          if (half + j < nr) dequantize_row(w, n0 + half + j, rows.data() + j * k);
          else std::memset(rows.data() + j * k, 0, sizeof(float) * k);
        }
        int64_t p = 0;
        for (; p + 16 <= k; p += 16) v::transpose16(rows.data() + p, k, tile.data() + p * NR + half, NR);
        for (; p < k; ++p)
          for (int j = 0; j < 16; ++j) tile[p * NR + half + j] = rows[j * k + p];
      }
      for (int64_t m0 = 0; m0 < m_rows; m0 += MR) {
        const int rows_now = (int)(m_rows - m0 < MR ? m_rows - m0 : MR);
        micro_rows<MR>(rows_now, xs + m0 * k, k, tile.data(), k, nr, y + m0 * ldy, ldy, n0, w.bias);
      }
    }
  }
}

// ---------------------------------------------------------------- int8 activations (the :a8 formats, 4-bit weights)

// A buffer of T on whole cache lines (64-byte aligned: the products load 64 bytes of x at a time, and loads split
// over two lines measured 8 % slower at AVX-512), kept for the next call.
template <typename T>
class Lines {
 public:
  Lines() = default;
  Lines(const Lines&) = delete;
  Lines& operator=(const Lines&) = delete;
  ~Lines() { ::operator delete(data_, std::align_val_t(64)); }
  void resize(int64_t n) {
    if (n <= size_) return;
    ::operator delete(data_, std::align_val_t(64));
    data_ = static_cast<T*>(::operator new(sizeof(T) * n, std::align_val_t(64)));
    size_ = n;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

// x rounded for the products, per step of 128 columns as its weights unpack (the step's 64 even columns, then its 64
// odd ones), with what a step's lanes need beside the products.
struct LaneD {
  v::F v;  // each lane's block scale d (0 past k)
};
struct Minus8 {
  v::I v;  // -8 x the sum of the q each lane multiplies (symmetric weights' offset, exact)
};
struct QuantizedX {
  Lines<int8_t> q;        // [steps * 128]; zeros past k
  Lines<LaneD> lane_d;    // [steps]
  Lines<Minus8> minus8;   // [steps]
  Lines<float> gsum;      // [groups padded to 16]: sum over each weight group of d_b * (block's sum of q)
  LaneD gsum_last;        // the last 16 groups' gsum, those of whole sixteens before them zeroed (groups >= 16)
};

// A block of 32 values' scale d = max|x| / 127 (the same float on every level).
inline float block_d(const float* xb) {
  const v::F x0 = v::load(xb), x1 = v::load(xb + 16);
  return v::reduce_max(v::max(v::max(x0, v::sub(v::zero(), x0)), v::max(x1, v::sub(v::zero(), x1)))) / 127.0f;
}

// Row x rounded (the same integers on every level: max of magnitudes, d = amax / 127, 1 / d, x * (1 / d) rounded
// half to even, all in float32; q = 0 where d == 0), laid out for the products.
void quantize_x(const float* x, int64_t k, int64_t group, QuantizedX& out) {
  const int64_t blocks = k / 32, steps = (k + kStepColumns - 1) / kStepColumns, groups = k / group;
  out.q.resize(steps * kStepColumns);
  out.lane_d.resize(steps);
  out.minus8.resize(steps);
  out.gsum.resize((groups + 15) / 16 * 16);
  float* gsum = out.gsum.data();
  for (int64_t g = 0; g < (groups + 15) / 16 * 16; ++g) gsum[g] = 0.0f;
  uint8_t eights[64];
  std::memset(eights, 0x88, sizeof eights);
  const StepWeights minus = unpack_step(eights);  // 8 everywhere: with -q, -8 x each lane's sum
  for (int64_t st = 0; st < steps; ++st) {
    int8_t* q = out.q.data() + st * kStepColumns;
    float d[kStepBlocks];
    for (int t = 0; t < kStepBlocks; ++t) {
      const int64_t b = st * kStepBlocks + t;
      d[t] = 0.0f;
      if (b < blocks) {
        const float* xb = x + b * 32;
        d[t] = block_d(xb);
        round_block(xb, d[t] != 0.0f ? 1.0f / d[t] : 0.0f, q + 16 * t, q + 64 + 16 * t);
        int32_t sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[16 * t + i] + q[64 + 16 * t + i];
        gsum[b * 32 / group] += d[t] * (float)sum;
      } else {  // past k: zeros
        std::memset(q + 16 * t, 0, 16);
        std::memset(q + 64 + 16 * t, 0, 16);
      }
    }
    out.lane_d.data()[st].v = spread(d);
    int8_t negated[kStepColumns];
    for (int i = 0; i < kStepColumns; ++i) negated[i] = (int8_t)-q[i];
    out.minus8.data()[st].v = step_dot(v::izero(), minus, negated);
  }
  if (groups >= 16) {
    float last[16];
    for (int l = 0; l < 16; ++l) last[l] = groups - 16 + l >= groups / 16 * 16 ? gsum[groups - 16 + l] : 0.0f;
    out.gsum_last.v = v::load(last);
  }
}

// The lane scales of step st of a row whose scales are s, for groups of 32 (G 32: a scale per block), of 64 (G 64: a
// scale per two blocks), or of any other multiple of 32 (G 0: each block's group found by division; no format has
// such groups). Groups of a multiple of 128 (G 1) take one scale for whole steps, set by the caller.
template <int G, typename S>
inline v::F lane_scales(const S* s, int64_t st, int64_t group) {
  if (G == 32) return block_scales(s + st * kStepBlocks);
  float b[kStepBlocks];
  for (int t = 0; t < kStepBlocks; ++t) b[t] = scale(s + (G == 64 ? st * 2 + t / 2 : (st * kStepBlocks + t) * 32 / group));
  return spread(b);
}

// acc + step st's products of unpacked weights wv (lane scales sl) and x: sum(q_w * q_x) * s * d, per lane.
template <bool MIN>
inline v::F step_product(const StepWeights& wv, v::F sl, const int8_t* xq, const LaneD* lane_d, const Minus8* minus8,
                         int64_t st, v::F acc) {
  const v::I dot = step_dot(MIN ? v::izero() : minus8[st].v, wv, xq + st * kStepColumns);
  return v::fma(v::to_float(dot), v::mul(sl, lane_d[st].v), acc);
}

// Sixteen values of a plane, and the first n < 16 (zeros after them).
inline v::F sixteen(const float* s) { return v::load(s); }
inline v::F sixteen(const uint16_t* s) { return v::load_half(s); }
inline v::F first_n(const float* s, int64_t n) { return v::load_first(s, n); }
inline v::F first_n(const uint16_t* s, int64_t n) { return first_halves(s, n); }

// Row r's product once its steps are summed in acc: the minimums' share (sum over groups of m_g times the sum
// of the rounded x over the group), the horizontal sum, the bias.
template <bool MIN, typename S>
inline float a8_row_tail(const Weights& w, const S* mins, const QuantizedX& xq, int64_t r, v::F acc) {
  if (MIN) {
    const S* mn = mins + r * w.groups;
    const float* gsum = xq.gsum.data();
    int64_t g = 0;
    for (; g + 16 <= w.groups; g += 16) acc = v::fma(sixteen(mn + g), v::load(gsum + g), acc);
    if (g < w.groups) {  // the rest: the row's last sixteen again (the groups counted already weigh 0), or fewer
      acc = w.groups >= 16 ? v::fma(sixteen(mn + w.groups - 16), xq.gsum_last.v, acc)
                           : v::fma(first_n(mn, w.groups), v::load(gsum), acc);
    }
  }
  return v::reduce_add(acc) + (w.bias ? w.bias[r] : 0.0f);
}

// y[j * ldy + r + i] for x rows j < XR (xq[0 .. XR)) and weight rows r + i, i < WR: each step of weights is
// unpacked once for XR rows of x and each step of x loaded once for WR weight rows. Decode (XR == 1) asks for
// the weight rows kAheadRows on. Inlined into a8_block's loop (a call per tile measured 5 % slower at AVX-512).
template <int XR, int WR, int G, bool MIN, typename S>
__attribute__((always_inline)) inline void a8_tile(const Weights& w, const S* scales, const S* mins,
                                                   const QuantizedX* xq, float* y, int64_t ldy, int64_t r) {
  const int64_t kh = w.k / 2, whole = w.k / kStepColumns;
  const uint8_t* q[WR];
  const S* s[WR];
  for (int i = 0; i < WR; ++i) {
    q[i] = w.q4 + (r + i) * kh;
    s[i] = scales + (r + i) * w.groups;
  }
  if (XR == 1 && r + kAheadRows + WR <= w.n) {
    const char* bytes = (const char*)(q[0] + kAheadRows * kh);
    for (int64_t i = 0; i < WR * kh; i += 64) v::prefetch(bytes + i);
    const char* more = (const char*)(s[0] + kAheadRows * w.groups);
    for (int64_t i = 0; i < WR * w.groups * (int64_t)sizeof(S); i += 64) v::prefetch(more + i);
  }
  const int8_t* xqq[XR];
  const LaneD* xd[XR];
  const Minus8* x8[XR];
  for (int j = 0; j < XR; ++j) {
    xqq[j] = xq[j].q.data();
    xd[j] = xq[j].lane_d.data();
    x8[j] = xq[j].minus8.data();
  }
  v::F acc[XR][WR];
  for (int j = 0; j < XR; ++j)
    for (int i = 0; i < WR; ++i) acc[j][i] = v::zero();
  const int64_t span = G == 1 ? w.group / kStepColumns : 1;  // steps of one set of lane scales (whole: a multiple)
  for (int64_t st0 = 0, g = 0; st0 < whole; st0 += span, ++g) {
    v::F sl[WR];
    for (int i = 0; i < WR; ++i) sl[i] = G == 1 ? v::set1(scale(s[i] + g)) : lane_scales<G>(s[i], st0, w.group);
    for (int64_t st = st0; st < st0 + span; ++st) {
      for (int i = 0; i < WR; ++i) {
        const StepWeights wv = unpack_step(q[i] + st * 64);
        for (int j = 0; j < XR; ++j) acc[j][i] = step_product<MIN>(wv, sl[i], xqq[j], xd[j], x8[j], st, acc[j][i]);
      }
    }
  }
  if (whole * kStepColumns < w.k) {  // a last step of fewer blocks: their weights and scales, zeros past them
    const int64_t st = whole, blocks = w.k / 32, left = kh - st * 64;  // the row's packed bytes from the step on
    for (int i = 0; i < WR; ++i) {
      // the 64 bytes from the step on, or a copy of the row's last ones where they would pass the plane's end: the
      // bytes past the row (the next row's) multiply x's zeros there
      const uint8_t* from = q[i] + st * 64;
      uint8_t copy[64] = {};
      if ((r + i) * kh + st * 64 + 64 > w.n * kh) {
        std::memcpy(copy, from, left);
        from = copy;
      }
      const StepWeights wv = unpack_step(from);
      float b[kStepBlocks];
      for (int t = 0; t < kStepBlocks; ++t) {
        const int64_t block = st * kStepBlocks + t;
        b[t] = block < blocks ? scale(s[i] + (G == 32 ? block : G == 64 ? block / 2 : block * 32 / w.group)) : 0.0f;
      }
      const v::F sl = spread(b);
      for (int j = 0; j < XR; ++j) acc[j][i] = step_product<MIN>(wv, sl, xqq[j], xd[j], x8[j], st, acc[j][i]);
    }
  }
  for (int j = 0; j < XR; ++j)
    for (int i = 0; i < WR; ++i) y[j * ldy + r + i] = a8_row_tail<MIN>(w, mins, xq[j], r + i, acc[j][i]);
}

// Rows [r0, r1) of the products of XR rows of x: WR weight rows a step, the rest one at a time.
template <int XR, int WR, int G, bool MIN, typename S>
void a8_block(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, float* y, int64_t ldy,
              int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + WR <= r1; r += WR) a8_tile<XR, WR, G, MIN>(w, scales, mins, xq, y, ldy, r);
  for (; r < r1; ++r) a8_tile<XR, 1, G, MIN>(w, scales, mins, xq, y, ldy, r);
}

// Rows [r0, r1) of the products of m_rows rows of x (outputs y, row stride ldy): MB rows of x a pass over the
// rows' weights, which stay in the cache between passes (prefill reads each weight from memory once, as decode does).
template <int G, bool MIN, typename S>
void a8_rows_of(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, int64_t m_rows, float* y,
                int64_t ldy, int64_t r0, int64_t r1) {
  if constexpr (G == 0) {  // groups of no format: correct, not fast
    for (int64_t m = 0; m < m_rows; ++m) a8_block<1, 1, 0, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1);
  } else {
    int64_t m = 0;
    for (; m + MB <= m_rows; m += MB) a8_block<MB, kA8Rows, G, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1);
    for (; m < m_rows; ++m) a8_block<1, kA8Rows, G, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1);
  }
}

template <int G, typename S>
void a8_rows_with(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, int64_t m_rows, float* y,
                  int64_t ldy, int64_t r0, int64_t r1) {
  if (mins) a8_rows_of<G, true>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  else a8_rows_of<G, false>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
}

template <typename S>
void a8_rows(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, int64_t m_rows, float* y,
             int64_t ldy, int64_t r0, int64_t r1) {
  if (w.group % kStepColumns == 0) a8_rows_with<1>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  else if (w.group == 32) a8_rows_with<32>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  else if (w.group == 64) a8_rows_with<64>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  else a8_rows_with<0>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
}

// Every part's output rows as tasks of `chunk` (16 unless said) for one OpenMP loop over all parts: task c is rows
// [r0, r1) of one part.
class PartChunks {
 public:
  PartChunks(const A8Part* parts, int64_t count, int64_t chunk = 16) : parts_(parts), chunk_(chunk), first_(count + 1, 0) {
    for (int64_t p = 0; p < count; ++p) first_[p + 1] = first_[p] + (parts[p].w.n + chunk - 1) / chunk;
  }
  int64_t count() const { return first_.back(); }
  const A8Part& at(int64_t c, int64_t* r0, int64_t* r1) const {
    int64_t p = 0;
    while (c >= first_[p + 1]) ++p;
    const int64_t n = parts_[p].w.n;
    *r0 = (c - first_[p]) * chunk_;
    *r1 = *r0 + chunk_ < n ? *r0 + chunk_ : n;
    return parts_[p];
  }

 private:
  const A8Part* parts_;
  int64_t chunk_;
  std::vector<int64_t> first_;  // parts_[p] owns the tasks [first_[p], first_[p + 1])
};

// Rows of x times every part's weight (all of the same k and group; part p's outputs at parts[p].y, row m at
// parts[p].y + m * ldy), in one OpenMP region: the products that share an input (a layer's query / key / value,
// its gate / up) cost one start of the team and one rounding of x, not one each. A chunk of 16 weight rows is
// multiplied by every row of x while it is in the cache.
void a8_products(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy) {
  const PartChunks chunks(parts, count);
  const int64_t k = parts[0].w.k, group = parts[0].w.group;
  std::vector<QuantizedX> rounded(m_rows > 1 ? m_rows : 0);
#pragma omp parallel
  {
    // one row (decode): every thread rounds it itself (a few hundred values, cheaper than a serial step and a
    // barrier), into buffers kept for its next call (a decode step makes hundreds); more rows: shared out
    static thread_local QuantizedX mine;
    const QuantizedX* xq = &mine;  // one thread-local lookup per call, not per row
    if (m_rows == 1) {
      quantize_x(x, k, group, mine);
    } else {
#pragma omp for schedule(static)
      for (int64_t m = 0; m < m_rows; ++m) quantize_x(x + m * k, k, group, rounded[m]);
      xq = rounded.data();
    }
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks.count(); ++c) {
      int64_t r0 = 0, r1 = 0;
      const A8Part& part = chunks.at(c, &r0, &r1);
      if (part.s16) a8_rows(part.w, part.s16, part.m16, xq, m_rows, part.y, ldy, r0, r1);
      else a8_rows(part.w, part.w.scales, part.w.mins, xq, m_rows, part.y, ldy, r0, r1);
    }
  }
}

// ---------------------------------------------------------------- int8 activations times int8 weights (int8[:gG]:a8)

// Row x rounded for int8 weights: its columns in their own order, zeros up to a whole step of 64 (two blocks of 32),
// and per step the lanes' block scales (lanes 0-7: the step's first block's d, lanes 8-15: its second's; 0 past k),
// the lanes vec::dot4_signed sums each block's products into.
struct RoundedX8 {
  Lines<int8_t> q;  // [steps * 64]
  Lines<LaneD> d;   // [steps]
};

void round_x8(const float* x, int64_t k, RoundedX8& out) {
  const int64_t blocks = k / 32, steps = (blocks + 1) / 2;
  out.q.resize(steps * 64);
  out.d.resize(steps);
  for (int64_t st = 0; st < steps; ++st) {
    float d[kStepBlocks];  // spread(): lanes 4t .. 4t + 3 take d[t]
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * st + h;
      int8_t* q = out.q.data() + b * 32;
      float db = 0.0f;
      if (b < blocks) {
        db = block_d(x + b * 32);
        int8_t even[16], odd[16];
        round_block(x + b * 32, db != 0.0f ? 1.0f / db : 0.0f, even, odd);
        for (int i = 0; i < 16; ++i) {
          q[2 * i] = even[i];
          q[2 * i + 1] = odd[i];
        }
      } else {
        std::memset(q, 0, 32);
      }
      d[2 * h] = d[2 * h + 1] = db;
    }
    out.d.data()[st].v = spread(d);
  }
}

// Row x as the values q8_products' integers stand for, in float: per block of 32, round-half-even(x * (1 / d)) * d
// (the floats q * d of round_x8 exactly: the same product, rounded the same way), what the float tiles multiply where
// the level runs no integer tiles (vec::kIntegerTiles).
void rounded_row(const float* x, int64_t k, float* out) {
  for (int64_t b = 0; b < k; b += 32) {  // k: a whole number of blocks
    const float d = block_d(x + b);
    const v::F vd = v::set1(d), vid = v::set1(d != 0.0f ? 1.0f / d : 0.0f);
    for (int64_t h = 0; h < 32; h += 16) v::store(out + b + h, v::mul(v::round_even(v::mul(v::load(x + b + h), vid)), vd));
  }
}

// Weight row r times M rounded rows of x: per step of 64 columns the weight bytes made ready once (vec::S), then
// per row of x one integer dot product, one conversion and one multiply-add by the lanes' scales (d times the
// weight's scale); row m's result to y[m * ldy]. G 0: one scale per row (applied once, at the end); G 32: a scale per
// block; G 1: groups of a multiple of 64, one scale per step. Each row's arithmetic is the same whatever M is.
template <int G, int M>
inline void q8_row(const Weights& w, const RoundedX8* xq, int64_t r, bool ahead, float* y, int64_t ldy) {
  const int64_t k = w.k, whole = k / 64;
  const int8_t* q = w.q8 + r * k;
  const float* s = w.scales + r * w.groups;
  if (ahead) {  // decode: the rows kAheadRows on asked for while this one multiplies
    for (int64_t i = 0; i < k; i += 64) v::prefetch(q + kAheadRows * k + i);
  }
  v::F acc[M];
  for (int m = 0; m < M; ++m) acc[m] = v::zero();
  // sl: the weight's scale in every lane (unused for G 0)
  auto step = [&](const int8_t* wq, int64_t st, v::F sl) {
    const v::S ws = v::signed_bytes(wq);
    for (int m = 0; m < M; ++m) {
      const v::F d = G == 0 ? xq[m].d.data()[st].v : v::mul(xq[m].d.data()[st].v, sl);
      acc[m] = v::fma(v::to_float(v::dot4_signed(v::izero(), ws, xq[m].q.data() + st * 64)), d, acc[m]);
    }
  };
  // lanes 0-7 a, lanes 8-15 b
  auto pair = [](float a, float b) {
    const float four[kStepBlocks] = {a, a, b, b};
    return spread(four);
  };
  if (G == 1) {  // one scale for group / 64 steps
    const int64_t per = w.group / 64;
    for (int64_t st0 = 0, g = 0; st0 < whole; st0 += per, ++g) {
      const v::F sg = v::set1(s[g]);
      for (int64_t st = st0; st < st0 + per; ++st) step(q + st * 64, st, sg);
    }
  } else {
    for (int64_t st = 0; st < whole; ++st) step(q + st * 64, st, G == 32 ? pair(s[2 * st], s[2 * st + 1]) : v::zero());
  }
  if (whole * 64 < k) {  // a last block of 32 (k an odd number of blocks: G is 0 or 32): its bytes in a zeroed step
    int8_t last[64] = {};
    std::memcpy(last, q + whole * 64, 32);
    step(last, whole, G == 32 ? pair(s[2 * whole], 0.0f) : v::zero());
  }
  const float bias = w.bias ? w.bias[r] : 0.0f;
  for (int m = 0; m < M; ++m) {
    const float total = v::reduce_add(acc[m]);
    y[m * ldy] = (G == 0 ? total * s[0] : total) + bias;
  }
}

// Weight rows [r0, r1) times M rows of x: each weight row read once for all of them.
template <int G, int M>
void q8_rows_of(const A8Part& part, const RoundedX8* xq, int64_t ldy, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) q8_row<G, M>(part.w, xq, r, r + kAheadRows < part.w.n, part.y + r, ldy);
}

template <int G>
void q8_rows(const A8Part& part, const RoundedX8* xq, int64_t m_rows, int64_t ldy, int64_t r0, int64_t r1) {
  static_assert(kFewRows == 4, "q8_rows names each count of rows up to kFewRows");
  switch (m_rows) {
    case 1: q8_rows_of<G, 1>(part, xq, ldy, r0, r1); break;
    case 2: q8_rows_of<G, 2>(part, xq, ldy, r0, r1); break;
    case 3: q8_rows_of<G, 3>(part, xq, ldy, r0, r1); break;
    default: q8_rows_of<G, 4>(part, xq, ldy, r0, r1); break;
  }
}

// ---------------------------------------------------------------- int8:a8 prefill: integer tiles

// Prefill tiles: WT sets of 16 weight rows, one row per int32 lane (vec::dot4_lanes), times XR rows of x a pass.
// Registers: XR * WT integer sums of the block, XR * WT float totals, WT steps of weights (one or two registers of
// bytes each: |w| and w where the level moves w's sign onto x) and their scales (AVX-512 4 x 2: 8 + 8 + 4 of 32 F;
// 8 F: 2 x 1, about 16 ymm at AVX2).
constexpr int kTileRows = kRegisters >= 32 ? 2 : 1;  // WT
constexpr int kTileX = kRegisters >= 32 ? 4 : 2;     // XR

// Row x rounded for the tiles: its int8 values in column order, per block of 32 its d and kLaneOffset times the
// block's sum of values (what the stored weights' offset adds to each lane's sum: subtracted once per block).
struct TileX {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> offset;
};

void round_tile_x(const float* x, int64_t k, TileX& out) {
  const int64_t blocks = k / 32;  // k: a whole number of blocks
  out.q.resize(k);
  out.d.resize(blocks);
  out.offset.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = block_d(x + b * 32);
    int8_t even[16], odd[16];
    round_block(x + b * 32, d != 0.0f ? 1.0f / d : 0.0f, even, odd);
    int32_t sum = 0;
    for (int i = 0; i < 16; ++i) {
      out.q[b * 32 + 2 * i] = even[i];
      out.q[b * 32 + 2 * i + 1] = odd[i];
      sum += even[i] + odd[i];
    }
    out.d[b] = d;
    out.offset[b] = v::kLaneOffset * sum;
  }
}

// Weight rows [n0, n0 + 16 * kTileRows) laid out for dot4_lanes: bytes [k / 4][kTileRows][16 rows][4 columns] (k
// rounded up to 64: 0 weights past it), each w + kLaneOffset (rows past n: 0 weights, 0 scales), and per block of 32 each
// row's scale, [blocks][kTileRows][16]. Four columns of a row are one 32-bit word, so the layout is a transpose of
// 16 x 16 words (vec::transpose16: its float lanes only move bits), 64 columns of 16 rows at a time.
void pack_tile(const Weights& w, int64_t n0, float* words, float* scales) {
  const int64_t k = w.k, blocks = k / 32;
  alignas(64) float block[256];
  unsigned char* bytes = reinterpret_cast<unsigned char*>(block);
  for (int t = 0; t < kTileRows; ++t) {
    for (int64_t c = 0; c < k; c += 64) {
      const int64_t count = k - c < 64 ? k - c : 64;
      for (int l = 0; l < 16; ++l) {
        const int64_t r = n0 + 16 * t + l;
        if (r < w.n && count == 64) {
          std::memcpy(bytes + 64 * l, w.q8 + r * k + c, 64);  // a constant size: one load and store, not a call
        } else {
          const int64_t real = r < w.n ? count : 0;
          std::memcpy(bytes + 64 * l, w.q8 + (r < w.n ? r : 0) * k + c, real);
          std::memset(bytes + 64 * l + real, 0, 64 - real);
        }
      }
      if (v::kLaneOffset == 128) {
        for (int i = 0; i < 1024; ++i) bytes[i] ^= 0x80;  // w + 128, modulo 256
      }
      v::transpose16(block, 16, words + (c / 4 * kTileRows + t) * 16, kTileRows * 16);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t g = w.group ? b * 32 / w.group : 0;  // the block's group: one division a block, not a scale
      float* to = scales + (b * kTileRows + t) * 16;
      for (int l = 0; l < 16; ++l) to[l] = n0 + 16 * t + l < w.n ? w.scales[(n0 + 16 * t + l) * w.groups + g] : 0.0f;
    }
  }
}

// y[j * ldy + n0 + 16 t + l] (+ bias) for XR rows of x: per block of 32 columns, each lane's integer sum over it
// (8 dot4_lanes), less x's offset term, converted once and multiplied by the row's scale times x's d.
template <int XR>
void q8_tile(const Weights& w, const uint8_t* bytes, const float* scales, const TileX* const* xs, int64_t n0, float* y,
             int64_t ldy) {
  const int64_t blocks = w.k / 32;
  v::F total[XR][kTileRows];
  for (int j = 0; j < XR; ++j)
    for (int t = 0; t < kTileRows; ++t) total[j][t] = v::zero();
  for (int64_t b = 0; b < blocks; ++b) {
    v::I sum[XR][kTileRows];
    for (int j = 0; j < XR; ++j)
      for (int t = 0; t < kTileRows; ++t) sum[j][t] = v::izero();
    // unrolled: a loop kept the sums moving between registers every column (GCC 12, measured)
#pragma GCC unroll 8
    for (int64_t p = 8 * b; p < 8 * b + 8; ++p) {
      v::L wv[kTileRows];
      for (int t = 0; t < kTileRows; ++t) wv[t] = v::lane_bytes(bytes + (p * kTileRows + t) * 64);
      for (int j = 0; j < XR; ++j)
        for (int t = 0; t < kTileRows; ++t) sum[j][t] = v::dot4_lanes(sum[j][t], wv[t], xs[j]->q.data() + 4 * p);
    }
    v::F sv[kTileRows];
    for (int t = 0; t < kTileRows; ++t) sv[t] = v::load(scales + (b * kTileRows + t) * 16);
    for (int j = 0; j < XR; ++j) {
      const v::F d = v::set1(xs[j]->d[b]);
      const int32_t offset = xs[j]->offset[b];
      for (int t = 0; t < kTileRows; ++t)
        total[j][t] = v::fma(v::to_float(v::sub(sum[j][t], offset)), v::mul(sv[t], d), total[j][t]);
    }
  }
  for (int t = 0; t < kTileRows; ++t) {
    const int64_t first = n0 + 16 * t, count = w.n - first;
    if (count <= 0) break;
    const v::F bias = w.bias ? v::load_first(w.bias + first, count) : v::zero();
    for (int j = 0; j < XR; ++j) v::store_first(y + j * ldy + first, v::add(total[j][t], bias), count);
  }
}

// q8_tile<rows> for any rows in 1 .. XR
template <int XR>
void q8_tile_rows(int rows, const Weights& w, const uint8_t* bytes, const float* scales, const TileX* const* xs,
                  int64_t n0, float* y, int64_t ldy) {
  if constexpr (XR > 1) {
    if (rows < XR) return q8_tile_rows<XR - 1>(rows, w, bytes, scales, xs, n0, y, ldy);
  }
  q8_tile<XR>(w, bytes, scales, xs, n0, y, ldy);
}

// Rows of x (more than kFewRows) times every part's int8 weights (all of one k), in one OpenMP region: the rows
// rounded (shared out), then every part's tiles as one loop, each thread packing a tile of weight rows at a time
// and running every row of x through it, so every weight is read from memory and packed once per call and a
// layer's query / key / value cost one start of the team and one wait at its end, not one each.
void q8_prefill(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy) {
  const int64_t k = parts[0].w.k, rows = 16 * kTileRows;
  const PartChunks tiles(parts, count, rows);
  std::vector<TileX> rounded(m_rows);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < m_rows; ++m) round_tile_x(x + m * k, k, rounded[m]);
    std::vector<float> words((k + 63) / 64 * 16 * rows);  // the packed bytes, four to a word
    std::vector<float> scales(k / 32 * rows);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(words.data());
    const TileX* pass[kTileX];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < tiles.count(); ++c) {
      int64_t n0 = 0, end = 0;
      const A8Part& part = tiles.at(c, &n0, &end);
      const Weights& w = part.w;
      float* y = part.y;
      pack_tile(w, n0, words.data(), scales.data());
      int64_t m = 0;
      for (; m + kTileX <= m_rows; m += kTileX) {
        for (int j = 0; j < kTileX; ++j) pass[j] = rounded.data() + m + j;
        q8_tile<kTileX>(w, bytes, scales.data(), pass, n0, y + m * ldy, ldy);
      }
      if (m < m_rows) {  // the rows left: one more pass
        for (int j = 0; j < m_rows - m; ++j) pass[j] = rounded.data() + m + j;
        q8_tile_rows<kTileX - 1>((int)(m_rows - m), w, bytes, scales.data(), pass, n0, y + m * ldy, ldy);
      }
    }
  }
}

// Every part's product (int8 weights) with x rounded to int8 per block of 32. A few rows (decode) multiply integers
// in one OpenMP region over every part's rows (PartChunks; each thread rounds x itself: a few hundred values); more
// rows (prefill) run the integer tiles (q8_prefill), each weight packed once per call, or the float tiles on the
// rounded values where the level's integer products are the slower (vec::kIntegerTiles).
void q8_products(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy) {
  const int64_t k = parts[0].w.k;
  if (m_rows > kFewRows && v::kIntegerTiles) {
    q8_prefill(parts, count, x, m_rows, ldy);
    return;
  }
  if (m_rows > kFewRows) {  // the float tiles on the rounded values q * d (the same math: a block's products are exact)
    std::vector<float> values(m_rows * k);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < m_rows; ++m) rounded_row(x + m * k, k, values.data() + m * k);
    for (int64_t p = 0; p < count; ++p) gemm(parts[p].w, values.data(), m_rows, parts[p].y, ldy);
    return;
  }
  const PartChunks chunks(parts, count);
#pragma omp parallel
  {
    static thread_local RoundedX8 mine[kFewRows];
    for (int64_t m = 0; m < m_rows; ++m) round_x8(x + m * k, k, mine[m]);
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks.count(); ++c) {
      int64_t r0 = 0, r1 = 0;
      const A8Part& part = chunks.at(c, &r0, &r1);
      if (part.w.group == 0) q8_rows<0>(part, mine, m_rows, ldy, r0, r1);
      else if (part.w.group == 32) q8_rows<32>(part, mine, m_rows, ldy, r0, r1);
      else q8_rows<1>(part, mine, m_rows, ldy, r0, r1);
    }
  }
}
}  // namespace

// y[m, n] = x[m, k] @ dequantized(w)^T (+ bias): the dot-product path for a few rows (decode), tiles above.
void qmm(const Weights* w, const float* x, int64_t m_rows, float* y) {
  if (m_rows <= 0 || w->n <= 0) return;
  if (m_rows <= kFewRows) gemv(*w, x, m_rows, y);
  else gemm(*w, x, m_rows, y, w->n);
}

// Every part's product with x rounded to int8 per block of 32 (the parts' y pointers set by the caller; all parts of
// one bits: 4-bit weights take a8_products, int8 ones q8_products).
void qmm_a8(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy) {
  if (count <= 0 || m_rows <= 0) return;
  if (parts[0].w.bits == 8) q8_products(parts, count, x, m_rows, ldy);
  else a8_products(parts, count, x, m_rows, ldy);
}

}  // namespace etsdk_kernels
