"""etsdk-aoti: lowers partitions with AOTInductor and runs them through the container C API."""
