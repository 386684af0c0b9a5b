"""The shared-memory group on its own: ranks as threads of one process over a real segment.

The multi-process paths (every size, every world, crashes) are in test_collectives and
test_faults; these tests pin down the barrier's own guarantees quickly.
"""

from __future__ import annotations

import gc
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from macfleet import segments, shm
from macfleet.errors import CollectiveTimeout, ConfigError, JobAborted, ProtocolError
from macfleet.segments import Segments
from macfleet.shm import DIRECT_BYTES, GATHER_BYTES, LocalGroup, Signature
from macfleet.transport import Liveness


def make_groups(tmp_path, size: int, slot_bytes: int = 4096, timeout_s: float = 10.0,
                direct_bytes: int = DIRECT_BYTES, objects: bool = False,
                gather_bytes: int = GATHER_BYTES) -> list[LocalGroup]:
    liveness = Liveness()
    groups = [LocalGroup(str(tmp_path), "job", 0, size, i, slot_bytes, liveness, timeout_s, direct_bytes, objects,
                         gather_bytes) for i in range(size)]
    with ThreadPoolExecutor(size) as pool:
        list(pool.map(LocalGroup.attach, groups))  # attach ends with a barrier: all must map the segment
    return groups


def close_all(groups: list[LocalGroup]) -> None:
    for group in groups:
        group.close()


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("direct_bytes, gather_bytes", [(0, 0), (DIRECT_BYTES, 0), (DIRECT_BYTES, 1 << 20)],
                         ids=["own-share-from-src", "all-through-slots", "every-rank-reduces-all"])
def test_ranks_reduce_exactly_over_many_pipelined_rounds(tmp_path, size: int, direct_bytes: int,
                                                         gather_bytes: int) -> None:
    """direct_bytes=0: each rank reads its own share from its tensor and writes the result
    straight back (what tensors over 1 MiB do); the default sends these small ones through the
    slots. 3 elements on 5 ranks leave some ranks no share at all. gather_bytes over the
    tensors' size: one round in which every rank reduces every row (what tensors up to
    GATHER_BYTES in all take), in 4 KiB slots that hold them. Objects (macOS's segments) for 3
    ranks."""
    groups = make_groups(tmp_path, size, slot_bytes=256 if not gather_bytes else 4096, direct_bytes=direct_bytes,
                         objects=size == 3, gather_bytes=gather_bytes)
    assert groups[0].segments.objects == (size == 3)
    assert not groups[0].segments.exists(groups[0].name)  # unlinked once everyone mapped it
    assert os.listdir(tmp_path) == []  # and its marker with it

    def on_every_rank(call) -> None:
        with ThreadPoolExecutor(size) as pool:
            list(pool.map(call, range(size)))

    try:
        for numel in (1000, 3):  # 1000 elements take 16 rounds, the last one short
            inputs = [torch.randint(-50, 50, (numel,)).float() for _ in range(size)]
            kept = [x.clone() for x in inputs]
            stacked = torch.stack(inputs)
            for op, want in (("sum", stacked.sum(0)), ("max", stacked.amax(0)), ("min", stacked.amin(0))):
                outs = [torch.empty(numel) for _ in range(size)]
                on_every_rank(lambda i, op=op, outs=outs, inputs=inputs: groups[i].all_reduce(inputs[i], outs[i], op))
                for out in outs:
                    assert torch.equal(out, want), (op, numel)
            assert all(torch.equal(x, k) for x, k in zip(inputs, kept, strict=True))  # the sources are only read
            # half precision is reduced in float32: the slot converts it, own share included
            halves = [x.half() for x in inputs]
            outs = [torch.empty(numel) for _ in range(size)]
            on_every_rank(lambda i, outs=outs, halves=halves: groups[i].all_reduce(halves[i], outs[i], "sum"))
            assert all(torch.equal(out, stacked.sum(0)) for out in outs), numel
            # in place (the result over the source), averaged in the same pass
            on_every_rank(lambda i, inputs=inputs: groups[i].all_reduce(inputs[i], inputs[i], "sum", divide_by=size))
            for x in inputs:
                assert torch.equal(x, stacked.sum(0) / size), numel
            # floats whose sum depends on the order of the additions: every rank gets the same bits
            floats = [torch.randn(numel) for _ in range(size)]
            outs = [torch.empty(numel) for _ in range(size)]
            on_every_rank(lambda i, outs=outs, floats=floats: groups[i].all_reduce(floats[i], outs[i], "sum"))
            assert all(torch.equal(out, outs[0]) for out in outs), numel
            torch.testing.assert_close(outs[0], torch.stack(floats).double().sum(0).float())
    finally:
        close_all(groups)


