"""Every built-in quantization method, registered once (a new method = its files + one call here)."""

from __future__ import annotations

from rapid_llm.quantization.compressed_tensors_config import parse_compressed_tensors
from rapid_llm.quantization.fp4_config import ONLINE_FP4, parse_modelopt, parse_mxfp4
from rapid_llm.quantization.fp8_config import ONLINE_FP8, parse_fbgemm_fp8, parse_fp8
from rapid_llm.quantization.int4_config import ONLINE_INT4, parse_awq, parse_gptq
from rapid_llm.quantization.registry import register_quantization

register_quantization(checkpoint={"fp8": parse_fp8, "fbgemm_fp8": parse_fbgemm_fp8}, online=dict(ONLINE_FP8))
register_quantization(checkpoint={"gptq": parse_gptq, "awq": parse_awq}, online=dict(ONLINE_INT4))
register_quantization(checkpoint={"modelopt": parse_modelopt, "mxfp4": parse_mxfp4}, online=dict(ONLINE_FP4))
register_quantization(checkpoint={"compressed-tensors": parse_compressed_tensors}, online={})
