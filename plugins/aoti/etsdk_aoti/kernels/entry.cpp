// etsdk-aoti kernels: the entry points AOTInductor-compiled libraries call, the same on every CPU.
//
// A compiled library calls aoti_torch_cpu_etsdk_<op> (AOTInductor's C-shim calling convention for the custom
// operator etsdk_aoti::etsdk_<op>) as it calls ATen's own shims; the loader resolves it against this library
// (libetsdk_aoti_kernels.so, loaded into the process's global scope before any compiled library). Each entry
// point checks every operand (dtype, rank, sizes, layout: a mismatch fails the call before any byte is read),
// allocates the output, and calls the selected level's table (table.h). The level is selected once by
// etsdk_aoti.kernels (etsdk_aoti_select) before any program runs: until then every call fails.
//
// This file is built with the compiler's baseline target (no -march): it runs on every CPU of its architecture.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "aoti_shim.h"
#include "table.h"

namespace {

using etsdk_kernels::A8Part;
using etsdk_kernels::CacheRows;
using etsdk_kernels::contiguous_tensor;
using etsdk_kernels::FloatWeight;
using etsdk_kernels::KernelTable;
using etsdk_kernels::Weights;

std::atomic<const KernelTable*> selected{nullptr};
std::atomic<int64_t> rows_read{0};
std::atomic<int64_t> queries_attended{0};
std::atomic<int64_t> rows_multiplied{0};

const KernelTable* table() { return selected.load(std::memory_order_acquire); }

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

// Rows of x [M, K] up to its last row holding a non-zero value. A padded prefill chunk's linear layers read zero
// rows (etsdk-hf-static zeroes them), and a zero row's product is the bias (or zero): the products below multiply
// only the rows before them and fill the rest (stored weights are finite, so 0 * w is 0 for each of them). Zero
// means +0.0 bytes, compared by memcmp's widest loads (a -0.0 row is multiplied, which is never wrong); a row in use
// usually ends the scan at its first bytes. Counted in rows_multiplied.
int64_t rows_in_use(const float* x, int64_t m_rows, int64_t k) {
  static const float zeros[256] = {};
  for (; m_rows > 0; --m_rows) {
    const float* row = x + (m_rows - 1) * k;
    for (int64_t j = 0; j < k; j += 256) {
      const int64_t len = k - j < 256 ? k - j : 256;
      if (std::memcmp(row + j, zeros, static_cast<size_t>(len) * sizeof(float)) != 0) {
        rows_multiplied.fetch_add(m_rows, std::memory_order_relaxed);
        return m_rows;
      }
    }
  }
  return 0;
}

// y's rows [from, m_rows) of columns [column, column + n) (a row of y is `stride` floats): the bias, or zeros.
// (memset / memcpy: the C library's widest stores, whatever this file's baseline target)
void fill_rows(float* y, int64_t from, int64_t m_rows, int64_t stride, int64_t column, int64_t n, const float* bias) {
  if (from >= m_rows) return;
  if (!bias && column == 0 && n == stride) {  // whole rows of zeros: one run
    std::memset(y + from * stride, 0, static_cast<size_t>((m_rows - from) * stride) * sizeof(float));
    return;
  }
  for (int64_t r = from; r < m_rows; ++r) {
    float* out = y + r * stride + column;
    if (bias) {
      std::memcpy(out, bias, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
    }
  }
}

// A new float32 tensor of `dims` sizes, contiguous.
bool new_output(int64_t dims, const int64_t* sizes, AtenTensorHandle* ret0, float** y) {
  int64_t strides[4];
  int64_t stride = 1;
  for (int64_t d = dims - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= sizes[d];
  }
  if (aoti_torch_empty_strided(dims, sizes, strides, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, ret0)) return false;
  void* yp = nullptr;
  if (aoti_torch_get_data_ptr(*ret0, &yp)) return false;
  *y = static_cast<float*>(yp);
  return true;
}

// The :a8 formats (4-bit or int8 weights, int8 activations) for one or more weights read by the same x (all of one
// bits and group size, qdata's dtype saying which: uint8 4-bit, int8 8-bit; their outputs side by side in one
// [M, sum of N] tensor). x's rows are rounded per block of 32, so k must be a whole number of blocks.
AOTITorchError qmm_a8(AtenTensorHandle x, const AtenTensorHandle* qdata, const AtenTensorHandle* scales,
                      const AtenTensorHandle* mins, const AtenTensorHandle* bias, int64_t count, int64_t group,
                      AtenTensorHandle* ret0) {
  const KernelTable* kernels = table();
  const float* xf = nullptr;
  float* y = nullptr;
  int64_t m_rows = 0, k = 0, n = 0;
  if (!kernels || count < 1 || !input_rows(x, &xf, &m_rows, &k) || k % 32) return AOTI_TORCH_FAILURE;
  int32_t qtype = 0;
  if (!qdata[0] || aoti_torch_get_dtype(qdata[0], &qtype)) return AOTI_TORCH_FAILURE;
  const int64_t bits = qtype == aoti_torch_dtype_int8() ? 8 : 4;  // another dtype fails weight_operands' check
  // int8 weights' :a8 decode goes 64 columns a step: a group is one block (32) or whole steps (a multiple of 64)
  if (bits == 8 && group && group != 32 && group % 64) return AOTI_TORCH_FAILURE;
  std::vector<A8Part> parts(count);
  for (int64_t p = 0; p < count; ++p) {
    const uint16_t* halves[2] = {nullptr, nullptr};
    Weights& w = parts[p].w;
    // int8 weights' scales are float32 (the kernel reads no float16 plane for them)
    if (!weight_operands(qdata[p], scales[p], mins ? mins[p] : nullptr, bias ? bias[p] : nullptr, bits, group, w,
                         bits == 4 ? halves : nullptr)) {
      return AOTI_TORCH_FAILURE;
    }
    if (w.k != k) return AOTI_TORCH_FAILURE;
    parts[p].s16 = halves[0];
    parts[p].m16 = halves[1];
    n += w.n;
  }
  const int64_t sizes[2] = {m_rows, n};
  if (!new_output(2, sizes, ret0, &y)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || n == 0) return AOTI_TORCH_SUCCESS;
  const int64_t used = rows_in_use(xf, m_rows, k);
  for (int64_t p = 0, column = 0; p < count; column += parts[p].w.n, ++p) {
    parts[p].y = y + column;
    fill_rows(y, used, m_rows, n, column, parts[p].w.n, parts[p].w.bias);
  }
  if (used) kernels->qmm_a8(parts.data(), count, xf, used, n);
  return AOTI_TORCH_SUCCESS;
}

// Checks the operands of every attention form and allocates the output; false when any is not what the schema says
// (nothing allocated then). query [B, Hq, L, E]; `count` caches: one tensor of B batches (count 1: key [B, H, S, E],
// value [B, H, S, Ev]) or one session's tensor per batch (count B: each [1, H, S, E] and [1, H, S, Ev], all of one
// shape); int8 caches with their row scales ([B or 1, H, S, 1], k_scales / v_scales non-null), float32 ones without;
// mask [B or 1, 1, L, S]. rows: one CacheRows per batch.
bool attention_operands(AtenTensorHandle query, const AtenTensorHandle* keys, const AtenTensorHandle* values,
                        const AtenTensorHandle* k_scales, const AtenTensorHandle* v_scales, int64_t count,
                        AtenTensorHandle mask, int64_t* shape, std::vector<CacheRows>& rows, const float** q,
                        const bool** m, AtenTensorHandle* ret0, float** out) {
  const int32_t f32 = aoti_torch_dtype_float32();
  const int32_t cache_dtype = k_scales ? aoti_torch_dtype_int8() : f32;
  int64_t *qs = nullptr, *ms = nullptr;
  void *qp = nullptr, *mp = nullptr;
  if (count < 1 || !keys || !values || (k_scales == nullptr) != (v_scales == nullptr)) return false;
  if (!contiguous_tensor(query, 4, f32, &qs, &qp) || !contiguous_tensor(mask, 4, aoti_torch_dtype_bool(), &ms, &mp))
    return false;
  const int64_t B = qs[0], Hq = qs[1], L = qs[2], E = qs[3];
  const int64_t each = count == 1 ? B : 1;  // batches per cache tensor
  if (count != 1 && count != B) return false;
  int64_t H = -1, S = -1, Ev = -1;
  rows.assign(static_cast<size_t>(B), CacheRows{});
  for (int64_t c = 0; c < count; ++c) {
    int64_t *ks = nullptr, *vs = nullptr;
    void *kp = nullptr, *vp = nullptr;
    if (!contiguous_tensor(keys[c], 4, cache_dtype, &ks, &kp) || !contiguous_tensor(values[c], 4, cache_dtype, &vs, &vp))
      return false;
    if (c == 0) H = ks[1], S = ks[2], Ev = vs[3];
    if (ks[0] != each || ks[1] != H || ks[2] != S || ks[3] != E || vs[0] != each || vs[1] != H || vs[2] != S || vs[3] != Ev)
      return false;
    const float *kscale = nullptr, *vscale = nullptr;
    if (k_scales) {
      int64_t *a = nullptr, *b = nullptr;
      void *ap = nullptr, *bp = nullptr;
      if (!contiguous_tensor(k_scales[c], 4, f32, &a, &ap) || !contiguous_tensor(v_scales[c], 4, f32, &b, &bp)) return false;
      for (const int64_t* sizes : {a, b})
        if (sizes[0] != each || sizes[1] != H || sizes[2] != S || sizes[3] != 1) return false;
      kscale = static_cast<const float*>(ap), vscale = static_cast<const float*>(bp);
    }
    const size_t width = k_scales ? 1 : sizeof(float);
    for (int64_t i = 0; i < each; ++i) {  // batch c * each + i: its own rows and scales
      rows[static_cast<size_t>(c * each + i)] = CacheRows{
          static_cast<const char*>(kp) + static_cast<size_t>(i * H * S * E) * width, kscale ? kscale + i * H * S : nullptr,
          static_cast<const char*>(vp) + static_cast<size_t>(i * H * S * Ev) * width, vscale ? vscale + i * H * S : nullptr};
    }
  }
  if (H <= 0 || Hq % H) return false;
  if (!(ms[0] == 1 || ms[0] == B) || ms[1] != 1 || ms[2] != L || ms[3] != S) return false;
  const int64_t sizes[4] = {B, Hq, L, Ev};
  if (!new_output(4, sizes, ret0, out)) return false;
  const int64_t found[8] = {B, Hq, L, E, H, S, Ev, ms[0]};
  std::memcpy(shape, found, sizeof(found));
  *q = static_cast<const float*>(qp), *m = static_cast<const bool*>(mp);
  return true;
}

// Every attention form: operands checked (attention_operands), then the selected level's kernel over each batch's rows.
AOTITorchError attention(AtenTensorHandle query, const AtenTensorHandle* keys, const AtenTensorHandle* values,
                         const AtenTensorHandle* k_scales, const AtenTensorHandle* v_scales, int64_t count,
                         AtenTensorHandle mask, double scale, AtenTensorHandle* ret0) {
  const KernelTable* kernels = table();
  int64_t shape[8];  // B, Hq, L, E, H, S, Ev, MB
  std::vector<CacheRows> rows;
  const float* q = nullptr;
  const bool* m = nullptr;
  float* out = nullptr;
  if (!kernels || !attention_operands(query, keys, values, k_scales, v_scales, count, mask, shape, rows, &q, &m, ret0, &out))
    return AOTI_TORCH_FAILURE;
  if (shape[0] == 0 || shape[1] == 0 || shape[2] == 0) return AOTI_TORCH_SUCCESS;
  int64_t attended = 0;
  const int64_t n = kernels->attention(q, rows.data(), m, out, shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                                       shape[6], shape[7], static_cast<float>(scale), &attended);
  rows_read.fetch_add(n, std::memory_order_relaxed);
  queries_attended.fetch_add(attended, std::memory_order_relaxed);
  return AOTI_TORCH_SUCCESS;
}

}  // namespace

#define ETSDK_EXPORT extern "C" __attribute__((visibility("default")))

// Makes `kernels` the table every entry point calls (a level library's etsdk_kernels_table()); 0 on success,
// 1 when its ABI is not this library's. Called by etsdk_aoti.kernels between calls, never during one.
ETSDK_EXPORT int32_t etsdk_aoti_select(const KernelTable* kernels) {
  if (!kernels || kernels->abi != etsdk_kernels::kTableAbi) return 1;
  selected.store(kernels, std::memory_order_release);
  return 0;
}

// The selected level's name, or "" before any is selected.
ETSDK_EXPORT const char* etsdk_aoti_level() {
  const KernelTable* kernels = table();
  return kernels ? kernels->level : "";
}

// Key / value rows the attention kernels have read in this process (the sum of n over their calls).
ETSDK_EXPORT int64_t etsdk_attention_rows_read() { return rows_read.load(); }

// Query rows (per head) the attention kernels have computed in this process: a row that repeats the one before it,
// under an equal mask row, is copied instead (a padded prefill chunk's rows).
ETSDK_EXPORT int64_t etsdk_attention_queries_attended() { return queries_attended.load(); }

// Rows of x the linear products (qmm, qmm_a8, linear) have multiplied in this process: trailing zero rows are not.
ETSDK_EXPORT int64_t etsdk_rows_multiplied() { return rows_multiplied.load(); }

ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_qmm(AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales,
                                                     AtenTensorHandle* mins, AtenTensorHandle* bias, int64_t bits,
                                                     int64_t group, AtenTensorHandle* ret0) {
  const KernelTable* kernels = table();
  Weights w;
  const float* xf = nullptr;
  float* y = nullptr;
  int64_t m_rows = 0, k = 0;
  if (!kernels || !input_rows(x, &xf, &m_rows, &k)) return AOTI_TORCH_FAILURE;
  if (!weight_operands(qdata, scales, mins ? *mins : nullptr, bias ? *bias : nullptr, bits, group, w)) return AOTI_TORCH_FAILURE;
  const int64_t sizes[2] = {m_rows, w.n};
  if (w.k != k || !new_output(2, sizes, ret0, &y)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || w.n == 0) return AOTI_TORCH_SUCCESS;
  const int64_t used = rows_in_use(xf, m_rows, k);
  fill_rows(y, used, m_rows, w.n, 0, w.n, w.bias);
  if (used) kernels->qmm(&w, xf, used, y);
  return AOTI_TORCH_SUCCESS;
}

ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_qmm_a8(AtenTensorHandle x, AtenTensorHandle qdata, AtenTensorHandle scales,
                                                        AtenTensorHandle* mins, AtenTensorHandle* bias, int64_t group,
                                                        AtenTensorHandle* ret0) {
  return qmm_a8(x, &qdata, &scales, mins && *mins ? mins : nullptr, bias && *bias ? bias : nullptr, 1, group, ret0);
}

// etsdk_aoti::etsdk_qmm_a8_fused: the :a8 product of several weights that read the same x, as AOTInductor passes
// Tensor[] arguments (a pointer and a length each); mins and bias hold one tensor per weight or none at all.
ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_qmm_a8_fused(AtenTensorHandle x, const AtenTensorHandle* qdata,
                                                              int64_t qdata_len, const AtenTensorHandle* scales,
                                                              int64_t scales_len, const AtenTensorHandle* mins,
                                                              int64_t mins_len, const AtenTensorHandle* bias,
                                                              int64_t bias_len, int64_t group, AtenTensorHandle* ret0) {
  if (scales_len != qdata_len || (mins_len && mins_len != qdata_len) || (bias_len && bias_len != qdata_len)) {
    return AOTI_TORCH_FAILURE;
  }
  return qmm_a8(x, qdata, scales, mins_len ? mins : nullptr, bias_len ? bias : nullptr, qdata_len, group, ret0);
}

ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_linear(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias,
                                                        AtenTensorHandle* ret0) {
  const KernelTable* kernels = table();
  const int32_t f32 = aoti_torch_dtype_float32(), bf16 = aoti_torch_dtype_bfloat16(), f16 = aoti_torch_dtype_float16();
  int64_t *xs = nullptr, *ws = nullptr, *bs = nullptr;
  void *xp = nullptr, *wp = nullptr, *bp = nullptr;
  int32_t w_dtype = 0;
  if (!kernels || !weight || aoti_torch_get_dtype(weight, &w_dtype) || (w_dtype != f32 && w_dtype != bf16 && w_dtype != f16)) {
    return AOTI_TORCH_FAILURE;
  }
  if (!contiguous_tensor(x, 2, f32, &xs, &xp) || !contiguous_tensor(weight, 2, w_dtype, &ws, &wp)) return AOTI_TORCH_FAILURE;
  const int64_t m_rows = xs[0], k = xs[1], n = ws[0];
  if (ws[1] != k) return AOTI_TORCH_FAILURE;
  if (bias && *bias && (!contiguous_tensor(*bias, 1, f32, &bs, &bp) || bs[0] != n)) return AOTI_TORCH_FAILURE;
  const int64_t sizes[2] = {m_rows, n};
  float* y = nullptr;
  if (!new_output(2, sizes, ret0, &y)) return AOTI_TORCH_FAILURE;
  if (m_rows == 0 || n == 0) return AOTI_TORCH_SUCCESS;
  const FloatWeight kind = w_dtype == bf16 ? FloatWeight::kBfloat16 : w_dtype == f16 ? FloatWeight::kFloat16 : FloatWeight::kFloat32;
  const int64_t used = rows_in_use(static_cast<const float*>(xp), m_rows, k);
  fill_rows(y, used, m_rows, n, 0, n, static_cast<const float*>(bp));
  if (used) kernels->linear(static_cast<const float*>(xp), wp, kind, static_cast<const float*>(bp), y, used, n, k);
  return AOTI_TORCH_SUCCESS;
}

ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_attention(AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value,
                                                           AtenTensorHandle mask, double scale, AtenTensorHandle* ret0) {
  return attention(query, &key, &value, nullptr, nullptr, 1, mask, scale, ret0);
}

ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_attention_int8(AtenTensorHandle query, AtenTensorHandle key,
                                                                AtenTensorHandle key_scale, AtenTensorHandle value,
                                                                AtenTensorHandle value_scale, AtenTensorHandle mask,
                                                                double scale, AtenTensorHandle* ret0) {
  return attention(query, &key, &value, &key_scale, &value_scale, 1, mask, scale, ret0);
}

// etsdk_aoti::etsdk_attention_slots: row b of the query over session b's own caches (keys[b], values[b]: [1, H, S, E]
// each; int8 ones with key_scales[b] / value_scales[b], float32 ones with empty scale lists), one kernel call for all.
ETSDK_EXPORT AOTITorchError aoti_torch_cpu_etsdk_attention_slots(
    AtenTensorHandle query, const AtenTensorHandle* keys, int64_t keys_len_, const AtenTensorHandle* values,
    int64_t values_len_, AtenTensorHandle mask, double scale, const AtenTensorHandle* key_scales, int64_t key_scales_len_,
    const AtenTensorHandle* value_scales, int64_t value_scales_len_, AtenTensorHandle* ret0) {
  const bool int8 = key_scales_len_ > 0;
  if (keys_len_ != values_len_ || key_scales_len_ != value_scales_len_ || (int8 && key_scales_len_ != keys_len_))
    return AOTI_TORCH_FAILURE;
  return attention(query, keys, values, int8 ? key_scales : nullptr, int8 ? value_scales : nullptr, keys_len_, mask, scale, ret0);
}
