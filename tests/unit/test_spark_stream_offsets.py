"""The streaming source's offsets and micro-batch bounds, and the sink's
transactional ids: pure functions, no Spark job runs."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from spark_jobs import streaming_sink
from spark_jobs.options import WriteOptions
from spark_jobs.streaming_source import from_json, held_to, share, to_json
from txlog.two_phase import task_id_pattern, task_transactional_id


def test_offsets_go_to_and_from_the_batch_sources_json_form():
    offsets = {("events", 0): 42, ("events", 1): 7, ("other", 0): 0}
    assert to_json(offsets) == {"events": {"0": 42, "1": 7}, "other": {"0": 0}}
    assert from_json(to_json(offsets)) == offsets


def test_a_bound_larger_than_the_backlog_reads_everything():
    start, end = {("t", 0): 0, ("t", 1): 5}, {("t", 0): 10, ("t", 1): 8}
    assert share(start, end, 100) == end


def test_a_bound_is_shared_in_proportion_to_each_partitions_backlog():
    start, end = {("t", 0): 0, ("t", 1): 0}, {("t", 0): 300, ("t", 1): 100}
    assert share(start, end, 40) == {("t", 0): 30, ("t", 1): 10}


backlogs = st.dictionaries(st.integers(0, 7).map(lambda p: ("t", p)), st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
                           min_size=1)


@given(backlogs, st.integers(1, 500))
def test_a_bounded_micro_batch_keeps_to_the_bound_never_goes_back_and_always_moves_on(partitions, records_max):
    start = {tp: first for tp, (first, _) in partitions.items()}
    end = {tp: first + waiting for tp, (first, waiting) in partitions.items()}
    bounded = share(start, end, records_max)
    assert all(start[tp] <= bounded[tp] <= end[tp] for tp in end)
    total, moved = sum(end[tp] - start[tp] for tp in end), sum(bounded[tp] - start[tp] for tp in end)
    assert moved <= records_max
    if total <= records_max:
        assert bounded == end
    if total:
        assert moved >= 1  # a backlog always makes progress


def test_a_new_partition_in_the_end_offsets_counts_from_its_own_start():
    assert share({("t", 0): 0, ("t", 1): 4}, {("t", 0): 10, ("t", 1): 4}, 5) == {("t", 0): 5, ("t", 1): 4}


def test_an_available_now_run_reads_up_to_its_target_and_no_partition_added_after_it():
    target = {("t", 0): 10, ("t", 1): 4}
    start = {("t", 0): 2, ("t", 1): 4, ("t", 2): 0, ("t", 3): 0}  # t-2 and t-3 appeared after the run began
    end = {("t", 0): 15, ("t", 1): 9, ("t", 2): 3, ("t", 3): 8}
    assert held_to(target, start, end) == {("t", 0): 10, ("t", 1): 4, ("t", 2): 0, ("t", 3): 0}
    assert held_to(target, {("t", 0): 2}, {("t", 0): 15, ("t", 5): 8}) == {("t", 0): 10}
    assert held_to(target, {("t", 0): 12}, {("t", 0): 15}) == {("t", 0): 12}  # never back


def test_a_micro_batch_tasks_ids_are_task_ids_of_the_querys_transaction_group():
    options = WriteOptions("h:1", "out", None, 60_000)
    prefix = streaming_sink.query_prefix(options, "1ed70c9a-1a1e-4400-bfe0-d8d395e9cc65")
    assert prefix == "txlog-stream-1ed70c9a-1a1e-4400-bfe0-d8d395e9cc65"
    run = streaming_sink.task_run(17, "00ED00F2-5607-44d2-8837-c898b1340e67")
    tid = task_transactional_id(prefix, run, 3, 99)
    matched = task_id_pattern(prefix).fullmatch(tid)
    assert matched and matched.group(1) == "r17-00ed00f2560744d28837c898b1340e67"
    assert not task_id_pattern(prefix).fullmatch(f"{prefix}/batches")  # the ledger is never taken for a task's
    assert streaming_sink.query_prefix(WriteOptions("h:1", "out", "mine", 60_000), "q") == "mine"
    assert re.fullmatch(r"[a-zA-Z0-9._:-]+", prefix)
