"""`python -m rapid_llm.quantize`: GPTQ and AWQ int4 quantization of a Hugging Face checkpoint, with calibration.

The model runs in transformers (fp32) one decoder layer at a time on calibration text; each layer's linear
layers are quantized (gptq.py: Hessian-based error compensation; awq.py: activation-aware scales folded into
the preceding norm or linear, then round-to-nearest) and the quantized layer produces the next one's inputs.
The result is a standard GPTQ (v1) or AWQ (GEMM) checkpoint that rapid_llm loads. See docs/quantization_int4.md.
"""
