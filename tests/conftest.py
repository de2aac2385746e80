"""Shared fixtures: one small wiki-hops world per test session (built once, served once)."""

from __future__ import annotations

import pytest
from _kept import kept as _kept  # tests/_kept.py: builds kept across a mutation run's sessions
from _no_skips import register as _fail_on_unexpected_skips


def pytest_configure(config):
    _fail_on_unexpected_skips(config)  # MGRPO_NO_SKIPS=1 (make test, CI): a skip that is not about a GPU fails
    # Tiny models are overhead-bound: one torch thread is fastest and keeps timings stable on a
    # shared 2-core machine (two threads under contention measured up to 50x slower).
    try:
        import torch
    except ImportError:  # the env and tools tests do not need torch
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def keep(tmp_path_factory):
    """``keep(name, build)``: ``build(folder)`` once per mutation run (tests/_kept.py), else per call."""
    return lambda name, build: _kept(name, build, tmp_path_factory)


@pytest.fixture(scope="session")
def small_scenario(tmp_path_factory):
    """A 300-entity wiki-hops world built in a temporary data dir (about a second)."""
    from mgrpo_scenarios.wiki_hops import WikiHops

    def build(folder):
        scenario = WikiHops(seed=0, num_entities=300, data_dir=folder)
        scenario.build()
        return scenario

    return _kept("mgrpo-data", build, tmp_path_factory)


@pytest.fixture(scope="session")
def small_world(small_scenario):
    """The small world, open (loopback site + index; Chromium starts on the first JS page)."""
    with small_scenario.open() as world:
        yield world


@pytest.fixture(scope="module")
def tokenizer(small_scenario, tmp_path_factory):
    """A byte-level BPE trained on the small world's pages and tasks (policy and KV-cache tests)."""
    from mgrpo_algo.policies.models import corpus_texts, train_tokenizer

    return _kept("tok", lambda folder: train_tokenizer(corpus_texts(small_scenario, max_pages=120, max_tasks=100),
                                                       folder, vocab_size=1024), tmp_path_factory)


@pytest.fixture(scope="module")
def tiny(small_scenario):
    """The session's small world seen through the tiny profile (the profile changes no world data)."""
    from mgrpo_scenarios.wiki_hops import WikiHops

    return WikiHops(seed=0, num_entities=300, profile="tiny", data_dir=small_scenario.data_dir)


@pytest.fixture(scope="module")
def tiny_world(tiny):
    with tiny.open() as world:
        yield world


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One real vLLM server for the session (the CPU build here, tests/test_vllm_*.py): a copy of the
    demo's warm-start main model, runtime LoRA on, development endpoints on. A start costs 35-60 s on
    2 shared cores, hence one per session. A missing engine (or a CPU without AVX2) fails the tests
    that need it, in one line: it never skips."""
    import shutil
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from mgrpo_algo.policies.vllm_server import VLLMServer, engine_refusal, save_for_engine

    problem = engine_refusal()
    if problem:
        pytest.fail(f"the served-engine tests need a vLLM server: {problem}", pytrace=False)
    folder = tmp_path_factory.mktemp("vllm") / "main"
    start = Path(__file__).resolve().parents[1] / "configs" / "demo-warm-start" / "main"
    shutil.copytree(start, folder)
    save_for_engine(AutoModelForCausalLM.from_pretrained(start), folder)  # untied: reloadable (vllm_server.py)
    server = VLLMServer(folder, name="test-main", enable_lora=True, max_lora_rank=8,
                        log_path=folder.parent / "server.log")
    server.start()
    yield server
    server.stop()
