"""Quantized weights with torch: the operators that read them, quantizing, and the planes a backend derives."""
