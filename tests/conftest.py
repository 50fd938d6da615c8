"""Fixtures of the scheduler's behavioural tests: the class under test and the variant."""

from __future__ import annotations

import pytest

from impl.infinilm import scheduler as impl_sched
from spec.infinilm import scheduler as spec_sched
from spec.infinilm.scheduler import RESERVATIONS


@pytest.fixture(params=[spec_sched.Scheduler, impl_sched.Scheduler], ids=["spec", "impl"])
def sched_cls(request):
    """The Scheduler class under test."""
    return request.param


@pytest.fixture(params=RESERVATIONS)
def variant(request):
    """The reservation variant under test."""
    return request.param
