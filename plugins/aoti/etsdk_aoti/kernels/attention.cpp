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
// not S. Work is split over (batch, key / value head, chunk of 256 rows) with OpenMP (torch's runtime, as the
// other kernels), the chunks of each query row combined after (flash-decoding's split). With AVX-512 and heads of
// 64 or 128 values, a task reads each key / value row once for all the query rows that see it (the group of a
// grouped-query model): int8 rows are widened once, not once per query head, which is what makes an int8 cache
// cheaper to attend over than a float32 one, not only smaller.
// Every tensor is checked (dtype, rank, sizes, contiguity) and a mismatch fails the call; a query
// row that sees nothing gets zeros (the exporters never make one).

#include "aoti_shim.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

// exp(x) for x <= 0 in a form the compiler vectorizes (std::exp does not): 2^(x log2 e) split into an integer
// power of two, built in the exponent bits, and a degree-6 polynomial for 2^f, f in [0, 1) (relative error
// about 1e-7, as expf's). Below -87 (under float's normal range) it is 0, so a masked score (-inf) weighs 0.
#pragma omp declare simd
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.f) * 1.4426950408889634f;
  const float whole = std::floor(t);
  const float f = t - whole;
  float p = 2.1702154e-4f;  // a minimax fit of 2^f on [0, 1): relative error 1.1e-7 evaluated in float32
  p = p * f + 1.2439680e-3f;
  p = p * f + 9.6788472e-3f;
  p = p * f + 5.5483337e-2f;
  p = p * f + 2.4022985e-1f;
  p = p * f + 6.9314700e-1f;
  p = p * f + 1.f;
  const int32_t bits = (static_cast<int32_t>(whole) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.f ? 0.f : p * scale;
}

// Key / value rows as stored: float32, or int8 with a float32 scale per row (scale == nullptr: float rows).
template <typename T>
struct Rows {
  const T* data;
  const float* scale;
  float row_scale(int64_t row) const { return scale ? scale[row] : 1.f; }
};

#if defined(__AVX512F__)
// 16 values of a row as floats (int8 rows widened in registers)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#endif

// q . row for a head of D values, q already in registers (AVX-512) or memory.
template <typename T, int64_t D>
inline float dot_fixed(const float* q, const T* row) {
#if defined(__AVX512F__)
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (int64_t c = 0; c < D / 16; c += 2) {
    a = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), load16(row + 16 * c), a);
    b = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c + 16), load16(row + 16 * c + 16), b);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
#else
  float x = 0.f;
#pragma omp simd reduction(+ : x)
  for (int64_t e = 0; e < D; ++e) x += q[e] * static_cast<float>(row[e]);
  return x;
#endif
}

#if defined(__AVX512F__)
// [sum(v[0]), sum(v[1]), ..., sum(v[15])]: sixteen horizontal sums in 45 shuffles and adds (one sum alone takes
// about 10), so a block of rows pays a fraction of a reduction each.
inline __m512 reduce16(const __m512* v) {
  __m512 s[8], u[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] of a = v[2i], b = v[2i+1]
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per block: the block's sums of v[4i .. 4i+3]
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// scores[j] = q . rows[j] for count rows of a head of D values.
template <typename T, int64_t D>
inline void dots_fixed(const float* q, const T* rows, int64_t count, float* scores) {
  int64_t j = 0;
#if defined(__AVX512F__)
  __m512 qv[D / 16];
  for (int64_t c = 0; c < D / 16; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  for (; j + 16 <= count; j += 16) {
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) {
      const T* row = rows + (j + r) * D;
      __m512 a = _mm512_mul_ps(qv[0], load16(row));
      for (int64_t c = 1; c < D / 16; ++c) a = _mm512_fmadd_ps(qv[c], load16(row + 16 * c), a);
      acc[r] = a;
    }
    _mm512_storeu_ps(scores + j, reduce16(acc));
  }
#endif
  for (; j < count; ++j) scores[j] = dot_fixed<T, D>(q, rows + j * D);
}

// out[0 .. D) = sum over rows j of w[j] * rows[j] (w already scaled): the path of builds without AVX-512.
template <typename T, int64_t D>
inline void weighted_sum_fixed(const float* w, const T* rows, int64_t count, float* out) {
  for (int64_t e = 0; e < D; ++e) out[e] = 0.f;
  for (int64_t j = 0; j < count; ++j)
    for (int64_t e = 0; e < D; ++e) out[e] += w[j] * static_cast<float>(rows[j * D + e]);
}

#if defined(__AVX512F__)
// exp(x) for x <= 0, sixteen at a time: exp_nonpositive's arithmetic in registers (the compiler does not vectorize
// that loop: the float -> int conversion and the bit cast stop it). NaN stays NaN.
inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(_mm512_set1_ps(-87.f), x), _mm512_set1_ps(1.4426950408889634f));
  const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, whole);
  __m512 p = _mm512_set1_ps(2.1702154e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.2439680e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6788472e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5483337e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022985e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314700e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(whole), _mm512_set1_epi32(127)), 23);
  const __m512 r = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_LT_OQ), _mm512_setzero_ps());
}

