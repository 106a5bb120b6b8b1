// etsdk-aoti kernels: attention under a boolean mask that reads only the key / value rows some query sees, at every
// instruction-set level (vec.h).
//
// Meaning: scaled_dot_product_attention(q, k, v, attn_mask=mask, scale) with grouped-query heads:
//
//   query float32 [B, Hq, L, E], key [B, H, S, E], value [B, H, S, Ev],
//   mask bool [B or 1, 1, L, S] (true: visible), Hq a multiple of H  ->  out float32 [B, Hq, L, Ev]
//
// Key and value rows are float32, or int8 with a float32 scale per row (k_scale / v_scale [B, H, S]: row j of head h
// stands for key[j] * k_scale[j]): an int8 cache is a quarter of the bytes, widened in registers. Called through the
// level table (table.h: attention) by aoti_torch_cpu_etsdk_attention, aoti_torch_cpu_etsdk_attention_int8 and
// aoti_torch_cpu_etsdk_attention_slots (entry.cpp), which checked the operands, allocated the output and count the
// rows read (the sum of n_b returned here). The table takes each batch's rows on their own (CacheRows): one tensor's
// batches, or the slots form's sessions, each its own cache tensor [1, H, S, E] (a batched decode step of several
// conversations: one call, one parallel region for all of them, not one per session).
//
// Why: batch b reads only rows 0 .. n_b-1 of its key and value, n_b being one past the last column any of its query
// rows sees: an LLM's decode step over a static cache of S rows costs what the conversation holds, not S.
//
// How the work is split: over (batch, key / value head, chunk of kChunk = 256 rows) with OpenMP (torch's runtime, as
// the other kernels), the chunks of each query row combined after (flash-decoding's split). For heads of 64 or 128
// values (chunk_blocked, every level) a task reads each key / value row once for all the query rows that see it (the
// group of a grouped-query model, times L): int8 rows are widened once, not once per query head, which is what makes
// an int8 cache cheaper to attend over than a float32 one, not only smaller. Its register blocking follows
// vec::kRegisters: with AVX-512's 32 registers a value row is summed whole into 4 (64 values) or 2 (128) query rows'
// outputs at once; with 8 (AVX2, NEON, portable) 32 values of it at a time into 3 query rows' outputs. Other head
// sizes (chunk_general) take one query row at a time.
// A masked row weighs nothing, whatever its key or value holds (inf and NaN too); a query row that sees nothing gets
// zeros (the exporters never make one).
//
// Repeated query rows: a query row equal to the row before it (same head; value by value, so +0 matches -0), under a
// mask row equal to the one before it, has that row's output, so it is copied, not computed (the exact result, not an
// approximation). A padded prefill chunk is made of such rows where the query projection has no bias (Llama,
// Mistral, SmolLM): etsdk-hf-static zeroes a padded row's input to every linear layer and gives it the last real
// row's mask, so its query rows are zeros and a 38-token chunk of 64 rows attends 39 rows, not 64. With a bias
// (Qwen2) the rotary embedding turns it into another vector at each position: nothing repeats, nothing is copied.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "table.h"
#include "vec.h"