def test_a_rank_that_never_arrives_is_named_when_the_barrier_times_out(tmp_path) -> None:
    groups = make_groups(tmp_path, 3, timeout_s=0.5)
    try:
        with ThreadPoolExecutor(2) as pool:
            arrived = pool.submit(groups[1].barrier)  # rank 1 arrives, rank 2 never does
            started = time.monotonic()
            with pytest.raises(CollectiveTimeout, match=r"local ranks \[2\]"):
                groups[0].barrier()
            assert time.monotonic() - started < 5
            with pytest.raises(CollectiveTimeout):
                arrived.result(timeout=10)
    finally:
        close_all(groups)


def test_an_abort_ends_a_barrier_wait(tmp_path) -> None:
    groups = make_groups(tmp_path, 2, timeout_s=60)
    try:
        groups[0].liveness.abort("rank 1 exited")
        started = time.monotonic()
        with pytest.raises(JobAborted, match="rank 1 exited"):
            groups[0].barrier()  # rank 1 never comes: the abort, not the 60 s deadline, ends the wait
        assert time.monotonic() - started < 5
    finally:
        close_all(groups)


def test_a_sleeping_rank_is_rung_awake_by_the_rank_that_arrives(tmp_path, monkeypatch) -> None:
    """A rank that waits long sleeps on its doorbell, and the last rank to arrive rings it: with
    the sleep's own limit at 60 s, only the ring can end rank 0's wait within the test's 20."""
    monkeypatch.setattr(shm, "CHECK_S", 60.0)
    groups = make_groups(tmp_path, 3, timeout_s=120)
    try:
        with ThreadPoolExecutor(2) as pool:
            waits = [pool.submit(groups[i].barrier) for i in (0, 1)]
            deadline = time.monotonic() + 20
            while not all(groups[2]._counters[i * shm.LINE + shm.ASLEEP] for i in (0, 1)):  # both asleep
                assert time.monotonic() < deadline and not any(w.done() for w in waits)
                time.sleep(0.01)
            groups[2].barrier()
            for wait in waits:
                wait.result(timeout=20)
        assert [g._counters[i * shm.LINE + shm.ASLEEP] for g in groups for i in range(3)] == [0] * 9
    finally:
        close_all(groups)


def test_a_rank_behind_is_waited_for_and_one_ahead_is_named(tmp_path) -> None:
    """A late rank still in an earlier collective is only behind; one that announced a later
    collective skipped this one and will never arrive (the multi-process mismatches are in
    test_faults)."""
    groups = make_groups(tmp_path, 2, timeout_s=30)
    tensors = [torch.ones(100), torch.ones(100)]
    this = Signature(1, "all_reduce", 100, torch.float32, "sum")

    def behind() -> None:
        groups[1].announce(Signature(0, "broadcast", 5, torch.float32))
        time.sleep(0.5)  # rank 0 looks at this line several times meanwhile
        groups[1].announce(this)
        groups[1].all_reduce(tensors[1], tensors[1], "sum")

    try:
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(behind)
            groups[0].announce(this)
            groups[0].all_reduce(tensors[0], tensors[0], "sum")
            late.result(timeout=10)
        assert all(torch.equal(t, torch.full((100,), 2.0)) for t in tensors)
        groups[1].announce(Signature(3, "all_reduce", 100, torch.float32, "sum"))
        groups[0].announce(Signature(2, "all_reduce", 100, torch.float32, "sum"))
        started = time.monotonic()
        with pytest.raises(ProtocolError, match=r"rank 1 is in all_reduce of 100 float32 \(sum\) \(collective 3\)"):
            groups[0].all_reduce(tensors[0], tensors[0], "sum")
        assert time.monotonic() - started < 5
    finally:
        close_all(groups)