// The first `count` of sixteen lanes.
inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// How far ahead (rows) a task asks for its key / value rows.
constexpr int64_t kAhead = 48;

// Asks for int8 rows [0, count) of D values to be brought into the cache ahead of their use: a task's chunk is a
// short stream, and int8 rows are consumed faster than the hardware prefetcher brings them (30 layers over 6000
// rows: 7.8 -> 6.6 ms per step). Float rows are left to the hardware prefetcher: asking for them too was slower.
template <typename T, int64_t D>
inline void prefetch_rows(const T* rows, int64_t count) {
  if (sizeof(T) != 1) return;
  const char* first = reinterpret_cast<const char*>(rows);
  for (int64_t byte = 0; byte < count * D * static_cast<int64_t>(sizeof(T)); byte += 64)
    _mm_prefetch(first + byte, _MM_HINT_T0);
}

// Rows [0, count) as float32 rows of D values: float rows as they are; int8 rows widened into `buffer` (count <= 16:
// 4 or 8 KiB, which stays in the L1 while every query row of the group reads it).
template <int64_t D>
inline const float* widened(const float* rows, int64_t, float*) {
  return rows;
}
template <int64_t D>
inline const float* widened(const int8_t* rows, int64_t count, float* buffer) {
  for (int64_t i = 0; i < count * D; i += 16) _mm512_store_ps(buffer + i, load16(rows + i));
  return buffer;
}

// out[i][0 .. D) += sum over rows j of w[i][j] * rows[j] for N query rows i at once: each row is loaded (an int8 row
// widened) once for all N, and their outputs stay in registers (N * D / 16 of them: 16 for N = 4, D = 64).
template <typename T, int64_t D, int N>
inline void weighted_sums(const float* const* w, const T* rows, int64_t count, float* const* out) {
  __m512 acc[N][D / 16];
  for (int i = 0; i < N; ++i)
    for (int64_t c = 0; c < D / 16; ++c) acc[i][c] = _mm512_loadu_ps(out[i] + 16 * c);
  for (int64_t j = 0; j < count; ++j) {
    if (j + kAhead < count) prefetch_rows<T, D>(rows + (j + kAhead) * D, 1);
    __m512 x[D / 16];
    for (int64_t c = 0; c < D / 16; ++c) x[c] = load16(rows + j * D + 16 * c);
    for (int i = 0; i < N; ++i) {
      const __m512 wj = _mm512_set1_ps(w[i][j]);
      for (int64_t c = 0; c < D / 16; ++c) acc[i][c] = _mm512_fmadd_ps(wj, x[c], acc[i][c]);
    }
  }
  for (int i = 0; i < N; ++i)
    for (int64_t c = 0; c < D / 16; ++c) _mm512_storeu_ps(out[i] + 16 * c, acc[i][c]);
}

// Query rows weighted_sums takes at once: their outputs fill 16 registers.
template <int64_t D>
constexpr int kSums = D == 64 ? 4 : 2;