namespace etsdk_kernels {
namespace {

using vec::F;

// Key / value rows as stored: float32, or int8 with a float32 scale per row (scale == nullptr: float rows).
template <typename T>
struct Rows {
  const T* data;
  const float* scale;
};

// Rows per task: a chunk's key and value rows stay in the core's cache while every query head of the group reads
// them, and a long conversation splits into many tasks however few heads the model has. A multiple of 16.
constexpr int64_t kChunk = 256;

// Query rows chunk_blocked takes together: their scores (kQueries x kChunk floats, 16 KiB) stay in the L1 / L2.
constexpr int64_t kQueries = 16;

// How far ahead (rows) a task asks for its int8 key / value rows.
constexpr int64_t kAhead = 48;

// weighted_sums' register blocking for heads of D values: kSums query rows at a time, their outputs kSlab vectors
// (16 values each) wide; kSums * kSlab accumulators and kSlab loaded value vectors stay in registers. With 32
// registers: whole rows, 4 x 4 (D = 64) or 2 x 8 (D = 128) accumulators; with 8: 3 x 2.
template <int64_t D>
constexpr int kSlab = vec::kRegisters >= 32 ? static_cast<int>(D / 16) : 2;
template <int64_t D>
constexpr int kSums = vec::kRegisters >= 32 ? (D == 64 ? 4 : 2) : 3;

// Asks for int8 rows [0, count) of D values to be brought into the cache ahead of their use: a task's chunk is a
// short stream, and int8 rows are consumed faster than the hardware prefetcher brings them (30 layers over 6000
// rows: 7.8 -> 6.6 ms per step). Float rows are left to the hardware prefetcher: asking for them too was slower.
template <typename T, int64_t D>
inline void prefetch_rows(const T* rows, int64_t count) {
  if (sizeof(T) != 1) return;
  const char* first = reinterpret_cast<const char*>(rows);
  for (int64_t byte = 0; byte < count * D; byte += 64) vec::prefetch(first + byte);
}

// Rows [0, count) as float32 rows of D values: float rows as they are; int8 rows widened into `buffer` (count <= 16:
// 4 or 8 KiB, which stays in the L1 while every query row of the group reads it).
template <int64_t D>
inline const float* widened(const float* rows, int64_t, float*) {
  return rows;
}
template <int64_t D>
inline const float* widened(const int8_t* rows, int64_t count, float* buffer) {
  for (int64_t i = 0; i < count * D; i += 16) vec::store(buffer + i, vec::load(rows + i));
  return buffer;
}

// Sixteen lanes whose sum is q . row for a row of E values: D > 0, E == D fixed at compile time and q in registers
// (qv); D == 0, any E, q read from memory.
template <int64_t D, typename T>
inline F dot(const F* qv, const float* q, const T* row, int64_t E) {
  if constexpr (D > 0) {
    F a = vec::mul(qv[0], vec::load(row));
    for (int64_t c = 1; c < D / 16; ++c) a = vec::fma(qv[c], vec::load(row + 16 * c), a);
    return a;
  } else {
    F a = vec::zero();
    int64_t e = 0;
    for (; e + 16 <= E; e += 16) a = vec::fma(vec::load(q + e), vec::load(row + e), a);
    if (e < E) a = vec::fma(vec::load_first(q + e, E - e), vec::load_first(row + e, E - e), a);
    return a;
  }
}

// scores[j] = q . rows[j] for count rows of E values (D: E fixed at compile time, or 0), sixteen rows at a time: one
// reduce16 takes their sixteen horizontal sums (one alone takes about 10 shuffles and adds), then one row at a time.
template <typename T, int64_t D>
inline void dots(const float* q, const T* rows, int64_t count, int64_t E, float* scores) {
  F qv[D > 0 ? D / 16 : 1];  // a fixed-size query row stays in registers
  if constexpr (D > 0)
    for (int64_t c = 0; c < D / 16; ++c) qv[c] = vec::load(q + 16 * c);
  const int64_t stride = D > 0 ? D : E;
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    F acc[16];
    // unrolled, the accumulators stay in registers where there are enough (GCC left this loop rolled for float rows,
    // its accumulators going through memory: 3 to 5 % slower at AVX-512); clang takes the pragma too
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = dot<D>(qv, q, rows + (j + r) * stride, E);
    vec::store(scores + j, vec::reduce16(acc));
  }
  for (; j < count; ++j) scores[j] = vec::reduce_add(dot<D>(qv, q, rows + j * stride, E));
}

// One query row's softmax share of a chunk, from its raw scores sc[0 .. rows) (q . key row): scaled by s and the key
// rows' scales, masked (a masked row scores -inf whatever it holds), less their maximum, exponentiated. sc then holds
// the weights, times the value rows' scales (0 for masked rows and past rows, up to the block of sixteen). Writes
// the maximum (-inf: the row sees nothing in the chunk, every weight 0) and the sum of the exponentials.
inline void soften(float* sc, int64_t rows, float s, const float* kscale, const float* vscale, const bool* mr,
                   float* top_out, float* total_out) {
  const F scale = vec::set1(s);
  F best = vec::set1(-INFINITY);
  for (int64_t j = 0; j < rows; j += 16) {  // sc has whole blocks of sixteen: lanes past rows read and written
    F x = vec::mul(vec::load(sc + j), scale);
    if (kscale) x = vec::mul(x, vec::load_first(kscale + j, rows - j));
    x = vec::visible_or(mr + j, rows - j, x, -INFINITY);
    vec::store(sc + j, x);
    best = vec::max(best, x);
  }
  const float top = vec::reduce_max(best);
  *top_out = top;
  *total_out = 0.f;
  if (top == -INFINITY) {  // sees nothing in this chunk: weighs nothing (its output stays zero)
    for (int64_t j = 0; j < rows; j += 16) vec::store(sc + j, vec::zero());
    return;
  }
  const F shift = vec::set1(top);
  F total = vec::zero();
  for (int64_t j = 0; j < rows; j += 16) {
    const F e = vec::exp_nonpositive(vec::sub(vec::load(sc + j), shift));  // -inf (masked, past rows): 0
    total = vec::add(total, e);
    if (vscale) {  // a masked row weighs 0 whatever its value scale holds (0 * inf, 0 * NaN are NaN)
      vec::store(sc + j, vec::visible_or(mr + j, rows - j, vec::mul(e, vec::load_first(vscale + j, rows - j)), 0.f));
    } else {
      vec::store(sc + j, e);
    }
  }
  *total_out = vec::reduce_add(total);
}

// out[i][0 .. D) += sum over rows j of w[i][j] * rows[j] for N query rows i at once: each row is loaded (an int8 row
// widened) once for all N, their outputs kept in registers kSlab vectors at a time. kEvery: every row has a weight
// for each of the N (no row is masked for any); otherwise a zero weight is skipped, so that a masked row adds
// nothing even when it holds inf or NaN.
template <typename T, int64_t D, int N, bool kEvery>
inline void weighted_sums(const float* const* w, const T* rows, int64_t count, float* const* out) {
  constexpr int C = kSlab<D>;
  static_assert(N <= kSums<D> && kSums<D> * C + C <= vec::kRegisters, "weighted_sums' block exceeds the registers");
  for (int64_t s = 0; s < D; s += 16 * C) {
    F acc[N][C];
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) acc[i][c] = vec::load(out[i] + s + 16 * c);
    for (int64_t j = 0; j < count; ++j) {
      if (s == 0 && j + kAhead < count) prefetch_rows<T, D>(rows + (j + kAhead) * D, 1);
      F x[C];
      for (int c = 0; c < C; ++c) x[c] = vec::load(rows + j * D + s + 16 * c);
      for (int i = 0; i < N; ++i) {
        if (!kEvery && w[i][j] == 0.f) continue;
        const F wj = vec::set1(w[i][j]);
        for (int c = 0; c < C; ++c) acc[i][c] = vec::fma(wj, x[c], acc[i][c]);
      }
    }
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) vec::store(out[i] + s + 16 * c, acc[i][c]);
  }
}

