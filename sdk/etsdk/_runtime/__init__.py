"""Layer 4b, runtime: loading checked programs (:func:`etsdk.load`), the native bridge that forwards the
ExecuTorch runtime's delegate calls to Python bindings, verification and inspection. Never imports export."""
