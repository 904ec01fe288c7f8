"""Unit tests of `policies/mutations.py` for session 12's survivors (issue #20) that a golden case cannot state:
a warning that must end where it ends (a case's `warningsContain` matches substrings only), under a policy the
policy check refuses (so only a Policy built in code has it)."""

from __future__ import annotations

import dataclasses

from policies.engine import review
from tests.test_golden import CASES, load_case, run_case

PREFER = "mutations/training-rack-prefer-when-no-rack-fits-now.yaml"


def test_the_prefer_fallbacks_warning_quotes_no_factor_when_the_comm_model_refuses_the_policy() -> None:
    """Bandwidths the comm model refuses (an oversubscription below 1; the policy check refuses it too since
    67db058): `_level_factor` has no figure, and the prefer fallback's warning ends after the domain it prefers,
    with no cost, no crash and nothing else (kills no_domain_fits_note 22, which formats None and raises, and 23,
    `"XXXX"` for no factor)."""
    case = load_case(CASES / PREFER)
    default, policy, inv, ctx = run_case(case, case["input"])
    head = "placement: no rack holds the 24-GPU job now: prefers rack-big (most room)"
    assert any(w.startswith(f"{head}; all-reduce ≈") for w in default.warnings), default.warnings
    refused = dataclasses.replace(policy, comm=dataclasses.replace(policy.comm, cross_rack_oversubscription=0.5))
    r = review(case["input"], policy=refused, inventory=inv, ctx=ctx)
    assert r.allowed and "training-rack" in r.mutations
    assert [w for w in r.warnings if w.startswith("placement: ")] == [head]