// weighted_sums for n <= kSums<D> query rows (n known at run time).
template <typename T, int64_t D, bool kEvery, int N = kSums<D>>
inline void weighted_sums_n(int n, const float* const* w, const T* rows, int64_t count, float* const* out) {
  if constexpr (N > 1) {
    if (n < N) return weighted_sums_n<T, D, kEvery, N - 1>(n, w, rows, count, out);
  }
  weighted_sums<T, D, N, kEvery>(w, rows, count, out);
}

// Where a task's work goes and what it reads: the task's chunk of one key / value head, for the query rows of that
// head's group that are computed (live[0 .. count), of the group's rows 0 .. queries: head hk * group + query / L,
// position query % L; the others repeat the row before them).
struct Task {
  int64_t index, b, hk, first, rows, head;  // head: the first row of this key / value head in batch b's rows, scales
  int64_t group, queries, Hq, L, S, MB;
  float s;
  const int64_t* live;
  int64_t count;
};

// One task for heads of D values (64, 128): its chunk of key / value rows is read in blocks of 16 rows, each block
// once (int8 rows widened once) for up to kQueries query rows at a time, not once per query row. Writes the partial
// softmax of every query row (its maximum, its sum of exp, its unnormalised output) into the task's slots.
template <typename T, int64_t D>
void chunk_blocked(const Task& t, const float* q, Rows<T> k, Rows<T> v, const bool* m, float* part_max, float* part_sum,
                   float* part_out, float* scores) {
  alignas(64) float wide[16 * D];  // a block of int8 rows as floats
  const float* kscale = k.scale ? k.scale + t.head + t.first : nullptr;
  const float* vscale = v.scale ? v.scale + t.head + t.first : nullptr;
  for (int64_t q0 = 0; q0 < t.count; q0 += kQueries) {
    const int64_t nq = std::min(kQueries, t.count - q0);
    // scores of every query row against the chunk
    for (int64_t j = 0; j < t.rows; j += 16) {
      const int64_t count = std::min<int64_t>(16, t.rows - j);
      const int64_t ahead = std::min<int64_t>(16, t.rows - j - kAhead);
      if (ahead > 0) prefetch_rows<T, D>(k.data + (t.head + t.first + j + kAhead) * D, ahead);
      const float* block = widened<D>(k.data + (t.head + t.first + j) * D, count, wide);
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t query = t.live[q0 + i], h = t.hk * t.group + query / t.L, l = query % t.L;
        dots<float, D>(q + ((t.b * t.Hq + h) * t.L + l) * D, block, count, D, scores + i * kChunk + j);
      }
    }
    // per query row: its softmax share; the weights carry the value rows' scales
    bool every[kQueries];  // the query row sees every row of the chunk
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t query = t.live[q0 + i], l = query % t.L;
      const size_t slot = static_cast<size_t>(t.index * t.queries + query);
      const bool* mr = m + ((t.MB == 1 ? 0 : t.b) * t.L + l) * t.S + t.first;
      for (int64_t e = 0; e < D; e += 16) vec::store(part_out + slot * D + e, vec::zero());
      soften(scores + i * kChunk, t.rows, t.s, kscale, vscale, mr, part_max + slot, part_sum + slot);
      every[i] = std::memchr(mr, 0, static_cast<size_t>(t.rows)) == nullptr;
    }
    // the weighted sum of the value rows, each row read once for every kSums query rows
    const T* value_rows = v.data + (t.head + t.first) * D;
    for (int64_t i = 0; i < nq; i += kSums<D>) {
      const float* w[kSums<D>];
      float* o[kSums<D>];
      const int n = static_cast<int>(std::min<int64_t>(kSums<D>, nq - i));
      bool all = true;
      for (int u = 0; u < n; ++u) {
        w[u] = scores + (i + u) * kChunk;
        o[u] = part_out + static_cast<size_t>(t.index * t.queries + t.live[q0 + i + u]) * D;
        all = all && every[i + u];
      }
      if (all) {
        weighted_sums_n<T, D, true>(n, w, value_rows, t.rows, o);
      } else {
        weighted_sums_n<T, D, false>(n, w, value_rows, t.rows, o);
      }
    }
  }
}