# What rank 0 and rank 1 announce as the same collective, one field apart, and how the error
# names each. (test_faults runs some of these as whole jobs.)
SUM8 = Signature(1, "all_reduce", 8, torch.float32, "sum")
ANNOUNCED = {
    "numel": (SUM8, Signature(1, "all_reduce", 9, torch.float32, "sum"), "all_reduce of 9 float32 (sum)"),
    "reduce op": (SUM8, Signature(1, "all_reduce", 8, torch.float32, "max"), "all_reduce of 8 float32 (max)"),
    "dtype": (SUM8, Signature(1, "all_reduce", 8, torch.int32, "sum"), "all_reduce of 8 int32 (sum)"),
    "kind": (SUM8, Signature(1, "all_gather", 8, torch.float32), "all_gather of 8 float32"),
    "caller": (SUM8, Signature(1, "all_reduce", 8, torch.float32, "sum", "checkpoint.save"),
               "all_reduce of 8 float32 (sum), from checkpoint.save"),
    "root": (Signature(1, "broadcast", 8, torch.float32, root=0), Signature(1, "broadcast", 8, torch.float32, root=1),
             "broadcast of 8 float32 from rank 1"),
}


@pytest.mark.parametrize("field", list(ANNOUNCED))
def test_ranks_that_announce_different_collectives_are_stopped_naming_both(tmp_path, field: str) -> None:
    """Each field of an announcement is compared: a difference in any one of them stops the
    ranks at the collective's first barrier, with what each rank is in."""
    ours, theirs, named = ANNOUNCED[field]
    groups = make_groups(tmp_path, 2)

    def enter(rank: int) -> str:
        groups[rank].announce(theirs if rank else ours)
        try:
            groups[rank].barrier()
        except ProtocolError as exc:
            return str(exc)
        return ""  # the first to compare finds the other's line as announced: one of the two may pass

    try:
        with ThreadPoolExecutor(2) as pool:
            said = list(pool.map(enter, range(2)))
    finally:
        close_all(groups)
    assert any(said), said
    ours_named = "broadcast of 8 float32 from rank 0" if field == "root" else "all_reduce of 8 float32 (sum)"
    for message in filter(None, said):
        assert f"{ours_named} (collective 1)" in message and f"{named} (collective 1)" in message, message


def test_ranks_whose_sizes_take_different_paths_are_stopped_not_mixed(tmp_path) -> None:
    """A small all-reduce takes one barrier and a large one two or more: ranks that disagree on
    the size meet at the first barrier all the same, and both stop there, naming both sizes,
    instead of one reading the other's bytes as its own or waiting at a barrier never reached."""
    groups = make_groups(tmp_path, 2, timeout_s=30)
    sizes = (9, 5000)  # 36 bytes: one barrier; 20000 bytes: rounds of the 4 KiB slot

    def enter(rank: int) -> str:
        n = sizes[rank]
        groups[rank].announce(Signature(1, "all_reduce", n, torch.float32, "sum"))
        try:
            groups[rank].all_reduce(torch.ones(n), torch.empty(n), "sum")
        except ProtocolError as exc:
            return str(exc)
        return "returned"

    try:
        with ThreadPoolExecutor(2) as pool:
            said = list(pool.map(enter, range(2)))
    finally:
        close_all(groups)
    assert "returned" not in said, said
    assert all("all_reduce of 9 float32" in s and "all_reduce of 5000 float32" in s for s in said), said


