"""Layouts tensor parallelism cannot run are refused in the launcher, before any child starts, with a message
naming --tensor-parallel-size: ranks that do not divide the heads or the MLP, models whose layers are not
sharded yet (DeepSeek-V4), and quantized linears."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rapid_llm.server_args import ServerArgs

FLAG = "--tensor-parallel-size"


@pytest.mark.parametrize(("architecture", "overrides", "args", "message"), [
    ("LlamaForCausalLM", {}, {"tensor_parallel_size": 3}, f"{FLAG} 3 must divide the model's 4 attention heads"),
    ("LlamaForCausalLM", {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3}, {},
     f"{FLAG} 2 must divide the model's 3 key/value heads, or be a multiple of them"),
    ("LlamaForCausalLM", {"intermediate_size": 130, "num_attention_heads": 4}, {"tensor_parallel_size": 4},
     f"{FLAG} 4 must divide the model's intermediate_size 130"),
    ("DeepseekV4ForCausalLM", {}, {}, f"{FLAG} 2: DeepseekV4ForCausalLM is not tensor-parallel yet"),
    ("NemotronHForCausalLM", {}, {"tensor_parallel_size": 4}, f"{FLAG} 4 must divide the model's n_groups 2"),
    ("LlamaForCausalLM", {}, {"quantization": "fp8"}, f"{FLAG} 2: quantized linear layers (fp8"),
    ("LlamaForCausalLM", {}, {"tensor_parallel_size": 0}, f"{FLAG} must be at least 1, got 0"),
])
def test_unsupported_layout_is_refused_naming_the_flag(tiny_checkpoint, architecture, overrides, args,
                                                        message) -> None:
    checkpoint = tiny_checkpoint(architecture, **overrides)
    server_args = ServerArgs(model=str(checkpoint), **{"tensor_parallel_size": 2, **args})
    with pytest.raises(ValueError) as error:
        server_args.engine_config(str(checkpoint))
    assert message in str(error.value)


def test_kv_heads_fewer_than_ranks_are_replicated_not_refused(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=1)
    config = ServerArgs(model=str(checkpoint), tensor_parallel_size=4).engine_config(str(checkpoint))
    assert config.parallel.tensor_parallel_size == 4


@pytest.mark.parametrize("spelling", ["--tp", "-tp", "--tp-size", FLAG])
def test_flag_spellings_parse(spelling: str) -> None:
    assert ServerArgs.from_cli([spelling, "2"]).tensor_parallel_size == 2


def test_launcher_exits_with_one_line(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    result = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--model", str(checkpoint), "--tp", "3"],
                            capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1
    assert f"{FLAG} 3 must divide the model's 4 attention heads" in lines[0]
