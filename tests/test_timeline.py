"""``macfleet launch --timeline FILE``: every rank's collectives and DataParallel's steps, in one
trace-event file on the launching machine."""

from __future__ import annotations

import _thread
import json
import threading
from collections import defaultdict

from macfleet import timeline
from macfleet.launcher.tracefile import TraceFile
from macfleet.timeline import Timeline
from conftest import BIN, run_launch

SCRIPT = str(BIN / "timeline.py")
STEPS, BUCKETS = 3, 3


def spans(events: list[dict], rank: int, name: str) -> list[dict]:
    return sorted((e for e in events if e.get("pid") == rank and e["name"] == name and e["ph"] in "Xi"),
                  key=lambda e: e["ts"])


def test_the_timeline_shows_each_ranks_buckets_exchanged_in_order_while_backward_waits(tmp_path) -> None:
    path = tmp_path / "timeline.json"
    job = run_launch("--nproc", "2", "--timeline", str(path), SCRIPT, timeout=90)
    assert job.code == 0, job.output
    assert f"in {path}; open it in https://ui.perfetto.dev" in job.stderr
    events = json.loads(path.read_text())  # the whole file: the array closed
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (localhost)", 1: "rank 1 (localhost)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    ops = {}
    for rank in (0, 1):
        waits = spans(events, rank, "waiting for gradients")
        assert len(waits) == STEPS
        assert len(spans(events, rank, "forward")) == STEPS
        exchanges = [spans(events, rank, f"all_reduce gradient bucket {k}") for k in range(BUCKETS)]
        readies = [spans(events, rank, f"gradient bucket {k} ready") for k in range(BUCKETS)]
        for step, wait in enumerate(waits):
            mine = [exchanges[k][step] for k in range(BUCKETS)]
            # on the communication thread, in bucket order, each after its gradients were ready
            assert {threads[(rank, e["tid"])] for e in mine} == {"macfleet-buckets"}
            assert [e["ts"] for e in mine] == sorted(e["ts"] for e in mine)
            assert [e["args"]["op"] for e in mine] == sorted(e["args"]["op"] for e in mine)
            for k in range(BUCKETS):
                assert readies[k][step]["ts"] <= mine[k]["ts"]
            # backward returned only once every bucket was averaged
            assert max(e["ts"] + e["dur"] for e in mine) <= wait["ts"] + wait["dur"] + 1
        # the buckets' shared memory, allocated when DataParallel was made, before the first forward
        allocated = spans(events, rank, "host_tensor")
        assert [e["args"]["by"] for e in allocated] == ["DataParallel (start)"] * BUCKETS
        assert max(e["ts"] for e in allocated) < waits[0]["ts"] and all(e["args"]["bytes"] > 0 for e in allocated)
        metric = spans(events, rank, "all_reduce metric")
        assert len(metric) == 1 and threads[(rank, metric[0]["tid"])] == "MainThread"
        ops[rank] = [e["args"]["op"] for e in events if e.get("pid") == rank and "op" in e.get("args", {})]
    assert ops[0] == ops[1] and len(set(ops[0])) == len(ops[0])  # the same collectives, each once


def test_a_failed_job_still_leaves_a_whole_timeline(tmp_path) -> None:
    path = tmp_path / "timeline.json"
    job = run_launch("--nproc", "2", "--timeline", str(path), SCRIPT, "fail-at", "2", timeout=90)
    assert job.code == 1, job.output
    assert "deliberate failure in step 2" in job.stderr
    events = json.loads(path.read_text())
    per_rank: dict[int, int] = defaultdict(int)
    for e in events:
        if e["name"] == "waiting for gradients":
            per_rank[e["pid"]] += 1
    assert per_rank == {0: 2, 1: 2}  # both ranks' steps before the failure


