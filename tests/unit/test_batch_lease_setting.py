"""BATCH_LEASE_S is a submitted batch's hold on its slices: shorter than the provider's 24 h
window, a day without a poll (workers stopped for a deploy, an outage) would let a sync worker
or a new round claim slices whose batch may still answer, and pay for them twice."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from examforge.settings import Settings


@pytest.fixture
def clean_env(monkeypatch):
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)


def test_the_batch_lease_outlasts_the_providers_window(clean_env):
    assert Settings(_env_file=None).batch_lease_s == 26 * 3600
    with pytest.raises(ValidationError, match="batch_lease_s"):
        Settings(_env_file=None, batch_lease_s=3600)
    assert Settings(_env_file=None, batch_lease_s=25 * 3600).batch_lease_s == 25 * 3600
