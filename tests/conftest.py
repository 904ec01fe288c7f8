"""Shared test settings.

HYPOTHESIS_PROFILE=mutmut (set by `make mutmut`) makes the property tests draw the same examples on every run,
so a mutant is killed or survives for a reason, not by the luck of one draw; and without hypothesis's
per-example deadline, which mutmut's tracing on a loaded machine exceeded (a DeadlineExceeded in the stats step
stops the whole run).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("mutmut", derandomize=True, database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