// out[0 .. Ev) = sum over rows j of w[j] * rows[j] for rows of any size, kWide vectors of outputs at a time; a zero
// weight is skipped (a masked row adds nothing, whatever it holds).
template <typename T>
inline void weighted_sum(const float* w, const T* rows, int64_t count, int64_t Ev, float* out) {
  constexpr int kWide = 4;
  for (int64_t e0 = 0; e0 < Ev; e0 += 16 * kWide) {
    const int64_t width = std::min<int64_t>(16 * kWide, Ev - e0);
    F acc[kWide];
    for (int c = 0; c < kWide; ++c) acc[c] = vec::zero();
    for (int64_t j = 0; j < count; ++j) {
      if (w[j] == 0.f) continue;
      const F wj = vec::set1(w[j]);
      const T* row = rows + j * Ev + e0;
      for (int c = 0; c < kWide; ++c) {
        const int64_t left = width - 16 * c;
        if (left >= 16) {
          acc[c] = vec::fma(wj, vec::load(row + 16 * c), acc[c]);
        } else if (left > 0) {
          acc[c] = vec::fma(wj, vec::load_first(row + 16 * c, left), acc[c]);
        }
      }
    }
    for (int c = 0; c < kWide; ++c) {
      const int64_t left = width - 16 * c;
      if (left >= 16) {
        vec::store(out + e0 + 16 * c, acc[c]);
      } else if (left > 0) {
        vec::store_first(out + e0 + 16 * c, acc[c], left);
      }
    }
  }
}

// One task for heads of any other size (E key values, Ev value values): one query row at a time, its scores, its
// softmax share and its weighted sum of the value rows.
template <typename T>
void chunk_general(const Task& t, const float* q, Rows<T> k, Rows<T> v, const bool* m, float* part_max, float* part_sum,
                   float* part_out, float* scores, int64_t E, int64_t Ev) {
  const float* kscale = k.scale ? k.scale + t.head + t.first : nullptr;
  const float* vscale = v.scale ? v.scale + t.head + t.first : nullptr;
  for (int64_t i = 0; i < t.count; ++i) {
    const int64_t query = t.live[i], h = t.hk * t.group + query / t.L, l = query % t.L;
    const size_t slot = static_cast<size_t>(t.index * t.queries + query);
    const bool* mr = m + ((t.MB == 1 ? 0 : t.b) * t.L + l) * t.S + t.first;
    dots<T, 0>(q + ((t.b * t.Hq + h) * t.L + l) * E, k.data + (t.head + t.first) * E, t.rows, E, scores);
    soften(scores, t.rows, t.s, kscale, vscale, mr, part_max + slot, part_sum + slot);
    weighted_sum(scores, v.data + (t.head + t.first) * Ev, t.rows, Ev, part_out + slot * Ev);
  }
}

