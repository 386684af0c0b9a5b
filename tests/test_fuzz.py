"""Garbage at live ports: a job keeps computing exact results while hypothesis throws frames at
its coordinator and at every rank's ring sockets; everything bad is dropped and counted."""

from __future__ import annotations

import json
import socket
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BIN, kill_group, start_launch

WORLD = 3


@pytest.fixture(scope="module")
def live_job(tmp_path_factory):
    stop = tmp_path_factory.mktemp("fuzz") / "stop"
    # Without shared memory every collective crosses the ring sockets the fuzzer can reach
    # (shared memory is a file only this job's ranks can open).
    proc, started = start_launch("--nproc", str(WORLD), str(BIN / "steady.py"), str(stop), ready=" ENDPOINTS ",
                                 ranks=WORLD, env={"MACFLEET_SHM": "0"})
    endpoints = {info["rank"]: info for info in (json.loads(line.split(" ENDPOINTS ", 1)[1])
                                                 for line in started if " ENDPOINTS " in line)}
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # keep the pipe drained
    reader.start()
    targets = [e for info in endpoints.values() for e in info["ring"].values()]
    ctx = zmq.Context()
    yield {"proc": proc, "stop": stop, "lines": lines, "reader": reader, "ctx": ctx,
           "ring": targets, "coordinator": endpoints[0]["coordinator"]}
    kill_group(proc.pid)
    proc.wait(timeout=30)
    reader.join(timeout=10)  # at the pipe's end now, before the pipe is closed under it
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    ctx.destroy(linger=0)


frames = st.lists(st.one_of(
    st.binary(max_size=64),                                             # garbage and truncated frames
    st.builds(lambda d: msgpack.packb(d), st.dictionaries(              # valid msgpack, wrong fields/versions
        st.sampled_from(["v", "job", "op", "seq", "src", "n", "kind", "from"]),
        st.one_of(st.integers(-5, 10**6), st.text(max_size=8), st.none()), max_size=8)),
    st.just(b"\x00" * 32),                                              # a mac-sized frame of zeros
), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=frames, target=st.integers(0, 100), raw_tcp=st.booleans())
def test_frames_thrown_at_live_ports_are_dropped(live_job, message: list[bytes], target: int, raw_tcp: bool) -> None:
    ring_target = target < 80  # mostly at the data plane, where the payloads are
    endpoint = live_job["ring"][target % len(live_job["ring"])] if ring_target else live_job["coordinator"]
    if raw_tcp:  # not even ZMTP: bytes straight at the port
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"".join(message) or b"\xff")
        return
    sock = live_job["ctx"].socket(zmq.PUSH if ring_target else zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    sock.send_multipart(message)
    sock.close()


def test_an_oversized_frame_is_refused(live_job) -> None:
    sock = live_job["ctx"].socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(live_job["ring"][0])
    sock.send(b"\x00" * (9 << 20))  # over MAXMSGSIZE: libzmq drops the connection, not the job
    sock.close()


def test_a_bad_frame_at_every_port_is_delivered(live_job) -> None:
    """Whatever hypothesis drew, one unsigned frame reaches every ring socket and the
    coordinator: terminating a context with linger waits until its queued frames are sent."""
    ctx = zmq.Context()
    for endpoint in [*live_job["ring"], live_job["coordinator"]]:
        sock = ctx.socket(zmq.DEALER if endpoint == live_job["coordinator"] else zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 5000)
        sock.connect(endpoint)
        sock.send_multipart([b"\x00" * 32, msgpack.packb({"v": 1, "op": "forged"})])
        sock.close()
    started = time.monotonic()
    ctx.term()
    assert time.monotonic() - started < 5, "a port did not take the frame"


def test_the_job_still_finishes_with_exact_results(live_job) -> None:
    live_job["stop"].write_text("stop")
    proc = live_job["proc"]
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    live_job["reader"].join(timeout=10)
    results = [line for line in live_job["lines"] if " RESULT " in line]
    assert len(results) == WORLD
    dropped = 0
    for line in results:
        fields = dict(kv.split("=") for kv in line.split(" RESULT ", 1)[1].split())
        assert fields["wrong"] == "0" and int(fields["iterations"]) > 0
        dropped += int(fields["dropped"])
    assert dropped > 0  # the ring sockets saw (and dropped) the fuzzer's frames
    assert "control messages were dropped" in err
