"""Pinned CPU kernels (``kernels.pin``, :mod:`mgrpo_algo.core.kernels`): set before torch loads, in every
process of a run, checked in force, refused in one line where it cannot be applied, noticed where the
CPU cannot honour it, and recorded with the machine in each run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgrpo_algo.core import kernels
from mgrpo_algo.core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
X86 = {"model": "x", "machine": "x86_64", "avx2": True, "avx512": ["avx512f"]}
AVX2 = kernels.PINS["avx2"]
# the pin's variables and the marker cleared: a child of this test starts unpinned unless it pins itself
CLEAN = {k: v for k, v in os.environ.items() if k not in (*kernels.RECORDED, *AVX2)}


def child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**CLEAN, **(env or {})}, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_config_field_is_off_by_default_on_in_the_demo_and_checked():
    assert load_config(None).kernels.pin == ""
    assert load_config(str(ROOT / "configs" / "demo.yaml")).kernels.pin == "avx2"
    with pytest.raises(ValueError, match="kernels.pin"):
        load_config(None, ["kernels.pin=avx512"])


def test_the_pin_of_a_config_is_read_without_building_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\nkernels: {pin: avx2}\n")
    assert kernels.pin_of_config(str(path)) == "avx2"
    assert kernels.pin_of_config(str(path), ['kernels.pin=""']) == ""
    assert kernels.pin_of_config(str(path), ["kernels={pin: ''}"]) == ""
    assert kernels.pin_of_config(None, ["kernels.pin=avx2"]) == "avx2"
    assert kernels.pin_of_config(str(tmp_path / "missing.yaml")) == ""  # the full load reports it
    assert kernels.pin_of_config(str(path), ["kernels.pin=[unclosed"]) == ""  # and a bad override
    assert kernels.pin_of_config(str(path), ["seed=2", "kernels.pin=avx9"]) == "avx9"  # refused by ensure_pinned


def test_apply_sets_the_variables_or_gives_one_notice_where_the_cpu_cannot_honour_it():
    env: dict[str, str] = {}
    assert kernels.apply_pin("avx2", env, X86) is None
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", kernels.MARKER: "avx2"}
    for cpu in ({**X86, "avx2": False, "avx512": []}, {**X86, "machine": "aarch64", "avx2": False}):
        env = {}
        notice = kernels.apply_pin("avx2", env, cpu)
        assert env == {} and notice.count("\n") == 0
        assert "cannot be honoured" in notice and "figures may differ from the committed ones" in notice
    env = {}
    assert kernels.apply_pin("", env, X86) is None and env == {}
    with pytest.raises(ValueError, match="kernels.pin"):
        kernels.apply_pin("avx9", {}, {**X86, "avx2": False})


def test_cpu_info_reads_the_model_and_the_isa_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: Some CPU @ 2GHz\n"
                    "flags\t\t: fpu sse avx avx2 avx512f avx512bw\n"
                    "processor\t: 1\nvendor_id\t: Other\nmodel name\t: Some CPU @ 2GHz\nflags\t\t: fpu\n")
    cpu = kernels.cpu_info(info)
    assert cpu["model"] == "Some CPU @ 2GHz" and cpu["avx2"] is True and cpu["avx512"] == ["avx512bw", "avx512f"]
    assert cpu["vendor"] == "AuthenticAMD" and kernels.cpu_vendor(cpu) == "AuthenticAMD"
    info.write_text("model name\t: Old\nflags\t: fpu sse avx\n")
    assert kernels.cpu_info(info)["avx2"] is False and kernels.cpu_info(info)["avx512"] == []
    # records written before the vendor was kept name it in the model only
    assert kernels.cpu_vendor({"model": "Intel(R) Xeon(R) Processor"}) == "GenuineIntel"
    assert kernels.cpu_vendor({"model": "AMD EPYC", "vendor": ""}) == "AuthenticAMD"
    assert kernels.cpu_vendor({"model": "Neoverse"}) == "Neoverse"


def test_a_library_caller_with_torch_loaded_is_refused_in_one_line(monkeypatch):
    import torch  # noqa: F401  (loaded, as in any pytest process here)

    for name in (*AVX2, kernels.MARKER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernels, "cpu_info", lambda *a: X86)
    with pytest.raises(kernels.KernelPinError, match="before torch is imported") as err:
        kernels.ensure_pinned("avx2", reexec=False)
    assert "\n" not in str(err.value) and "ATEN_CPU_CAPABILITY=avx2" in str(err.value)
    assert kernels.MARKER not in os.environ  # nothing half-applied
    assert kernels.ensure_pinned("", reexec=False) is None
    from mgrpo_algo.cli import main

    assert main(["train", "--config", str(ROOT / "configs" / "demo.yaml")]) == 2  # refused before any work


AVX512_HERE = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False


def test_pinned_before_torch_it_is_in_force_here_and_in_spawned_children(tmp_path):
    code = """
