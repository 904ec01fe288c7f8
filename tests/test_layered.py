"""cluster/layered.py: views of a dict written in place are immutable and equal to a copy taken at the time,
across compactions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import layered
from cluster.layered import Layered

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from("abcdef"), st.integers(1, 9)),
        st.tuples(st.just("pop"), st.sampled_from("abcdef"), st.just(0)),
        st.tuples(st.just("view"), st.just(""), st.just(0)),
    ),
    max_size=60,
)


@pytest.mark.parametrize("compact_at", [0, 2, 1024])
@given(ops=OPS)
def test_every_view_equals_the_dict_when_it_was_taken(compact_at: int, ops: list[tuple[str, str, int]]) -> None:
    old = layered.COMPACT_AT
    layered.COMPACT_AT = compact_at
    try:
        table: Layered[str, int] = Layered()
        plain: dict[str, int] = {}
        taken = []
        for op, key, value in ops:
            if op == "set":
                table.set(key, value)
                plain[key] = value
            elif op == "pop":
                table.pop(key)
                plain.pop(key, None)
            else:
                taken.append((table.view(), dict(plain)))
            assert len(table) == len(plain) and table.get(key) == plain.get(key)
        taken.append((table.view(), dict(plain)))
        for view, then in taken:
            assert dict(view) == then and len(view) == len(then) and sorted(view) == sorted(then)
            for key in "abcdefg":
                assert view.get(key, -1) == then.get(key, -1) and (key in view) == (key in then)
                if key in then:
                    assert view[key] == then[key]
                else:
                    with pytest.raises(KeyError):
                        view[key]
    finally:
        layered.COMPACT_AT = old


def test_a_view_copies_only_the_changes_since_the_last_compaction() -> None:
    table: Layered[int, int] = Layered()
    for i in range(5000):
        table.set(i, i)
    first = table.view()  # 5000 changes > COMPACT_AT: compacted on the way, at most COMPACT_AT beside the base
    assert len(first._delta) <= layered.COMPACT_AT and len(first._base) >= 5000 - layered.COMPACT_AT
    table.set(0, -1)
    table.pop(1)
    second = table.view()
    assert first._base is second._base and second._delta == {**first._delta, 0: -1, 1: layered._GONE}
    assert (first[0], second[0], 1 in first, 1 in second, len(first), len(second)) == (0, -1, True, False, 5000, 4999)


def test_changes_without_any_view_stay_bounded() -> None:
    """With no reader for a while (no GPU review while pods come and go) the changes must not pile up: one
    entry per key ever removed was a leak of the pod view's per-job counts."""
    d: Layered[str, int] = Layered()
    for i in range(10 * layered.COMPACT_AT):
        d.set(f"job-{i}", 1)
        d.pop(f"job-{i}")
    assert len(d._delta) <= layered.COMPACT_AT and len(d._base) <= layered.COMPACT_AT
    assert dict(d.view()) == {} and len(d) == 0
