"""Ops nested in the aten call before them (torch's ``_grouped_mm`` fallback's per-expert ``mm``) pay
no framework time and are not scaled as Python-level calls in context."""

from __future__ import annotations

from hardware.hostprofile import in_context, predict_gaps
from opgraph.ir import HostIssue, OpBase, OpGraph, is_nested
from tests.hardware.host_builders import toy_graph, toy_profile


def _nest(graph: OpGraph, index: int) -> OpGraph:
    ops: list[OpBase] = list(graph.ops)
    op = ops[index]
    ops[index] = op.model_copy(update={"issue": HostIssue.NESTED})  # its definition stays as it was
    return graph.model_copy(update={"ops": tuple(ops)})


def test_a_nested_op_gets_no_framework_gap_the_others_keep_theirs() -> None:
    prof = toy_profile()
    plain = toy_graph(2, timed=False)
    nested = _nest(plain, 1)  # the up_proj GEMM of layer 0, issued inside the call before it
    assert is_nested(nested.ops[1]) and not is_nested(plain.ops[1])
    before, after = predict_gaps(plain, prof), predict_gaps(nested, prof)
    assert before.gaps_us[1] > 0.0
    assert after.gaps_us[1] == 0.0
    assert after.gaps_us[:1] + after.gaps_us[2:] == before.gaps_us[:1] + before.gaps_us[2:]
    assert after.levels["nested"] == 1 and after.levels["exact"] == len(plain.ops) - 1
    assert "1 nested in a call (none)" in after.describe()


def test_in_context_terms_leave_a_nested_ops_host_time_as_measured() -> None:
    prof = toy_profile(op_scale=2.0, forward_us=10.0, busy_scale=1.0)
    g = _nest(toy_graph(1, timed=False), 2)
    host = [1.0, 2.0, 3.0, 4.0]
    device = [10.0, 0.0, 0.0, 0.0]  # busy share u = 1 (device 10 us over host 10 us)
    # every Python-level op x2 (op_scale) x2 (busy), the forward's time on the first; the nested one as given
    assert in_context(host, g, prof, device) == [14.0, 8.0, 3.0, 16.0]


def test_host_syncs_are_the_ops_marked_so_in_program_order() -> None:
    from opgraph.ir import host_syncs

    g = toy_graph(2, timed=False)
    assert host_syncs(g) == ()
    ops = [op.model_copy(update={"issue": HostIssue.SYNC}) if op.id in (5, 1) else op for op in g.ops]
    marked = g.model_copy(update={"ops": tuple(ops)})
    assert host_syncs(marked) == (1, 5)
    assert not any(is_nested(op) for op in marked.ops)  # a sync is a Python-level call
