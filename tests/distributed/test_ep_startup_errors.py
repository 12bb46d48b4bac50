"""Expert-parallel layouts that cannot run are refused in the launcher with a message naming the flag: EP on a
model without experts, EPLB without EP (or on one rank), --eplb-config without --enable-eplb or with a bad
field, expert slots that do not divide over the ranks, torch.compile, and EP across DP replicas; EP forces eager decode (no CUDA graphs).
The flags parse as vLLM spells them."""

from __future__ import annotations

import pytest

from rapid_llm.server_args import ServerArgs

EP = {"tensor_parallel_size": 2, "enable_expert_parallel": True}


@pytest.mark.parametrize(("architecture", "args", "message"), [
    ("LlamaForCausalLM", EP, "--enable-expert-parallel: LlamaForCausalLM has no experts to partition"),
    ("Qwen3MoeForCausalLM", {"tensor_parallel_size": 2, "enable_eplb": True},
     "--enable-eplb balances experts over expert-parallel ranks: it needs --enable-expert-parallel"),
    ("Qwen3MoeForCausalLM", {**EP, "eplb_config": {"num_redundant_experts": 2}},
     "--eplb-config takes effect with --enable-eplb only"),
    ("Qwen3MoeForCausalLM", {**EP, "enable_eplb": True, "eplb_config": {"num_redundant_experts": 1}},
     "the 4 experts (plus num_redundant_experts) must divide over the 2 expert-parallel ranks, got 5 slots"),
    ("Qwen3MoeForCausalLM", {**EP, "enable_eplb": True, "eplb_config": '{"window": 3}'},
     "--eplb-config: Object contains unknown field `window`"),
    ("Qwen3MoeForCausalLM", {**EP, "enable_eplb": True, "eplb_config": {"step_interval": 0}},
     "--eplb-config: window_size and step_interval must be at least 1"),
    ("Qwen3MoeForCausalLM", {**EP, "quantization": "fp8"}, "--tensor-parallel-size 2: quantized linear layers"),
    ("Qwen3MoeForCausalLM", {**EP, "enable_torch_compile": True},
     "--enable-torch-compile with --enable-expert-parallel"),
    ("Qwen3MoeForCausalLM", {**EP, "data_parallel_size": 2},
     "--enable-expert-parallel with --data-parallel-size 2: experts are partitioned inside one replica's"),
])
def test_unsupported_expert_layout_is_refused(tiny_checkpoint, architecture, args, message) -> None:
    checkpoint = tiny_checkpoint(architecture)
    with pytest.raises(ValueError) as error:
        ServerArgs(model=str(checkpoint), **args).engine_config(str(checkpoint))
    assert message in str(error.value)


def test_expert_parallel_on_one_rank_is_a_no_op(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("Qwen3MoeForCausalLM")
    config = ServerArgs(model=str(checkpoint), enable_expert_parallel=True).engine_config(str(checkpoint))
    assert config.parallel.expert_parallel_size == 1


def test_expert_parallel_decodes_eagerly(tiny_checkpoint) -> None:
    """The all-to-all's split sizes are read on the host, so no decode step may be captured in a CUDA graph."""
    checkpoint = tiny_checkpoint("Qwen3MoeForCausalLM")
    def eager(**args: object) -> bool:
        return ServerArgs(model=str(checkpoint), **args).engine_config(str(checkpoint)).compilation.enforce_eager

    assert eager(**EP) and not eager(tensor_parallel_size=2)


def test_flags_parse_as_vllm_spells_them() -> None:
    args = ServerArgs.from_cli(["--tp", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-config",
                                '{"num_redundant_experts": 2, "window_size": 10, "step_interval": 20}'])
    assert args.enable_expert_parallel and args.enable_eplb
    assert args.eplb_config == '{"num_redundant_experts": 2, "window_size": 10, "step_interval": 20}'
