"""ServerArgs: the command line (one flat namespace, like SGLang's), validated into an EngineConfig once.

The offline `LLM` class takes the same fields as keyword arguments, so both entry points
share one set of names, defaults and error messages. Every check that needs no weights (paths,
tokenizer files, architecture, op backends, port) runs here, before any child starts, and
fails with one line naming the flag and the fix; so does a command-line syntax error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import rapid_llm

from rapid_llm.config.scheduler_config import DEFAULT_WATCHDOG_TIMEOUT_S
from rapid_llm.quantization.registry import online_names

if TYPE_CHECKING:
    from rapid_llm.config.kv_transfer_config import KVTransferConfig
    from rapid_llm.config.lora_config import LoRAConfig
    from rapid_llm.config.micro_batch_config import MicroBatchConfig
    from rapid_llm.config.model_config import ModelConfig
    from rapid_llm.config.parallel_config import ParallelConfig
    from rapid_llm.config.speculative_config import SpeculativeConfig

DEFAULT_PORT = 30000
MAX_PORT = 65535
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str, flag: str) -> int:
    """'4GiB', '512M', '1.5g' or a plain byte count -> bytes; errors name `flag`."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not match:
        raise ValueError(f"{flag} {text!r} is not a size; write e.g. 4GiB, 512MiB or a byte count")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