def test_a_timeline_that_cannot_be_written_is_a_usage_error(tmp_path) -> None:
    job = run_launch("--nproc", "2", "--timeline", str(tmp_path / "no-such-dir" / "t.json"), SCRIPT, timeout=30)
    assert job.code == 2 and "--timeline" in job.stderr and "cannot write" in job.stderr, job.output
    assert "[rank" not in job.stdout


def test_the_file_keeps_the_first_events_up_to_its_limit_and_skips_what_is_not_an_event(tmp_path) -> None:
    path = tmp_path / "t.json"
    trace = TraceFile(str(path), limit=5)
    good = [("all_reduce x", 10 + k, 3, "MainThread", {"op": k}) for k in range(4)]
    trace.add(0, "mini", [*good[:2], ("not", "an", "event"), ["x", "ts", 1, "t", None]])
    trace.add(1, "studio", good + [("instant", 20, -1, "macfleet-buckets", None)], dropped=7)
    trace.close()
    events = json.loads(path.read_text())
    kept = [e for e in events if e["ph"] != "M"]
    assert [(e["pid"], e["name"]) for e in kept] == [(0, "all_reduce x")] * 2 + [(1, "all_reduce x")] * 3
    assert (trace.events, trace.past_limit, trace.malformed, trace.dropped) == (5, 2, 2, {1: 7})
    said = "\n".join(trace.summary())  # the launcher's end lines: every count, with what it counts
    assert "5 events of 2 ranks" in said and "2 more were left out" in said, said
    assert "7 events left out (recorded faster than they could be sent) by rank 1" in said, said
    assert "2 events left out that were not in this macfleet's format" in said, said
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (mini)", 1: "rank 1 (studio)"}


def test_a_file_the_disk_has_no_room_for_is_said_to_be_cut_short_and_never_ends_the_job() -> None:
    """A full disk under --timeline raised from the launcher's loop, mid-job: a traceback, and
    every rank stopped. /dev/full takes the file and fails every write it flushes."""
    trace = TraceFile("/dev/full")
    for batch in range(50):  # past the file's buffer, so that writes fail before the end too
        trace.add(batch % 2, "mini", [("all_reduce x", 10 + k, 3, "MainThread", {"op": k}) for k in range(20)])
    trace.close()
    assert trace.failed == "No space left on device" and trace.unwritten > 0, (trace.failed, trace.unwritten)
    assert trace.events + trace.unwritten == 1000
    assert trace.summary() == [f"timeline: cannot write /dev/full (No space left on device): it is cut short within "
                               f"its first {trace.events} events of 2 ranks, and {trace.unwritten} more were left out"]


def test_a_thread_python_did_not_start_is_named_as_autograds() -> None:
    """On a GPU, backward and DataParallel's hooks run on a thread of the autograd engine's,
    which Python knows only as "Dummy-1"; its track is named for what it is. (A thread that
    _thread starts is such a thread to Python, as autograd's are.)"""
    recorder, done = Timeline(True), threading.Event()

    def foreign() -> None:
        recorder.instant("gradient bucket 0 ready")
        done.set()

    _thread.start_new_thread(foreign, ())
    assert done.wait(10)
    recorder.instant("forward")
    assert [(name, thread) for name, _, _, thread, _ in recorder.take(5)] == \
        [("gradient bucket 0 ready", "autograd"), ("forward", "MainThread")]


def test_a_rank_keeps_a_bounded_number_of_unsent_events() -> None:
    recorder = Timeline(True)
    for k in range(timeline.KEPT + 3):
        recorder.instant("x")
    assert recorder.dropped == 3
    assert len(recorder.take(10)) == 10 and len(recorder.take(timeline.KEPT)) == timeline.KEPT - 10
    recorder.span("a" * 500, 1.0, 0.5)  # a clock stepped back: no negative duration; a long name cut
    (name, _, duration, thread, _), = recorder.take(5)
    assert (len(name), duration, thread) == (timeline.NAME_CHARS, 0, "MainThread")