// Query rows a task takes together: their scores (kQueries x kChunk floats, 16 KiB) stay in the L1 / L2.
constexpr int64_t kQueries = 16;
#endif

// Rows per task: a chunk's key and value rows stay in the core's cache while every query head of the group
// reads them, and a long conversation splits into many tasks however few heads the model has.
constexpr int64_t kChunk = 256;

#if defined(__AVX512F__)
// One task of attend() for a head size D fixed at compile time: its chunk of key / value rows is read in blocks of
// 16 rows, each block once (int8 rows widened once) for up to kQueries query rows at a time, not once per query row
// (a decode step of a model with grouped heads has group query rows per key / value head). Writes the partial
// softmax of every query row (its maximum, its sum of exp, its unnormalised output) into the task's slots.
template <typename T, int64_t D>
void chunk_blocked(const float* q, Rows<T> k, Rows<T> v, const bool* m, float* part_max, float* part_sum,
                   float* part_out, float* scores, float* widen, int64_t task, int64_t b, int64_t hk, int64_t first,
                   int64_t rows, int64_t head, int64_t group, int64_t queries, int64_t Hq, int64_t L, int64_t S,
                   int64_t MB, float s) {
  const float* kscale = k.scale ? k.scale + head + first : nullptr;
  const float* vscale = v.scale ? v.scale + head + first : nullptr;
  for (int64_t q0 = 0; q0 < queries; q0 += kQueries) {
    const int64_t nq = std::min(kQueries, queries - q0);
    auto query_row = [&](int64_t i) {
      const int64_t query = q0 + i, h = hk * group + query / L, l = query % L;
      return q + ((b * Hq + h) * L + l) * D;
    };
    // scores of every query row against the chunk
    for (int64_t j = 0; j < rows; j += 16) {
      const int64_t count = std::min<int64_t>(16, rows - j);
      const int64_t ahead = std::min<int64_t>(16, std::max<int64_t>(0, rows - j - kAhead));
      prefetch_rows<T, D>(k.data + (head + first + j + kAhead) * D, ahead);
      const float* block = widened<D>(k.data + (head + first + j) * D, count, widen);
      for (int64_t i = 0; i < nq; ++i) dots_fixed<float, D>(query_row(i), block, count, scores + i * kChunk + j);
    }
    // per query row: scaled, masked, its maximum, then exp and sum; the weights carry the value rows' scales
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t query = q0 + i, l = query % L;
      const size_t slot = static_cast<size_t>(task * queries + query);
      const bool* mr = m + ((MB == 1 ? 0 : b) * L + l) * S + first;
      float* sc = scores + i * kChunk;
      float* o = part_out + slot * D;
      for (int64_t e = 0; e < D; e += 16) _mm512_storeu_ps(o + e, _mm512_setzero_ps());
      __m512 best = _mm512_set1_ps(-INFINITY);
      for (int64_t j = 0; j < rows; j += 16) {
        const __mmask16 in = lanes(rows - j);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, sc + j), _mm512_set1_ps(s));
        if (kscale) x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(in, kscale + j));
        const __m128i visible = _mm_maskz_loadu_epi8(in, mr + j);
        // a masked row weighs nothing, whatever it holds
        x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), _mm_test_epi8_mask(visible, visible) & in, x);
        _mm512_mask_storeu_ps(sc + j, in, x);
        best = _mm512_max_ps(best, x);
      }
      const float top = _mm512_reduce_max_ps(best);
      part_max[slot] = top;
      part_sum[slot] = 0.f;
      if (top == -INFINITY) {  // sees nothing in this chunk: weighs nothing (its output stays zero)
        for (int64_t j = 0; j < rows; j += 16) _mm512_mask_storeu_ps(sc + j, lanes(rows - j), _mm512_setzero_ps());
        continue;
      }
      __m512 total = _mm512_setzero_ps();
      for (int64_t j = 0; j < rows; j += 16) {
        const __mmask16 in = lanes(rows - j);
        const __m512 e = _mm512_maskz_mov_ps(in, exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, sc + j), _mm512_set1_ps(top))));
        total = _mm512_add_ps(total, e);
        _mm512_mask_storeu_ps(sc + j, in, vscale ? _mm512_mul_ps(e, _mm512_maskz_loadu_ps(in, vscale + j)) : e);
      }
      part_sum[slot] = _mm512_reduce_add_ps(total);
    }
    // the weighted sum of the value rows, each row read once for every kSums query rows
    const T* value_rows = v.data + (head + first) * D;
    for (int64_t i = 0; i < nq; i += kSums<D>) {
      const float* w[kSums<D>];
      float* o[kSums<D>];
      const int n = static_cast<int>(std::min<int64_t>(kSums<D>, nq - i));
      for (int t = 0; t < n; ++t) {
        w[t] = scores + (i + t) * kChunk;
        o[t] = part_out + static_cast<size_t>(task * queries + q0 + i + t) * D;
      }
      switch (n) {
        case 4: weighted_sums<T, D, 4>(w, value_rows, rows, o); break;
        case 3: weighted_sums<T, D, 3>(w, value_rows, rows, o); break;
        case 2: weighted_sums<T, D, 2>(w, value_rows, rows, o); break;
        default: weighted_sums<T, D, 1>(w, value_rows, rows, o); break;
      }
    }
  }
}
#endif

