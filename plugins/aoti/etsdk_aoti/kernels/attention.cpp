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
// aoti_torch_cpu_etsdk_attention_int8 (etsdk_aoti::etsdk_attention_int8) is the int8-cache form: key and
// value int8 with float32 scales [B, H, S, 1], one per row (row j of head h stands for key[j] * key_scale[j]);
// it reads a quarter of the bytes and dequantizes in registers.
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

inline float dot(const float* a, const int8_t* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * static_cast<float>(b[i]);
  return acc;
}

// Key / value rows as stored: float32, or int8 with a float32 scale per row (scale == nullptr: float rows).
template <typename T>
struct Rows {
  const T* data;
  const float* scale;
  float row_scale(int64_t row) const { return scale ? scale[row] : 1.f; }
};

// The attention itself, shared by both forms: q [B, Hq, L, E], mask [MB, 1, L, S], out [B, Hq, L, Ev].
template <typename T>
void attend(const float* q, Rows<T> k, Rows<T> v, const bool* m, float* out, int64_t B, int64_t Hq, int64_t L,
            int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float s) {
  // n: one past the last column some row sees (mask rows of every batch entry)
  int64_t n = 0;
  for (int64_t r = 0; r < MB * L; ++r) {
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

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(n, 1)));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * Hq; ++bh) {
      const int64_t b = bh / Hq, h = bh % Hq, hk = h / group;
      const int64_t head = (b * H + hk) * S;  // first row of this key / value head
      for (int64_t l = 0; l < L; ++l) {
        const float* qr = q + ((b * Hq + h) * L + l) * E;
        const bool* mr = m + ((MB == 1 ? 0 : b) * L + l) * S;
        float* o = out + ((b * Hq + h) * L + l) * Ev;
        float best = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (!mr[j]) continue;
          const float x = dot(qr, k.data + (head + j) * E, E) * k.row_scale(head + j) * s;
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
          const float w = p * v.row_scale(head + j);
          const T* vr = v.data + (head + j) * Ev;
#pragma omp simd
          for (int64_t e = 0; e < Ev; ++e) o[e] += w * static_cast<float>(vr[e]);
        }
        const float inv = 1.f / total;
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] *= inv;
      }
    }
  }
}

// Checks the operands of either form and allocates the output; false when any is not what the schema says.
bool operands(AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, AtenTensorHandle mask,
              int32_t cache_dtype, int64_t** qs, int64_t** ks, int64_t** vs, int64_t** ms, void** qp, void** kp,
              void** vp, void** mp, AtenTensorHandle* ret0, float** out) {
  const int32_t f32 = aoti_torch_dtype_float32();
  if (!contiguous_tensor(query, 4, f32, qs, qp) || !contiguous_tensor(key, 4, cache_dtype, ks, kp) ||
      !contiguous_tensor(value, 4, cache_dtype, vs, vp) || !contiguous_tensor(mask, 4, aoti_torch_dtype_bool(), ms, mp))
    return false;
  const int64_t B = (*qs)[0], Hq = (*qs)[1], L = (*qs)[2], E = (*qs)[3];
  const int64_t H = (*ks)[1], S = (*ks)[2], Ev = (*vs)[3];
  if ((*ks)[0] != B || (*ks)[3] != E || (*vs)[0] != B || (*vs)[1] != H || (*vs)[2] != S || H <= 0 || Hq % H) return false;
  if (!((*ms)[0] == 1 || (*ms)[0] == B) || (*ms)[1] != 1 || (*ms)[2] != L || (*ms)[3] != S) return false;
  const int64_t sizes[4] = {B, Hq, L, Ev};
  const int64_t strides[4] = {Hq * L * Ev, L * Ev, Ev, 1};
  if (aoti_torch_empty_strided(4, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, ret0)) return false;
  void* op = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &op)) return false;
  *out = static_cast<float*>(op);
  return true;
}

// A scale operand: contiguous float32 [B, H, S, 1] for the cache sizes ks.
bool scales(AtenTensorHandle handle, const int64_t* ks, const float** data) {
  int64_t* sizes = nullptr;
  void* p = nullptr;
  if (!contiguous_tensor(handle, 4, aoti_torch_dtype_float32(), &sizes, &p)) return false;
  if (sizes[0] != ks[0] || sizes[1] != ks[1] || sizes[2] != ks[2] || sizes[3] != 1) return false;
  *data = static_cast<const float*>(p);
  return true;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int64_t etsdk_attention_rows_read() { return rows_read.load(); }

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_attention(
    AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, AtenTensorHandle mask, double scale,
    AtenTensorHandle* ret0) {
  int64_t *qs = nullptr, *ks = nullptr, *vs = nullptr, *ms = nullptr;
  void *qp = nullptr, *kp = nullptr, *vp = nullptr, *mp = nullptr;
  float* out = nullptr;
  if (!operands(query, key, value, mask, aoti_torch_dtype_float32(), &qs, &ks, &vs, &ms, &qp, &kp, &vp, &mp, ret0, &out))
    return AOTI_TORCH_FAILURE;
  if (qs[0] == 0 || qs[1] == 0 || qs[2] == 0) return AOTI_TORCH_SUCCESS;
  attend<float>(static_cast<const float*>(qp), {static_cast<const float*>(kp), nullptr},
                {static_cast<const float*>(vp), nullptr}, static_cast<const bool*>(mp), out, qs[0], qs[1], qs[2], qs[3],
                ks[1], ks[2], vs[3], ms[0], static_cast<float>(scale));
  return AOTI_TORCH_SUCCESS;
}

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_etsdk_attention_int8(
    AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle key_scale, AtenTensorHandle value,
    AtenTensorHandle value_scale, AtenTensorHandle mask, double scale, AtenTensorHandle* ret0) {
  int64_t *qs = nullptr, *ks = nullptr, *vs = nullptr, *ms = nullptr;
  void *qp = nullptr, *kp = nullptr, *vp = nullptr, *mp = nullptr;
  const float *kscale = nullptr, *vscale = nullptr;
  float* out = nullptr;
  // the scales are checked first: no output is allocated for a call that fails
  int64_t* key_sizes = nullptr;
  void* unused = nullptr;
  if (!contiguous_tensor(key, 4, aoti_torch_dtype_int8(), &key_sizes, &unused) || !scales(key_scale, key_sizes, &kscale) ||
      !scales(value_scale, key_sizes, &vscale))
    return AOTI_TORCH_FAILURE;
  if (!operands(query, key, value, mask, aoti_torch_dtype_int8(), &qs, &ks, &vs, &ms, &qp, &kp, &vp, &mp, ret0, &out))
    return AOTI_TORCH_FAILURE;
  if (qs[0] == 0 || qs[1] == 0 || qs[2] == 0) return AOTI_TORCH_SUCCESS;
  attend<int8_t>(static_cast<const float*>(qp), {static_cast<const int8_t*>(kp), kscale},
                 {static_cast<const int8_t*>(vp), vscale}, static_cast<const bool*>(mp), out, qs[0], qs[1], qs[2],
                 qs[3], ks[1], ks[2], vs[3], ms[0], static_cast<float>(scale));
  return AOTI_TORCH_SUCCESS;
}
