// etsdk-aoti: x @ w^T (+ bias) by float32, bfloat16 or float16 weights for a few rows of x (an LLM's decode step),
// on every thread, at every instruction-set level (vec.h).
//
// y[M, N] = x[M, K] @ float(w[N, K])^T (+ bias[N]); x, bias and y float32, w float32, bfloat16 or float16 (widened
// to float32 in registers: exact, so the result is what float32 weights of the same values give). 16-bit weights
// halve the bytes a decode step reads. Called through the level table (table.h: linear) by
// aoti_torch_cpu_etsdk_linear (entry.cpp), which checked the operands.
//
// Why: a decode step multiplies one row of activations by every weight matrix, so its cost is reading the
// weights. The library GEMV that Inductor calls for such a product (MKL's sgemv here) runs on one thread while
// the other waits (measured on the project's reference machine: a 135M-parameter model's float32 decode read
// its weights at a third of the memory's bandwidth). This kernel splits the output rows over torch's OpenMP team
// (the team size torch is given applies here too) and reads each weight once per call, with two independent
// accumulation chains per row of x, asking for the weight rows kAheadRows on (vec.h) while it multiplies one. The
// exporter points only products of at most kFewRows rows at it (prefill keeps the library GEMM); any M is computed
// correctly, kRows rows of x at a time (4 where the level has 32 vector registers, 2 where it has 16).

#include <omp.h>

#include <cstdint>

#include "table.h"
#include "vec.h"

namespace etsdk_kernels {
namespace {

namespace v = vec;

// Rows of x a pass takes: 2 * rows accumulators and two weight vectors live at once.
constexpr int kRows = v::kRegisters >= 16 ? 4 : 2;

// y[m][r] for r in [r0, r1) and m < M: each weight row is read once for the M rows of x.
template <int M, typename W>
void rows(const float* x, const W* w, const float* bias, float* y, int64_t n, int64_t k, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const W* row = w + r * k;
    if (r + kAheadRows < n) {  // the row kAheadRows on, asked for while this one multiplies (vec.h)
      const char* ahead = (const char*)(row + kAheadRows * k);
      for (int64_t i = 0; i < k * (int64_t)sizeof(W); i += 64) v::prefetch(ahead + i);
    }
    // two chains per x row: a multiply-add waits for the previous one of its chain only
    v::F a[M], b[M];
    for (int m = 0; m < M; ++m) a[m] = b[m] = v::zero();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      const v::F w0 = v::load(row + i), w1 = v::load(row + i + 16);
      for (int m = 0; m < M; ++m) {
        a[m] = v::fma(v::load(x + m * k + i), w0, a[m]);
        b[m] = v::fma(v::load(x + m * k + i + 16), w1, b[m]);
      }
    }
    for (; i < k; i += 16) {  // the columns past the last whole 32, sixteen (or fewer) at a time
      const v::F w0 = v::load_first(row + i, k - i);
      for (int m = 0; m < M; ++m) a[m] = v::fma(v::load_first(x + m * k + i, k - i), w0, a[m]);
    }
    const float add = bias ? bias[r] : 0.0f;
    for (int m = 0; m < M; ++m) y[m * n + r] = v::reduce_add(v::add(a[m], b[m])) + add;
  }
}

// Output rows per task: enough work per task that the team's start-up is amortized, small enough to balance.
constexpr int64_t kChunk = 16;

template <typename W>
void linear_of(const float* x, const W* w, const float* bias, float* y, int64_t m_rows, int64_t n, int64_t k) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Each task takes kChunk weight rows through every block of x rows: the chunk's weights are read from memory
  // once and stay in the core's cache for the other blocks (a prefill of 16-bit weights runs here too).
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * kChunk, r1 = r0 + kChunk < n ? r0 + kChunk : n;
    for (int64_t m0 = 0; m0 < m_rows; m0 += kRows) {
      const float* xb = x + m0 * k;
      float* yb = y + m0 * n;
      switch (m_rows - m0 < kRows ? m_rows - m0 : kRows) {
        case 1: rows<1>(xb, w, bias, yb, n, k, r0, r1); break;
        case 2: rows<2>(xb, w, bias, yb, n, k, r0, r1); break;
        case 3: rows<3>(xb, w, bias, yb, n, k, r0, r1); break;
        default: rows<kRows>(xb, w, bias, yb, n, k, r0, r1); break;
      }
    }
  }
}

}  // namespace

void linear(const float* x, const void* w, FloatWeight w_dtype, const float* bias, float* y, int64_t m_rows, int64_t n,
            int64_t k) {
  switch (w_dtype) {
    case FloatWeight::kBfloat16: linear_of(x, static_cast<const Bf16*>(w), bias, y, m_rows, n, k); break;
    case FloatWeight::kFloat16: linear_of(x, static_cast<const F16*>(w), bias, y, m_rows, n, k); break;
    default: linear_of(x, static_cast<const float*>(w), bias, y, m_rows, n, k); break;
  }
}

}  // namespace etsdk_kernels
