// etsdk-aoti: matrix multiplication by quantized weights, for AOTInductor-compiled libraries.
//
// A compiled library calls aoti_torch_cpu_etsdk_qmm (AOTInductor's C-shim calling
// convention for the custom operator etsdk_aoti::etsdk_qmm) as it calls ATen's
// own shims. y[M, N] = x[M, K] @ w[N, K]^T (+ bias), where w is stored in one of
// etsdk's planes formats (etsdk._format.weight_format):
//
//   bits 8, group 0 : qdata int8 [N, K], scales float32 [N]           w = q * s
//   bits 8, group G : qdata int8 [N, K], scales float32 [N, K/G]      w = q * s
//   bits 4, group G : qdata uint8 [N, K/2] (value 2i in the low nibble of byte i,
//                     2i+1 in the high one), scales float32 [N, K/G],
//                     mins float32 [N, K/G] or none:  w = q * s + m,  or (q - 8) * s
//
// aoti_torch_cpu_etsdk_qmm_a8 (etsdk_aoti::etsdk_qmm_a8) is the same product for the ``:a8`` formats: 4-bit
// weights, x rounded to int8 per block of 32 (d = max|x| / 127, q = round-half-even(x / d)). Every row (decode
// and prefill) multiplies the integers with AVX-512 VNNI (64 products per instruction, each block's sum exact in int32),
// then applies d times the weight's scale once per block: no 4-bit value is widened to float.
//
// Every packed byte is read once per call. Small M (decode) takes a dot-product
// path straight from the packed bytes; larger M (prefill) dequantizes four weight
// rows at a time into a small float tile and runs a 6 x 4 register-blocked
// micro-kernel over all rows of x, so each weight is decoded once per call
// whatever M is. Work is split over output rows with OpenMP (torch's own
// runtime, so the team size torch is given applies here too).
//
// Shapes and dtypes are checked by the caller (the etsdk-aoti serializer builds
// the graph, the runtime checks every bound constant); this code checks them
// again and fails the call rather than read out of bounds.

#include "aoti_shim.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>

namespace {

struct Weights {
  int bits;
  int64_t n, k, group, groups;  // group 0: one scale per row (groups == 1)
  const int8_t* q8;
  const uint8_t* q4;
  const float* scales;
  const float* mins;
  const float* bias;
};

// ---------------------------------------------------------------- dequantize one row (prefill tiles)

// Row r of w as floats. For 4-bit weights the row comes out permuted: the even
// columns first, then the odd ones (x is permuted the same way), so no
// interleaving is needed.
void dequantize_row(const Weights& w, int64_t r, float* out) {
  const int64_t k = w.k;
  if (w.bits == 8) {
    const int8_t* q = w.q8 + r * k;
    const int64_t group = w.group ? w.group : k;
    for (int64_t g0 = 0, gi = 0; g0 < k; g0 += group, ++gi) {
      const float s = w.scales[r * w.groups + gi];
      int64_t i = g0;
      const int64_t end = g0 + group < k ? g0 + group : k;
#if defined(__AVX512F__)
      const __m512 vs = _mm512_set1_ps(s);
      for (; i + 16 <= end; i += 16) {
        __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(v, vs));
      }
#endif
      for (; i < end; ++i) out[i] = q[i] * s;
    }
    return;
  }
  const uint8_t* q = w.q4 + r * (k / 2);
  const int64_t half = w.group / 2;  // bytes per group
  float* even = out;
  float* odd = out + k / 2;
  for (int64_t gi = 0; gi < w.groups; ++gi) {
    const float s = w.scales[r * w.groups + gi];
    const float m = w.mins ? w.mins[r * w.groups + gi] : -8.0f * s;
    const int64_t b0 = gi * half;
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s), vm = _mm512_set1_ps(m);
    const __m512i mask = _mm512_set1_epi32(0x0F);
    for (; i + 16 <= half; i += 16) {
      __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + b0 + i)));
      __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, mask));
      __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
      _mm512_storeu_ps(even + b0 + i, _mm512_fmadd_ps(lo, vs, vm));
      _mm512_storeu_ps(odd + b0 + i, _mm512_fmadd_ps(hi, vs, vm));
    }
#endif
    for (; i < half; ++i) {
      const uint8_t byte = q[b0 + i];
      even[b0 + i] = (byte & 0x0F) * s + m;
      odd[b0 + i] = (byte >> 4) * s + m;
    }
  }
}

// ---------------------------------------------------------------- decode: dot products from the packed bytes

