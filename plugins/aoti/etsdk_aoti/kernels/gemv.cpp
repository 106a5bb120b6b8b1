// etsdk-aoti: x @ w^T (+ bias) by float32, bfloat16 or float16 weights for a few rows of x (an LLM's decode step),
// on every thread.
//
// A compiled library calls aoti_torch_cpu_etsdk_linear (AOTInductor's C-shim calling convention for the custom
// operator etsdk_aoti::etsdk_linear): y[M, N] = x[M, K] @ float(w[N, K])^T (+ bias[N]); x, bias and y float32, w
// float32, bfloat16 or float16 (widened to float32 in registers: exact, so the result is what float32 weights of
// the same values give), all contiguous. 16-bit weights halve the bytes a decode step reads.
//
// Why: a decode step multiplies one row of activations by every weight matrix, so its cost is reading the
// weights. The library GEMV that Inductor calls for such a product (MKL's sgemv here) runs on one thread while
// the other waits (measured on the project's reference machine: a 135M-parameter model's float32 decode read
// its weights at a third of the memory's bandwidth). This kernel splits the output rows over torch's OpenMP team
// (the team size torch is given applies here too) and reads each weight once per call, with several independent
// accumulation chains per row. The exporter points only products of at most kFewRows rows at it (prefill keeps
// the library GEMM); any M is computed correctly, four rows of x at a time.
//
// Every tensor is checked (dtype, rank, sizes, contiguity) and a mismatch fails the call.

#include "aoti_shim.h"

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>

namespace {

using etsdk_kernels::contiguous_tensor;

// The weight dtypes (etsdk_kernels::Bf16 / F16) and widen(), their exact float32 value: aoti_shim.h.
using etsdk_kernels::Bf16;
using etsdk_kernels::F16;
using etsdk_kernels::widen;

#if defined(__AVX512F__)
// 16 weights from p, widened to float32.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Bf16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load16(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#endif

// y[m][r] for r in [r0, r1) and m < M: each weight row is read once for the M rows of x.
template <int M, typename W>
void rows(const float* x, const W* w, const float* bias, float* y, int64_t n, int64_t k, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const W* row = w + r * k;
    float total[M];
    int64_t i = 0;
#if defined(__AVX512F__)
    // two chains per x row: a multiply-add waits for the previous one of its chain only
    __m512 a[M], b[M];
    for (int m = 0; m < M; ++m) a[m] = b[m] = _mm512_setzero_ps();
    for (; i + 32 <= k; i += 32) {
      const __m512 w0 = load16(row + i), w1 = load16(row + i + 16);
      for (int m = 0; m < M; ++m) {
        a[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i), w0, a[m]);
        b[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i + 16), w1, b[m]);
      }
    }
    for (int m = 0; m < M; ++m) total[m] = _mm512_reduce_add_ps(_mm512_add_ps(a[m], b[m]));
#else
    for (int m = 0; m < M; ++m) total[m] = 0.0f;
#endif
    for (int m = 0; m < M; ++m) {  // the columns past the last whole 32 (all of them without AVX-512)
      float dot = 0.0f;
      for (int64_t j = i; j < k; ++j) dot += x[m * k + j] * widen(row[j]);
      total[m] += dot;
    }
    const float add = bias ? bias[r] : 0.0f;
    for (int m = 0; m < M; ++m) y[m * n + r] = total[m] + add;
  }
}

// Output rows per task: enough work per task that the team's start-up is amortized, small enough to balance.
constexpr int64_t kChunk = 16;

template <typename W>
void linear(const float* x, const W* w, const float* bias, float* y, int64_t m_rows, int64_t n, int64_t k) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Each task takes kChunk weight rows through every block of four x rows: the chunk's weights are read from
  // memory once and stay in the core's cache for the other blocks (a prefill of 16-bit weights runs here too).
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * kChunk, r1 = r0 + kChunk < n ? r0 + kChunk : n;
    for (int64_t m0 = 0; m0 < m_rows; m0 += 4) {
      const float* xb = x + m0 * k;
      float* yb = y + m0 * n;
      switch (m_rows - m0 < 4 ? m_rows - m0 : 4) {
        case 1: rows<1>(xb, w, bias, yb, n, k, r0, r1); break;
        case 2: rows<2>(xb, w, bias, yb, n, k, r0, r1); break;
        case 3: rows<3>(xb, w, bias, yb, n, k, r0, r1); break;
        default: rows<4>(xb, w, bias, yb, n, k, r0, r1); break;
      }
    }
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_linear(
    AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  const int32_t f32 = aoti_torch_dtype_float32(), bf16 = aoti_torch_dtype_bfloat16(), f16 = aoti_torch_dtype_float16();
  int64_t *xs = nullptr, *ws = nullptr, *bs = nullptr;
  void *xp = nullptr, *wp = nullptr, *bp = nullptr;
  int32_t w_dtype = 0;
  if (!weight || aoti_torch_get_dtype(weight, &w_dtype) || (w_dtype != f32 && w_dtype != bf16 && w_dtype != f16)) {
    return AOTI_TORCH_FAILURE;
  }
  if (!contiguous_tensor(x, 2, f32, &xs, &xp) || !contiguous_tensor(weight, 2, w_dtype, &ws, &wp)) return AOTI_TORCH_FAILURE;
  const int64_t m_rows = xs[0], k = xs[1], n = ws[0];
  if (ws[1] != k) return AOTI_TORCH_FAILURE;
  if (bias && *bias && (!contiguous_tensor(*bias, 1, f32, &bs, &bp) || bs[0] != n)) return AOTI_TORCH_FAILURE;
  const int64_t sizes[2] = {m_rows, n};
  const int64_t strides[2] = {n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, ret0)) return AOTI_TORCH_FAILURE;
  void* yp = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &yp)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || n == 0) return AOTI_TORCH_SUCCESS;
  const float* xf = static_cast<const float*>(xp);
  const float* bf = static_cast<const float*>(bp);
  float* yf = static_cast<float*>(yp);
  if (w_dtype == bf16) {
    linear(xf, static_cast<const Bf16*>(wp), bf, yf, m_rows, n, k);
  } else if (w_dtype == f16) {
    linear(xf, static_cast<const F16*>(wp), bf, yf, m_rows, n, k);
  } else {
    linear(xf, static_cast<const float*>(wp), bf, yf, m_rows, n, k);
  }
  return AOTI_TORCH_SUCCESS;
}
