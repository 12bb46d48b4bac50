"""FP4 math (rapid_llm/quantization/fp4_math.py) and the fp4_linear op against independent references: the e2m1
table and rounding, nibble order, NVFP4 tensors read back by compressed-tensors, MXFP4 scales, W4A4 activations."""

from __future__ import annotations

import torch

from rapid_llm.ops.fp4_linear import Fp4LinearSpec, fp4_linear
from rapid_llm.quantization.fp4_math import (
    fp4_encode, mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_fake_quantize, nvfp4_global_scale,
    nvfp4_quantize, pack_fp4, unpack_fp4,
)
from tests.quantization.fp4_reference import TABLE, compressed_tensors_fake_quantize, decode, nearest_codes


def test_encode_is_nearest_with_ties_to_even_and_saturates() -> None:
    x = torch.randn(4096) * 4
    assert torch.equal(TABLE[fp4_encode(x).long()], TABLE[nearest_codes(x).long()])  # no exact ties in randn
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 9.0, -100.0])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 6.0, -6.0])
    assert torch.equal(TABLE[fp4_encode(midpoints).long()], expected)


def test_packing_puts_the_even_element_in_the_low_nibble() -> None:
    codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert torch.equal(packed[0, 0], codes[0, 0] | (codes[0, 1] << 4))
    assert torch.equal(unpack_fp4(packed), decode(packed))


def test_nvfp4_tensors_read_back_by_compressed_tensors() -> None:
    """Our packed weight and fp8 scales, dequantized by compressed-tensors' own unpacker, are our dequantized
    weight (their global scale is the reciprocal of ours)."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    w = torch.randn(48, 128)
    packed, scales, global_scale = nvfp4_quantize(w)
    theirs = unpack_fp4_from_uint8(packed, 48, 128, dtype=torch.float32) \
        * scales.float().repeat_interleave(16, dim=1) * global_scale
    ours = nvfp4_dequantize(packed, scales, global_scale, torch.float32)
    assert torch.equal(ours, theirs)
    assert (ours - w).abs().max() <= w.abs().max() / 6  # within half the coarsest e2m1 step of the largest group
    assert scales.dtype == torch.float8_e4m3fn and scales.float().max() <= 448


def test_mxfp4_scales_are_the_smallest_power_of_two_that_fits() -> None:
    w = torch.randn(16, 96) * 3
    packed, scales = mxfp4_quantize(w)
    step = torch.exp2(scales.float() - 127)
    amax = w.view(16, 3, 32).abs().amax(-1)
    assert torch.all(amax <= 6 * step) and torch.all(amax > 3 * step)
    assert torch.equal(mxfp4_dequantize(packed, scales, torch.float32),
                       (decode(packed).view(16, 3, 32) * step.unsqueeze(-1)).view(16, 96))


def test_nvfp4_activation_fake_quantization_matches_compressed_tensors() -> None:
    x = torch.randn(5, 64) * 2
    global_scale = nvfp4_global_scale(x.abs().amax() * 1.5)
    ours = nvfp4_fake_quantize(x, global_scale)
    theirs = compressed_tensors_fake_quantize(x, (1 / global_scale).reshape(1))
    # Same codes and scales; the products are taken in another order (fp32 rounding only).
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)

def test_fp4_linear_op_is_dequantize_then_matmul() -> None:
    x, w, bias = torch.randn(3, 64), torch.randn(40, 64), torch.randn(40)
    packed, scales, global_scale = nvfp4_quantize(w)
    reference = x @ nvfp4_dequantize(packed, scales, global_scale, torch.float32).T + bias
    out = fp4_linear(x, packed, scales, global_scale.reshape(1, 1), None, Fp4LinearSpec("nvfp4"), bias)
    torch.testing.assert_close(out, reference)
    input_global = nvfp4_global_scale(x.abs().amax())
    w4a4 = fp4_linear(x, packed, scales, global_scale.reshape(1, 1), input_global, Fp4LinearSpec("nvfp4", "nvfp4"))
    dequantized = nvfp4_dequantize(packed, scales, global_scale, torch.float32)
    torch.testing.assert_close(w4a4, nvfp4_fake_quantize(x, input_global) @ dequantized.T)
    assert not torch.allclose(w4a4, reference - bias, atol=1e-3)  # the activations really are quantized
    mx_packed, mx_scales = mxfp4_quantize(w)
    out = fp4_linear(x.bfloat16(), mx_packed, mx_scales, None, None, Fp4LinearSpec("mxfp4"))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), x.bfloat16().float() @ mxfp4_dequantize(mx_packed, mx_scales,
                                                                                     torch.bfloat16).float().T,
                               atol=5e-2, rtol=2e-2)