@pytest.mark.parametrize("size", [2, 3])
def test_shared_tensors_are_reduced_where_they_are(tmp_path, size: int) -> None:
    groups = make_groups(tmp_path, size, slot_bytes=256, gather_bytes=0)  # pieces of 64 floats: 1000 elements take many
    try:
        with ThreadPoolExecutor(size) as pool:
            tensors = list(pool.map(lambda g: g.shared_tensor(1000, torch.float32), groups))
        assert os.listdir(tmp_path) == []  # unlinked once everyone mapped it
        assert all(torch.equal(t, torch.zeros(1000)) for t in tensors)
        inputs = [torch.randint(-50, 50, (1000,)).float() for _ in range(size)]
        cases = (("sum", size, torch.stack(inputs).sum(0) / size), ("max", 1, torch.stack(inputs).amax(0)))
        for op, divide_by, want in cases:
            for t, x in zip(tensors, inputs, strict=True):
                t.copy_(x)
            with ThreadPoolExecutor(size) as pool:
                list(pool.map(lambda i, op=op, d=divide_by: groups[i].all_reduce(tensors[i], tensors[i], op, d),
                              range(size)))
            assert all(g.path == "in place" for g in groups)
            for t in tensors:
                assert torch.equal(t, want), op
        # one rank brings a private tensor: nobody reduces in place, and the result is still exact
        private = inputs[0].clone()
        for t, x in zip(tensors[1:], inputs[1:], strict=True):
            t.copy_(x)
        brought = [private, *tensors[1:]]
        with ThreadPoolExecutor(size) as pool:
            list(pool.map(lambda i: groups[i].all_reduce(brought[i], brought[i], "sum"), range(size)))
        assert not any(g.path == "in place" for g in groups)
        for t in brought:
            assert torch.equal(t, torch.stack(inputs).sum(0))
        # the same run of elements on every rank (buf[a:b] of a host tensor) is reduced in place
        # too, and the rest of each rank's tensor is left as it was
        for t, x in zip(tensors, inputs, strict=True):
            t.copy_(x)
        with ThreadPoolExecutor(size) as pool:
            list(pool.map(lambda i: groups[i].all_reduce(tensors[i][100:700], tensors[i][100:700], "sum"), range(size)))
        assert all(g.path == "in place" for g in groups)
        for t, x in zip(tensors, inputs, strict=True):
            assert torch.equal(t[100:700], torch.stack(inputs)[:, 100:700].sum(0))
            assert torch.equal(t[:100], x[:100]) and torch.equal(t[700:], x[700:])
        # runs at different places on different ranks: through the slots, each rank's own run summed
        for t, x in zip(tensors, inputs, strict=True):
            t.copy_(x)
        runs = [t[10 * i:10 * i + 600] for i, t in enumerate(tensors)]
        want = torch.stack([x[10 * i:10 * i + 600] for i, x in enumerate(inputs)]).sum(0)
        with ThreadPoolExecutor(size) as pool:
            list(pool.map(lambda i: groups[i].all_reduce(runs[i], runs[i], "sum"), range(size)))
        assert not any(g.path == "in place" for g in groups)
        for run in runs:
            assert torch.equal(run, want)
        # a view of another dtype (a bool flag's uint8, say) is summed in its own: the rows were
        # summed as float32 under it
        words = [torch.randint(1 << 24, 1 << 28, (1000,), dtype=torch.int32) for _ in range(size)]  # normal floats as bits (denormals add as integers do)
        views = [t.view(torch.int32) for t in tensors]
        for v, w in zip(views, words, strict=True):
            v.copy_(w)
        with ThreadPoolExecutor(size) as pool:
            list(pool.map(lambda i: groups[i].all_reduce(views[i], views[i], "sum"), range(size)))
        for v in views:
            assert torch.equal(v, torch.stack(words).sum(0))
    finally:
        close_all(groups)


