"""Shared test settings.

HYPOTHESIS_PROFILE=mutmut (set by `make mutmut`) makes the property tests draw the same examples on every run,
so a mutant is killed or survives for a reason, not by the luck of one draw.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("mutmut", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
