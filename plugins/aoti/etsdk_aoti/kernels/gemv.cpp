// etsdk-aoti: x @ w^T (+ bias) by float32 weights for a few rows of x (an LLM's decode step), on every thread.
//
// A compiled library calls aoti_torch_cpu_etsdk_linear (AOTInductor's C-shim calling convention for the custom
// operator etsdk_aoti::etsdk_linear): y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), all float32, contiguous.
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

// y[m][r] for r in [r0, r1) and m < M: each weight row is read once for the M rows of x.
template <int M>
void rows(const float* x, const float* w, const float* bias, float* y, int64_t n, int64_t k, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * k;
    float total[M];
#if defined(__AVX512F__)
    // two chains per x row: a multiply-add waits for the previous one of its chain only
    __m512 a[M], b[M];
    for (int m = 0; m < M; ++m) a[m] = b[m] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      const __m512 w0 = _mm512_loadu_ps(row + i), w1 = _mm512_loadu_ps(row + i + 16);
      for (int m = 0; m < M; ++m) {
        a[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i), w0, a[m]);
        b[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * k + i + 16), w1, b[m]);
      }
    }
    for (; i < k; i += 16) {
      const __mmask16 in = k - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (k - i)) - 1u);
      const __m512 w0 = _mm512_maskz_loadu_ps(in, row + i);
      for (int m = 0; m < M; ++m) a[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, x + m * k + i), w0, a[m]);
    }
    for (int m = 0; m < M; ++m) total[m] = _mm512_reduce_add_ps(_mm512_add_ps(a[m], b[m]));
#else
    for (int m = 0; m < M; ++m) {
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < k; ++i) dot += x[m * k + i] * row[i];
      total[m] = dot;
    }
#endif
    const float add = bias ? bias[r] : 0.0f;
    for (int m = 0; m < M; ++m) y[m * n + r] = total[m] + add;
  }
}

// Output rows per task: enough work per task that the team's start-up is amortized, small enough to balance.
constexpr int64_t kChunk = 16;

void linear(const float* x, const float* w, const float* bias, float* y, int64_t m_rows, int64_t n, int64_t k) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  for (int64_t m0 = 0; m0 < m_rows; m0 += 4) {
    const int64_t block = m_rows - m0 < 4 ? m_rows - m0 : 4;
    const float* xb = x + m0 * k;
    float* yb = y + m0 * n;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * kChunk, r1 = r0 + kChunk < n ? r0 + kChunk : n;
      switch (block) {
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
  const int32_t f32 = aoti_torch_dtype_float32();
  int64_t *xs = nullptr, *ws = nullptr, *bs = nullptr;
  void *xp = nullptr, *wp = nullptr, *bp = nullptr;
  if (!contiguous_tensor(x, 2, f32, &xs, &xp) || !contiguous_tensor(weight, 2, f32, &ws, &wp)) return AOTI_TORCH_FAILURE;
  const int64_t m_rows = xs[0], k = xs[1], n = ws[0];
  if (ws[1] != k) return AOTI_TORCH_FAILURE;
  if (bias && *bias && (!contiguous_tensor(*bias, 1, f32, &bs, &bp) || bs[0] != n)) return AOTI_TORCH_FAILURE;
  const int64_t sizes[2] = {m_rows, n};
  const int64_t strides[2] = {n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, ret0)) return AOTI_TORCH_FAILURE;
  void* yp = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &yp)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || n == 0) return AOTI_TORCH_SUCCESS;
  linear(static_cast<const float*>(xp), static_cast<const float*>(wp), static_cast<const float*>(bp),
         static_cast<float*>(yp), m_rows, n, k);
  return AOTI_TORCH_SUCCESS;
}