// y[m][r] for rows r in [r0, r1) and every m < M (M <= 4), x rows of length k
// (for 4 bits: xe / xo, the even and odd columns, and xs, the sums of x per group).
template <int M>
void gemv_rows(const Weights& w, const float* x, const float* xe, const float* xo, const float* xs, float* y,
               int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = w.k;
  for (int64_t r = r0; r < r1; ++r) {
    float total[M];
    for (int m = 0; m < M; ++m) total[m] = 0.0f;
    if (w.bits == 8) {
      const int8_t* q = w.q8 + r * k;
      const int64_t group = w.group ? w.group : k;
#if defined(__AVX512F__)
      __m512 sum[M];
      for (int m = 0; m < M; ++m) sum[m] = _mm512_setzero_ps();
#endif
      for (int64_t g0 = 0, gi = 0; g0 < k; g0 += group, ++gi) {
        const int64_t end = g0 + group < k ? g0 + group : k;
        const float s = w.scales[r * w.groups + gi];
        int64_t i = g0;
#if defined(__AVX512F__)
        __m512 acc[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
        if (w.group == 0) {
          // one scale per row: the whole row is one group, so split its sum over two chains (a multiply-add then
          // waits on every other one, not on the one before it: measured 11 % faster). Groups of 32-64 values are
          // short chains already, and their extra addition measured slower there.
          __m512 acc1[M];
          for (int m = 0; m < M; ++m) acc1[m] = _mm512_setzero_ps();
          for (; i + 32 <= end; i += 32) {
            const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i))));
            const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i + 16))));
            for (int m = 0; m < M; ++m) {
              acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i), v0, acc[m]);
              acc1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i + 16), v1, acc1[m]);
            }
          }
          for (int m = 0; m < M; ++m) acc[m] = _mm512_add_ps(acc[m], acc1[m]);
        }
        for (; i + 16 <= end; i += 16) {
          __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i))));
          for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i), v, acc[m]);
        }
        if (i < end) {  // only one scale per row has a tail (groups are multiples of 32)
          const __mmask16 tail = (__mmask16)((1u << (end - i)) - 1u);
          __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail, q + i)));
          for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + m * k + i), v, acc[m]);
        }
        const __m512 vs = _mm512_set1_ps(s);
        for (int m = 0; m < M; ++m) sum[m] = _mm512_fmadd_ps(vs, acc[m], sum[m]);
#else
        for (int m = 0; m < M; ++m) {
          float dot = 0.0f;
          for (int64_t j = g0; j < end; ++j) dot += x[m * k + j] * q[j];
          total[m] += s * dot;
        }
#endif
      }
#if defined(__AVX512F__)
      for (int m = 0; m < M; ++m) total[m] += _mm512_reduce_add_ps(sum[m]);
#endif
    } else {
      const uint8_t* q = w.q4 + r * (k / 2);
      const int64_t half = w.group / 2;
      const int64_t kh = k / 2;
#if defined(__AVX512F__)
      __m512 sum[M];
      for (int m = 0; m < M; ++m) sum[m] = _mm512_setzero_ps();
      const __m512i mask = _mm512_set1_epi32(0x0F);
#endif
      for (int64_t gi = 0; gi < w.groups; ++gi) {
        const float s = w.scales[r * w.groups + gi];
        const float c = w.mins ? w.mins[r * w.groups + gi] : -8.0f * s;  // w = q * s + c
        const int64_t b0 = gi * half;
#if defined(__AVX512F__)
        __m512 acc[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
        for (int64_t i = 0; i < half; i += 16) {  // half is a multiple of 16 (group >= 32)
          __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + b0 + i)));
          __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, mask));
          __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
          for (int m = 0; m < M; ++m) {
            acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xe + m * kh + b0 + i), lo, acc[m]);
            acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xo + m * kh + b0 + i), hi, acc[m]);
          }
        }
        const __m512 vs = _mm512_set1_ps(s);
        for (int m = 0; m < M; ++m) {
          sum[m] = _mm512_fmadd_ps(vs, acc[m], sum[m]);
          total[m] += c * xs[m * w.groups + gi];
        }
#else
        for (int m = 0; m < M; ++m) {
          float dot = 0.0f;
          for (int64_t i = 0; i < half; ++i) {
            const uint8_t byte = q[b0 + i];
            dot += xe[m * kh + b0 + i] * (byte & 0x0F) + xo[m * kh + b0 + i] * (byte >> 4);
          }
          total[m] += s * dot + c * xs[m * w.groups + gi];
        }
#endif
      }
#if defined(__AVX512F__)
      for (int m = 0; m < M; ++m) total[m] += _mm512_reduce_add_ps(sum[m]);
#endif
    }
    const float b = w.bias ? w.bias[r] : 0.0f;
    for (int m = 0; m < M; ++m) y[m * ldy + r] = total[m] + b;
  }
}

// ---------------------------------------------------------------- prefill: float tiles and a register-blocked kernel

constexpr int NR = 32;  // weight rows per tile (two vectors of outputs)
constexpr int MR = 8;   // x rows per micro-kernel call

