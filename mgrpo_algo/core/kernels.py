"""Pinned CPU kernels: the same float rounding on one vendor's x86 machines, so committed figures reproduce.

torch picks its CPU kernels by the instruction set it finds: on an AVX-512 machine ATen's vectorised
kernels and MKL's BLAS take 512-bit paths that round differently from the AVX2
paths of an AVX2-only machine. A sampled token flips now and then at temperature 1 and RL carries it,
so the demo's figures differed between the two kinds of machine (issue 55). ``kernels.pin: avx2``
caps ATen's and MKL's kernels to AVX2 through environment variables that each library reads once, when it loads
or first runs a kernel: they must be in ``os.environ`` before ``import torch`` in the process, and
every child (``compare --jobs``, the ``processes`` placement: ``spawn``-ed, so they inherit it; Ray
actors get it through ``runtime_env``) sees it too. :func:`apply_pin` sets them; the CLI calls it
before anything imports torch and re-executes itself when torch is already loaded. ``MGRPO_KERNELS_PIN``
marks a pinned process tree, so each process that runs torch can check that the pin took effect
(:func:`check_in_force`: ``torch.backends.cpu.get_cpu_capability()``).

Across vendors the pin is not enough: an Intel Xeon and an AMD EPYC still round the backward's last digits
apart, and on an EPYC Zen 4 that flips a draw in the demo's second iteration (docs/guides/training.md,
"Pinned kernels"; the fingerprint check compares what the two can agree on).

A machine that cannot honour the pin (no AVX2, not x86) runs unpinned with a one-line notice that its
figures may differ from the committed ones. This module never imports torch at its top: it runs before.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PINS", "CAPABILITY", "MARKER", "KernelPinError", "cpu_info", "cpu_vendor", "pin_env", "apply_pin", "pin_of_config",
           "check_in_force", "not_in_force", "kernel_state", "ensure_pinned", "describe"]

#: The settings of each pin: the smallest set that gave the four-variable cap's fingerprint on an AVX-512
#: machine (benchmarks/demo_fingerprint.py, 3 iterations + 48 start episodes; docs/guides/training.md
#: "Pinned kernels"). ATen's vectorised kernels and MKL's BLAS both dispatch on the ISA: ATen's cap alone,
#: MKL_CBWR alone, ATen's with MKL_ENABLE_INSTRUCTIONS=AVX2 and ATen's with ONEDNN_MAX_CPU_ISA=AVX2 each
#: still moved the gradient norms and entropies in the 7th digit; ATen's with MKL_CBWR=AVX2 matched the
#: four together exactly. The other two are recorded in each run all the same (set or not).
PINS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
}
#: What ``torch.backends.cpu.get_cpu_capability()`` reports under each pin.
CAPABILITY = {"avx2": "AVX2"}
#: Set (to the pin's name) in a pinned process and inherited by its children.
MARKER = "MGRPO_KERNELS_PIN"
#: Every variable the pins set, recorded in each run's provenance (set or not).
RECORDED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", MARKER)


class KernelPinError(RuntimeError):
    """The pin cannot be applied in this process (torch already loaded unpinned) or did not take effect."""


def cpu_info(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model, architecture and the ISA flags that change torch's kernels (avx2, avx512*)."""
    model, vendor, flags = "", "", set()
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key in ("flags", "Features") and not flags:  # x86; ARM says Features
                flags = set(value.split())
    except OSError:  # not Linux: the architecture alone
        pass
    model = model or platform.processor()
    return {"model": model, "vendor": vendor, "machine": platform.machine(), "avx2": "avx2" in flags,
            "avx512": sorted(f for f in flags if f.startswith("avx512"))}