// Per query row (b, h, l) of q [B, Hq, L, E]: 1 when it repeats row l - 1 of the same head under a mask row equal to
// row l - 1's (so its output is that row's), else 0. Values compare as numbers: +0 and -0 match (a padded row's zeros
// come out of the rotary embedding with either sign), NaN never does. Row 0 never repeats: every run starts computed.
inline std::vector<uint8_t> repeats(const float* q, const bool* m, int64_t B, int64_t Hq, int64_t L, int64_t E, int64_t S,
                                    int64_t MB) {
  std::vector<uint8_t> repeat(static_cast<size_t>(B * Hq * L), 0);
  if (L < 2) return repeat;  // decode: one row, nothing to compare
  std::vector<uint8_t> same_mask(static_cast<size_t>(MB * L), 0);
  for (int64_t mb = 0; mb < MB; ++mb)
    for (int64_t l = 1; l < L; ++l) {
      const bool* row = m + (mb * L + l) * S;
      same_mask[static_cast<size_t>(mb * L + l)] = std::memcmp(row, row - S, static_cast<size_t>(S)) == 0;
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t l = 1; l < L; ++l) {
        if (!same_mask[static_cast<size_t>((MB == 1 ? 0 : b) * L + l)]) continue;
        const float* row = q + ((b * Hq + h) * L + l) * E;
        bool same = true;
        for (int64_t e = 0; e < E && same; ++e) same = row[e] == row[e - E];
        repeat[static_cast<size_t>((b * Hq + h) * L + l)] = same;
      }
  return repeat;
}

// The attention itself, for either form: q [B, Hq, L, E], mask [MB, 1, L, S], out [B, Hq, L, Ev]. Each task takes
// one key / value head and a chunk of its rows, and for every query row of the heads that read it computes a partial
// softmax (its maximum, its sum, its unnormalised output); a second pass combines the chunks of each query row (as
// flash-decoding does). D: the head size when it is known at compile time (64, 128: E == Ev == D; the dot products
// unroll and a query row's output stays in registers), 0 otherwise. k[b], v[b]: batch b's rows (its own cache: the
// batches of a call may be sessions of different lengths, each reads its own filled rows). Returns the rows read
// (summed over the batches); *attended: the query rows computed (the others repeat the row before them: repeats()).
template <typename T, int64_t D>
int64_t attend(const float* q, const Rows<T>* k, const Rows<T>* v, const bool* m, float* out, int64_t B, int64_t Hq,
               int64_t L, int64_t E_, int64_t H, int64_t S, int64_t Ev_, int64_t MB, float s, int64_t* attended) {
  const int64_t E = D ? D : E_, Ev = D ? D : Ev_;
  // n[b]: one past the last column batch b's mask rows see
  std::vector<int64_t> n(static_cast<size_t>(B), 0);
  int64_t read = 0, longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t& filled = n[static_cast<size_t>(b)];
    for (int64_t r = 0; r < L; ++r) {
      const bool* row = m + ((MB == 1 ? 0 : b) * L + r) * S;
      for (int64_t j = S - 1; j >= filled; --j) {
        if (row[j]) {
          filled = j + 1;
          break;
        }
      }
    }
    read += filled;
    longest = std::max(longest, filled);
  }
  const int64_t group = Hq / H;
  const int64_t chunks = std::max<int64_t>(1, (longest + kChunk - 1) / kChunk);
  const int64_t queries = group * L;  // query rows reading one key / value head
  // per (b, hk): the query rows computed (live[bhk * queries ..], live_count[bhk] of them)
  const std::vector<uint8_t> repeat = repeats(q, m, B, Hq, L, E, S, MB);
  std::vector<int64_t> live(static_cast<size_t>(B * H * queries)), live_count(static_cast<size_t>(B * H));
  *attended = 0;
  for (int64_t bhk = 0; bhk < B * H; ++bhk) {
    const int64_t b = bhk / H, hk = bhk % H;
    int64_t count = 0;
    for (int64_t query = 0; query < queries; ++query) {
      const int64_t h = hk * group + query / L, l = query % L;
      if (!repeat[static_cast<size_t>((b * Hq + h) * L + l)]) live[static_cast<size_t>(bhk * queries + count++)] = query;
    }
    live_count[static_cast<size_t>(bhk)] = count;
    *attended += count;
  }
  // per (b, hk, chunk, query row): the chunk's maximum score, its sum of exp, its unnormalised output
  std::vector<float> part_max(static_cast<size_t>(B * H * chunks * queries));
  std::vector<float> part_sum(part_max.size());
  std::vector<float> part_out(part_max.size() * static_cast<size_t>(Ev));

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(kQueries * kChunk));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * H * chunks; ++task) {
      const int64_t c = task % chunks, bhk = task / chunks, b = bhk / H, hk = bhk % H;
      const int64_t first = c * kChunk, rows = std::min(n[static_cast<size_t>(b)], first + kChunk) - first;
      const Task t{task,  b,  hk, first, rows, hk * S, group, queries, Hq, L, S, MB, s,
                   live.data() + bhk * queries, live_count[static_cast<size_t>(bhk)]};
      if (rows <= 0) {  // a chunk past this batch's filled rows (another batch's is longer): weighs nothing
        for (int64_t i = 0; i < t.count; ++i) part_max[static_cast<size_t>(task * queries + t.live[i])] = -INFINITY;
      } else if constexpr (D > 0) {
        chunk_blocked<T, D>(t, q, k[b], v[b], m, part_max.data(), part_sum.data(), part_out.data(), scores.data());
      } else {
        chunk_general<T>(t, q, k[b], v[b], m, part_max.data(), part_sum.data(), part_out.data(), scores.data(), E, Ev);
      }
    }
    // combine the chunks of each query row: softmax over all of them is each chunk's share rescaled to the maximum
