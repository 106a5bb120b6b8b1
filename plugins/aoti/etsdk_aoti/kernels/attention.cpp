// etsdk-aoti: attention under a boolean mask that reads only the key / value rows some query sees.
//
// A compiled library calls aoti_torch_cpu_etsdk_attention (AOTInductor's C-shim calling
// convention for the custom operator etsdk_aoti::etsdk_attention, which stands for the core's
// etsdk::attention). Meaning: scaled_dot_product_attention(q, k, v, attn_mask=mask, scale) with
// grouped-query heads:
//
//   query float32 [B, Hq, L, E], key float32 [B, H, S, E], value float32 [B, H, S, Ev],
//   mask bool [B or 1, 1, L, S] (true: visible), Hq a multiple of H  ->  out float32 [B, Hq, L, Ev]
//
// Only rows 0 .. n-1 of key and value are read, n being one past the last column any query row
// sees: an LLM's decode step over a static cache of S rows costs what the conversation holds,
// not S. Work is split over (batch, query head) with OpenMP (torch's runtime, as the other kernels).
// Every tensor is checked (dtype, rank, sizes, contiguity) and a mismatch fails the call; a query
// row that sees nothing gets zeros (the exporters never make one).

#include "aoti_shim.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

namespace {

using etsdk_kernels::contiguous_tensor;

std::atomic<int64_t> rows_read{0};

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int64_t etsdk_attention_rows_read() { return rows_read.load(); }

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_attention(
    AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, AtenTensorHandle mask, double scale,
    AtenTensorHandle* ret0) {
  const int32_t f32 = aoti_torch_dtype_float32();
  int64_t *qs = nullptr, *ks = nullptr, *vs = nullptr, *ms = nullptr;
  void *qp = nullptr, *kp = nullptr, *vp = nullptr, *mp = nullptr;
  if (!contiguous_tensor(query, 4, f32, &qs, &qp) || !contiguous_tensor(key, 4, f32, &ks, &kp) ||
      !contiguous_tensor(value, 4, f32, &vs, &vp) || !contiguous_tensor(mask, 4, aoti_torch_dtype_bool(), &ms, &mp))
    return AOTI_TORCH_FAILURE;
  const int64_t B = qs[0], Hq = qs[1], L = qs[2], E = qs[3];
  const int64_t H = ks[1], S = ks[2], Ev = vs[3];
  if (ks[0] != B || ks[3] != E || vs[0] != B || vs[1] != H || vs[2] != S || H <= 0 || Hq % H) return AOTI_TORCH_FAILURE;
  if (!(ms[0] == 1 || ms[0] == B) || ms[1] != 1 || ms[2] != L || ms[3] != S) return AOTI_TORCH_FAILURE;
  const int64_t sizes[4] = {B, Hq, L, Ev};
  const int64_t strides[4] = {Hq * L * Ev, L * Ev, Ev, 1};
  if (aoti_torch_empty_strided(4, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, ret0)) return AOTI_TORCH_FAILURE;
  void* op = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &op)) return AOTI_TORCH_FAILURE;
  const float* q = static_cast<const float*>(qp);
  const float* k = static_cast<const float*>(kp);
  const float* v = static_cast<const float*>(vp);
  const bool* m = static_cast<const bool*>(mp);
  float* out = static_cast<float*>(op);
  if (B == 0 || Hq == 0 || L == 0) return AOTI_TORCH_SUCCESS;

  // n: one past the last column some row sees (mask rows of every batch entry)
  int64_t n = 0;
  for (int64_t r = 0; r < ms[0] * L; ++r) {
    const bool* row = m + r * S;
    for (int64_t j = S - 1; j >= n; --j) {
      if (row[j]) {
        n = j + 1;
        break;
      }
    }
  }
  rows_read.fetch_add(n, std::memory_order_relaxed);
  const int64_t group = Hq / H;
  const float s = static_cast<float>(scale);

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(n, 1)));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * Hq; ++bh) {
      const int64_t b = bh / Hq, h = bh % Hq, hk = h / group;
      const float* kh = k + (b * H + hk) * S * E;
      const float* vh = v + (b * H + hk) * S * Ev;
      for (int64_t l = 0; l < L; ++l) {
        const float* qr = q + ((b * Hq + h) * L + l) * E;
        const bool* mr = m + ((ms[0] == 1 ? 0 : b) * L + l) * S;
        float* o = out + ((b * Hq + h) * L + l) * Ev;
        float best = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (!mr[j]) continue;
          const float x = dot(qr, kh + j * E, E) * s;
          scores[j] = x;
          best = std::max(best, x);
        }
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] = 0.f;
        if (best == -INFINITY) continue;  // sees nothing: zeros
        float total = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          if (!mr[j]) continue;
          const float p = std::exp(scores[j] - best);
          total += p;
          const float* vr = vh + j * Ev;
#pragma omp simd
          for (int64_t e = 0; e < Ev; ++e) o[e] += p * vr[e];
        }
        const float inv = 1.f / total;
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] *= inv;
      }
    }
  }
  return AOTI_TORCH_SUCCESS;
}
