"""policies/limits.py in process, for its mutants (session 11, issue #20): `LimitError`'s fields and line,
`walk_too_deep` (the iterative fallback of `json_too_deep`) at exact depths, `json_too_deep`'s three paths, and
`check_yaml`'s bounds one below and at each limit. tests/test_limits.py runs the CLI on hostile input; it is not
in the per-mutant selection (subprocesses, memory bounds), so these pin the same limits where mutmut sees them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies import limits
from policies.limits import LimitError, check_yaml, json_too_deep, walk_too_deep


class _Mark:
    def __init__(self, line: int, column: int) -> None:
        self.line, self.column = line, column


class _Event:
    def __init__(self, mark: _Mark | None) -> None:
        self.start_mark = mark


def nest(depth: int, leaf: Any = 1, *, as_dict: bool = False) -> Any:
    """A value `depth` containers deep (the top level is depth 1); a scalar for depth 0."""
    value = leaf
    for i in range(depth):
        value = {f"k{i}": value} if as_dict else [value]
    return value


# -- LimitError --------------------------------------------------------------------------------------------


def test_a_limit_error_at_a_mark_names_its_line_and_column_from_one() -> None:
    exc = LimitError("pods.yaml", _Event(_Mark(2, 4)), "nested deeper than 100 levels")
    assert (exc.line, exc.column, exc.problem) == (3, 5, "nested deeper than 100 levels")
    assert str(exc) == "pods.yaml:3:5: nested deeper than 100 levels"


@pytest.mark.parametrize("event", [_Event(None), object(), None], ids=["mark-none", "no-mark-attribute", "no-event"])
def test_a_limit_error_without_a_mark_has_line_and_column_zero_and_names_only_the_source(event: Any) -> None:
    exc = LimitError("policy.yaml", event, "more than 5 nodes")
    assert (exc.line, exc.column, exc.problem) == (0, 0, "more than 5 nodes")
    assert str(exc) == "policy.yaml: more than 5 nodes"


def test_a_limit_error_from_check_yaml_points_at_the_event_past_the_limit() -> None:
    with pytest.raises(LimitError) as info:
        check_yaml("a:\n  b:\n    c: [1]\n", "f.yaml", max_depth=3)
    assert (info.value.line, info.value.column) == (3, 8)
    assert str(info.value) == "f.yaml:3:8: nested deeper than 3 levels"


# -- walk_too_deep and json_too_deep ------------------------------------------------------------------------


@pytest.mark.parametrize("too_deep", [walk_too_deep, json_too_deep], ids=["walk", "json"])
@pytest.mark.parametrize("as_dict", [False, True], ids=["lists", "dicts"])
def test_depth_is_counted_exactly_on_both_sides_of_the_limit(too_deep: Any, as_dict: bool) -> None:
    for limit in (1, 2, 3, 7, 100):
        assert not too_deep(nest(limit, as_dict=as_dict), limit), (limit, "at the limit")
        assert too_deep(nest(limit + 1, as_dict=as_dict), limit), (limit, "one past")
    assert not too_deep(nest(100, as_dict=as_dict))  # the default limit is MAX_DEPTH
    assert too_deep(nest(101, as_dict=as_dict))


@pytest.mark.parametrize("too_deep", [walk_too_deep, json_too_deep], ids=["walk", "json"])
def test_scalars_are_never_too_deep(too_deep: Any) -> None:
    for value in (1, "x", None, 2.5, True):
        assert not too_deep(value, 0)
        assert not too_deep(value)


@pytest.mark.parametrize("too_deep", [walk_too_deep, json_too_deep], ids=["walk", "json"])
def test_the_deepest_branch_counts_wherever_it_is(too_deep: Any) -> None:
    deep_last = {"a": 1, "b": [1, 2], "c": {"d": [nest(3)]}}  # depth 1 + 1 + 1 + 3 = 6
    deep_first = [nest(5, as_dict=True), "x", {}]  # depth 1 + 5 = 6
    for value in (deep_last, deep_first):
        assert not too_deep(value, 6)
        assert too_deep(value, 5)
    # a dict inside a dict inside a dict: the walk reads a dict's values, not its keys
    assert too_deep({"a": {"b": {"c": {}}}}, 3)
    assert not too_deep({"a": {"b": {"c": {}}}}, 4)
    # an empty container is a level too
    assert too_deep([[[]]], 2) and not too_deep([[[]]], 3)


def test_values_orjson_cannot_serialize_are_walked() -> None:
    """orjson refuses a non-string key and a set (YAML gives both: `{1: x}`, `!!set`); the walk decides."""
    assert json_too_deep({1: nest(4)}, 4)
    assert not json_too_deep({1: nest(3)}, 4)
    assert json_too_deep([{"x"}, nest(4)], 4)
    assert not json_too_deep([{"x"}, nest(3)], 4)


def test_json_too_deep_at_each_room_orjson_leaves() -> None:
    """`json_too_deep` serializes the value inside a chain of lists leaving it exactly `limit` levels: with no
    room (limit = orjson's depth) it serializes the value alone; past orjson's depth it walks."""
    top = limits._dumps_depth()
    for limit in (top - 1, top, top + 1, top + 5):
        assert not json_too_deep(nest(limit), limit), limit
        assert json_too_deep(nest(limit + 1), limit), limit
        assert not json_too_deep(nest(limit, as_dict=True), limit), limit
        assert json_too_deep(nest(limit + 1, as_dict=True), limit), limit


def test_orjsons_depth_is_found_once_and_is_what_orjson_serializes() -> None:
    import orjson

    top = limits._dumps_depth()
    assert limits._dumps_depth() == top and [top] == limits._DUMPS_DEPTH
    orjson.dumps(nest(top))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nest(top + 1))


def test_a_wrapper_is_a_chain_of_room_lists_with_one_empty_slot() -> None:
    for room in (1, 2, 5):
        outer, inner = limits._wrapper(room)
        assert limits._wrapper(room) == (outer, inner) and limits._wrapper(room)[0] is outer  # made once
        assert inner == [None]
        depth, cur = 1, outer
        while cur is not inner:
            assert isinstance(cur, list) and len(cur) == 1
            cur, depth = cur[0], depth + 1
        assert depth == room


def test_the_slot_is_emptied_after_each_check_so_no_value_is_kept() -> None:
    top = limits._dumps_depth()
    big = nest(3, "x" * 1000)
    json_too_deep(big, 10)
    json_too_deep(nest(20), 10)  # too deep: the error path empties it too
    assert limits._WRAPPERS[top - 10][1] == [None]


# -- check_yaml -----------------------------------------------------------------------------------------------


def _flow(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_yaml_depth_at_and_one_past_the_limit() -> None:
    assert check_yaml(_flow(4), "f", max_depth=4) == 1
    with pytest.raises(LimitError, match=r"^f:1:5: nested deeper than 4 levels$"):
        check_yaml(_flow(5), "f", max_depth=4)
    assert check_yaml(_flow(100), "f") == 1
    with pytest.raises(LimitError, match="nested deeper than 100 levels"):
        check_yaml(_flow(101), "f")


def test_yaml_nodes_at_and_one_past_the_limit_with_and_without_aliases() -> None:
    # [1, 2, 3]: the sequence and three scalars, four nodes
    assert check_yaml("[1, 2, 3]", "f", max_nodes=4) == 1
    with pytest.raises(LimitError, match=r"^f:1:9: more than 3 nodes in one document \(aliases expanded\)$"):
        check_yaml("[1, 2, 3]", "f", max_nodes=3)
    # an alias counts the anchored node's whole size: [&a [1, 2], *a] is 1 + 3 + 3
    text = "[&a [1, 2], *a]"
    assert check_yaml(text, "f", max_nodes=7) == 1
    with pytest.raises(LimitError, match="more than 6 nodes"):
        check_yaml(text, "f", max_nodes=6)
    # an alias of a scalar counts one
    assert check_yaml("[&s x, *s, *s]", "f", max_nodes=4, max_alias_nodes=2) == 1
    with pytest.raises(LimitError, match="more than 3 nodes"):
        check_yaml("[&s x, *s, *s]", "f", max_nodes=3)


def test_yaml_alias_nodes_at_and_one_past_their_limit() -> None:
    text = "a: &a [1, 2]\nb: *a\nc: *a\n"  # each alias expands to 3 nodes
    assert check_yaml(text, "f", max_alias_nodes=6) == 1
    with pytest.raises(LimitError, match=r"^f:3:4: aliases expand to more than 5 nodes$"):
        check_yaml(text, "f", max_alias_nodes=5)


def test_yaml_alias_depth_counts_where_the_alias_is_placed() -> None:
    text = "a: &a [[1]]\nb: [[*a]]\n"  # b nests 1 (map) + 2 + 2 = 5
    assert check_yaml(text, "f", max_depth=5) == 1
    with pytest.raises(LimitError, match=r"^f:2:6: an alias nests deeper than 4 levels$"):
        check_yaml(text, "f", max_depth=4)
    # an alias of a mapping with a nested anchor: depth taken from the anchored collection, children included
    text = "a: &a {x: {y: 1}}\nb: [*a]\n"  # b nests 1 (map) + 1 + 2
    assert check_yaml(text, "f", max_depth=4) == 1
    with pytest.raises(LimitError, match="an alias nests deeper than 3 levels"):
        check_yaml(text, "f", max_depth=3)
    # an alias of a scalar adds no depth; an unknown alias counts one node of no depth
    assert check_yaml("a: &s x\nb: [*s]\n", "f", max_depth=2) == 1


def test_an_anchor_on_a_nested_collection_records_its_own_size() -> None:
    # &in is [1, 2] (3 nodes) inside &out; aliasing the inner one adds 3, not the outer's 5
    text = "a: &out [&in [1, 2]]\nb: *in\n"
    assert check_yaml(text, "f", max_alias_nodes=3) == 1
    with pytest.raises(LimitError, match="more than 2 nodes"):
        check_yaml(text, "f", max_alias_nodes=2)
    # the outer one: 1 + 3 = 4 nodes through the alias
    text = "a: &out [&in [1, 2]]\nb: *out\n"
    assert check_yaml(text, "f", max_alias_nodes=4) == 1
    with pytest.raises(LimitError, match="more than 3 nodes"):
        check_yaml(text, "f", max_alias_nodes=3)


def test_each_document_counts_its_own_nodes_and_aliases_and_anchors() -> None:
    doc = "[&a [1, 2], *a, *a]\n"  # 1 + 3 + 3 + 3 = 10 nodes, 6 through aliases
    text = "---\n" + doc + "---\n" + doc + "---\n" + doc
    assert check_yaml(text, "f", max_nodes=10, max_alias_nodes=6) == 3
    with pytest.raises(LimitError, match="more than 9 nodes"):
        check_yaml(text, "f", max_nodes=9)
    with pytest.raises(LimitError, match="more than 5 nodes"):
        check_yaml(text, "f", max_alias_nodes=5)
    # an anchor of an earlier document is not known in the next: there its alias is an error for the loader
    assert check_yaml("--- &a [1, 2, 3, 4]\n--- [*a]\n", "f", max_nodes=5) == 2


def test_documents_are_counted_and_the_count_stops_one_past_the_bound() -> None:
    assert check_yaml("", "f") == 0
    assert check_yaml("a: 1\n", "f") == 1
    assert check_yaml("a: 1\n---\nb: 2\n---\nc: 3\n", "f") == 3
    assert check_yaml("a: 1\n---\nb: 2\n---\nc: 3\n", "f", max_documents=1) == 2
    assert check_yaml("a: 1\n---\nb: 2\n---\nc: 3\n", "f", max_documents=3) == 3
    # the documents after the bound are not read: a too-deep one there raises nothing
    assert check_yaml("a: 1\n---\nb: 2\n---\n" + _flow(9), "f", max_depth=3, max_documents=1) == 2
    with pytest.raises(LimitError):
        check_yaml("a: 1\n---\nb: 2\n---\n" + _flow(9), "f", max_depth=3, max_documents=3)


def test_a_syntax_error_is_left_to_the_loader_with_the_documents_read_so_far() -> None:
    assert check_yaml("a: 1\n---\nb: [1, 2\n", "f") == 2
    assert check_yaml("a: [\n", "f") == 1
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load("a: [\n")


def test_the_defaults_are_the_documented_limits() -> None:
    assert (limits.MAX_DEPTH, limits.MAX_YAML_NODES, limits.MAX_ALIAS_NODES) == (100, 2_000_000, 100_000)
    assert check_yaml(_flow(100), "f") == 1


def test_an_alias_of_an_unknown_anchor_counts_one_node_of_no_depth() -> None:
    """The parser leaves an undefined alias to the loader (which refuses it); the pre-scan counts it as one
    scalar: one node, one aliased node, no depth."""
    assert check_yaml("[*nowhere]", "f", max_nodes=2, max_alias_nodes=1, max_depth=1) == 1
    with pytest.raises(LimitError, match="more than 1 nodes in one document"):
        check_yaml("[*nowhere]", "f", max_nodes=1)
    with pytest.raises(LimitError, match="aliases expand to more than 0 nodes"):
        check_yaml("[*nowhere]", "f", max_alias_nodes=0)


def test_with_no_room_above_the_value_a_value_orjson_refuses_is_walked() -> None:
    """At limit == orjson's own depth the value is serialized alone: an error other than the recursion limit
    (a non-string key, met before any depth) falls back to the walk, whatever the depth."""
    top = limits._dumps_depth()
    assert json_too_deep({1: nest(top)}, top)
    assert not json_too_deep({1: nest(top - 1)}, top)
    assert not json_too_deep({1: nest(150)}, top)  # deeper than MAX_DEPTH, within this limit
    assert not json_too_deep({1: 1}, top)
    assert json_too_deep(nest(top + 1), top)
