"""Weight quantization: a registry of methods (configs parsed torch-free in the launcher) and the linear methods
that own a quantized layer's parameters, loading and matmul in the worker. See docs/quantization.md."""
