"""Start-up validation and the command line: one-line errors naming the flag and the fix, --help, aliases."""

from __future__ import annotations

import dataclasses

import json
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rapid_llm
from rapid_llm.config.checkpoint_dir import check_model_dir, check_tokenizer_dir
from rapid_llm.entrypoints.http_server import bind_listening_socket
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.server_args import ServerArgs
from tests.hf_reference import TOKENIZER_IMPORTS_TORCH, TOKENIZER_IMPORTS_TORCH_REASON

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture
def no_tokenizer_checkpoint(tiny_checkpoint, tmp_path):
    """The tiny checkpoint with its tokenizer files deleted."""
    directory = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_checkpoint(), directory)
    for name in TOKENIZER_FILES:
        (directory / name).unlink(missing_ok=True)
    return directory


def test_a_hub_id_is_refused_with_the_local_directory_fix() -> None:
    with pytest.raises(ValueError, match="^--model 'meta-llama/Llama-3-8B' is not a local directory, and hub ids "
                                         "are not downloaded; pass a local directory") as raised:
        check_model_dir("meta-llama/Llama-3-8B")
    # Both fixes it names exist: the project's downloader and `hf` (huggingface_hub 1.0 removed `huggingface-cli`).
    message = str(raised.value)
    assert "`python tools/download_model.py meta-llama/Llama-3-8B`" in message
    assert "`hf download meta-llama/Llama-3-8B --local-dir DIR`" in message
    assert "huggingface-cli" not in message