#pragma omp for schedule(static)
    for (int64_t bq = 0; bq < B * H * queries; ++bq) {
      const int64_t bhk = bq / queries, query = bq % queries, b = bhk / H, hk = bhk % H;
      const int64_t h = hk * group + query / L, l = query % L;
      if (repeat[static_cast<size_t>((b * Hq + h) * L + l)]) continue;  // copied below
      float* o = out + ((b * Hq + h) * L + l) * Ev;
      float best = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c)
        best = std::max(best, part_max[static_cast<size_t>((bhk * chunks + c) * queries + query)]);
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
    // a repeated row: the output of the computed row its run starts from (every one written: the loop above ends
    // with the team's barrier)
#pragma omp for schedule(static)
    for (int64_t row = 0; row < B * Hq * L; ++row) {
      if (!repeat[static_cast<size_t>(row)]) continue;
      int64_t from = row - 1;
      while (repeat[static_cast<size_t>(from)]) --from;
      std::memcpy(out + row * Ev, out + from * Ev, sizeof(float) * static_cast<size_t>(Ev));
    }
  }
  return read;
}

// attend() over each batch's rows typed, with the head size fixed at compile time where it is a common one.
template <typename T>
int64_t dispatch(const float* q, const CacheRows* caches, const bool* m, float* out, int64_t B, int64_t Hq, int64_t L,
                 int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float s, int64_t* attended) {
  std::vector<Rows<T>> k(static_cast<size_t>(B)), v(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    k[static_cast<size_t>(b)] = {static_cast<const T*>(caches[b].k), caches[b].k_scale};
    v[static_cast<size_t>(b)] = {static_cast<const T*>(caches[b].v), caches[b].v_scale};
  }
  if (E == 64 && Ev == 64) return attend<T, 64>(q, k.data(), v.data(), m, out, B, Hq, L, E, H, S, Ev, MB, s, attended);
  if (E == 128 && Ev == 128) return attend<T, 128>(q, k.data(), v.data(), m, out, B, Hq, L, E, H, S, Ev, MB, s, attended);
  return attend<T, 0>(q, k.data(), v.data(), m, out, B, Hq, L, E, H, S, Ev, MB, s, attended);
}

}  // namespace

int64_t attention(const float* q, const CacheRows* caches, const bool* mask, float* out, int64_t B, int64_t Hq, int64_t L,
                  int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float scale, int64_t* attended) {
  if (caches[0].k_scale) return dispatch<int8_t>(q, caches, mask, out, B, Hq, L, E, H, S, Ev, MB, scale, attended);
  return dispatch<float>(q, caches, mask, out, B, Hq, L, E, H, S, Ev, MB, scale, attended);
}

}  // namespace etsdk_kernels
