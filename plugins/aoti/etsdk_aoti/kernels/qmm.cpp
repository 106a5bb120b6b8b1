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

using etsdk_kernels::contiguous_tensor;

}  // namespace

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_qmm(
    AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales, AtenTensorHandle* mins,
    AtenTensorHandle* bias, int64_t bits, int64_t group, AtenTensorHandle* ret0) {
  const int32_t f32 = aoti_torch_dtype_float32();
  int64_t *xs = nullptr, *qs = nullptr, *ss = nullptr, *ms = nullptr, *bs = nullptr;
  void *xp = nullptr, *qp = nullptr, *sp = nullptr, *mp = nullptr, *bp = nullptr;
  if (!(bits == 8 || bits == 4) || group < 0 || (bits == 4 && group < 32) || (group % 32 && group)) return AOTI_TORCH_FAILURE;
  if (!contiguous_tensor(x, 2, f32, &xs, &xp)) return AOTI_TORCH_FAILURE;
  const int32_t qtype = bits == 8 ? aoti_torch_dtype_int8() : aoti_torch_dtype_uint8();
  if (!contiguous_tensor(qdata, 2, qtype, &qs, &qp)) return AOTI_TORCH_FAILURE;
  Weights w{};
  w.bits = (int)bits;
  w.n = qs[0];
  w.k = bits == 8 ? qs[1] : qs[1] * 2;
  w.group = group;
  w.groups = group ? w.k / group : 1;
  if (xs[1] != w.k || (group && w.k % group)) return AOTI_TORCH_FAILURE;
  if (group) {
    if (!contiguous_tensor(scales, 2, f32, &ss, &sp) || ss[0] != w.n || ss[1] != w.groups) return AOTI_TORCH_FAILURE;
  } else if (!contiguous_tensor(scales, 1, f32, &ss, &sp) || ss[0] != w.n) {
    return AOTI_TORCH_FAILURE;
  }
  if (mins && *mins) {
    if (bits != 4 || !contiguous_tensor(*mins, 2, f32, &ms, &mp) || ms[0] != w.n || ms[1] != w.groups) return AOTI_TORCH_FAILURE;
  }
  if (bias && *bias) {
    if (!contiguous_tensor(*bias, 1, f32, &bs, &bp) || bs[0] != w.n) return AOTI_TORCH_FAILURE;
  }
  w.q8 = static_cast<const int8_t*>(qp);
  w.q4 = static_cast<const uint8_t*>(qp);
  w.scales = static_cast<const float*>(sp);
  w.mins = static_cast<const float*>(mp);
  w.bias = static_cast<const float*>(bp);
  const int64_t m_rows = xs[0];
  const int64_t sizes[2] = {m_rows, w.n};
  const int64_t strides[2] = {w.n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, ret0)) return AOTI_TORCH_FAILURE;
  void* yp = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &yp)) return AOTI_TORCH_FAILURE;
  const float* xf = static_cast<const float*>(xp);
  float* y = static_cast<float*>(yp);
  if (m_rows == 0 || w.n == 0) return AOTI_TORCH_SUCCESS;
  if (m_rows <= 4) gemv(w, xf, m_rows, y);
  else gemm(w, xf, m_rows, y);
  return AOTI_TORCH_SUCCESS;
}
