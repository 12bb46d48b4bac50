"""`python -m rapid_llm.router --prefill URL [URL...] --decode URL [URL...] --port N`: the PD router (app.py).

The instances are ordinary `launch_server` processes started with `--kv-transfer-config` (kv_role kv_producer for
prefill, kv_consumer for decode); see docs/disaggregation.md.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from rapid_llm.router.app import build_app
from rapid_llm.router.instances import POLICIES, InstancePool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rapid_llm.router",
                                     description="Route OpenAI requests over prefill and decode instances.")
    parser.add_argument("--prefill", nargs="+", required=True, metavar="URL", help="Prefill instances' base URLs.")
    parser.add_argument("--decode", nargs="+", required=True, metavar="URL", help="Decode instances' base URLs.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000).")
    parser.add_argument("--policy", default="least_load", choices=POLICIES,
                        help="How an instance is chosen per request (default: least_load).")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s router: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per upstream request otherwise
    try:
        app = build_app(InstancePool("prefill", args.prefill, args.policy),
                        InstancePool("decode", args.decode, args.policy))
    except ValueError as error:
        parser.error(str(error))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
