"""Wait for the README-started server to be healthy, then check that it answers a completion.

Usage: python3 .ci/check_server.py PORT PID. Stdlib only: it runs before any package is installed.
Gives up after 900 s (the serve command installs torch first) or as soon as PID exits.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 900
while True:
    if not os.path.exists(f"/proc/{pid}"):
        sys.exit("the serve command exited before the server became healthy")
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
            if response.status == 200:
                break
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass
    if time.monotonic() > deadline:
        sys.exit("the server was not healthy after 900 s")
    time.sleep(1)

body = json.dumps({"prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0}).encode()
request = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as response:
    result = json.load(response)
choice = result["choices"][0]
if result["usage"]["completion_tokens"] < 1 or choice["finish_reason"] not in ("length", "stop"):
    sys.exit(f"unexpected completion: {result}")
print(f"server healthy; completion: {choice['text']!r} ({result['usage']})")
