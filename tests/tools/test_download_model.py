"""tools/download_model.py against a local stand-in of both sources: nothing leaves 127.0.0.1."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.tools.model_hub_stand_in import COMMIT, FILES, REPO, StandIn, git_blob_sha1
from tools import download_model

DEFAULT_SELECTION = {"config.json", "tokenizer.json", "model.safetensors", "sub/notes.txt"}
SOURCES = ("huggingface", "modelscope")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    for name in ("RAPID_LLM_MODEL_SOURCE", "RAPID_LLM_USE_MODELSCOPE", "HF_ENDPOINT", "MODELSCOPE_DOMAIN",
                 "MODELSCOPE_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")  # never a developer's saved login
    stand_in = StandIn()
    yield stand_in
    stand_in.close()


def run(hub: StandIn, folder: Path, *flags: str, endpoint: bool = True) -> int:
    return download_model.main([REPO, "--local-dir", str(folder), *flags, *(["--endpoint", hub.url] * endpoint)])


def files_in(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("source", SOURCES)
def test_the_default_selection_arrives_verified(hub: StandIn, tmp_path: Path, source: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(hub, tmp_path, "--source", source) == 0
    assert files_in(tmp_path) == {path: FILES[path] for path in DEFAULT_SELECTION}  # no .part, no .bin, no README
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path)
    assert captured.err.count(" ok)") == len(DEFAULT_SELECTION)
    listing = hub.paths_requested()[0]
    if source == "huggingface":  # the default branch is listed, then every file is fetched at its commit
        assert listing.startswith(f"/api/models/{REPO}/revision/main?")
        assert all(f"/resolve/{COMMIT}/" in path for path in hub.paths_requested()[1:] if "/cdn/" not in path)
    else:
        assert listing.startswith(f"/api/v1/models/{REPO}/repo/files?Revision=master&Recursive=True")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])  # on Hugging Face: LFS sha256, git sha1
def test_a_file_corrupted_in_transit_is_deleted_and_named(hub: StandIn, tmp_path: Path, source: str, name: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    hub.served[name] = FILES[name][:-1] + b"!"
    assert run(hub, tmp_path, "--source", source) == 1
    error = capsys.readouterr().err
    kind = "git-sha1" if source == "huggingface" and name == "config.json" else "sha256"
    digest = git_blob_sha1 if kind == "git-sha1" else lambda content: hashlib.sha256(content).hexdigest()
    assert f"{name}: {kind} mismatch: expected {digest(FILES[name])}, got {digest(hub.served[name])}" in error
    assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.part").exists()


def test_allow_patterns_choose_the_files(hub: StandIn, tmp_path: Path) -> None:
    assert run(hub, tmp_path, "--allow-patterns", "*.json", "*.bin") == 0
    assert set(files_in(tmp_path)) == {"config.json", "tokenizer.json", "pytorch_model.bin"}
    assert not any("safetensors" in path for path in hub.paths_requested())


def test_no_matching_file_lists_what_the_repo_has(hub: StandIn, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run(hub, tmp_path, "--allow-patterns", "*.gguf") == 1
    assert f"no file of {REPO} matches *.gguf; it has config.json, tokenizer.json" in capsys.readouterr().err


@pytest.mark.parametrize(("environment", "source"), [
    ({}, "huggingface"),
    ({"RAPID_LLM_MODEL_SOURCE": "modelscope"}, "modelscope"),
    ({"RAPID_LLM_USE_MODELSCOPE": "True"}, "modelscope"),
    ({"RAPID_LLM_MODEL_SOURCE": "huggingface", "RAPID_LLM_USE_MODELSCOPE": "0"}, "huggingface"),
])
def test_the_environment_selects_source_and_endpoint(hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     environment: dict[str, str], source: str) -> None:
    for name, value in {**environment, "HF_ENDPOINT": hub.url, "MODELSCOPE_DOMAIN": hub.url}.items():
        monkeypatch.setenv(name, value)
    assert run(hub, tmp_path, endpoint=False) == 0
    prefix = "/api/models/" if source == "huggingface" else "/api/v1/models/"
    assert hub.paths_requested()[0].startswith(prefix)


@pytest.mark.parametrize("source", SOURCES)
def test_verified_files_are_skipped_and_stale_ones_replaced(hub: StandIn, tmp_path: Path, source: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run(hub, tmp_path, "--source", source) == 0
    (tmp_path / "config.json").write_bytes(b'{"stale": true}')
    hub.requests.clear()
    capsys.readouterr()
    assert run(hub, tmp_path, "--source", source) == 0
    assert len(hub.requests) == 2 and "config.json" in hub.requests[1][0]  # the listing, then the stale file
    assert (tmp_path / "config.json").read_bytes() == FILES["config.json"]
    assert capsys.readouterr().err.count("present") == len(DEFAULT_SELECTION) - 1


@pytest.mark.parametrize("source", SOURCES)
def test_a_partial_file_resumes_with_a_range_request(hub: StandIn, tmp_path: Path, source: str) -> None:
    half = len(FILES["model.safetensors"]) // 2
    (tmp_path / "model.safetensors.part").write_bytes(FILES["model.safetensors"][:half])
    assert run(hub, tmp_path, "--source", source) == 0
    assert (tmp_path / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    ranges = [headers.get("range") for path, headers in hub.requests if path == "/cdn/model.safetensors"]
    assert ranges == [f"bytes={half}-"]


def test_credentials_reach_the_source_but_not_the_redirect(hub: StandIn, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms_stand_in")
    assert run(hub, tmp_path / "hf", "--source", "huggingface") == 0
    assert run(hub, tmp_path / "ms", "--source", "modelscope") == 0
    for path, headers in hub.requests:
        if path.startswith("/cdn/"):
            assert "authorization" not in headers and "cookie" not in headers, path
        elif path.startswith("/api/v1/"):
            assert headers["authorization"] == "Bearer ms_stand_in" and headers["cookie"] == "m_session_id=ms_stand_in"
        else:
            assert headers["authorization"] == "Bearer hf_stand_in", path


@pytest.mark.parametrize(("entry", "message"), [
    ({"Path": "extra.json", "Sha256": ""}, "the source lists no hash for extra.json"),
    ({"Path": "../outside.json", "Sha256": "0" * 64}, "a path outside"),
])
def test_unhashed_or_escaping_files_are_refused(hub: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                entry: dict[str, str], message: str) -> None:
    hub.extra_modelscope_entries.append({"Name": "x", "Type": "blob", "Size": 2, **entry})
    assert run(hub, tmp_path / "model", "--source", "modelscope") == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "outside.json").exists()


@pytest.mark.parametrize("source", SOURCES)
def test_an_unknown_repo_is_reported(hub: StandIn, tmp_path: Path, source: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert download_model.main(["org/missing", "--source", source, "--endpoint", hub.url,
                                "--local-dir", str(tmp_path)]) == 1
    assert "org/missing" in capsys.readouterr().err


def test_bad_source_names_fail_clearly(hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(hub, tmp_path, "--source", "github")
    assert exit_info.value.code == 2
    assert "argument --source: invalid choice: 'github'" in capsys.readouterr().err
    monkeypatch.setenv("RAPID_LLM_MODEL_SOURCE", "hf")
    assert run(hub, tmp_path) == 1
    assert "RAPID_LLM_MODEL_SOURCE='hf' is not a source: use one of huggingface, modelscope" in capsys.readouterr().err
    monkeypatch.setenv("RAPID_LLM_MODEL_SOURCE", "huggingface")
    monkeypatch.setenv("RAPID_LLM_USE_MODELSCOPE", "1")
    assert run(hub, tmp_path) == 1
    assert "contradicts RAPID_LLM_USE_MODELSCOPE" in capsys.readouterr().err
    monkeypatch.setenv("RAPID_LLM_USE_MODELSCOPE", "maybe")
    assert run(hub, tmp_path) == 1
    assert "RAPID_LLM_USE_MODELSCOPE='maybe' is neither true nor false" in capsys.readouterr().err
    assert hub.requests == []


def test_the_script_runs_from_a_checkout(hub: StandIn, tmp_path: Path) -> None:
    script = Path(download_model.__file__)
    result = subprocess.run([sys.executable, str(script), REPO, "--endpoint", hub.url, "--local-dir", str(tmp_path),
                             "--allow-patterns", "config.json"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path) and (tmp_path / "config.json").read_bytes() == FILES["config.json"]
