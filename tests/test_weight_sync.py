"""WeightSync against a loopback server that speaks vLLM's documented weight-update endpoints:
runtime LoRA (/v1/load_lora_adapter, /v1/unload_lora_adapter) and the development-mode full-weights
reload (/sleep, /wake_up, /collective_rpc, /reset_prefix_cache, /is_sleeping), plus /v1/completions
answering only for served model names, so the rollout policy is checked to ask for the adapter."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from mgrpo_algo.policies.weight_sync import WeightSync, WeightSyncError, server_root


class FakeServer:
    """vLLM-like loopback server. ``lora`` / ``dev`` switch the two endpoint families on (as the env
    variables do). ``script`` lists forced statuses for the next requests ("500", "503", "400"; ""
    answers normally)."""

    def __init__(self, *, lora: bool = True, dev: bool = True, base_model: str = "base") -> None:
        self.calls: list[tuple[str, str, dict, dict | None]] = []  # method, path, query, body
        self.adapters: dict[str, str] = {}
        self.sleeping: set[str] = set()
        self.reloads = 0
        self.script: list[str] = []
        self.lora, self.dev, self.base_model = lora, dev, base_model
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def _handle(self, method):
                split = urlsplit(self.path)
                query = parse_qs(split.query)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with fake.lock:
                    fake.calls.append((method, split.path, query, body))
                    forced = fake.script.pop(0) if fake.script else None
                    status, payload = (int(forced), {"object": "error", "message": "forced"}) if forced else \
                        fake.route(method, split.path, query, body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def route(self, method, path, query, body):  # noqa: C901 - one branch per endpoint
        not_found = (404, {"detail": "Not Found"})  # FastAPI's answer for an unknown route
        if path == "/v1/load_lora_adapter" and self.lora:
            name, lora_path = body.get("lora_name"), body.get("lora_path")
            if not name or not lora_path:
                return 400, {"object": "error", "message": "Both 'lora_name' and 'lora_path' must be provided."}
            if name in self.adapters:
                return 400, {"object": "error", "message": f"The lora adapter '{name}' has already been loaded."}
            self.adapters[name] = lora_path
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter" and self.lora:
            name = body.get("lora_name")
            if name not in self.adapters:
                return 404, {"object": "error", "message": f"The lora adapter '{name}' cannot be found."}
            del self.adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if path == "/v1/completions":
            if body["model"] != self.base_model and body["model"] not in self.adapters:
                return 404, {"object": "error", "message": f"The model `{body['model']}` does not exist."}
            ids = [5, 6]
            choice = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": body["prompt"],
                      "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.1, -0.2]},
                      "finish_reason": "stop"}
            return 200, {"id": "c", "object": "text_completion", "model": body["model"], "choices": [choice]}
        if not self.dev:
            return not_found
        if path == "/sleep" and method == "POST":
            self.sleeping = {"weights", "kv_cache"}
            return 200, ""
        if path == "/wake_up" and method == "POST":
            self.sleeping -= set(query.get("tags", ["weights", "kv_cache"]))
            return 200, ""
        if path == "/collective_rpc" and method == "POST":
            if body.get("method") != "reload_weights":
                return 400, {"error": "unknown method"}
            if "weights" in self.sleeping:
                return 500, {"error": "weights are asleep"}
            self.reloads += 1
            return 200, {"results": [None]}
        if path == "/reset_prefix_cache" and method == "POST":
            return 200, ""
        if path == "/is_sleeping" and method == "GET":
            return 200, {"is_sleeping": bool(self.sleeping)}
        return not_found

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def server():
    fake = FakeServer()
    yield fake
    fake.close()


def adapter(tmp_path, name="a"):
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (path / "adapter_model.safetensors").write_bytes(b"")
    return path


def sync(server, **kw):
    return WeightSync(server.url + "/v1", **{"backoff_s": 0.01, "max_retries": 2, "timeout_s": 5, **kw})


def test_server_root():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/completions"):
        assert server_root(url) == "http://h:8000"


def test_sync_lora_unloads_then_loads_with_the_documented_bodies(server, tmp_path):
    path = adapter(tmp_path)
    with sync(server, api_key="k") as ws:
        assert ws.sync_lora(path, "main") == "main"
        assert ws.sync_lora(path, "main") == "main"  # again after the next update: replaced
    posts = [(p, b) for m, p, _, b in server.calls]
    assert posts == [
        ("/v1/unload_lora_adapter", {"lora_name": "main"}),  # not loaded yet: tolerated
        ("/v1/load_lora_adapter", {"lora_name": "main", "lora_path": str(path.resolve())}),
        ("/v1/unload_lora_adapter", {"lora_name": "main"}),
        ("/v1/load_lora_adapter", {"lora_name": "main", "lora_path": str(path.resolve())}),
    ]
    assert server.adapters == {"main": str(path.resolve())} and ws.loaded == {"main": str(path.resolve())}
    assert ws.syncs == 2


def test_policy_samples_from_the_synced_adapter(server, tmp_path):
    from mgrpo_algo.policies.http_policy import OpenAICompatiblePolicy, PolicyError
    from mgrpo_algo.policies.models import train_tokenizer
    from mgrpo_env.rollout import PolicyRequest

    tokenizer = train_tokenizer(["<answer>1911</answer> Who founded Velmora Press?"] * 20, tmp_path / "tok",
                                vocab_size=300)
    request = PolicyRequest(0, "sub_0", "sub", "Q", [{"role": "user", "content": "Q"}], None, [])
    with OpenAICompatiblePolicy(server.url, "sub-lora", role="sub", tokenizer=tokenizer, max_retries=0) as policy:
        with pytest.raises(PolicyError, match="404"):  # not served before the sync
            policy([request])
        with sync(server) as ws:
            policy.model = ws.sync_lora(adapter(tmp_path), "sub-lora")
        response = policy([request])[0]
    assert server.calls[-1][3]["model"] == "sub-lora"
    assert response.extra["completion_ids"] == [5, 6]


def test_learner_adapter_directory_is_what_gets_loaded(server, tmp_path):
    pytest.importorskip("peft")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.learning.learner import RoleLearner

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64))
    learner = RoleLearner("main", model, LearnerConfig(lora_rank=2))
    out = learner.save_adapter(tmp_path / "main-adapter")
    with sync(server) as ws:
        ws.sync_lora(out, "main")
    assert server.adapters["main"] == str(out.resolve())
    assert {p.name for p in out.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}


def test_sync_lora_checks_the_directory_before_any_request(server, tmp_path):
    with sync(server) as ws, pytest.raises(WeightSyncError, match="adapter_config.json"):
        ws.sync_lora(tmp_path, "main")
    assert server.calls == []


def test_runtime_lora_disabled_gives_a_clear_error(tmp_path):
    fake = FakeServer(lora=False)
    try:
        with sync(fake) as ws, pytest.raises(WeightSyncError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING") as info:
            ws.sync_lora(adapter(tmp_path), "main")
        assert info.value.status == 404
        assert len(fake.calls) == 1  # a missing route is not retried
    finally:
        fake.close()


def test_transient_errors_are_retried_and_client_errors_are_not(server, tmp_path):
    path = adapter(tmp_path)
    with sync(server) as ws:
        server.script = ["503", "500"]  # the unload fails twice, then goes through
        ws.sync_lora(path, "main")
        assert server.adapters == {"main": str(path.resolve())}
        server.script = ["400"]
        with pytest.raises(WeightSyncError, match="HTTP 400") as info:
            ws.unload_lora("main")
        assert info.value.status == 400
        server.script = ["500"] * 3
        with pytest.raises(WeightSyncError, match="after 3 attempts"):
            ws.unload_lora("main")
        with pytest.raises(WeightSyncError, match="cannot be found"):
            ws.unload_lora("nope")  # missing_ok=False by default


def test_unreachable_server_raises_after_retries():
    with WeightSync("http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2) as ws, \
            pytest.raises(WeightSyncError, match="ConnectError.*after 2 attempts"):
        ws.reload_weights()


def test_sync_full_follows_the_documented_level2_sequence(server):
    with sync(server) as ws:
        ws.sync_full()
        assert not ws.is_sleeping()
    seq = [(m, p, q, b) for m, p, q, b in server.calls]
    assert seq == [
        ("POST", "/sleep", {"level": ["2"]}, None),
        ("POST", "/wake_up", {"tags": ["weights"]}, None),
        ("POST", "/collective_rpc", {}, {"method": "reload_weights"}),
        ("POST", "/wake_up", {"tags": ["kv_cache"]}, None),
        ("GET", "/is_sleeping", {}, None),
    ]
    assert server.reloads == 1 and ws.syncs == 1


def test_sync_full_without_sleep_resets_the_prefix_cache(server):
    with sync(server) as ws:
        ws.sync_full(sleep=False)
    assert [(p, b) for _, p, _, b in server.calls] == [
        ("/collective_rpc", {"method": "reload_weights"}),
        ("/reset_prefix_cache", None),
    ]


def test_sync_full_without_dev_mode_names_the_flag():
    fake = FakeServer(dev=False)
    try:
        with sync(fake) as ws, pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            ws.sync_full()
    finally:
        fake.close()


def test_sync_full_failure_after_sleep_says_the_engine_may_be_asleep(server):
    with sync(server, max_retries=0) as ws:
        server.script = ["", "", "500"]  # "" = answer normally: sleep and wake_up pass, the reload fails
        with pytest.raises(WeightSyncError, match="may still be asleep") as info:
            ws.sync_full()
        assert info.value.status == 500 and ws.is_sleeping() and ws.syncs == 0
        ws.wake_up()
        assert not ws.is_sleeping()
