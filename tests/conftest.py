"""Shared test settings.

HYPOTHESIS_PROFILE=mutmut (set by `make mutmut`) makes the property tests draw the same examples on every run,
so a mutant is killed or survives for a reason, not by the luck of one draw; and without hypothesis's
per-example deadline, which mutmut's tracing on a loaded machine exceeded (a DeadlineExceeded in the stats step
stops the whole run). Every profile here is untimed (below).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

# No property test asserts its own speed (issue #20: timing belongs in benchmarks): hypothesis's per-example
# deadline and its too_slow health check both failed tests on a machine busy with other suites
# (test_audit_cli's width property, FailedHealthCheck at load 17, passing alone).
settings.register_profile("project", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# No shrinking under mutmut: the first failing example kills the mutant; shrinking it (minutes on a busy
# machine) made mutants that fail a property time out instead (session 10, RoomIndex.updated).
settings.register_profile(
    "mutmut",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "project"))
