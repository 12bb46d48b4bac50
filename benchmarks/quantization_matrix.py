"""The weight-mode x KV-cache-dtype matrix of docs/benchmark_quantization_models.md.

One server per cell: start it, score the held-out text (bench_accuracy, deterministic), time a short
random workload (bench_serving; it waits --lock-wait s for /tmp/bench.flock, then runs unlocked and the cell
says so), read /server_info, stop it. Each cell's
logs and JSONs go to OUT/CELL.*; `report` turns them into the markdown tables and checks weight_bytes and
kv_cache_tokens against the formats' arithmetic (benchmarks/quantization_matrix_report.py). A cell whose
server does not start is recorded as unsupported with its start-up error.

  python benchmarks/quantization_matrix.py run --out DIR [--rows bf16,fp8,...] [--kv auto,fp8,nvfp4]
      [--ckpt gptq-w4a16=/tmp/qm-gptq ...] [--max-tokens-total 1400] [--port N]
  python benchmarks/quantization_matrix.py report --out DIR --doc docs/benchmark_quantization_models.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ONLINE_ROWS = ["bf16", "fp8", "fp8-rowwise", "fp8-block128", "fp8-block128-ue8m0", "fp8-block32",
               "fp8-block32-ue8m0", "w4a16", "w4a8", "nvfp4", "mxfp4"]
KV_DTYPES = ["auto", "fp8", "nvfp4"]
SERVING = ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "16",
           "--num-prompts", "4", "--max-concurrency", "4", "--temperature", "0", "--seed", "1",
           "--num-warmups", "1", "--disable-tqdm"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def _start(args: argparse.Namespace, model: str, quantization: str | None, kv: str, log: Path
           ) -> tuple[subprocess.Popen | None, str]:
    cmd = [sys.executable, "-m", "rapid_llm.launch_server", "--model", model, "--port", str(args.port),
           "--kv-cache-memory", args.kv_cache_memory, "--log-level", "info", "--kv-cache-dtype", kv]
    if quantization:
        cmd += ["--quantization", quantization]
    # One torch thread: several cells share 2 busy cores, and OpenMP's spinning threads oversubscribed them.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    handle = log.open("w")
    handle.write(" ".join(cmd) + "\n")
    handle.flush()
    server = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            errors = [line.strip() for line in log.read_text().splitlines() if "Error" in line or "error" in line]
            return None, errors[-1] if errors else f"exit code {server.returncode}"
        try:
            _get(f"http://127.0.0.1:{args.port}/health")
            return server, ""
        except OSError:
            time.sleep(1)
    server.kill()
    return None, "not healthy after 300 s"


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_cell(args: argparse.Namespace, row: str, model: str, quantization: str | None, kv: str) -> None:
    name = f"{row}__kv-{kv}"
    out = Path(args.out)
    if (out / f"{name}.cell.json").exists() and not args.force:
        return
    print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
    cell: dict[str, Any] = {"row": row, "kv": kv, "model": model, "quantization": quantization,
                            "source_model": args.model, "kv_cache_memory": args.kv_cache_memory}
    started = time.monotonic()
    server, error = _start(args, model, quantization, kv, out / f"{name}.server.log")
    if server is None:
        cell["unsupported"] = error
    else:
        try:  # any failure below still stops the server
            base = f"http://127.0.0.1:{args.port}"
            cell["server_info"] = _get(f"{base}/server_info")
            subprocess.run([sys.executable, "benchmarks/bench_accuracy.py", "--backend", "server", "--base-url", base,
                            "--num-lines", "0", "--max-tokens-total", str(args.max_tokens_total), "--label", name,
                            "--output", str(out / f"{name}.accuracy.json")],
                           cwd=ROOT, check=True, stdout=(out / f"{name}.accuracy.log").open("w"),
                           stderr=subprocess.STDOUT)
            serving_cmd = [sys.executable, "benchmarks/bench_serving.py", "--base-url", base, *SERVING, "--label",
                           name, "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.serving.json"]
            serving_log = (out / f"{name}.serving.log").open("w")
            # Wait a while for the benchmark lock; a long benchmark of another session may hold it for many
            # minutes, and then the run goes ahead unlocked and the cell says so.
            locked = subprocess.run(["flock", "-w", str(args.lock_wait), "/tmp/bench.flock", *serving_cmd], cwd=ROOT,
                                    stdout=serving_log, stderr=subprocess.STDOUT)
            cell["serving_locked"] = locked.returncode == 0
            if locked.returncode == 1 and not (out / f"{name}.serving.json").exists():
                subprocess.run(serving_cmd, cwd=ROOT, check=True, stdout=serving_log, stderr=subprocess.STDOUT)
            elif locked.returncode != 0:
                raise subprocess.CalledProcessError(locked.returncode, serving_cmd)
            accuracy = json.loads((out / f"{name}.accuracy.json").read_text())
            serving = json.loads((out / f"{name}.serving.json").read_text())
            cell["accuracy"] = {k: accuracy[k] for k in ("perplexity", "top1_accuracy", "scored_tokens",
                                                          "score_seconds")}
            cell["serving"] = {k: serving[k] for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms",
                                                        "completed", "failed")}
        except subprocess.CalledProcessError as exc:
            cell["error"] = f"{Path(exc.cmd[-1]).name if exc.cmd else ''} failed: exit {exc.returncode}"
        finally:
            _stop(server)
    cell["threads"] = args.threads
    cell["seconds"] = round(time.monotonic() - started, 1)
    cell["load_average"] = os.getloadavg()
    (out / f"{name}.cell.json").write_text(json.dumps(cell, indent=1))


def cmd_run(args: argparse.Namespace) -> None:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = [(row, args.model, None if row == "bf16" else row) for row in args.rows.split(",") if row]
    for spec in args.ckpt:
        label, path = spec.split("=", 1)
        rows.append((label, path, None))
    for row, model, quantization in rows:
        for kv in args.kv.split(","):
            run_cell(args, row, model, quantization, kv)


def _cells(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    cells = {}
    for path in sorted(out.glob("*.cell.json")):
        cell = json.loads(path.read_text())
        cells[(cell["row"], cell["kv"])] = cell
    return cells




def cmd_report(args: argparse.Namespace) -> None:
    from benchmarks.quantization_matrix_report import render  # the markdown, kept apart from the runner
    tables = render(_cells(Path(args.out)))
    if args.doc is None:
        print(tables)
        return
    # Each results folder has its own block, named after the folder.
    name = Path(args.out).name
    begin = f"<!-- matrix:begin {name} (benchmarks/quantization_matrix.py report) -->"
    end = f"<!-- matrix:end {name} -->"
    doc = Path(args.doc)
    text = doc.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{doc} has no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{tables}\n{end}{rest.split(end, 1)[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out", required=True)
    run.add_argument("--model", default="rapid_llm/demo_models/target")
    run.add_argument("--rows", default=",".join(ONLINE_ROWS))
    run.add_argument("--kv", default=",".join(KV_DTYPES))
    run.add_argument("--ckpt", nargs="*", default=[], help="LABEL=CHECKPOINT_DIR rows (GPTQ / AWQ)")
    run.add_argument("--max-tokens-total", type=int, default=1400)
    run.add_argument("--port", type=int, default=31771)
    run.add_argument("--kv-cache-memory", default="1GiB")
    run.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each server")
    run.add_argument("--lock-wait", type=int, default=90, help="seconds to wait for /tmp/bench.flock")
    run.add_argument("--force", action="store_true", help="rerun cells that have a result")
    report = sub.add_parser("report")
    report.add_argument("--out", required=True)
    report.add_argument("--doc", help="replace the tables between this folder's matrix markers in this markdown file")
    args = parser.parse_args()
    {"run": cmd_run, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    main()
