"""Download a checkpoint from Hugging Face or ModelScope, verifying every file against the source's hash.

    python tools/download_model.py Qwen/Qwen3-0.6B                    # Hugging Face, into ~/.cache/rapid_llm
    python tools/download_model.py Qwen/Qwen3-0.6B --source modelscope --local-dir ckpt/qwen3
    RAPID_LLM_MODEL_SOURCE=modelscope python tools/download_model.py Qwen/Qwen3-0.6B

Key design choice: no file gets its final name before its hash equals the one the source publishes
(Hugging Face: the LFS sha256, else the git blob sha1; ModelScope: `Sha256`). Bytes stream into
`<name>.part` and are hashed as they arrive; a rerun resumes a part with an HTTP Range request and skips
files already verified. Listings come from tools/model_sources.py. The last line printed is the folder,
ready for `rapid-llm serve`.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import sys
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as `python tools/download_model.py`: the repo root makes `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.model_sources import SOURCES, DownloadError, RemoteFile, list_files, open_url

# vLLM's loader reads safetensors weights plus the config and tokenizer files; rapid_llm loads safetensors only.
DEFAULT_PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
CACHE_DIR = Path.home() / ".cache" / "rapid_llm" / "models"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}
_CHUNK = 1 << 20


class ChecksumError(DownloadError):
    """A downloaded file's hash differs from the one its source lists; the file was deleted."""


def choose_source(flag: str | None) -> str:
    """--source, else RAPID_LLM_MODEL_SOURCE, else RAPID_LLM_USE_MODELSCOPE (as VLLM_USE_MODELSCOPE), else HF."""
    if flag is not None:
        return flag
    named = os.environ.get("RAPID_LLM_MODEL_SOURCE", "").strip().lower()
    use_modelscope = os.environ.get("RAPID_LLM_USE_MODELSCOPE", "").strip().lower()
    if named and named not in SOURCES:
        raise DownloadError(f"RAPID_LLM_MODEL_SOURCE={named!r} is not a source: use one of {', '.join(SOURCES)}")
    if use_modelscope not in _TRUE | _FALSE:
        raise DownloadError(f"RAPID_LLM_USE_MODELSCOPE={use_modelscope!r} is neither true nor false")
    if named and use_modelscope in _TRUE and named != "modelscope":
        raise DownloadError(f"RAPID_LLM_MODEL_SOURCE={named} contradicts RAPID_LLM_USE_MODELSCOPE: unset one")
    return named or ("modelscope" if use_modelscope in _TRUE else "huggingface")


def selected(files: list[RemoteFile], patterns: Sequence[str]) -> list[RemoteFile]:
    """The files whose repo path matches a glob (`*` crosses `/`, as huggingface_hub's allow_patterns)."""
    return [file for file in files if any(fnmatch.fnmatch(file.path, pattern) for pattern in patterns)]


def _target(local_dir: Path, relative: str) -> Path:
    target = (local_dir / relative).resolve()
    if local_dir.resolve() not in target.parents:  # a listing must not write outside the folder
        raise DownloadError(f"the source lists {relative!r}, a path outside {local_dir}: refused")
    return target


def _hash_into(hasher: "hashlib._Hash", path: Path) -> None:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)


def _is_verified(file: RemoteFile, path: Path) -> bool:
    if not path.is_file() or path.stat().st_size != file.size:
        return False
    hasher = file.hasher()
    _hash_into(hasher, path)
    return hasher.hexdigest() == file.digest


def fetch(file: RemoteFile, local_dir: Path, credentials: dict[str, str]) -> bool:
    """Make `local_dir/file.path` hold exactly the listed bytes; False when it already did."""
    if not file.digest:
        raise DownloadError(f"the source lists no hash for {file.path}: refusing to download it unverified")
    target = _target(local_dir, file.path)
    if _is_verified(file, target):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    offset = part.stat().st_size if part.is_file() else 0
    if offset > file.size:  # longer than the file: not its beginning, start over
        part.unlink()
        offset = 0
    hasher = file.hasher()
    if offset:
        _hash_into(hasher, part)
    if offset < file.size or not part.exists():
        with open_url(file.url, credentials, {"Range": f"bytes={offset}-"} if offset else {}) as response:
            if offset and response.status != 206:  # the server ignored the range: start the part over
                offset, hasher = 0, file.hasher()
            with part.open("ab" if offset else "wb") as out:
                while chunk := response.read(_CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
    actual, received = hasher.hexdigest(), part.stat().st_size
    if actual != file.digest:
        part.unlink()
        raise ChecksumError(f"{file.path}: {file.hash_kind} mismatch: expected {file.digest}, got {actual} "
                            f"({received} of {file.size} bytes); the file was deleted, run again to retry")
    os.replace(part, target)
    return True


def download(repo_id: str, source: str, revision: str | None, local_dir: Path | None,
             patterns: Sequence[str], endpoint: str | None) -> Path:
    """Fetch and verify every file of `repo_id` that matches `patterns`; returns the folder."""
    listing = list_files(source, repo_id, revision, endpoint)
    files = selected(listing.files, patterns)
    if not files:
        names = ", ".join(file.path for file in listing.files[:20]) or "no files"
        raise DownloadError(f"no file of {repo_id} matches {' '.join(patterns)}; it has {names}")
    folder = local_dir or CACHE_DIR / source / repo_id
    print(f"{source} {repo_id}@{listing.revision} -> {folder} ({len(files)} files)", file=sys.stderr)
    for file in files:
        fetched = fetch(file, folder, listing.credentials)
        state = "downloaded" if fetched else "present"
        print(f"  {state:10} {file.path} ({file.size / 2**20:.1f} MiB, {file.hash_kind} ok)", file=sys.stderr)
    return folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="download_model.py", description=__doc__.split("\n")[0])
    parser.add_argument("repo_id", help="owner/name on the source, e.g. Qwen/Qwen3-0.6B")
    parser.add_argument("--source", choices=SOURCES, default=None,
                        help="default: $RAPID_LLM_MODEL_SOURCE, else modelscope if $RAPID_LLM_USE_MODELSCOPE "
                             "is true, else huggingface")
    parser.add_argument("--revision", help="branch, tag or commit (default: main on Hugging Face, master on "
                                           "ModelScope)")
    parser.add_argument("--local-dir", type=Path, help=f"default: {CACHE_DIR}/SOURCE/REPO_ID")
    parser.add_argument("--allow-patterns", nargs="+", default=list(DEFAULT_PATTERNS), metavar="GLOB",
                        help=f"repo paths to fetch (default: {' '.join(DEFAULT_PATTERNS)})")
    parser.add_argument("--endpoint", help="default: $HF_ENDPOINT / $MODELSCOPE_DOMAIN, else the public hub")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        folder = download(args.repo_id, choose_source(args.source), args.revision, args.local_dir,
                          args.allow_patterns, args.endpoint)
    except DownloadError as error:
        print(f"download_model: {error}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
