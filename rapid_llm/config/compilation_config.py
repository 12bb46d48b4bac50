"""CompilationConfig: how the decode forward is run -- eager, torch.compile'd, and/or replayed from CUDA graphs.

Flags follow vLLM and SGLang: `--enforce-eager` (vLLM) turns CUDA graphs off, and on the CPU their stand-in, the
decode program (models/llama_decode_program.py); `--cuda-graph-max-bs` (SGLang) is the largest decode batch
captured, `--enable-torch-compile` (SGLang) compiles the model forward with inductor for decode steps (no decode
program then). CUDA graphs exist on CUDA only; on the CPU they are off whatever the flags say.
`two_batch_overlap` (`--enable-two-batch-overlap`) runs big steps as two overlapped micro-batches (MicroBatchConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from rapid_llm.config.micro_batch_config import MicroBatchConfig

DEFAULT_CUDA_GRAPH_MAX_BS = 256


@dataclass(frozen=True)
class CompilationConfig:
    enforce_eager: bool = False
    cuda_graph_max_bs: int = DEFAULT_CUDA_GRAPH_MAX_BS
    enable_torch_compile: bool = False
    two_batch_overlap: MicroBatchConfig | None = None  # None: every step runs as one batch

    def __post_init__(self) -> None:
        if self.cuda_graph_max_bs < 1:
            raise ValueError(f"--cuda-graph-max-bs must be at least 1, got {self.cuda_graph_max_bs}")
