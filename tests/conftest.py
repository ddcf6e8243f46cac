"""Hypothesis profiles: local runs draw new examples each time (exploration); CI
(``KVTRACE_CI=1``, set by ``.ci/run``) replays a fixed, seeded set, so a landing
decision never depends on which random examples a run happened to draw. Tests that pin
their own ``settings`` keep them and inherit the profile's ``derandomize``."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("KVTRACE_CI") == "1":
    settings.load_profile("ci")