// y[m0 + i][n0 + j] (+ bias) for i < R, j < nr: tile is [k][NR] (tile[p * NR + j] = w[n0 + j][p]), so each
// step of p broadcasts one x value per row against two vectors of 16 outputs: no horizontal sums.
template <int R>
void micro(const float* x, int64_t ldx, const float* tile, int64_t k, int nr, float* y, int64_t ldy, int64_t n0,
           const float* bias) {
#if defined(__AVX512F__)
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 t0 = _mm512_loadu_ps(tile + p * NR);
    const __m512 t1 = _mm512_loadu_ps(tile + p * NR + 16);
    for (int i = 0; i < R; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * ldx + p]);
      acc[i][0] = _mm512_fmadd_ps(xv, t0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, t1, acc[i][1]);
    }
  }
  const __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
  const __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u) : (__mmask16)0;
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias) {
    b0 = _mm512_maskz_loadu_ps(m0, bias + n0);
    b1 = _mm512_maskz_loadu_ps(m1, bias + n0 + 16);
  }
  for (int i = 0; i < R; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy + n0, m0, _mm512_add_ps(acc[i][0], b0));
    _mm512_mask_storeu_ps(y + i * ldy + n0 + 16, m1, _mm512_add_ps(acc[i][1], b1));
  }
#else
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < nr; ++j) {
      float dot = 0.0f;
      for (int64_t p = 0; p < k; ++p) dot += x[i * ldx + p] * tile[p * NR + j];
      y[i * ldy + n0 + j] = dot + (bias ? bias[n0 + j] : 0.0f);
    }
#endif
}

void micro_rows(int rows, const float* x, int64_t ldx, const float* tile, int64_t k, int nr, float* y, int64_t ldy,
                int64_t n0, const float* bias) {
  switch (rows) {
    case 8: micro<8>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 7: micro<7>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 6: micro<6>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 5: micro<5>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 4: micro<4>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 3: micro<3>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    case 2: micro<2>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
    default: micro<1>(x, ldx, tile, k, nr, y, ldy, n0, bias); break;
  }
}

#if defined(__AVX512F__)
// dst[i][j] = src[j][i] for a 16 x 16 block (rows lds / ldd floats apart).
inline void transpose16(const float* src, long lds, float* dst, long ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; ++i) { t[2*i] = _mm512_unpacklo_ps(r[2*i], r[2*i+1]); t[2*i+1] = _mm512_unpackhi_ps(r[2*i], r[2*i+1]); }
  for (int i = 0; i < 4; ++i) {
    r[4*i+0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4*i+0]), _mm512_castps_pd(t[4*i+2])));
    r[4*i+1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4*i+0]), _mm512_castps_pd(t[4*i+2])));
    r[4*i+2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4*i+1]), _mm512_castps_pd(t[4*i+3])));
    r[4*i+3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4*i+1]), _mm512_castps_pd(t[4*i+3])));
  }
  for (int i = 0; i < 4; ++i) {
    t[i]    = _mm512_shuffle_f32x4(r[i],   r[i+4],  0x88);
    t[i+4]  = _mm512_shuffle_f32x4(r[i],   r[i+4],  0xdd);
    t[i+8]  = _mm512_shuffle_f32x4(r[i+8], r[i+12], 0x88);
    t[i+12] = _mm512_shuffle_f32x4(r[i+8], r[i+12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i]   = _mm512_shuffle_f32x4(t[i], t[i+8], 0x88);
    r[i+8] = _mm512_shuffle_f32x4(t[i], t[i+8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
#endif

void gemm(const Weights& w, const float* x, int64_t m_rows, float* y) {
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
#if defined(__AVX512F__)
        for (; p + 16 <= k; p += 16) transpose16(rows.data() + p, k, tile.data() + p * NR + half, NR);
#endif
        for (; p < k; ++p)
          for (int j = 0; j < 16; ++j) tile[p * NR + half + j] = rows[j * k + p];
      }
      for (int64_t m0 = 0; m0 < m_rows; m0 += MR) {
        const int rows = (int)(m_rows - m0 < MR ? m_rows - m0 : MR);
        micro_rows(rows, xs + m0 * k, k, tile.data(), k, nr, y + m0 * w.n, w.n, n0, w.bias);
      }
    }
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
  const float* pe = xe.data();
  const float* po = xo.data();
  const float* ps = xs.data();
  // rows per chunk: enough work per chunk that the team's start-up is amortized, small enough to balance
  const int64_t chunk = 16;
  const int64_t chunks = (w.n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * chunk, r1 = r0 + chunk < w.n ? r0 + chunk : w.n;
    switch (m_rows) {
      case 1: gemv_rows<1>(w, x, pe, po, ps, y, w.n, r0, r1); break;
      case 2: gemv_rows<2>(w, x, pe, po, ps, y, w.n, r0, r1); break;
      case 3: gemv_rows<3>(w, x, pe, po, ps, y, w.n, r0, r1); break;
      default: gemv_rows<4>(w, x, pe, po, ps, y, w.n, r0, r1); break;
    }
  }
}

// ---------------------------------------------------------------- int8 activations (the :a8 formats, 4-bit weights)

// One block of 32 values: its scale d and its integers q (the reference math of etsdk's ``:a8`` formats:
// d = max|x| / 127, q = round-half-even(x * (1 / d)), q = 0 when d == 0).
inline float quantize_block(const float* xb, int* q) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) q[i] = (int)std::nearbyint(xb[i] * id);  // the default rounding: half to even
  return d;
}

