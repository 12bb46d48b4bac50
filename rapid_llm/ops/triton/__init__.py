"""Triton kernels of the built-in ops, one concept per file; the default implementations on CUDA.

Nothing is imported here: `catalog.py` names each kernel by "module:function", so a CPU server (where
their `device` condition fails) never imports triton. Each function has exactly the signature of its
torch_ref implementation, so dispatch can swap them. On CPU tensors they run only under Triton's
interpreter (TRITON_INTERPRET=1, set before triton is imported), which the kernel tests use.
"""
