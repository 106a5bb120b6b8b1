"""etsdk-tensorrt: a TensorRT backend for etsdk."""

BACKEND_ID = "EtsdkTensorRTBackend"
