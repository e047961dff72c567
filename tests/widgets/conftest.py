"""Fixtures for the widget tests."""

from __future__ import annotations

import pytest

from tests.widgets.stand_in import StandInRun


@pytest.fixture
def stand_in_run() -> StandInRun:
    return StandInRun()