// Rows of x replaced by q * d (what the layer computes with): the products of more than one row run on the
// float paths with these values.
void fake_quantize_rows(const float* x, int64_t rows, int64_t k, float* out) {
  int q[32];
  for (int64_t b = 0; b < rows * (k / 32); ++b) {
    const float d = quantize_block(x + b * 32, q);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = (float)q[i] * d;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
// x rounded for the decode product, per chunk of 64 columns (two blocks) as the weights' bytes unpack: the even
// columns of both blocks, then their odd ones, so that one VNNI product of a chunk's 32 packed bytes (low nibbles,
// then high ones) against it sums 4 values of one block per lane.
struct QuantizedX {
  std::vector<int8_t> q;       // [chunks * 64]
  std::vector<float> lane_d;   // [chunks * 16]: each dpbusd lane's block scale
  std::vector<int32_t> minus8; // [chunks * 16]: -8 x each lane's sum of q (symmetric weights' offset, exact)
  std::vector<float> gsum;     // [groups padded to 16]: sum over each weight group of d_b * (block's sum of q)
};

// The rounding of quantize_block, vectorized (the same float32 steps, so the same integers: max of magnitudes,
// d = amax / 127, 1 / d, x * (1 / d), round half to even), laid out for the products.
void quantize_x(const float* x, int64_t k, int64_t group, QuantizedX& out) {
  const int64_t blocks = k / 32, chunks = (k + 63) / 64, groups = k / group;
  out.q.resize(chunks * 64);
  out.lane_d.resize(chunks * 16);
  out.minus8.resize(chunks * 16);
  out.gsum.assign((groups + 15) / 16 * 16, 0.0f);
  if (blocks % 2) {  // a last chunk of one block: the other block's lanes multiply zeros
    const int64_t c = blocks / 2;
    for (int i = 0; i < 16; ++i) out.q[c * 64 + 16 + i] = out.q[c * 64 + 48 + i] = 0;
    for (int l = 0; l < 4; ++l) {
      out.lane_d[c * 16 + 4 + l] = out.lane_d[c * 16 + 12 + l] = 0.0f;
      out.minus8[c * 16 + 4 + l] = out.minus8[c * 16 + 12 + l] = 0;
    }
  }
  const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m128i ones = _mm_set1_epi8(1);
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
    const __m128i e = _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, evens, q1));
    const __m128i o = _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, odds, q1));
    const int64_t c = b / 2, second = b % 2;
    _mm_storeu_si128((__m128i*)(out.q.data() + c * 64 + second * 16), e);
    _mm_storeu_si128((__m128i*)(out.q.data() + c * 64 + 32 + second * 16), o);
    const __m128i se = _mm_dpbusd_epi32(_mm_setzero_si128(), ones, e), so = _mm_dpbusd_epi32(_mm_setzero_si128(), ones, o);
    _mm_storeu_si128((__m128i*)(out.minus8.data() + c * 16 + second * 4), _mm_mullo_epi32(se, _mm_set1_epi32(-8)));
    _mm_storeu_si128((__m128i*)(out.minus8.data() + c * 16 + 8 + second * 4), _mm_mullo_epi32(so, _mm_set1_epi32(-8)));
    const __m128 vd = _mm_set1_ps(d);
    _mm_storeu_ps(out.lane_d.data() + c * 16 + second * 4, vd);
    _mm_storeu_ps(out.lane_d.data() + c * 16 + 8 + second * 4, vd);
    const __m128i sums = _mm_add_epi32(se, so);
    const int sum = _mm_extract_epi32(sums, 0) + _mm_extract_epi32(sums, 1) + _mm_extract_epi32(sums, 2) + _mm_extract_epi32(sums, 3);
    out.gsum[b * 32 / group] += d * (float)sum;
  }
}

// A weight's scales (and minimums) as stored: float32, or float16 read as they are (``int4:g32:f16:a8`` holds
// exactly the bytes of llama.cpp's Q4_0: a decode step reads 10 % fewer bytes than with float32 scales).
inline __m128 two_scales(const float* s) { return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)s)); }
inline __m128 two_scales(const uint16_t* s) {
  int32_t both;
  std::memcpy(&both, s, sizeof both);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(both));
}
inline float one_scale(const float* s) { return *s; }
inline float one_scale(const uint16_t* s) { return _cvtsh_ss(*s); }
inline __m512 sixteen(const float* s, __mmask16 m) { return _mm512_maskz_loadu_ps(m, s); }
inline __m512 sixteen(const uint16_t* s, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s)); }

