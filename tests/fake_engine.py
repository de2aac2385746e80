"""A stand-in for a vLLM OpenAI-compatible server process (no vLLM needed), run as a script on loopback:
``GET /health`` and ``POST /v1/completions`` (the fields ``OpenAICompatiblePolicy`` reads), each
behaving as ``--mode`` says:

- ``ok``: /health 200, completions answer ``--ids`` with log-prob -0.5 each;
- ``503``: everything 503, what vLLM's API server answers once its engine process died;
- ``hang``: accepts the connection and never answers;
- ``drop``: closes the connection without a reply;
- ``crash``: exits with code 3 before listening (a server that dies while loading), saying so on stderr.

``--delay S`` waits S seconds before listening (a slow start). At start it writes the engine variables
:class:`~mgrpo_algo.policies.vllm_server.VLLMServer` sets (``VLLM_*``, ``MGRPO_FAKE_*``) to stderr, which the
server's log file receives, as vLLM's own log lines. tests/test_vllm_watchdog.py runs it under
:class:`mgrpo_algo.policies.vllm_server.VLLMServer` in place of vLLM's entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="ok", choices=["ok", "503", "hang", "drop", "crash"])
    p.add_argument("--ids", default="5,6,7")
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    shown = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(("VLLM_", "MGRPO_FAKE_")))
    print(f"fake engine: environment {' '.join(shown)}", file=sys.stderr, flush=True)
    if args.mode == "crash":
        print("fake engine: RuntimeError while loading the model", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(args.delay)
    ids = [int(i) for i in args.ids.split(",")]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _misbehave(self) -> bool:
            if args.mode == "hang":
                time.sleep(3600)
            if args.mode == "drop":
                self.close_connection = True
                self.connection.close()
                return True
            if args.mode == "503":
                self._send(503, b'{"error": "EngineDeadError"}')
                return True
            return False

        def do_GET(self):
            if not self._misbehave():
                self._send(200 if self.path == "/health" else 404, b"")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self._misbehave():
                return
            logprobs = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}
            choice = {"index": 0, "logprobs": logprobs, "finish_reason": "stop", "token_ids": ids,
                      "prompt_token_ids": body["prompt"]}
            self._send(200, json.dumps({"choices": [choice]}).encode())

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
