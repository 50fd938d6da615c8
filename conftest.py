"""Hypothesis profile selection for the whole test suite: HYPOTHESIS_PROFILE, else ``ci`` under CI
and ``dev`` locally."""

import os

from hypothesis import settings

from stateful_tests import profiles

settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
assert settings.default is not None and profiles.PROFILES