// Chunk c's 64 weights of a row, unpacked to bytes: the 32 low nibbles, then the 32 high ones.
inline __m512i chunk_weights(const uint8_t* q, int64_t c, bool whole) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i v = whole ? _mm256_loadu_si256((const __m256i*)(q + c * 32)) : _mm256_maskz_loadu_epi8(0xFFFF, q + c * 32);
  const __m256i lo = _mm256_and_si256(v, low);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Each dpbusd lane's weight scale for chunk c (a last chunk of one block reads that block's scale only).
template <bool G32, typename S>
inline __m512 chunk_scales(const S* s, int64_t c, int64_t group, bool whole) {
  const __m512i pattern = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  if (G32 && whole) return _mm512_permutexvar_ps(pattern, _mm512_castps128_ps512(two_scales(s + 2 * c)));
  return _mm512_set1_ps(one_scale(s + c * 64 / group));
}

// acc + chunk c's products of unpacked weights wv (lane scales sl) and x: sum(q_w * q_x) * s * d, per lane.
template <bool MIN>
inline __m512 chunk_product(__m512i wv, __m512 sl, const QuantizedX& xq, int64_t c, __m512 acc) {
  const __m512i init = MIN ? _mm512_setzero_si512() : _mm512_loadu_si512(xq.minus8.data() + c * 16);
  const __m512i dot = _mm512_dpbusd_epi32(init, wv, _mm512_loadu_si512(xq.q.data() + c * 64));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sl, _mm512_loadu_ps(xq.lane_d.data() + c * 16)), acc);
}

template <bool G32, bool MIN, typename S>
inline __m512 chunk_fma(const uint8_t* q, const S* s, const QuantizedX& xq, int64_t c, int64_t group, bool whole, __m512 acc) {
  return chunk_product<MIN>(chunk_weights(q, c, whole), chunk_scales<G32>(s, c, group, whole), xq, c, acc);
}

template <bool MIN, typename S>
inline float a8_row_tail(const Weights& w, const S* mins, const QuantizedX& xq, int64_t r, __m512 acc) {
  if (MIN) {  // the minimums' share: sum over groups of m_g * (sum of the dequantized x over the group)
    const S* mn = mins + r * w.groups;
    for (int64_t g = 0; g < w.groups; g += 16) {
      const __mmask16 m = w.groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (w.groups - g)) - 1u);
      acc = _mm512_fmadd_ps(sixteen(mn + g, m), _mm512_loadu_ps(xq.gsum.data() + g), acc);
    }
  }
  return _mm512_reduce_add_ps(acc) + (w.bias ? w.bias[r] : 0.0f);
}

// Rows this far ahead are asked for while two are multiplied (measured: 9 % less time per decode step's
// products when the weights come from memory, as they do for any model larger than the caches).
constexpr int64_t AHEAD = 8;

template <bool G32, bool MIN, typename S>
void gemv_a8_rows(const Weights& w, const S* scales, const S* mins, const QuantizedX& xq, float* y, int64_t r0, int64_t r1) {
  const int64_t k = w.k, kh = k / 2, chunks = (k + 63) / 64, whole = kh / 32;
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) {  // two rows: two independent chains, each x chunk loaded once for both
    const uint8_t* q0 = w.q4 + r * kh;
    const uint8_t* q1 = q0 + kh;
    const S* s0 = scales + r * w.groups;
    const S* s1 = s0 + w.groups;
    if (r + AHEAD + 2 <= w.n) {
      const char* bytes = (const char*)(q0 + AHEAD * kh);
      for (int64_t i = 0; i < 2 * kh; i += 64) _mm_prefetch(bytes + i, _MM_HINT_T0);
      const char* more = (const char*)(s0 + AHEAD * w.groups);
      for (int64_t i = 0; i < 2 * w.groups * (int64_t)sizeof(S); i += 64) _mm_prefetch(more + i, _MM_HINT_T0);
    }
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const bool full = c < whole;
      a0 = chunk_fma<G32, MIN>(q0, s0, xq, c, w.group, full, a0);
      a1 = chunk_fma<G32, MIN>(q1, s1, xq, c, w.group, full, a1);
    }
    y[r] = a8_row_tail<MIN>(w, mins, xq, r, a0);
    y[r + 1] = a8_row_tail<MIN>(w, mins, xq, r + 1, a1);
  }
  for (; r < r1; ++r) {
    const uint8_t* q = w.q4 + r * kh;
    const S* s = scales + r * w.groups;
    __m512 a0 = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) a0 = chunk_fma<G32, MIN>(q, s, xq, c, w.group, c < whole, a0);
    y[r] = a8_row_tail<MIN>(w, mins, xq, r, a0);
  }
}

