"""Shared fixtures: one small wiki-hops world per test session (built once, served once)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def small_scenario(tmp_path_factory):
    """A 300-entity wiki-hops world built in a temporary data dir (about a second)."""
    from mgrpo_scenarios.wiki_hops import WikiHops

    scenario = WikiHops(seed=0, num_entities=300, data_dir=tmp_path_factory.mktemp("mgrpo-data"))
    scenario.build()
    return scenario


@pytest.fixture(scope="session")
def small_world(small_scenario):
    """The small world, open (loopback site + index; Chromium starts on the first JS page)."""
    with small_scenario.open() as world:
        yield world