def test_a_missing_model_path_says_it_does_not_exist(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist; pass a local Hugging Face checkpoint directory"):
        check_model_dir(str(tmp_path / "nope"))


def test_a_model_without_tokenizer_names_the_tokenizer_flag(no_tokenizer_checkpoint) -> None:
    with pytest.raises(ValueError, match=r"^--model '.*' has no tokenizer files \(tokenizer.json.*\); pass "
                                         "--tokenizer DIR"):
        ServerArgs(model=str(no_tokenizer_checkpoint)).engine_config(str(no_tokenizer_checkpoint))


def test_an_explicit_tokenizer_without_files_names_that_flag(tmp_path, tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="^--tokenizer .* holds no tokenizer files"):
        check_tokenizer_dir(str(tmp_path), explicit=True)
    check_tokenizer_dir(str(tiny_checkpoint()), explicit=True)


def test_an_unsupported_architecture_names_it_and_the_supported_list(tiny_checkpoint, tmp_path) -> None:
    directory = tmp_path / "classifier"
    shutil.copytree(tiny_checkpoint(), directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(ValueError, match="'LlamaForSequenceClassification' is not supported.*Supported "
                                         "architectures: DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                                         "DeepseekV4ForCausalLM, Lfm2ForCausalLM, LlamaForCausalLM, "):
        ServerArgs(model=str(directory)).engine_config(str(directory))


def test_an_unknown_attention_backend_is_refused(tiny_checkpoint) -> None:
    backends = ", ".join(REGISTRY.backends()["attention"])
    with pytest.raises(ValueError, match=f"^--attention-backend: op 'attention' has no backend 'flash'; "
                                         f"its backends: {backends}$"):
        ServerArgs(attention_backend="flash").engine_config(str(tiny_checkpoint()))


@pytest.mark.parametrize("port", [0, 99999, -1])
def test_a_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=f"^--port {port} is out of range; pass a port in 1-65535$"):
        ServerArgs(port=port).check_http()


def test_a_port_in_use_is_found_by_binding() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"^--port {port} is already in use on 127.0.0.1; .* another --port$"):
            bind_listening_socket("127.0.0.1", port)
    bind_listening_socket("127.0.0.1", port).close()


def test_sglang_spellings_are_aliases() -> None:
    args = ServerArgs.from_cli(["--model-path", "/m", "--mem-fraction-static", "0.5"])
    assert (args.model, args.gpu_memory_utilization) == ("/m", 0.5)


def test_numeric_flags_parse_as_numbers() -> None:
    """Every int or float field, optional or not, reaches the config as a number (not the CLI's string)."""
    numeric = [f for f in dataclasses.fields(ServerArgs) if str(f.type) in ("int", "int | None", "float", "float | None")]
    argv = ["--model", "/m"]
    for field in numeric:
        argv += [f"--{field.name.replace('_', '-')}", "3"]
    args = ServerArgs.from_cli(argv)
    assert {field.name: getattr(args, field.name) for field in numeric} == {field.name: 3 for field in numeric}
    assert isinstance(args.itl_target_ms, float)


def test_serve_takes_the_model_as_a_positional_argument(capsys) -> None:
    assert ServerArgs.from_cli(["/m", "--port", "8000"], positional_model=True).model == "/m"
    assert ServerArgs.from_cli(["--model", "/m"], positional_model=True).model == "/m"
    with pytest.raises(SystemExit):
        ServerArgs.from_cli(["/a", "--model", "/b"], positional_model=True)
    assert capsys.readouterr().err.count("\n") == 1


def test_help_states_each_default_once(capsys) -> None:
    with pytest.raises(SystemExit):
        ServerArgs.from_cli(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in help_text
    assert "(default: the model's). (default" not in help_text
    assert "HTTP port. (default: 30000)" in help_text
    assert "--model-path" in help_text and "--generation-config" in help_text


def test_version_and_a_bad_flag_value_are_one_line() -> None:
    version = subprocess.run([sys.executable, "-m", "rapid_llm.cli", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("rapid_llm ")
    bad = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--port", "abc"], capture_output=True,
                         text=True)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "python -m rapid_llm.launch_server: error: argument --port: invalid int value: 'abc' (see --help)"]


def test_the_launcher_modules_do_not_import_torch_or_the_engine() -> None:
    """The HTTP process imports engine_processes; the children import the model stack themselves."""
    code = ("import sys, rapid_llm.entrypoints.engine_processes, rapid_llm.entrypoints.http_server, rapid_llm.cli; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('rapid_llm.worker_proc', "
            "'rapid_llm.models', 'rapid_llm.scheduler_proc', 'rapid_llm.detokenizer_proc'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("files", [{}, {"__init__.py": "VERSION = 1\n"}], ids=["folder", "other-package"])
def test_a_rapid_llm_folder_that_shadows_the_package_is_named_with_the_fix(tmp_path, files) -> None:
    # A package on sys.path cannot lose to a plain folder, and a folder with an __init__ hides it whole (launcher
    # included); the launcher runs beside a shadowing folder only when an editable install's finder, which
    # Python asks after sys.path, finds the package.
    probe = "import importlib.machinery; print(importlib.machinery.PathFinder.find_spec('rapid_llm') is None)"
    if subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                      check=True).stdout.strip() != "True":
        pytest.skip("rapid_llm is not an editable install here")
    shadow = tmp_path.resolve() / "rapid_llm"  # as os.getcwd() spells it
    shadow.mkdir()
    for name, text in files.items():
        (shadow / name).write_text(text)
    result = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    found = shadow / "__init__.py" if files else shadow
    package = Path(rapid_llm.__file__).resolve().parent
    assert result.stderr.splitlines()[-1] == (
        f"ImportError: `import rapid_llm` found {found}, not the rapid_llm package ({package}): a folder named "
        "rapid_llm in the current directory or the script's directory shadows it; run from another directory, or "
        "rename that folder")


@pytest.mark.skipif(TOKENIZER_IMPORTS_TORCH, reason=TOKENIZER_IMPORTS_TORCH_REASON)
def test_the_launcher_start_up_path_does_not_import_torch(tiny_checkpoint) -> None:
    """Config resolution, tokenizer load and the HTTP app's modules, as launch_server runs them."""
    code = textwrap.dedent("""
        import sys
        import rapid_llm.entrypoints.engine_processes, rapid_llm.frontend.app, rapid_llm.frontend.tokenizer_manager
        from rapid_llm.server_args import ServerArgs
        from rapid_llm.utils.tokenizer_loading import load_tokenizer
        args = ServerArgs(model=sys.argv[1])
        config = args.engine_config(sys.argv[1])
        args.frontend_options(config.sampling_defaults)
        load_tokenizer(config.tokenizer).apply_chat_template([{"role": "user", "content": "hi"}])
        print(config.summary()["device"], config.model.dtype_name, "torch" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", code, str(tiny_checkpoint())], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split()[1:] == ["float32", "False"]


@pytest.mark.parametrize(("flags", "message"), [
    ({"tensor_parallel_size": 2}, "--kv-offload-size with --tp/--pp/--dp above 1: not combined yet"),
    ({"enable_prefix_caching": False}, "--kv-offload-size with --disable-prefix-caching: the tier holds"),
    ({"prefix_cache_policy": "tree"}, "--prefix-cache-policy must be one of hash, radix, got 'tree'"),
    ({"eviction_policy": "mru"}, "--eviction-policy must be one of lru, lfu, cost, got 'mru'"),
])
def test_prefix_cache_flags_are_checked_at_start(tiny_checkpoint, flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(kv_offload_size="1MiB", **flags).engine_config(str(tiny_checkpoint()))


def test_an_explicit_radix_cache_is_refused_for_sliding_window_and_state_models() -> None:
    from rapid_llm.config.scheduler_config import SchedulerConfig

    windowed = SchedulerConfig(max_model_len=64, kv_windows=(None, 8), prefix_cache_policy="radix")
    with pytest.raises(ValueError, match="radix is not available for this model: its sliding-window layers"):
        windowed.cache_policy()
    assert SchedulerConfig(max_model_len=64, kv_windows=(None, 8)).cache_policy() == "hash"
    assert SchedulerConfig(max_model_len=64, recurrent_state=True).cache_policy() == "hash"
    assert SchedulerConfig(max_model_len=64).cache_policy() == "radix"
    off = SchedulerConfig(max_model_len=64, recurrent_state=True, prefix_cache_policy="radix",
                          enable_prefix_caching=False)
    assert off.cache_policy() == "radix", "no refusal while caching is off"