// Rows [r0, r1) of the products of MB rows of x (xq[0 .. MB), outputs y + j * ldy): two weight rows times MB
// x rows at a time, so each chunk of weights is unpacked once for MB rows and each chunk of x loaded once for
// two weight rows (prefill: the products are bound by instructions, not by memory).
template <int MB, bool G32, bool MIN, typename S>
void gemm_a8_block(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, float* y, int64_t ldy,
                   int64_t r0, int64_t r1) {
  const int64_t kh = w.k / 2, chunks = (w.k + 63) / 64, whole = kh / 32;
  for (int64_t r = r0; r < r1; r += 2) {
    const bool pair = r + 1 < r1;
    const uint8_t* q0 = w.q4 + r * kh;
    const uint8_t* q1 = pair ? q0 + kh : q0;  // an odd last row is multiplied twice, kept once
    const S* s0 = scales + r * w.groups;
    const S* s1 = pair ? s0 + w.groups : s0;
    __m512 a0[MB], a1[MB];
    for (int j = 0; j < MB; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const bool full = c < whole;
      const __m512i w0 = chunk_weights(q0, c, full), w1 = chunk_weights(q1, c, full);
      const __m512 l0 = chunk_scales<G32>(s0, c, w.group, full), l1 = chunk_scales<G32>(s1, c, w.group, full);
      for (int j = 0; j < MB; ++j) {
        a0[j] = chunk_product<MIN>(w0, l0, xq[j], c, a0[j]);
        a1[j] = chunk_product<MIN>(w1, l1, xq[j], c, a1[j]);
      }
    }
    for (int j = 0; j < MB; ++j) {
      y[j * ldy + r] = a8_row_tail<MIN>(w, mins, xq[j], r, a0[j]);
      if (pair) y[j * ldy + r + 1] = a8_row_tail<MIN>(w, mins, xq[j], r + 1, a1[j]);
    }
  }
}

template <bool G32, bool MIN, typename S>
void gemm_a8_rows(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, int64_t m_rows, float* y,
                  int64_t ldy, int64_t r0, int64_t r1) {
  int64_t m = 0;
  for (; m + 4 <= m_rows; m += 4) gemm_a8_block<4, G32, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1);
  switch (m_rows - m) {
    case 3: gemm_a8_block<3, G32, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1); break;
    case 2: gemm_a8_block<2, G32, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1); break;
    case 1: gemm_a8_block<1, G32, MIN>(w, scales, mins, xq + m, y + m * ldy, ldy, r0, r1); break;
    default: break;
  }
}

// One weight of a (possibly fused) :a8 product: its operands, where its outputs go, and its float16 planes
// (s16 / m16: the scales and minimums read as stored, or null for float32 ones in w.scales / w.mins).
struct A8Part {
  Weights w;
  const uint16_t* s16;
  const uint16_t* m16;
  float* y;
};

// Rows [r0, r1) of the products of m_rows rows of x (outputs y, row stride ldy).
template <typename S>
void a8_rows(const Weights& w, const S* scales, const S* mins, const QuantizedX* xq, int64_t m_rows, float* y, int64_t ldy,
             int64_t r0, int64_t r1) {
  const bool g32 = w.group == 32, with_min = mins != nullptr;
  if (m_rows == 1) {
    if (g32) with_min ? gemv_a8_rows<true, true>(w, scales, mins, *xq, y, r0, r1) : gemv_a8_rows<true, false>(w, scales, mins, *xq, y, r0, r1);
    else with_min ? gemv_a8_rows<false, true>(w, scales, mins, *xq, y, r0, r1) : gemv_a8_rows<false, false>(w, scales, mins, *xq, y, r0, r1);
  } else if (g32) {
    with_min ? gemm_a8_rows<true, true>(w, scales, mins, xq, m_rows, y, ldy, r0, r1)
             : gemm_a8_rows<true, false>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  } else {
    with_min ? gemm_a8_rows<false, true>(w, scales, mins, xq, m_rows, y, ldy, r0, r1)
             : gemm_a8_rows<false, false>(w, scales, mins, xq, m_rows, y, ldy, r0, r1);
  }
}

// Rows of x times every part's weight (all of the same k and group; part p's outputs at parts[p].y, row m at
// parts[p].y + m * ldy), in one OpenMP region: the products that share an input (a layer's query / key / value,
// its gate / up) cost one start of the team and one rounding of x, not one each. Every row multiplies integers:
// a chunk of 16 weight rows is multiplied by each row of x while it is in the cache (prefill reads each weight
// once, as decode does).
void a8_products(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy) {
  const int64_t chunk = 16;
  std::vector<int64_t> first(count + 1, 0);  // parts[p] owns the chunks [first[p], first[p + 1])
  for (int64_t p = 0; p < count; ++p) first[p + 1] = first[p] + (parts[p].w.n + chunk - 1) / chunk;
  const int64_t chunks = first[count], k = parts[0].w.k, group = parts[0].w.group;
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
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t p = 0;
      while (c >= first[p + 1]) ++p;
      const A8Part& part = parts[p];
      const int64_t r0 = (c - first[p]) * chunk, r1 = r0 + chunk < part.w.n ? r0 + chunk : part.w.n;
      if (part.s16) a8_rows(part.w, part.s16, part.m16, xq, m_rows, part.y, ldy, r0, r1);
      else a8_rows(part.w, part.w.scales, part.w.mins, xq, m_rows, part.y, ldy, r0, r1);
    }
  }
}

