"""The demo models' corpus: the Python source of CPython's standard library, split by file.

Files are visited in the order of the SHA-256 of their relative path and each joins the held-out split
while it still fits in ``HELD_OUT_MAX_BYTES``, so the split depends only on file names and sizes, is
disjoint by construction, and stays small enough to ship. The held-out text is committed as one file
(``data/held_out.txt``, files joined by separator lines) so evaluation does not depend on the local
Python; the train split stays on disk and ``data/manifest.json`` records its files' SHA-256 hashes.

Usage:
    python -m tools.demo_model.data            # regenerate split + manifest into data/ and verify
    python -m tools.demo_model.data --check    # only verify the local stdlib against the manifest
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import platform
import shutil
import sysconfig

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"
MANIFEST_NAME, HELD_OUT_NAME, LICENSE_NAME = "manifest.json", "held_out.txt", "PSF-LICENSE.txt"
DEFAULT_STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
HELD_OUT_MAX_BYTES = 400_000
# Directory names skipped anywhere below the stdlib root: tests, third-party code, IDLE, and caches.
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "__pycache__"})
SEPARATOR = "#<|file|> {path}\n"
SOURCE = f"CPython {platform.python_version()} standard library"
_SEPARATOR_RE = re.compile(r"^#<\|file\|> (.+)\n", re.MULTILINE)


class CorpusError(RuntimeError):
    """The local standard library does not match the manifest, or the shipped files are malformed."""


def source_files(stdlib: pathlib.Path) -> list[str]:
    """Relative paths (POSIX form) of the corpus files below ``stdlib``, sorted."""
    if not stdlib.is_dir():
        raise CorpusError(f"standard library directory not found: {stdlib}")
    return sorted(
        path.relative_to(stdlib).as_posix()
        for path in stdlib.rglob("*.py")
        if path.is_file() and not EXCLUDED_DIRS.intersection(path.relative_to(stdlib).parts[:-1])
    )


def path_hash(relative_path: str) -> str:
    return hashlib.sha256(relative_path.encode()).hexdigest()


def split(sizes: dict[str, int], max_held_out_bytes: int = HELD_OUT_MAX_BYTES) -> tuple[list[str], list[str]]:
    """``(train, held_out)`` relative paths, each sorted, from each file's size in bytes."""
    held_out: list[str] = []
    total = 0
    for path in sorted(sizes, key=path_hash):
        if total + sizes[path] <= max_held_out_bytes:
            held_out.append(path)
            total += sizes[path]
    chosen = set(held_out)
    return sorted(p for p in sizes if p not in chosen), sorted(held_out)


def join_files(texts: dict[str, str]) -> str:
    """One text holding ``texts`` in path order, each preceded by its separator line."""
    for path, text in texts.items():
        # A separator must start a line, so a text without its final newline would not come back intact.
        if text and not text.endswith("\n"):
            raise CorpusError(f"{path} does not end with a newline")
        if _SEPARATOR_RE.search(text):
            raise CorpusError(f"{path} contains a line that looks like a file separator")
    return "".join(SEPARATOR.format(path=path) + text for path, text in sorted(texts.items()))


def split_files(joined: str) -> dict[str, str]:
    """The inverse of :func:`join_files`."""
    parts = _SEPARATOR_RE.split(joined)
    if parts[0]:
        raise CorpusError("joined text does not start with a file separator")
    return dict(zip(parts[1::2], parts[2::2]))


def load_held_out(data_dir: pathlib.Path = DATA_DIR) -> dict[str, str]:
    """The shipped held-out files, by relative path."""
    return split_files((data_dir / HELD_OUT_NAME).read_text(encoding="utf-8"))


def load_train(stdlib: pathlib.Path = DEFAULT_STDLIB, data_dir: pathlib.Path = DATA_DIR) -> dict[str, str]:
    """The train files read from ``stdlib``, by relative path; raises if any differs from the manifest."""
    manifest = json.loads((data_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    texts: dict[str, str] = {}
    for entry in manifest["train"]:
        path = stdlib / entry["path"]
        if not path.is_file():
            raise CorpusError(f"train file missing from {stdlib}: {entry['path']}")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CorpusError(f"train file differs from the manifest: {entry['path']}")
        texts[entry["path"]] = data.decode("utf-8")
    return texts


def write_split(stdlib: pathlib.Path, data_dir: pathlib.Path) -> dict[str, int]:
    """Write manifest, held-out text and licence for ``stdlib`` into ``data_dir``; return summary counts."""
    contents = {path: (stdlib / path).read_bytes() for path in source_files(stdlib)}
    train, held_out = split({path: len(data) for path, data in contents.items()})
    data_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "source": SOURCE,
        "held_out_max_bytes": HELD_OUT_MAX_BYTES,
        "held_out": held_out,
        "train": [{"path": p, "sha256": hashlib.sha256(contents[p]).hexdigest(), "bytes": len(contents[p])}
                  for p in train],
    }
    (data_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    joined = join_files({path: contents[path].decode("utf-8") for path in held_out})
    (data_dir / HELD_OUT_NAME).write_text(joined, encoding="utf-8")
    shutil.copyfile(stdlib / "LICENSE.txt", data_dir / LICENSE_NAME)
    return {"train_files": len(train), "train_bytes": sum(len(contents[p]) for p in train),
            "held_out_files": len(held_out), "held_out_bytes": sum(len(contents[p]) for p in held_out)}


def verify(stdlib: pathlib.Path, data_dir: pathlib.Path) -> None:
    """Raise :class:`CorpusError` unless ``stdlib`` reproduces the shipped split exactly."""
    load_train(stdlib, data_dir)
    for path, text in load_held_out(data_dir).items():
        if (stdlib / path).read_text(encoding="utf-8") != text:
            raise CorpusError(f"held-out file differs from the shipped text: {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdlib", type=pathlib.Path, default=DEFAULT_STDLIB)
    parser.add_argument("--out", type=pathlib.Path, default=DATA_DIR, help="where manifest and held-out go")
    parser.add_argument("--check", action="store_true", help="only verify, write nothing")
    args = parser.parse_args(argv)
    if not args.check:
        print(json.dumps(write_split(args.stdlib, args.out)))
    verify(args.stdlib, args.out)
    print(f"verified {args.stdlib} against {args.out / MANIFEST_NAME}")


if __name__ == "__main__":
    main()