import multiprocessing as mp
from mgrpo_algo.core.kernels import ensure_pinned, check_in_force
assert ensure_pinned("avx2", reexec=False) is None
import torch

def capability(_):
    check_in_force()
    return torch.backends.cpu.get_cpu_capability()

if __name__ == "__main__":
    check_in_force()
    with mp.get_context("spawn").Pool(1) as pool:  # as compare --jobs and the processes placement start theirs
        print(torch.backends.cpu.get_cpu_capability(), pool.map(capability, [0])[0])
"""
    script = tmp_path / "pinned_child.py"  # spawn re-imports the main module: a file, not -c
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], env=CLEAN, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AVX2", "AVX2"]
    unpinned = child("import torch; print(torch.backends.cpu.get_cpu_capability())").stdout.strip()
    assert unpinned == ("AVX512" if AVX512_HERE else "AVX2")  # so the pin above changed something here


def test_a_command_with_torch_already_loaded_starts_again_pinned():
    done = child("import torch\nfrom mgrpo_algo.core.kernels import ensure_pinned\n"
                 "print(torch.backends.cpu.get_cpu_capability(), flush=True)\n"
                 "ensure_pinned('avx2', reexec=True)\nprint(torch.backends.cpu.get_cpu_capability(), 'pinned')")
    # the first run prints the CPU's own capability and re-executes itself (python -c, the same code) with
    # the pin in its environment; the second finds it set and goes on
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AVX512" if AVX512_HERE else "AVX2", "AVX2", "AVX2", "pinned"]


def test_a_pinned_tree_whose_process_runs_other_kernels_stops():
    # the marker without the variables: a child started with another environment. Where torch reports
    # AVX2 unpinned anyway (an AVX2-only CPU), the pin is made to expect another capability instead.
    expect = "" if AVX512_HERE else "kernels.CAPABILITY['avx2'] = 'AVX512'\n"
    done = child(f"from mgrpo_algo.core import kernels\n{expect}import torch\nkernels.check_in_force()",
                 env={kernels.MARKER: "avx2"})
    assert done.returncode != 0 and "kernels.pin=avx2 is not in force" in done.stderr
    assert child("from mgrpo_algo.core import kernels\nkernels.check_in_force()").returncode == 0  # no marker


def test_kernel_state_records_the_machine_kernels_versions_and_threads():
    state = kernels.kernel_state()
    assert set(state) >= {"cpu", "pin", "env", "torch_capability", "torch_threads", "versions"}
    assert set(state["versions"]) >= {"torch", "transformers", "numpy"}
    assert set(state["env"]) == set(kernels.RECORDED)
    line = kernels.describe(state)
    assert "torch reports" in line and state["versions"]["torch"] in line and json.dumps(state)


def test_a_library_trainer_on_a_pinned_config_without_the_pin_warns_in_one_line(monkeypatch):
    for name in (*AVX2, kernels.MARKER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernels, "cpu_info", lambda *a: X86)
    line = kernels.not_in_force("avx2")
    assert line.startswith("kernels.pin=avx2 is not in force in this process") and "\n" not in line
    assert kernels.not_in_force("") is None
    monkeypatch.setenv(kernels.MARKER, "avx2")
    assert kernels.not_in_force("avx2") is None
    monkeypatch.delenv(kernels.MARKER)
    monkeypatch.setattr(kernels, "cpu_info", lambda *a: {**X86, "avx2": False, "avx512": []})
    assert kernels.not_in_force("avx2") is None  # apply_pin's notice says it where the CPU cannot
