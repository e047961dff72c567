"""Fixtures for the RL core tests; the hub is never contacted from here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# datasets reads these when it is first imported, so they must be set before any test imports it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def gsm8k_fixture() -> Path:
    return FIXTURES / "gsm8k_small.jsonl"