// The attention itself, shared by both forms: q [B, Hq, L, E], mask [MB, 1, L, S], out [B, Hq, L, Ev].
// Each task takes one key / value head and a chunk of its rows, and for every query row of the heads that read
// it computes a partial softmax (its maximum, its sum, its unnormalised output); a second pass combines the
// chunks of each query row (as flash-decoding does).
// D: the head size when it is known at compile time (64, 128: E == Ev == D; the dot products unroll and a query
// row's output stays in registers), 0 otherwise.
template <typename T, int64_t D>
void attend(const float* q, Rows<T> k, Rows<T> v, const bool* m, float* out, int64_t B, int64_t Hq, int64_t L,
            int64_t E_, int64_t H, int64_t S, int64_t Ev_, int64_t MB, float s) {
  const int64_t E = D ? D : E_, Ev = D ? D : Ev_;
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
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
  const int64_t queries = group * L;  // query rows reading one key / value head
  // per (b, hk, chunk, query row): the chunk's maximum score, its sum of exp, its unnormalised output
  std::vector<float> part_max(static_cast<size_t>(B * H * chunks * queries));
  std::vector<float> part_sum(part_max.size());
  std::vector<float> part_out(part_max.size() * static_cast<size_t>(Ev));

#pragma omp parallel
  {
#if defined(__AVX512F__)
    std::vector<float> scores(static_cast<size_t>(kQueries * kChunk));
    alignas(64) float widen[16 * (D > 0 ? D : 16)];  // a block of int8 rows as floats
#else
    std::vector<float> scores(static_cast<size_t>(kChunk));
#endif
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * H * chunks; ++task) {
      const int64_t c = task % chunks, bhk = task / chunks, b = bhk / H, hk = bhk % H;
      const int64_t first = c * kChunk, rows = std::min(n, first + kChunk) - first;
      const int64_t head = (b * H + hk) * S;  // first row of this key / value head
#if defined(__AVX512F__)
      if constexpr (D > 0) {
        chunk_blocked<T, D>(q, k, v, m, part_max.data(), part_sum.data(), part_out.data(), scores.data(), widen,
                            task, b, hk, first, rows, head, group, queries, Hq, L, S, MB, s);
        continue;
      }
#endif
      for (int64_t query = 0; query < queries; ++query) {
        const int64_t h = hk * group + query / L, l = query % L;
        const float* qr = q + ((b * Hq + h) * L + l) * E;
        const bool* mr = m + ((MB == 1 ? 0 : b) * L + l) * S + first;
        const size_t slot = static_cast<size_t>(task * queries + query);
        float* o = part_out.data() + slot * Ev;
        if constexpr (D > 0) {
          dots_fixed<T, D>(qr, k.data + (head + first) * D, rows, scores.data());
        } else {
          for (int64_t j = 0; j < rows; ++j) scores[j] = dot(qr, k.data + (head + first + j) * E, E);
        }
        if (k.scale) {
#pragma omp simd
          for (int64_t j = 0; j < rows; ++j) scores[j] *= k.scale[head + first + j];
        }
        float best = -INFINITY;
#pragma omp simd reduction(max : best)
        for (int64_t j = 0; j < rows; ++j) {
          scores[j] = mr[j] ? scores[j] * s : -INFINITY;  // a masked row weighs nothing, whatever it holds
          best = std::max(best, scores[j]);
        }
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] = 0.f;
        part_max[slot] = best;
        part_sum[slot] = 0.f;
        if (best == -INFINITY) continue;  // sees nothing in this chunk
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < rows; ++j) {
          scores[j] = exp_nonpositive(scores[j] - best);
          total += scores[j];
        }
        part_sum[slot] = total;
        if constexpr (D > 0) {
          if (v.scale) {
#pragma omp simd
            for (int64_t j = 0; j < rows; ++j) scores[j] *= v.scale[head + first + j];
          }
          weighted_sum_fixed<T, D>(scores.data(), v.data + (head + first) * D, rows, o);
        } else {
          for (int64_t j = 0; j < rows; ++j) {
            if (scores[j] == 0.f) continue;
            const float w = scores[j] * v.row_scale(head + first + j);
            const T* vr = v.data + (head + first + j) * Ev;
#pragma omp simd
            for (int64_t e = 0; e < Ev; ++e) o[e] += w * static_cast<float>(vr[e]);
          }
        }
      }
    }
    // combine the chunks of each query row: softmax over all of them is each chunk's share rescaled to the maximum