#endif  // VNNI

using etsdk_kernels::contiguous_tensor;


// One weight's operands checked (bits, group, dtypes, shapes, layout); false: fail the call (nothing read).
// mins and bias may be null. With halves non-null (the :a8 entries), float16 scales and minimums are accepted too
// and returned there (halves[0]: scales, halves[1]: minimums or null); w.scales / w.mins are then null.
bool weight_operands(AtenTensorHandle qdata, AtenTensorHandle scales, AtenTensorHandle mins, AtenTensorHandle bias,
                     int64_t bits, int64_t group, Weights& w, const uint16_t** halves = nullptr) {
  const int32_t f32 = aoti_torch_dtype_float32();
  int64_t *qs = nullptr, *ss = nullptr, *ms = nullptr, *bs = nullptr;
  void *qp = nullptr, *sp = nullptr, *mp = nullptr, *bp = nullptr;
  if (!(bits == 8 || bits == 4) || group < 0 || (bits == 4 && group < 32) || (group % 32 && group)) return false;
  const int32_t qtype = bits == 8 ? aoti_torch_dtype_int8() : aoti_torch_dtype_uint8();
  if (!contiguous_tensor(qdata, 2, qtype, &qs, &qp)) return false;
  w = Weights{};
  w.bits = (int)bits;
  w.n = qs[0];
  w.k = bits == 8 ? qs[1] : qs[1] * 2;
  w.group = group;
  w.groups = group ? w.k / group : 1;
  if (group && w.k % group) return false;
  int32_t scale_type = f32;
  if (halves) {  // the :a8 entries: float16 planes are read as stored
    int32_t found = 0;
    if (!scales || aoti_torch_get_dtype(scales, &found)) return false;
    if (found == aoti_torch_dtype_float16()) scale_type = found;
  }
  if (group) {
    if (!contiguous_tensor(scales, 2, scale_type, &ss, &sp) || ss[0] != w.n || ss[1] != w.groups) return false;
  } else if (!contiguous_tensor(scales, 1, scale_type, &ss, &sp) || ss[0] != w.n) {
    return false;
  }
  if (mins) {
    if (bits != 4 || !contiguous_tensor(mins, 2, scale_type, &ms, &mp) || ms[0] != w.n || ms[1] != w.groups) return false;
  }
  if (bias) {
    if (!contiguous_tensor(bias, 1, f32, &bs, &bp) || bs[0] != w.n) return false;
  }
  w.q8 = static_cast<const int8_t*>(qp);
  w.q4 = static_cast<const uint8_t*>(qp);
  if (scale_type == f32) {
    w.scales = static_cast<const float*>(sp);
    w.mins = static_cast<const float*>(mp);
    if (halves) halves[0] = halves[1] = nullptr;
  } else {
    halves[0] = static_cast<const uint16_t*>(sp);
    halves[1] = static_cast<const uint16_t*>(mp);
  }
  w.bias = static_cast<const float*>(bp);
  return true;
}

// x: float32 [M, K], contiguous; false: fail the call.
bool input_rows(AtenTensorHandle x, const float** xf, int64_t* m_rows, int64_t* k) {
  int64_t* xs = nullptr;
  void* xp = nullptr;
  if (!contiguous_tensor(x, 2, aoti_torch_dtype_float32(), &xs, &xp)) return false;
  *xf = static_cast<const float*>(xp);
  *m_rows = xs[0];
  *k = xs[1];
  return true;
}

// A new float32 [M, N] output.
bool new_output(int64_t m_rows, int64_t n, AtenTensorHandle* ret0, float** y) {
  const int64_t sizes[2] = {m_rows, n};
  const int64_t strides[2] = {n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, ret0)) return false;
  void* yp = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &yp)) return false;
  *y = static_cast<float*>(yp);
  return true;
}

