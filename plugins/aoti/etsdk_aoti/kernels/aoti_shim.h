// etsdk-aoti kernels: the AOTInductor C-shim functions they call, and the one operand check they share.
//
// Every kernel receives AtenTensorHandles from a compiled library and reads them through these functions (torch's
// libtorch_cpu exports them). contiguous_tensor() is the check each operand passes before any byte is read;
// widen() reads a bfloat16 / float16 value as its exact float32 (portable code, no instruction-set extension).

#pragma once

#include <torch/csrc/inductor/aoti_torch/c/macros.h>

#include <cstdint>

extern "C" {
AOTITorchError aoti_torch_get_data_ptr(AtenTensorHandle tensor, void** ret_data_ptr);
AOTITorchError aoti_torch_get_dim(AtenTensorHandle tensor, int64_t* ret_dim);
AOTITorchError aoti_torch_get_sizes(AtenTensorHandle tensor, int64_t** ret_sizes);
AOTITorchError aoti_torch_get_strides(AtenTensorHandle tensor, int64_t** ret_strides);
AOTITorchError aoti_torch_get_dtype(AtenTensorHandle tensor, int32_t* ret_dtype);
AOTITorchError aoti_torch_empty_strided(int64_t ndim, const int64_t* sizes_ptr, const int64_t* strides_ptr,
                                        int32_t dtype, int32_t device_type, int32_t device_index,
                                        AtenTensorHandle* ret_new_tensor);
int32_t aoti_torch_dtype_float32();
int32_t aoti_torch_dtype_bfloat16();
int32_t aoti_torch_dtype_float16();
int32_t aoti_torch_dtype_int8();
int32_t aoti_torch_dtype_uint8();
int32_t aoti_torch_dtype_bool();
int32_t aoti_torch_device_type_cpu();
}

namespace etsdk_kernels {

// True when h is a contiguous tensor of rank dims and dtype dtype; then *sizes and *data point at its sizes and bytes.
inline bool contiguous_tensor(AtenTensorHandle h, int64_t dims, int32_t dtype, int64_t** sizes, void** data) {
  int64_t dim = 0;
  int32_t found = 0;
  if (!h || aoti_torch_get_dim(h, &dim) || dim != dims || aoti_torch_get_dtype(h, &found) || found != dtype) return false;
  int64_t* strides = nullptr;
  if (aoti_torch_get_sizes(h, sizes) || aoti_torch_get_strides(h, &strides) || aoti_torch_get_data_ptr(h, data)) return false;
  int64_t expected = 1;  // contiguous
  for (int64_t d = dims - 1; d >= 0; --d) {
    if ((*sizes)[d] != 1 && strides[d] != expected) return false;
    expected *= (*sizes)[d];
  }
  return true;
}

// The weight dtypes: W is the stored element, widen() its exact float32 value.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float widen(float v) { return v; }
inline float widen(Bf16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float out;
  __builtin_memcpy(&out, &bits, sizeof out);
  return out;
}
inline float widen(F16 v) {  // IEEE half: sign, 5-bit exponent (bias 15), 10-bit fraction
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exponent = (v.bits >> 10) & 0x1Fu, fraction = v.bits & 0x3FFu, bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (fraction << 13);  // infinity, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (fraction << 13);
  } else if (fraction == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113u;
    while (!(fraction & 0x400u)) {
      fraction <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((fraction & 0x3FFu) << 13);
  }
  float out;
  __builtin_memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace etsdk_kernels