def test_too_little_shared_memory_is_a_clear_error_not_a_crash(tmp_path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)],
                                 capture_output=True).returncode == 0
    except OSError:  # no mount command
        mounted = False
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:  # a /dev/shm of 256 KiB: two buffers of (2 ranks + result) x 64 KiB slots fit, 1 MiB slots do not
        with pytest.raises(ConfigError, match=r"no room for 6 MiB .*MACFLEET_SHM=0"):
            LocalGroup(str(small), "job", 0, 2, 0, 1 << 20, Liveness(), 10.0)
        assert os.listdir(small) == []
        groups = make_groups(small, 2, slot_bytes=16 << 10, timeout_s=1.0)
        try:
            with ThreadPoolExecutor(2) as pool:
                failures = list(pool.map(lambda g: _raises(lambda: g.shared_tensor(1 << 20, torch.float32)), groups))
            assert isinstance(failures[0], ConfigError) and "no room for 8 MiB" in str(failures[0])
            assert isinstance(failures[1], CollectiveTimeout)  # in a job, rank 0's exit aborts it at once
        finally:
            close_all(groups)
    finally:
        subprocess.run(["umount", str(small)], check=True)


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def mapped(name: str) -> list[str]:
    """The lines of this process's memory map that map the file ``name``."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if name in line]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the mappings from /proc (Linux)")
def test_a_shared_tensor_is_unmapped_once_nothing_uses_it(tmp_path) -> None:
    groups = make_groups(tmp_path, 2)
    try:
        with ThreadPoolExecutor(2) as pool:
            tensors = list(pool.map(lambda g: g.shared_tensor(4096, torch.float32), groups))
        assert mapped("shm-job-0-t1")  # both "ranks" (threads of this process) map it
        grad = tensors[0][:10]  # a view outlives the tensor it came from, as a parameter's .grad does
        del tensors
        gc.collect()
        assert all(g._shared == {} for g in groups)
        grad.add_(1)  # still mapped while a view lives
        assert mapped("shm-job-0-t1")
        del grad
        gc.collect()
        assert not mapped("shm-job-0-t1")
    finally:
        close_all(groups)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="looks for the objects in /dev/shm (Linux)")
def test_an_object_a_crash_left_is_released_with_its_directory(tmp_path) -> None:
    """A segment's creator that dies before unlinking it leaves a POSIX object, which would
    hold its memory until the Mac restarts; its marker in the per-job directory names it."""
    store = Segments(str(tmp_path), objects=True)
    name = "shm-0123456789ab-12-t34567"  # as long as a job's names get
    assert len(segments.object_name(name)) <= 30  # macOS's limit, the slash included
    os.close(store.create(name, 1 << 20))
    in_dev_shm = "/dev/shm" + segments.object_name(name)  # where glibc's shm_open puts it
    assert os.path.getsize(in_dev_shm) == 1 << 20 and store.exists(name)
    assert os.listdir(tmp_path) == [name]  # the marker
    with pytest.raises(FileExistsError):  # never two segments of one name
        store.create(name, 4096)
    segments.release(str(tmp_path))
    assert not os.path.exists(in_dev_shm) and not store.exists(name)
    # an object that cannot be made is a ConfigError that says what to do, and leaves no marker
    os.remove(tmp_path / name)
    with open(in_dev_shm, "wb"):  # someone else's, in the way
        pass
    try:
        with pytest.raises(ConfigError, match="cannot create a POSIX shared-memory object .*MACFLEET_SHM=0"):
            store.create(name, 4096)
        assert os.listdir(tmp_path) == []
    finally:
        os.remove(in_dev_shm)


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_slots_fit_the_shared_cache_within_the_measured_bounds(ranks: int) -> None:
    """The slot is a power of two that puts the segment (two buffers of ranks + 1 slots) in
    about half the shared cache, never above the size measured best where the cache holds any
    segment (16 MiB up to 4 ranks, 4 MiB beyond), unless a rank has several cores: then never
    under 2 MiB per core of its share, up to 16 MiB."""
    MiB = 1 << 20
    largest = 16 * MiB if ranks <= 4 else 4 * MiB
    assert shm.default_slot_bytes(ranks) == largest  # nothing known of the cache
    assert shm.default_slot_bytes(ranks, 4 * 2 * (ranks + 1) * largest, 2) == largest  # room for any segment
    for cache in (8 * MiB, 12 * MiB, 32 * MiB, 48 * MiB):
        slot = shm.default_slot_bytes(ranks, cache, ranks)  # one core a rank
        assert slot & (slot - 1) == 0 and MiB <= slot <= largest
        if MiB < slot < largest:
            assert cache / 2 / 2 ** 0.5 <= 2 * (ranks + 1) * slot <= cache / 2 * 2 ** 0.5, (cache, slot)
        many = shm.default_slot_bytes(ranks, cache, 16 * ranks)  # 16 cores a rank: rounds of 16 MiB at least
        assert many == 16 * MiB
        assert shm.default_slot_bytes(ranks, cache, 3 * ranks) == max(slot, 6 * MiB)  # 3 cores a rank: 6 MiB
    assert shm.default_slot_bytes(ranks, None, 8 * ranks) == 16 * MiB  # the cache unknown, as on a Mac


def test_the_shared_cache_is_the_largest_that_several_cores_share(tmp_path) -> None:
    """Read from a tree laid out as Linux's /sys/devices/system/cpu/cpu0/cache: a core's own
    caches and instruction caches are not shared data; an unreadable entry is skipped."""
    def cache(name: str, kind: str, shared: str, size: str) -> None:
        (tmp_path / name).mkdir()
        for field, value in (("type", kind), ("shared_cpu_list", shared), ("size", size)):
            (tmp_path / name / field).write_text(value + "\n")

    assert shm.shared_cache_bytes(str(tmp_path)) is None
    cache("index0", "Data", "0", "48K")
    cache("index1", "Instruction", "0-3", "64M")
    cache("index2", "Unified", "0", "2048K")
    assert shm.shared_cache_bytes(str(tmp_path)) is None  # nothing shared
    cache("index3", "Unified", "0-15", "307200K")
    cache("index4", "Unified", "0,8", "garbage")
    assert shm.shared_cache_bytes(str(tmp_path)) == 300 << 20


def test_ranks_of_one_host_with_different_slots_are_stopped_before_any_collective(tmp_path) -> None:
    """Their slots would lie at different offsets of the segment: every rank reads its slot
    size from the same place (the knob, or the cache it finds), and if they ever differ, every
    rank stops at attach with a message naming both, instead of reducing garbage."""
    liveness = Liveness()
    groups = [LocalGroup(str(tmp_path), "job", 0, 2, i, 8192 // (i + 1), liveness, 10.0) for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        errors = [f.exception(timeout=30) for f in [pool.submit(g.attach) for g in groups]]
    try:
        for error in errors:
            assert isinstance(error, ConfigError), error
            assert "slots of 8192 bytes (rank 0), 4096 bytes (rank 1)" in str(error)
            assert "MACFLEET_SHM_SLOT_BYTES must be the same" in str(error)
    finally:
        close_all(groups)
    # larger slots than the segment holds: that rank stops as it maps it (the others wait for it
    # at the barrier, where the launcher's abort ends their wait)
    leader = LocalGroup(str(tmp_path), "job2", 4, 2, 0, 4096, liveness, 10.0)
    late = LocalGroup(str(tmp_path), "job2", 4, 2, 1, 8192, liveness, 10.0)
    with pytest.raises(ConfigError, match=r"slots of 8192 bytes \(rank 5\) that do not fit the segment rank 4 made"):
        late.attach()
    close_all([leader, late])