void product(const Weights& w, const float* x, int64_t m_rows, float* y) {
  if (m_rows <= 4) gemv(w, x, m_rows, y);
  else gemm(w, x, m_rows, y);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_qmm(
    AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales, AtenTensorHandle* mins,
    AtenTensorHandle* bias, int64_t bits, int64_t group, AtenTensorHandle* ret0) {
  Weights w;
  const float* xf = nullptr;
  float* y = nullptr;
  int64_t m_rows = 0, k = 0;
  if (!input_rows(x, &xf, &m_rows, &k)) return AOTI_TORCH_FAILURE;
  if (!weight_operands(qdata, scales, mins ? *mins : nullptr, bias ? *bias : nullptr, bits, group, w)) return AOTI_TORCH_FAILURE;
  if (w.k != k || !new_output(m_rows, w.n, ret0, &y)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || w.n == 0) return AOTI_TORCH_SUCCESS;
  product(w, xf, m_rows, y);
  return AOTI_TORCH_SUCCESS;
}

namespace {

// The :a8 formats (4-bit weights, int8 activations), for one or more weights read by the same x (all of one
// group size; their outputs side by side in one [M, sum of N] tensor): every row multiplies integers with
// VNNI, every weight in one OpenMP region. Without VNNI, the float paths run on the rows rounded as the format
// says (q * d).
AOTITorchError qmm_a8(AtenTensorHandle x, const AtenTensorHandle* qdata, const AtenTensorHandle* scales,
                      const AtenTensorHandle* mins, const AtenTensorHandle* bias, int64_t count, int64_t group,
                      AtenTensorHandle* ret0) {
  const float* xf = nullptr;
  float* y = nullptr;
  int64_t m_rows = 0, k = 0, n = 0;
  if (count < 1 || !input_rows(x, &xf, &m_rows, &k)) return AOTI_TORCH_FAILURE;
  std::vector<A8Part> parts(count);
  for (int64_t p = 0; p < count; ++p) {
    const uint16_t* halves[2] = {nullptr, nullptr};
    Weights& w = parts[p].w;
    if (!weight_operands(qdata[p], scales[p], mins ? mins[p] : nullptr, bias ? bias[p] : nullptr, 4, group, w, halves)) {
      return AOTI_TORCH_FAILURE;
    }
    if (w.k != k) return AOTI_TORCH_FAILURE;
    parts[p].s16 = halves[0];
    parts[p].m16 = halves[1];
    n += w.n;
  }
  if (!new_output(m_rows, n, ret0, &y)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || n == 0) return AOTI_TORCH_SUCCESS;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
  for (int64_t p = 0, column = 0; p < count; column += parts[p].w.n, ++p) parts[p].y = y + column;
  a8_products(parts.data(), count, xf, m_rows, n);
#else
  std::vector<float> rounded(m_rows * k);
  fake_quantize_rows(xf, m_rows, k, rounded.data());
  std::vector<float> wide_scales, wide_mins, own;  // the float paths read float32 planes
  for (int64_t p = 0, column = 0; p < count; column += parts[p].w.n, ++p) {
    Weights& w = parts[p].w;
    const auto widen_plane = [&w](const uint16_t* plane, std::vector<float>& out) {
      out.resize(w.n * w.groups);
      for (size_t i = 0; i < out.size(); ++i) out[i] = etsdk_kernels::widen(etsdk_kernels::F16{plane[i]});
      return out.data();
    };
    if (parts[p].s16) w.scales = widen_plane(parts[p].s16, wide_scales);
    if (parts[p].m16) w.mins = widen_plane(parts[p].m16, wide_mins);
    if (count == 1) {
      product(w, rounded.data(), m_rows, y);
      break;
    }
    own.resize(m_rows * w.n);  // this weight's columns of y
    product(w, rounded.data(), m_rows, own.data());
    for (int64_t m = 0; m < m_rows; ++m) std::memcpy(y + m * n + column, own.data() + m * w.n, sizeof(float) * w.n);
  }
#endif
  return AOTI_TORCH_SUCCESS;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_qmm_a8(
    AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales, AtenTensorHandle* mins,
    AtenTensorHandle* bias, int64_t group, AtenTensorHandle* ret0) {
  return qmm_a8(x, &qdata, &scales, mins && *mins ? mins : nullptr, bias && *bias ? bias : nullptr, 1, group, ret0);
}

// etsdk_aoti::etsdk_qmm_a8_fused: the :a8 product of several weights that read the same x, as AOTInductor passes
// Tensor[] arguments (a pointer and a length each); mins and bias hold one tensor per weight or none at all.
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_qmm_a8_fused(
    AtenTensorHandle x, const AtenTensorHandle* qdata, int64_t qdata_len, const AtenTensorHandle* scales,
    int64_t scales_len, const AtenTensorHandle* mins, int64_t mins_len, const AtenTensorHandle* bias,
    int64_t bias_len, int64_t group, AtenTensorHandle* ret0) {
  if (scales_len != qdata_len || (mins_len && mins_len != qdata_len) || (bias_len && bias_len != qdata_len)) {
    return AOTI_TORCH_FAILURE;
  }
  return qmm_a8(x, qdata, scales, mins_len ? mins : nullptr, bias_len ? bias : nullptr, qdata_len, group, ret0);
}