def cpu_vendor(cpu: Mapping[str, Any]) -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ...: from a :func:`cpu_info` record, or its model name in a record
    written before the vendor was kept (those say "Intel(R) ..." or "AMD ...")."""
    if cpu.get("vendor"):
        return str(cpu["vendor"])
    model = str(cpu.get("model", "")).lower()
    return "GenuineIntel" if "intel" in model else "AuthenticAMD" if "amd" in model else str(cpu.get("model", ""))


def pin_env(pin: str) -> dict[str, str]:
    """The environment variables of ``pin`` (with the marker); {} for "" (no pin)."""
    if not pin:
        return {}
    if pin not in PINS:
        raise ValueError(f"config field 'kernels.pin' must be one of {sorted(PINS)} or \"\", got {pin!r}")
    return {**PINS[pin], MARKER: pin}


def _honoured(pin: str, cpu: Mapping[str, Any]) -> bool:
    return cpu["machine"].lower() in ("x86_64", "amd64") and bool(cpu["avx2"]) if pin == "avx2" else True


def apply_pin(pin: str, environ: Any = None, cpu: Mapping[str, Any] | None = None) -> str | None:
    """Set ``pin``'s variables in ``environ`` (``os.environ``); returns a one-line notice when this
    machine cannot honour it (nothing is set then), else None. Call before torch is imported."""
    environ = os.environ if environ is None else environ
    if not pin:
        return None
    cpu = cpu_info() if cpu is None else cpu
    if not _honoured(pin, cpu):
        pin_env(pin)  # a bad name still raises
        return (f"mgrpo: notice: kernels.pin={pin} cannot be honoured on this CPU ({cpu['machine']}, "
                f"{'no ' if not cpu['avx2'] else ''}avx2): its figures may differ from the committed ones")
    environ.update(pin_env(pin))
    return None


def pin_of_config(path: str | None, overrides: Sequence[str] = ()) -> str:
    """``kernels.pin`` of a config file and its ``--set`` overrides, read without building the config
    (building it imports torch: the pin must be in the environment before). The full load checks it."""
    import yaml

    pin: Any = ""
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return ""  # the full load reports it
        kernels = data.get("kernels") if isinstance(data, dict) else None
        pin = kernels.get("pin", "") if isinstance(kernels, dict) else ""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in ("kernels", "kernels.pin"):
            continue
        try:
            loaded = yaml.safe_load(value)
        except yaml.YAMLError:
            return ""  # the full load reports it
        pin = loaded if key == "kernels.pin" else loaded.get("pin", "") if isinstance(loaded, dict) else ""
    return pin if isinstance(pin, str) else ""


def ensure_pinned(pin: str, *, reexec: bool) -> str | None:
    """Apply ``pin`` to this process before torch loads; returns the notice of :func:`apply_pin`.

    When torch is already imported and the pin is not in force, ``reexec`` starts this same command
    again with the pin in its environment (a command line's entry); otherwise it raises
    :class:`KernelPinError` in one line (a library caller must pin before importing torch)."""
    wanted = pin_env(pin)
    if not wanted or all(os.environ.get(k) == v for k, v in wanted.items()):
        return None if not wanted else apply_pin(pin)  # already set by a parent: nothing to change
    if "torch" not in sys.modules:
        return apply_pin(pin)
    probe: dict[str, str] = {}
    notice = apply_pin(pin, probe)
    if notice is not None:  # nothing to pin on this machine
        return notice
    if reexec:
        os.environ.update(probe)
        argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
        os.execve(sys.executable, [sys.executable, *argv[1:]], dict(os.environ))
    raise KernelPinError(f"kernels.pin={pin} must be in force before torch is imported: torch is already loaded in "
                         f"this process; set {' '.join(f'{k}={v}' for k, v in wanted.items())} in its environment")


def check_in_force() -> None:
    """In a pinned process tree (``MGRPO_KERNELS_PIN`` set), raise :class:`KernelPinError` unless torch
    reports the pin's capability: a child started with another environment would run unpinned in silence."""
    pin = os.environ.get(MARKER, "")
    if not pin:
        return
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    if got != CAPABILITY.get(pin, got):
        raise KernelPinError(f"kernels.pin={pin} is not in force in process {os.getpid()}: torch reports {got}, "
                             f"not {CAPABILITY[pin]} (was torch imported before the pin was set?)")


def not_in_force(pin: str) -> str | None:
    """One line when a config asks for ``pin`` and this process runs other kernels (a library caller that
    imported torch without pinning: ``Trainer(load_config("configs/demo.yaml"))`` in a script), so its
    figures are not the committed ones; None when the pin is in force, not asked, or cannot be honoured
    here (:func:`apply_pin`'s notice covers that). Imports torch."""
    if not pin or os.environ.get(MARKER) == pin or not _honoured(pin, cpu_info()):
        return None
    import torch

    return (f"kernels.pin={pin} is not in force in this process (torch reports "
            f"{torch.backends.cpu.get_cpu_capability()}): its figures may differ from the committed ones; pin "
            f"before importing torch (mgrpo_algo.core.kernels.ensure_pinned), run it through the mgrpo command, "
            f"or set kernels.pin=\"\"")


def kernel_state() -> dict[str, Any]:
    """What decides this process's float rounding, for a run's records: the CPU and its ISA flags, the
    kernel settings in force (the variables and torch's reported capability), the library versions and
    the thread counts. Imports torch (call it where the run has loaded it)."""
    import numpy
    import torch
    import transformers

    return {
        "cpu": cpu_info(),
        "pin": os.environ.get(MARKER, ""),
        "env": {k: os.environ.get(k) for k in RECORDED},
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": numpy.__version__},
    }


def describe(state: Mapping[str, Any]) -> str:
    """One line of :func:`kernel_state` for a report: CPU, ISA, kernels in force, versions, threads."""
    cpu, v = state["cpu"], state["versions"]
    isa = "AVX-512" if cpu["avx512"] else "AVX2" if cpu["avx2"] else "no AVX2"
    pin = f"pinned to {state['pin']}" if state["pin"] else "not pinned"
    return (f"{cpu['model'] or cpu['machine']} ({isa}); kernels {pin}, torch reports {state['torch_capability']}; "
            f"torch {v['torch']}, transformers {v['transformers']}, numpy {v['numpy']}; "
            f"{state['torch_threads']} torch thread(s)")