#pragma omp for schedule(static)
    for (int64_t bq = 0; bq < B * H * queries; ++bq) {
      const int64_t bhk = bq / queries, query = bq % queries, b = bhk / H, hk = bhk % H;
      const int64_t h = hk * group + query / L, l = query % L;
      float* o = out + ((b * Hq + h) * L + l) * Ev;
      float best = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) best = std::max(best, part_max[static_cast<size_t>((bhk * chunks + c) * queries + query)]);
#pragma omp simd
      for (int64_t e = 0; e < Ev; ++e) o[e] = 0.f;
      if (best == -INFINITY) continue;  // sees nothing: zeros
      float total = 0.f;
      for (int64_t c = 0; c < chunks; ++c) {
        const size_t slot = static_cast<size_t>((bhk * chunks + c) * queries + query);
        if (part_max[slot] == -INFINITY) continue;
        const float weight = std::exp(part_max[slot] - best);
        total += weight * part_sum[slot];
        const float* po = part_out.data() + slot * Ev;
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] += weight * po[e];
      }
      const float inv = 1.f / total;
#pragma omp simd
      for (int64_t e = 0; e < Ev; ++e) o[e] *= inv;
    }
  }
}

// attend() with the head size fixed at compile time where it is a common one.
template <typename T>
void dispatch(const float* q, Rows<T> k, Rows<T> v, const bool* m, float* out, int64_t B, int64_t Hq, int64_t L,
              int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float s) {
  if (E == 64 && Ev == 64) return attend<T, 64>(q, k, v, m, out, B, Hq, L, E, H, S, Ev, MB, s);
  if (E == 128 && Ev == 128) return attend<T, 128>(q, k, v, m, out, B, Hq, L, E, H, S, Ev, MB, s);
  attend<T, 0>(q, k, v, m, out, B, Hq, L, E, H, S, Ev, MB, s);
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
  dispatch<float>(static_cast<const float*>(qp), {static_cast<const float*>(kp), nullptr},
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
  dispatch<int8_t>(static_cast<const float*>(qp), {static_cast<const int8_t*>(kp), kscale},
                 {static_cast<const int8_t*>(vp), vscale}, static_cast<const bool*>(mp), out, qs[0], qs[1], qs[2],
                 qs[3], ks[1], ks[2], vs[3], ms[0], static_cast<float>(scale));
  return AOTI_TORCH_SUCCESS;
}
