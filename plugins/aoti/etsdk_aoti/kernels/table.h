// etsdk-aoti kernels: what a level library computes, as the one table the entry points call through.
//
// The kernels are built once per instruction-set level (vec.h), each level into its own library
// (libetsdk_aoti_kernels_<level>.so) that links no torch and exports one function, etsdk_kernels_table().
// The entry points AOTInductor's compiled code calls (entry.cpp: aoti_torch_cpu_etsdk_*) check every operand,
// allocate the output and call the selected level's table; etsdk_aoti.kernels picks the level (the host's best,
// or ETSDK_AOTI_ISA's) and hands its table to entry.cpp before any program runs. The standalone check
// (check.cpp) calls a table directly, which is how the aarch64 build is tested under qemu.
//
// Everything a table function receives has been checked: shapes agree, pointers are valid for them, groups
// divide k. A table function never fails.

#pragma once

#include <cstdint>

namespace etsdk_kernels {

// Bump when a struct or a signature below changes: a level library of another ABI is refused at load.
constexpr int32_t kTableAbi = 3;

// One weight in a quantized planes format (etsdk._format.weight_format):
//   bits 8, group 0 : q8 int8 [n, k], scales [n]                 w = q * s
//   bits 8, group G : q8 int8 [n, k], scales [n, k / G]          w = q * s
//   bits 4, group G : q4 uint8 [n, k / 2] (value 2i in the low nibble of byte i, 2i + 1 in the high one),
//                     scales [n, k / G], mins [n, k / G] or null:  w = q * s + m,  or (q - 8) * s
struct Weights {
  int bits;
  int64_t n, k, group, groups;  // group 0: one scale per row (groups == 1)
  const int8_t* q8;
  const uint8_t* q4;
  const float* scales;  // float32 planes; null in an A8Part whose planes are float16 (s16 / m16)
  const float* mins;
  const float* bias;    // [n] or null
};

// One weight of a (possibly fused) :a8 product (4-bit or int8 weights, x rounded to int8 per block of 32): its operands,
// its float16 planes (s16 / m16: scales and minimums as stored, or null for float32 ones in w.scales / w.mins),
// and where its outputs go (row m of x at y + m * ldy).
struct A8Part {
  Weights w;
  const uint16_t* s16;
  const uint16_t* m16;
  float* y;
};

// One batch's key / value rows: k [H, S, E], v [H, S, Ev], float32, or int8 with a float32 scale per row (k_scale /
// v_scale [H, S]; null for float rows). A batch of one tensor points into it; a batch of sessions (each its own cache
// tensor) points at each session's own.
struct CacheRows {
  const void* k;
  const float* k_scale;
  const void* v;
  const float* v_scale;
};

// The stored element of a float weight: float32, bfloat16 or float16.
enum class FloatWeight : int32_t { kFloat32 = 0, kBfloat16 = 1, kFloat16 = 2 };

struct KernelTable {
  int32_t abi;        // kTableAbi
  const char* level;  // vec::kLevel of the build: "avx512vnni", "avx2", "neon", "portable", ...
  // y[m, n] = x[m, k] @ dequantized(w)^T (+ bias)
  void (*qmm)(const Weights* w, const float* x, int64_t m_rows, float* y);
  // every part's product with x rounded to int8 per block of 32 (d = max|x| / 127, q = round-half-even(x / d));
  // all parts share bits, k (a multiple of 32) and group; int8 weights' scales are float32; ldy: the row stride of
  // every part's outputs
  void (*qmm_a8)(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy);
  // y[m, n] = x[m, k] @ widen(w[n, k])^T (+ bias)
  void (*linear)(const float* x, const void* w, FloatWeight w_dtype, const float* bias, float* y, int64_t m_rows,
                 int64_t n, int64_t k);
  // sdpa(q [B, Hq, L, E], batch b's keys / values caches[b] (CacheRows: [H, S, E] / [H, S, Ev], every batch
  // float or every batch int8), mask [MB, 1, L, S]) with grouped heads (Hq % H == 0) into out [B, Hq, L, Ev].
  // Batch b reads only its rows 0 .. n_b - 1 (n_b: one past the last column its mask rows see); returns the sum of
  // n_b. A query row that sees nothing gets zeros. A query row equal to the one before it (as numbers) under an
  // equal mask row is not computed again (it gets that row's output); *attended: the query rows computed.
  int64_t (*attention)(const float* q, const CacheRows* caches, const bool* mask, float* out, int64_t B, int64_t Hq,
                       int64_t L, int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float scale,
                       int64_t* attended);
};

// Implemented once per level (qmm.cpp, gemv.cpp, attention.cpp), gathered by level.cpp.
void qmm(const Weights* w, const float* x, int64_t m_rows, float* y);
void qmm_a8(const A8Part* parts, int64_t count, const float* x, int64_t m_rows, int64_t ldy);
void linear(const float* x, const void* w, FloatWeight w_dtype, const float* bias, float* y, int64_t m_rows, int64_t n,
            int64_t k);
int64_t attention(const float* q, const CacheRows* caches, const bool* mask, float* out, int64_t B, int64_t Hq, int64_t L,
                  int64_t E, int64_t H, int64_t S, int64_t Ev, int64_t MB, float scale, int64_t* attended);

}  // namespace etsdk_kernels

extern "C" const etsdk_kernels::KernelTable* etsdk_kernels_table();
