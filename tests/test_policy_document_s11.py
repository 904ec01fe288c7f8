"""The policy document's last open mutants of session 10 (issue #20): the smallest message size, a toleration with
no key, and a YAML error that has a context line besides its problem."""

from __future__ import annotations

import pytest

from policies.document import PolicyError, Toleration, compile_policy, parse_policy_text

HEAD = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"
BASE = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "Policy"}


def test_a_one_byte_message_size_compiles() -> None:
    """The bound is 0 < size: one byte is the smallest message (0 is refused, test_policy_document)."""
    assert compile_policy({**BASE, "comm": {"messageSize": 1}}).comm.message_bytes == 1
    assert parse_policy_text(HEAD + "comm:\n  messageSize: 1\n").comm.message_bytes == 1


def test_a_toleration_without_a_key_tolerates_every_taint_with_an_empty_key() -> None:
    """Kubernetes reads an empty key with operator Exists as "every taint": the key is "", not null or made up."""
    policy = compile_policy({**BASE, "gpuNodes": {"tolerations": [{"operator": "Exists"}]}})
    assert policy.tolerations == (Toleration(key="", operator="Exists", value="", effect=""),)
    assert [t.as_json() for t in policy.tolerations] == [{"key": "", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        # PyYAML's message starts with its context ("while parsing a block mapping"); the problem is what went wrong
        (
            "rules: {x: 1}\n  bad: indentation\n",
            "line 4, column 3: invalid YAML: expected <block end>, but found '<block mapping start>'",
        ),
        (
            "rules:\n  x: [1, 2\n",
            "line 5, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'",
        ),
    ],
)
def test_a_yaml_error_with_a_context_quotes_its_problem(body: str, error: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(HEAD + body)
    assert info.value.errors == [error]
