// etsdk-aoti kernels: the AOTInductor C-shim functions the entry points call, and the one operand check they share.
//
// The entry points (entry.cpp) receive AtenTensorHandles from a compiled library and read them through these
// functions (torch's libtorch_cpu exports them). contiguous_tensor() is the check each operand passes before any
// byte is read. Only entry.cpp includes this file: the level libraries link no torch.

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

}  // namespace etsdk_kernels
