"""The applications over the runtime: ``etsdk export``, ``etsdk generate``, ``etsdk chat``, ``etsdk serve``, the demo.
Each is a thin layer over :mod:`etsdk_hf_static.runtime`; none has a generation loop of its own."""