@dataclass
class ServerArgs:
    model: str | None = field(default=None, metadata={"help": "Hugging Face checkpoint directory, or a packaged "
                              "demo model: demo-target (alias demo), demo-draft or demo-moe (an existing path of "
                              "that name wins). Without it, demo-target is served: 15.7M parameters, trained on "
                              "CPython's standard library.",
                              "aliases": ("--model-path",)})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer directory (default: the model's)."})
    served_model_name: str | None = field(default=None, metadata={"help": "Model id clients use (default: the "
                                          "demo model's short name, else --model as given)."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=DEFAULT_PORT, metadata={"help": "HTTP port."})
    dtype: str = field(default="auto", metadata={"help": "Model dtype: auto (the checkpoint's), float32, "
                       "bfloat16 or float16."})
    quantization: str | None = field(default=None, metadata={"help": "Quantize the weights of a bf16/fp32 "
                                     "checkpoint after loading: " + ", ".join(online_names()) + " (fp8*: FP8 e4m3, "
                                     "W8A8 with dynamic activations, per-tensor; per-row; 128x128 or 32x32 blocks; "
                                     "-ue8m0: power-of-two scales; w4a16 / w4a8: int4 round-to-nearest in groups "
                                     "of 128, w4a8 with int8 per-token activations; nvfp4 / mxfp4: FP4 weight only, "
                                     "16-element fp8-scaled / 32-element e8m0-scaled groups). Quantized checkpoints "
                                     "(quant_method fp8, fbgemm_fp8, gptq, awq, compressed-tensors, modelopt, mxfp4) "
                                     "load as quantized without it. See docs/quantization.md, "
                                     "docs/quantization_int4.md and docs/quantization_fp4.md."})
    max_model_len: int | None = field(default=None, metadata={"help": "Longest prompt + output in tokens "
                                      "(default: what the model supports)."})
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests running in one step."})
    max_num_batched_tokens: int | None = field(default=None, metadata={"help": "Token budget per step; longer "
                                               "prompts are chunked (default: 8192 on GPU, 2048 on CPU)."})
    block_size: int = field(default=16, metadata={"help": "Tokens per KV-cache block."})
    kv_cache_memory: str | None = field(default=None, metadata={"help": "KV-cache size, e.g. 4GiB (default on "
                                        "CPU: 4GiB; on GPU: --gpu-memory-utilization)."})
    num_kv_blocks: int | None = field(default=None, metadata={"help": "Exact number of KV blocks (overrides "
                                      "--kv-cache-memory)."})
    max_state_snapshots: int | None = field(default=None, metadata={"help": "Recurrent-state snapshots kept at "
                                            "block boundaries so that models with state layers (short conv, "
                                            "recurrent) get prefix-cache hits (default: --max-num-seqs, 0 with "
                                            "prefix caching off; 0 turns their hits off)."})
    state_snapshot_interval: int = field(default=16, metadata={"help": "Blocks between the recurrent-state "
                                         "snapshots a prompt keeps (besides the one at its last block boundary): "
                                         "smaller finds more shared prefixes of models with state layers, at "
                                         "more snapshot rows per prompt."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Share of GPU memory for weights and "
                                          "KV cache.", "aliases": ("--mem-fraction-static",)})
    kv_cache_dtype: str = field(default="auto", metadata={"help": "KV-cache dtype: auto (= model "
                                "dtype), a float dtype, or fp8 (= fp8_e4m3: quantized per layer with the checkpoint's "
                                "k_scale/v_scale, else 1.0; twice bf16's tokens) or nvfp4 (e2m1 with an fp8 scale per 16 values; "
                                "3.56x bf16's tokens; read by --attention-backend torch_ref only)."})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "Worker ranks the model's layers are split "
                                      "over (tensor parallelism, torch.distributed: gloo on CPU, NCCL on CUDA); "
                                      "Llama-family, MoE and DeepSeek-V2/V3 models. See docs/parallelism.md.",
                                      "aliases": ("--tp", "--tp-size", "-tp")})
    pipeline_parallel_size: int = field(default=1, metadata={"help": "Pipeline stages the decoder layers are "
                                        "split into, each of --tensor-parallel-size ranks; hidden states pass stage "
                                        "to stage, the last stage samples. Llama-family, MoE and DeepSeek-V2/V3 "
                                        "models. See docs/parallelism.md.",
                                        "aliases": ("--pp", "--pp-size", "-pp")})
    pp_layer_partition: str | None = field(default=None, metadata={"help": "Decoder layers per pipeline stage, "
                                           "comma-separated (e.g. 10,14); default: an even split, the remainder "
                                           "on the last stages."})
    decode_context_parallel_size: int = field(default=1, metadata={"help": "Decode context parallelism: blocks "
                                              "of this many tensor-parallel ranks holding the same KV head split "
                                              "every sequence's KV by position, so a request's context can be that "
                                              "many times longer; attention merges exactly. See "
                                              "docs/parallelism.md.", "aliases": ("--dcp", "--dcp-size", "-dcp")})
    prefill_context_parallel_size: int = field(default=1, metadata={"help": "Prefill context parallelism: this "
                                               "many replicas of the tensor-parallel group split every step's tokens "
                                               "(zig-zag pieces of each prompt), exchange K/V by all-gather and "
                                               "each keep every token's KV. See docs/parallelism.md.",
                                               "aliases": ("--pcp", "--pcp-size", "-pcp")})
    enable_expert_parallel: bool = field(default=False, metadata={"help": "Partition MoE experts over the "
                                         "tensor-parallel ranks (EP size = TP size) instead of splitting each "
                                         "expert."})
    afd_config: str | dict[str, Any] | None = field(default=None, metadata={"help": "Attention-FFN "
                            "disaggregation, a JSON object: {\"num_ffn_ranks\": 1} more ranks compute the MoE "
                            "layers for the tensor-parallel (attention) ranks (default: off). See "
                            "docs/parallelism.md."})
    enable_eplb: bool = field(default=False, metadata={"help": "Expert-parallel load balancing: redundant "
                              "copies of hot experts, placement recomputed from measured loads (--eplb-config)."})
    eplb_config: str | dict[str, Any] | None = field(default=None, metadata={"help": "EPLB settings as vLLM "
                                                     "spells them, a JSON object: {\"num_redundant_experts\": 2, "
                                                     "\"window_size\": 1000, \"step_interval\": 3000}."})
    data_parallel_size: int = field(default=1, metadata={"help": "Engine replicas (each a scheduler and its "
                                    "tensor-parallel ranks) behind one frontend. See docs/parallelism.md.",
                                    "aliases": ("--dp", "--dp-size", "-dp")})
    load_balance_method: str = field(default="round_robin", metadata={"help": "How the frontend picks a "
                                     "replica per request: round_robin, shortest_queue (fewest requests in "
                                     "flight), minimum_tokens (fewest tokens outstanding) or cache_aware "
                                     "(longest cached prompt prefix, unless that replica is overloaded)."})
    nnodes: int = field(default=1, metadata={"help": "Hosts one engine's ranks are spread over."})
    node_rank: int = field(default=0, metadata={"help": "This host's place among --nnodes (0 serves HTTP; the "
                           "others run only worker ranks)."})
    dist_init_addr: str | None = field(default=None, metadata={"help": "HOST:PORT of node 0 (multi-node; "
                                       "PORT and the next 2 + tp ports must be free there)."})
    attention_backend: str = field(default="auto", metadata={"help": "Alias of --op-backend attention=NAME; "
                                   "auto lets the op registry choose."})
    op_backend: str | None = field(default=None, metadata={"help": "Pin ops to implementations, e.g. "
                                   "attention=torch_ref,rms_norm=torch_ref (default: the registry chooses by "
                                   "priority and conditions; RAPID_LLM_OP_BACKEND, same syntax, applies to ops "
                                   "this flag leaves out)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom code in the checkpoint."})
    generation_config: str = field(default="auto", metadata={"help": "Sampling defaults for fields a request "
                                   "leaves unset: auto (the model's generation_config.json), vllm (none) or a "
                                   "directory holding a generation_config.json."})
    api_key: str | None = field(default=None, metadata={"help": "Require 'Authorization: Bearer KEY'."})
    chat_template: str | None = field(default=None, metadata={"help": "Chat template replacing the tokenizer's: "
                                      "a file, or the jinja template itself."})
    trust_request_chat_template: bool = field(default=False, metadata={"help": "Honour chat templates sent with "
                                              "a request (refused by default: they run on the server)."})
    tool_call_parser: str | None = field(default=None, metadata={"help": "How tool calls are read from the "
                                         "model's text for tool_choice auto: hermes, llama3_json, mistral, "
                                         "qwen3_coder, deepseek_v3, deepseek_v31 or pythonic. See docs/tool_calling.md."})
    enable_auto_tool_choice: bool = field(default=False, metadata={"help": "Allow tool_choice auto (the "
                                          "default when a request has tools); needs --tool-call-parser."})
    reasoning_parser: str | None = field(default=None, metadata={"help": "How a reasoning model's think block "
                                         "is read from its text into reasoning_content on /v1/chat/completions: "
                                         "qwen3 or deepseek_r1. See docs/reasoning.md."})
    shutdown_timeout: float = field(default=10.0, metadata={"help": "Seconds requests in flight may run on after "
                                    "SIGTERM; then each still open ends with an error."})
    max_request_body_size: str = field(default="8MiB", metadata={"help": "Largest request body accepted; larger "
                                       "ones get a 413."})
    disable_async_scheduling: bool = field(default=False, metadata={"help": "Plan each step only after the "
                                           "previous one finished (lock-step)."})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "Reuse the KV cache of full blocks that "
                                        "match earlier requests' tokens (automatic prefix caching).",
                                        "off_flag": "--disable-prefix-caching"})
    prefix_cache_policy: str | None = field(default=None, metadata={"help": "The prefix cache's index: hash (full "
                                            "blocks under chained hashes) or radix (a tree of blocks: hits to the "
                                            "token, copying a partly shared block; leaves evicted first). Default: "
                                            "radix, hash for models with sliding-window or state layers."})
    kv_offload_size: str | None = field(default=None, metadata={"help": "Size of the prefix cache's second tier, "
                                        "e.g. 8GiB: evicted KV blocks are kept there and loaded back on a hit "
                                        "(default: none)."})
    kv_offload_path: str | None = field(default=None, metadata={"help": "Directory of the second tier's file "
                                        "(default: the tier is kept in host memory)."})
    eviction_policy: str = field(default="lru", metadata={"help": "Which unreferenced cached block goes first: "
                                 "lru, lfu (fewest hits) or cost (GreedyDual-Size-Frequency over hits and the "
                                 "block's recompute cost).", "aliases": ("--radix-eviction-policy",)})
    max_waiting_requests: int | None = field(default=None, metadata={"help": "Most requests waiting for a "
                                             "slot; one more is refused at once with 503 and Retry-After "
                                             "(default: unbounded, as vLLM and SGLang)."})
    itl_target_ms: float | None = field(default=None, metadata={"help": "Inter-token latency target while a "
                                        "long prompt arrives: a step carrying decodes takes only the prompt tokens "
                                        "that keep its time, predicted from measured step times, within it "
                                        "(at least 128 per step; default: off, chunks cut by the token budget "
                                        "alone)."})
    watchdog_timeout: float = field(default=DEFAULT_WATCHDOG_TIMEOUT_S, metadata={"help": "Seconds one engine "
                                    "step may take before /health turns 503 and the log names the stuck "
                                    "process."})
    enforce_eager: bool = field(default=False, metadata={"help": "Run decode steps module by module: no CUDA "
                                "graphs on CUDA, no decode program (one flat loop over the layers' ops) on the CPU."})
    cuda_graph_max_bs: int = field(default=256, metadata={"help": "Largest decode batch captured as a CUDA graph "
                                   "(buckets 1, 2, 4, then every 8 up to it; capped by --max-num-seqs)."})
    enable_torch_compile: bool = field(default=False, metadata={"help": "Compile the model forward of decode "
                                       "steps with torch.compile (inductor); the first steps of each shape "
                                       "compile."})
    enable_two_batch_overlap: bool = field(default=False, metadata={"help": "Two-batch overlap (--tp >= 2): "
                                           "split big steps into two micro-batches whose collectives overlap the "
                                           "other's compute. See docs/parallelism.md.", "aliases": ("--enable-dbo",)})
    dbo_decode_token_threshold: int = field(default=512, metadata={"help": "Smallest decode-only step that two-"
                                            "batch overlap splits."})
    dbo_prefill_token_threshold: int = field(default=1024, metadata={"help": "Smallest step with a prompt that "
                                             "two-batch overlap splits."})
    speculative_config: str | dict[str, Any] | None = field(default=None, metadata={"help": "Speculative "
                                  "decoding as vLLM spells it, a JSON object: {\"method\": \"ngram\", "
                                  "\"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1, \"prompt_lookup_max\": 4} "
                                  "(default: off). See docs/spec_decode/README.md."})
    kv_transfer_config: str | dict[str, Any] | None = field(default=None, metadata={"help": "Prefill/decode "
                                  "disaggregation as vLLM spells it, a JSON object: {\"kv_connector\": "
                                  "\"ZmqConnector\", \"kv_role\": \"kv_producer\" (prefill) | \"kv_consumer\" "
                                  "(decode) | \"kv_both\", \"kv_ip\": \"127.0.0.1\", \"kv_port\": 14579} "
                                  "(default: off). See docs/disaggregation.md."})
    disaggregation_mode: str | None = field(default=None, metadata={"help": "SGLang's spelling of the role: "
                                            "prefill (= kv_role kv_producer) or decode (= kv_consumer), with the "
                                            "built-in connector."})
    enable_lora: bool = field(default=False, metadata={"help": "Serve LoRA adapters (PEFT folders) over the "
                              "model: a request's \"model\" names one. See docs/lora.md."})
    lora_modules: list[str] | None = field(default=None, metadata={"help": "Adapters served from the start, "
                                           "NAME=PATH ...", "nargs": "+"})
    max_loras: int = field(default=1, metadata={"help": "Adapters held on the device at once: the most distinct "
                           "adapters one step runs (others wait)."})
    max_lora_rank: int = field(default=16, metadata={"help": "Largest adapter rank served; every device slot is "
                               "padded to it."})
    max_cpu_loras: int | None = field(default=None, metadata={"help": "Adapters kept in host memory; the least "
                                      "recently used beyond it is read from disk again (default: --max-loras)."})
    lora_allowed_dirs: list[str] | None = field(default=None, metadata={"help": "Directories POST "
                                                "/v1/load_lora_adapter may load adapter folders from (default: "
                                                "none, runtime loading is off).", "nargs": "+"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error."})

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     exclude: frozenset[str] = frozenset()) -> None:
        """Add one flag per field (the benchmarks reuse this, leaving out HTTP-only fields)."""
        for item in dataclasses.fields(cls):
            if item.name in exclude:
                continue
            flags = ["--" + item.name.replace("_", "-"), *item.metadata.get("aliases", ())]
            if item.type in ("bool", bool):
                parser.add_argument(*flags, action="store_true", default=item.default,
                                    help=_with_default(item.metadata["help"], "on" if item.default else "off"))
                if "off_flag" in item.metadata:
                    parser.add_argument(item.metadata["off_flag"], dest=item.name, action="store_false",
                                        help=f"Turn {flags[0]} off.")
                continue
            kind = {"int": int, "int | None": int, "float": float, "float | None": float}.get(str(item.type), str)
            parser.add_argument(*flags, type=kind, default=item.default, nargs=item.metadata.get("nargs"),
                                help=_with_default(item.metadata["help"], item.default))

    @classmethod
    def from_cli(cls, argv: list[str] | None = None, prog: str = "python -m rapid_llm.launch_server",
                 positional_model: bool = False) -> "ServerArgs":
        """Parse `argv`; `positional_model` also takes the model as the first argument (`rapid-llm serve MODEL`)."""
        parser = OneLineErrorParser(prog=prog, description="Serve a model over the OpenAI API.")
        if positional_model:
            parser.add_argument("model_tag", nargs="?", metavar="MODEL", help="Same as --model.")
        parser.add_argument("--version", action="version", version=f"rapid_llm {rapid_llm.__version__}")
        cls.add_cli_args(parser)
        values = vars(parser.parse_args(argv))
        model_tag = values.pop("model_tag", None)
        if model_tag is not None:
            if values["model"] not in (None, model_tag):
                parser.error(f"the model is given twice ({model_tag!r} and --model {values['model']!r}); give one")
            values["model"] = model_tag
        return cls(**values)

    def check_http(self) -> None:
        """The HTTP-only settings the offline LLM does not use."""
        if not 1 <= self.port <= MAX_PORT:
            raise ValueError(f"--port {self.port} is out of range; pass a port in 1-{MAX_PORT}")
        if not 0 <= self.shutdown_timeout <= 3600:
            raise ValueError(f"--shutdown-timeout {self.shutdown_timeout} must be within 0-3600 seconds")
        if self.tool_call_parser is not None:
            from rapid_llm.frontend.tool_parsers import parser_class

            parser_class(self.tool_call_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME (how to read the calls)")
        if self.reasoning_parser is not None:
            from rapid_llm.frontend.reasoning_parsers import REASONING_PARSERS

            REASONING_PARSERS.check(self.reasoning_parser)

    def frontend_options(self, sampling_defaults: dict[str, Any]):
        """The HTTP server's settings (chat template read from its file); errors name the flag."""
        from rapid_llm.frontend.chat_template import load_chat_template
        from rapid_llm.frontend.options import FrontendOptions

        return FrontendOptions(
            api_key=self.api_key,
            max_request_body_bytes=parse_size(self.max_request_body_size, "--max-request-body-size"),
            chat_template=None if self.chat_template is None else load_chat_template(self.chat_template),
            trust_request_chat_template=self.trust_request_chat_template,
            tool_call_parser=self.tool_call_parser,
            enable_auto_tool_choice=self.enable_auto_tool_choice,
            reasoning_parser=self.reasoning_parser,
            sampling_defaults=sampling_defaults,
        )

    def engine_config(self, model_dir: str):
        """Resolve and validate every setting; errors name the flag and the fix."""
        from rapid_llm.config.checkpoint_dir import check_model_dir, check_tokenizer_dir

        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(f"--log-level {self.log_level!r} must be debug, info, warning or error")
        # First, so a wrong path fails with the cause that names the fix.
        check_model_dir(model_dir)
        check_tokenizer_dir(self.tokenizer or model_dir, explicit=self.tokenizer is not None)
        from rapid_llm.config import (CacheConfig, CompilationConfig, DeviceConfig, EngineConfig, ModelConfig,
                                      ParallelConfig, SchedulerConfig)
        from rapid_llm.config.afd_config import AFDConfig
        from rapid_llm.config.eplb_config import EPLBConfig
        from rapid_llm.config.feature_combinations import PlainFlags, check_disaggregation, check_feature_combinations
        from rapid_llm.config.generation_defaults import generation_defaults
        from rapid_llm.config.kv_transfer_config import KVTransferConfig
        from rapid_llm.config.speculative_config import SpeculativeConfig
        from rapid_llm.models.registry import check_supported
        from rapid_llm.utils.demo_checkpoint import packaged_demo_name
        from rapid_llm.utils.plugins import load_plugins

        op_backends = self.op_backends()
        speculative = SpeculativeConfig.parse(self.speculative_config)
        if speculative is not None:
            from rapid_llm.spec_decode.registry import check_method

            check_method(speculative.method)
        device = DeviceConfig(self.device)
        load_plugins()  # before the architecture is read: a plugin may register it
        model = ModelConfig.from_pretrained(model_dir, self.dtype, self.max_model_len, self.trust_remote_code,
                                            self.quantization)
        check_supported(model.architecture)
        if self.eplb_config is not None and not self.enable_eplb:
            raise ValueError("--eplb-config takes effect with --enable-eplb only")
        afd = AFDConfig.parse(self.afd_config)
        parallel = ParallelConfig(tensor_parallel_size=self.tensor_parallel_size,
                                  enable_expert_parallel=self.enable_expert_parallel,
                                  eplb=EPLBConfig.parse(self.eplb_config) if self.enable_eplb else None,
                                  data_parallel_size=self.data_parallel_size,
                                  load_balance_method=self.load_balance_method, nnodes=self.nnodes,
                                  node_rank=self.node_rank, dist_init_addr=self.dist_init_addr,
                                  pipeline_parallel_size=self.pipeline_parallel_size,
                                  decode_context_parallel_size=self.decode_context_parallel_size,
                                  prefill_context_parallel_size=self.prefill_context_parallel_size,
                                  afd_ffn_ranks=afd.num_ffn_ranks if afd is not None else 0,
                                  pp_layer_partition=_int_tuple(self.pp_layer_partition, "--pp-layer-partition"))
        if parallel.expert_parallel_size > 1 and self.enable_torch_compile:
            raise ValueError("--enable-torch-compile with --enable-expert-parallel: the all-to-all's data-dependent "
                             "split sizes are not compiled; drop one of the flags")
        parallel.check_model(model)
        kv_transfer = KVTransferConfig.parse(self.kv_transfer_config, self.disaggregation_mode)
        if kv_transfer is not None:
            check_disaggregation(kv_transfer, parallel, speculative, self.enable_prefix_caching)
        served_model_name = self.served_model_name or packaged_demo_name(model_dir) or self.model or model_dir
        lora = self._lora_config(speculative, kv_transfer, served_model_name)
        check_feature_combinations(parallel, speculative, kv_transfer, lora is not None, PlainFlags(
            self.kv_cache_dtype, self.enable_prefix_caching, bool(self.kv_offload_size), self.enable_torch_compile))
        dcp = parallel.decode_context_parallel_size
        cache = CacheConfig(
            # With decode context parallelism a block's tokens are shared out: --block-size per rank, as vLLM.
            block_size=self.block_size * dcp,
            context_parallel_size=dcp,
            cache_dtype=self.kv_cache_dtype,
            kv_cache_memory_bytes=parse_size(self.kv_cache_memory, "--kv-cache-memory") if self.kv_cache_memory else None,
            num_blocks=self.num_kv_blocks,
            offload_bytes=parse_size(self.kv_offload_size, "--kv-offload-size") if self.kv_offload_size else None,
            offload_path=self.kv_offload_path,
            gpu_memory_utilization=self.gpu_memory_utilization,
            state_snapshots=(self.max_state_snapshots if self.max_state_snapshots is not None else
                             self.max_num_seqs if self.enable_prefix_caching else 0),
        )
        default_budget = 8192 if device.type == "cuda" else 2048
        scheduler = SchedulerConfig(
            max_model_len=model.max_model_len,
            block_size=cache.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or default_budget,
            eos_token_ids=model.eos_token_ids,
            vocab_size=model.vocab_size,
            async_scheduling=not self.disable_async_scheduling,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_cache_policy=self.prefix_cache_policy,
            eviction_policy=self.eviction_policy,
            state_snapshot_interval=self.state_snapshot_interval,
            max_waiting_requests=self.max_waiting_requests,
            watchdog_timeout=self.watchdog_timeout,
            speculative=speculative,
            itl_target_ms=self.itl_target_ms,
            kv_transfer=kv_transfer,
            lora=lora,
            pipeline_parallel_size=parallel.pipeline_parallel_size,
        )
        return EngineConfig(
            model=model,
            cache=cache,
            device=device,
            scheduler=scheduler,
            tokenizer=self.tokenizer or model_dir,
            served_model_name=served_model_name,
            op_backends=op_backends,
            log_level=self.log_level.lower(),
            sampling_defaults=generation_defaults(self.generation_config, model_dir),
            # EP's dispatchers size tensors from data (split sizes, pair counts), which a CUDA graph cannot capture,
            # and AFD's exchange is not captured: eager decode.
            compilation=CompilationConfig(self.enforce_eager or parallel.expert_parallel_size > 1
                                          or parallel.afd_ffn_ranks > 0,
                                          self.cuda_graph_max_bs, self.enable_torch_compile,
                                          self._two_batch_overlap(parallel, model, speculative, kv_transfer, lora)),
            parallel=parallel,
        )


    def _two_batch_overlap(self, parallel: ParallelConfig, model: ModelConfig, speculative: SpeculativeConfig | None,
                           kv_transfer: KVTransferConfig | None, lora: LoRAConfig | None) -> MicroBatchConfig | None:
        from rapid_llm.config.micro_batch_config import MicroBatchConfig, check_two_batch_overlap
        from rapid_llm.config.parallel_config import PIPELINE_PARALLEL_ARCHITECTURES
        from rapid_llm.spec_decode.registry import runs_in_worker

        if not self.enable_two_batch_overlap:
            return None
        check_two_batch_overlap(parallel.tensor_parallel_size + parallel.afd_ffn_ranks,
                                model.architecture in PIPELINE_PARALLEL_ARCHITECTURES, [
            (parallel.pipeline_parallel_size > 1, "--pipeline-parallel-size > 1", "not combined yet"),
            (parallel.decode_context_parallel_size > 1 or parallel.prefill_context_parallel_size > 1,
             "decode/prefill context parallelism", "their attention's collectives are not split yet"),
            (speculative is not None and runs_in_worker(speculative.method), "a draft-model/EAGLE/MTP "
             "--speculative-config", "the proposer reads the target's hidden states of the whole step"),
            (lora is not None, "--enable-lora", "adapters are read per token of the whole step"),
            (kv_transfer is not None, "--kv-transfer-config", "not combined yet"),
        ])
        return MicroBatchConfig(self.dbo_decode_token_threshold, self.dbo_prefill_token_threshold)

    def _lora_config(self, speculative: SpeculativeConfig | None, kv_transfer: KVTransferConfig | None,
                     served_model_name: str) -> LoRAConfig | None:
        """--enable-lora's settings; what it cannot run with yet is refused at start with the reason."""
        from rapid_llm.config.lora_config import LoRAConfig

        if not self.enable_lora:
            if self.lora_modules or self.lora_allowed_dirs:
                raise ValueError("--lora-modules and --lora-allowed-dirs take effect with --enable-lora only")
            return None
        if speculative is not None:
            raise ValueError("--enable-lora with --speculative-config: drafts and their verification would run "
                             "without the request's adapter; drop one of the flags")
        if kv_transfer is not None:
            raise ValueError("--enable-lora with --kv-transfer-config: transferred KV is not keyed by adapter yet; "
                             "drop one of the flags")
        return LoRAConfig.parse(self.lora_modules, self.max_loras, self.max_lora_rank, self.max_cpu_loras,
                                self.lora_allowed_dirs, served_model_name)

    def op_backends(self) -> dict[str, str]:
        """The op -> backend overrides: RAPID_LLM_OP_BACKEND, then --op-backend and --attention-backend
        over it; names are checked against the op catalog (torch-free)."""
        from rapid_llm.ops.registry import OP_BACKEND_ENV, REGISTRY, parse_op_backends

        flags = parse_op_backends(self.op_backend)
        REGISTRY.check_overrides(flags)
        if self.attention_backend != "auto":
            REGISTRY.check_overrides({"attention": self.attention_backend}, "--attention-backend")
            if flags.setdefault("attention", self.attention_backend) != self.attention_backend:
                raise ValueError(f"--attention-backend {self.attention_backend} contradicts --op-backend "
                                 f"attention={flags['attention']}; give one")
        from_env = parse_op_backends(os.environ.get(OP_BACKEND_ENV), OP_BACKEND_ENV)
        REGISTRY.check_overrides(from_env, OP_BACKEND_ENV)
        return {**from_env, **flags}


def _with_default(help_text: str, default: object) -> str:
    """`help_text` plus its default, unless the text already says what the default is."""
    if default is None or "default" in help_text:
        return help_text
    return f"{help_text} (default: {default})"


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def _int_tuple(text: str | None, flag: str) -> tuple[int, ...] | None:
    """"10,14" -> (10, 14); None stays None."""
    if text is None:
        return None
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
