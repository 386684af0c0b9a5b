"""Collectives against exact expected values, for random sizes, dtypes, ops and world sizes.

Each example starts a real job (``macfleet launch``) whose ranks run a list of generated
cases; every rank checks every result against values it computes independently.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BIN, Job, run_launch

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "uint8", "int16", "int32", "int64"]
OTHERS = ["bool", "complex64"]  # as torch.distributed takes them: views of uint8 and of float32 pairs
SIZES = st.one_of(
    st.integers(0, 9),                       # empty, and fewer elements than ranks
    st.integers(10, 5000),                    # odd sizes
    st.sampled_from([16384, 16385, 70001, 300_001]),  # several chunks and parts
)


@st.composite
def cases(draw: st.DrawFn) -> dict:
    dtype = draw(st.sampled_from(FLOATS + INTS + OTHERS))
    kind = draw(st.sampled_from(["all_reduce", "all_reduce", "broadcast", "all_gather"]))
    ops = {"complex64": ["sum", "avg"]}.get(dtype, ["sum", "avg", "max", "min"] if dtype in FLOATS
                                            else ["sum", "max", "min"])
    shared, leaf = draw(st.booleans()), draw(st.booleans())
    return {
        "kind": kind, "dtype": dtype, "numel": draw(SIZES), "seed": draw(st.integers(0, 10**6)),
        "op": draw(st.sampled_from(ops)), "src": draw(st.integers(0, 7)), "shared": shared, "leaf": leaf,
        # a strided view (a column of a wider tensor), whose neighbours the collective must leave alone
        "column": not (shared or leaf) and draw(st.booleans()),
    }


# One job per path, of 24 to 40 cases, drawn varied: hypothesis draws the simplest example
# first (12 empty float32 all-reduces), which as one of two examples spent a job per path, about
# 40 s of the suite, on nothing the other cases do not cover.
VARIED_CASE_LISTS = st.lists(cases(), min_size=24, max_size=40).filter(
    lambda case_list: len({(case["kind"], case["dtype"]) for case in case_list}) >= 8)


def run_cases(tmp_path, world: int, case_list: list[dict], env: dict[str, str] | None = None,
              hosts: list[str] | None = None) -> Job:
    for case in case_list:
        case["src"] %= world
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(case_list))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    where = hosts or ["--nproc", str(world)]
    job = run_launch(*where, str(BIN / "collective_cases.py"), str(cases_file), str(out), env=env, timeout=240)
    assert job.code == 0, job.output
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    for report in reports:
        assert report["cases"] == len(case_list)
        assert report["failures"] == [], report["failures"][:3]
    return job


# (world size, environment): the paths a collective can take. Tiny chunks and a tiny latency
# threshold force the pipelined multi-chunk, multi-part ring even for small tensors.
TCP = {"MACFLEET_SHM": "0"}
PATHS = {
    "w1": (1, {}),
    "w2-default": (2, {}),
    "w2-tcp": (2, TCP),  # a pair: each adds the other's tensor into its own (one pass up to 4 MiB)
    "w2-tcp-tiny-chunks": (2, {**TCP, "MACFLEET_CHUNK_BYTES": "1000"}),  # the pair's tensor in many pieces
    # segments as POSIX shared-memory objects, as on macOS (macfleet.segments)
    "w3-shm-tiny-slots": (3, {"MACFLEET_SHM_SLOT_BYTES": "4096", "MACFLEET_SMALL_BYTES": "256",
                              "MACFLEET_SHM_GATHER_BYTES": "64", "MACFLEET_SHM_OBJECTS": "1"}),
    "w3-tcp-tiny-chunks-2-streams": (3, {**TCP, "MACFLEET_CHUNK_BYTES": "4096", "MACFLEET_SMALL_BYTES": "256",
                                         "MACFLEET_STREAMS": "2"}),
    "w4-tcp-tiny-chunks": (4, {**TCP, "MACFLEET_CHUNK_BYTES": "1000", "MACFLEET_SMALL_BYTES": "64"}),
    # 64 KiB chunks: pyzmq copies smaller frames whatever it is asked. Up to four parts, so
    # some collectives settle on a back channel that carried none of their data.
    "w4-tcp-zero-copy-2-streams": (4, {**TCP, "MACFLEET_CHUNK_BYTES": "65536", "MACFLEET_SMALL_BYTES": "64",
                                       "MACFLEET_ZERO_COPY_BYTES": "1", "MACFLEET_MIN_PART_BYTES": "16384",
                                       "MACFLEET_STREAMS": "2"}),
    "w8-default": (8, {"MACFLEET_SMALL_BYTES": "512"}),
}


@pytest.mark.parametrize("path", list(PATHS))
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case_list=VARIED_CASE_LISTS)
def test_collectives_are_exact(tmp_path, path: str, case_list: list[dict]) -> None:
    """On the paths that have fixed cases (``FIXED_JOBS``, below), those run first in the job of
    the drawn ones: a start of three or four ranks is 6-10 s of CPU on a 2-core machine, most of
    it importing torch. The tests of the fixed cases read that job, once it has passed, rather
    than start their own."""
    world, env, fixed = fixed_cases(path)
    job = run_cases(tmp_path, world, fixed + case_list, env)
    if fixed:
        FIXED_RAN.setdefault(path, job)  # the first example's, which hypothesis draws once when it passes


def test_all_reduce_of_more_than_100_mib_is_exact(tmp_path) -> None:
    numel = (100 << 20) // 4 + 12345  # just over 100 MiB of float32
    run_cases(tmp_path, 2, [
        {"kind": "all_reduce", "dtype": "float32", "numel": numel, "seed": 7, "op": "sum", "src": 0},
        {"kind": "all_reduce", "dtype": "int64", "numel": numel // 2, "seed": 8, "op": "max", "src": 0},
    ], env={"MACFLEET_STREAMS": "2"})


# The fixed case lists of the three tests below run in one job per path, each test checking its
# part (a start of three ranks is 8-15 s of CPU on a loaded 2-core machine). Where a job has the
# in-place cases it starts inside torch.inference_mode(), as a script that only evaluates may.
BOOL_COMPLEX_SPARSE = [
    {"kind": kind, "dtype": dtype, "numel": numel, "seed": seed, "op": op, "src": 1, "shared": shared}
    for seed, (kind, dtype, op) in enumerate(
        [("all_reduce", "bool", op) for op in ("sum", "max", "min")] +
        [("all_reduce", "complex64", op) for op in ("sum", "avg")] +
        [(kind, dtype, "sum") for kind in ("broadcast", "all_gather") for dtype in OTHERS])
    for numel, shared in ((5, False), (70001, True))
] + [
    {"kind": "all_reduce", "dtype": dtype, "numel": numel, "seed": seed, "op": op, "src": 1, "sparse": True}
    for seed, (dtype, op, numel) in enumerate([("float32", "sum", 5), ("float32", "sum", 70_001),
                                               ("float32", "avg", 7_000), ("int64", "sum", 7_000),
                                               ("bfloat16", "sum", 70_001), ("float64", "avg", 70_007)])
]
IN_PLACE = [
    {"kind": kind, "dtype": dtype, "numel": numel, "seed": seed, "op": op, "src": 1, **marks, "shared": shared}
    for seed, (kind, dtype, numel, op, shared) in enumerate([
        ("all_reduce", "float32", 1000, "avg", False), ("all_reduce", "float32", 300_001, "sum", False),
        ("all_reduce", "float32", 5000, "sum", True), ("all_reduce", "bfloat16", 999, "max", False),
        ("broadcast", "float32", 70_001, "sum", False), ("all_gather", "float16", 77, "sum", False),
        ("all_reduce", "float64", 300_001, "sum", False), ("all_reduce", "complex64", 200_001, "sum", False),
        ("all_reduce", "float16", 500_001, "avg", False), ("all_reduce", "bfloat16", 500_001, "max", False)])
    for marks in ({"leaf": True}, {"inference": "made"}, {"inference": "inside"})
] + [  # the first shared float64s, inside the mode, then outside it: memory reused from call to call
    {"kind": "all_reduce", "dtype": "float64", "numel": 5000, "seed": 50 + k, "op": "sum", "src": 1,
     "shared": True, **marks} for k, marks in enumerate([{"inference": "inside"}, {}, {}])]
COMPRESSED = [
    {"kind": "all_reduce", "dtype": dtype, "numel": numel, "seed": seed, "op": op, "src": 0, "compression": wire}
    for seed, (wire, dtype, op, numel) in enumerate([
        ("fp16", "float32", "sum", 70_001), ("bf16", "float32", "avg", 300_001),
        ("bf16", "float16", "sum", 16_385), ("fp16", "bfloat16", "max", 70_001),
        ("bf16", "float32", "sum", 100)])
] + [  # inside torch.inference_mode(), as an evaluation's metrics are, in parts on pool threads
    {"kind": "all_reduce", "dtype": "float32", "numel": 500_001, "seed": 9, "op": "sum", "src": 0,
     "compression": "bf16", "inference": "inside"}]
FIXED_JOBS = {
    "w3-shm-tiny-slots": [BOOL_COMPLEX_SPARSE, IN_PLACE],
    "w3-tcp-tiny-chunks-2-streams": [BOOL_COMPLEX_SPARSE, IN_PLACE, COMPRESSED],
    "w4-tcp-zero-copy-2-streams": [COMPRESSED],
}


FIXED_RAN: dict[str, Job] = {}  # path -> a passed job that ran its FIXED_JOBS cases


def fixed_cases(path: str) -> tuple[int, dict[str, str], list[dict]]:
    """``path``'s world size and environment, and copies of its fixed cases (none for most)."""
    world, env = PATHS[path]
    groups = FIXED_JOBS.get(path, [])
    if any(group is IN_PLACE for group in groups):
        env = {**env, "CASES_INIT_INFERENCE": "1"}
    return world, env, [dict(case) for group in groups for case in group]


@pytest.fixture(scope="module")
def fixed_cases_job(tmp_path_factory) -> Callable[[str], Job]:
    """The job that ran ``FIXED_JOBS[path]``'s cases on ``path``, every one exact on every rank:
    test_collectives_are_exact's, or (where that did not pass or run) one started here."""

    def job_of(path: str) -> Job:
        if path not in FIXED_RAN:
            world, env, fixed = fixed_cases(path)
            FIXED_RAN[path] = run_cases(tmp_path_factory.mktemp(path), world, fixed, env)
        return FIXED_RAN[path]

    return job_of


@pytest.mark.parametrize("path", ["w3-shm-tiny-slots", "w3-tcp-tiny-chunks-2-streams"])
def test_bool_complex_and_sparse_tensors_are_taken_as_torch_distributed_takes_them(fixed_cases_job, path: str) -> None:
    """An early-stopping flag (``all_reduce(torch.tensor(stop))``) and complex numbers, every
    kind of collective, in shared memory and not (drawn above only by chance). They were a
    ConfigError, while torch.distributed takes both. So was a sparse COO tensor (an embedding's
    gradient reduced by hand), which gloo sums: each rank's entries at places of its own, single
    numbers and rows, and a rank's tensor with no entries at all (5 numbers, a tenth kept).
    Without torch's warning from every rank that sparse invariant checks are off: the sum is
    built checked."""
    job = fixed_cases_job(path)
    assert "Sparse invariant checks" not in job.output, job.output


@pytest.mark.parametrize("path", ["w3-shm-tiny-slots", "w3-tcp-tiny-chunks-2-streams"])
def test_parameters_and_inference_tensors_are_reduced_in_place(fixed_cases_job, path: str) -> None:
    """Parameters, as ``dist.broadcast(p, 0)`` and ``dist.all_reduce(p)`` take them: autograd
    refused our in-place writes into a leaf that requires grad (drawn above only by chance).
    2.4 MB of float64 is three parts of the ring over sockets, two of them on pool threads,
    where a ``no_grad`` entered by the calling thread did not reach (the hypothesis cases
    found that). Tensors made under ``torch.inference_mode()`` (evaluation metrics), as
    torch.distributed takes them: outside that mode torch refused our writes from inside the
    collective, and inside it the pool threads' writes, which the mode does not reach. Half
    precision is reduced in a float32 host buffer, as every GPU tensor is: made inside the
    mode, the buffer was an inference tensor itself, and the pool threads' additions into it
    were refused (found by random cases in bulk, session 48). The job starts inside the mode
    (``macfleet.init()`` under it), as a script that only evaluates may."""
    fixed_cases_job(path)  # every case exact on every rank


def test_broadcasts_over_sockets_in_uneven_pieces_are_exact(tmp_path) -> None:
    """A broadcast between Macs goes in pieces of a sixteenth of the tensor (256 KiB at least,
    the chunk size at most): tensors that their pieces do not divide, from every source, with
    the default chunk (the tiny-chunk paths above cut every broadcast at the chunk size)."""
    run_cases(tmp_path, 3, [
        {"kind": "broadcast", "dtype": dtype, "numel": numel, "seed": seed, "op": "sum", "src": seed % 3}
        for seed, (dtype, numel) in enumerate([("float32", 1_500_007), ("float64", 70_001), ("int8", 5_000_001),
                                               ("float32", 1_500_007), ("float16", 65_537), ("float32", 1_500_007)])
    ], TCP)


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case_list=VARIED_CASE_LISTS)
def test_hierarchical_all_reduce_across_hosts_is_exact(sshd, tmp_path, case_list: list[dict]) -> None:
    """Shared memory inside each "host", a ring of host leaders between them (uneven slots)."""
    run_cases(tmp_path, 5, case_list, {"MACFLEET_SHM_SLOT_BYTES": "8192", "MACFLEET_SMALL_BYTES": "128"},
              hosts=["--hosts", "127.0.0.2:2,127.0.0.3:1,127.0.0.1:2", *sshd.launch_options()])


@pytest.mark.parametrize("where", ["one host", "three hosts", "sockets only"])
def test_broadcasts_from_every_rank_and_gathers_through_shared_memory(request, tmp_path, where: str) -> None:
    """Broadcasts and all-gathers go through shared memory (a ring over sockets took a hop per
    rank: SyncBatchNorm gathers in every forward, DataParallel broadcasts buffers). From every
    source: across hosts a leader, a rank that is not one, and a host of one rank, in 8 KiB
    slots so that 5000 floats take three rounds. Then 300 one-round collectives back to back:
    a rank past their only barrier announces the next while others still check this one's
    announcements, which read as ranks in different collectives before that was allowed for.
    ``sockets only``: the ring of all five ranks, where a broadcast of up to 256 KiB goes both
    ways round it (the hosts' ring of three, above, takes that path too) and a larger one
    (70001 floats) one way, in pieces."""
    sizes = (("float32", 5000), ("int8", 3)) + ((("float32", 70001),) if where == "sockets only" else ())
    cases = [{"kind": "broadcast", "dtype": dtype, "numel": numel, "seed": src, "op": "sum", "src": src}
             for src in range(5) for dtype, numel in sizes]
    cases += [{"kind": "all_gather", "dtype": "float64", "numel": 2500, "seed": 9, "op": "sum", "src": 0}]
    cases += [{"kind": ("broadcast", "all_gather")[k % 2], "dtype": "float32", "numel": 1 + k % 7, "seed": k,
               "op": "sum", "src": k % 5} for k in range(300)]
    hosts = None
    if where == "three hosts":
        hosts = ["--hosts", "127.0.0.2:2,127.0.0.3:1,127.0.0.1:2", *request.getfixturevalue("sshd").launch_options()]
    env = {"MACFLEET_SHM": "0"} if where == "sockets only" else {"MACFLEET_SHM_SLOT_BYTES": "8192"}
    run_cases(tmp_path, 5, cases, env, hosts=hosts)


@pytest.mark.parametrize("zero_copy_bytes", ["1", str(1 << 30)], ids=["zero-copy", "copy"])
def test_shared_tensors_between_hosts_on_every_channel(sshd, tmp_path, zero_copy_bytes: str) -> None:
    """4.8 MB of shared tensors between two hosts of two ranks (above the one pass of a pair): the
    leaders' two-member ring splits it over all four channels. Found by the test above: when zero-copy sends waited for
    pyzmq's trackers this hung, every time, on a message the peer had received but libzmq never
    released. Zero-copy sends now settle with the peers instead."""
    shared = [{"kind": "all_reduce", "dtype": dtype, "numel": numel, "seed": seed, "op": "sum", "src": 0,
               "shared": True} for dtype, numel, seed in (("float64", 600_000, 1), ("float32", 1_200_002, 2))]
    run_cases(tmp_path, 4, shared, {"MACFLEET_TIMEOUT": "30", "MACFLEET_ZERO_COPY_BYTES": zero_copy_bytes},
              hosts=["--hosts", "127.0.0.2:2,127.0.0.3:2", *sshd.launch_options()])


@pytest.mark.parametrize("path", ["w3-tcp-tiny-chunks-2-streams", "w4-tcp-zero-copy-2-streams"])
def test_compressed_all_reduce_is_close_and_identical_on_every_rank(fixed_cases_job, path: str) -> None:
    """What crosses the wire is rounded to half precision; every rank must still end with the
    same bits (DataParallel's replicas would drift apart otherwise)."""
    fixed_cases_job(path)  # every case within its bound and the same on every rank


@pytest.mark.parametrize("world", [1, 3])
def test_python_objects_are_gathered_and_broadcast(world: int) -> None:
    job = run_launch("--nproc", str(world), str(BIN / "objects.py"), timeout=90)
    assert job.code == 0, job.output
    assert job.stdout.count("objects ok") == world, job.output


def test_arguments_refused_in_a_job_are_refused_alone_too() -> None:
    """A script tried with plain ``python train.py`` (a job of one) before it is launched: every
    collective returned there whatever its arguments (an op that does not exist, a sparse
    tensor, a source that is no rank), or after macfleet.shutdown(), and was refused only under
    the launcher. A sparse, nested or meta tensor, or an expanded one to write into, was refused
    in a job with torch's own words from deep inside ("reshape is not implemented for sparse
    tensors"), some of them once the other ranks were waiting in the collective."""
    script = str(BIN / "refusals.py")
    alone = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    job = run_launch("--nproc", "2", script, timeout=120)
    assert alone.returncode == 0 and job.code == 0, (alone.stderr, job.output)
    lines = [line for line in alone.stdout.splitlines() if ": " in line]
    assert len(lines) == 18 and all(": ConfigError: " in line for line in lines), alone.stdout
    # torch.distributed's op is named with ours; a float source failed at a shift of its bits
    assert "is torch.distributed's: give 'sum' (macfleet's ops are sum, avg, max, min)" in alone.stdout, alone.stdout
    assert "src-float: ConfigError: broadcast src=1.0 must be a rank's number, an int" in alone.stdout
    for rank in (0, 1):
        ours = [line.removeprefix(f"[rank {rank}] ") for line in job.stdout.splitlines()
                if line.startswith(f"[rank {rank}] ") and ": " in line]
        assert [re.sub(r"world size \d", "", line) for line in ours] == \
            [re.sub(r"world size \d", "", line) for line in lines], (ours, lines)


def test_sparse_tensors_of_different_shapes_are_named_not_summed(tmp_path) -> None:
    """A sparse all-reduce gathers every rank's entries and sums them in the rank's own shape:
    an embedding's gradient of 10 rows on one rank and 1000 on the other left each rank with a
    different result, the smaller one holding an entry past its end (a sparse tensor torch does
    not check unless asked). Every rank now names both shapes. Then the same with one rank's tensor sparse in both dimensions."""
    script = tmp_path / "shapes.py"
    script.write_text("""
import sys, torch, macfleet
macfleet.init()
rank = macfleet.rank()
rows = 10 if rank == 0 or sys.argv[1] == "dims" else 1000
t = torch.zeros(rows, 4)
t[rows - 1] = 1
macfleet.all_reduce(t.to_sparse(1) if rank == 0 or sys.argv[1] == "rows" else t.to_sparse(), name="embedding grad")
""")
    for how, named in (("rows", "rank 0: [10, 4] (1 sparse), rank 1: [1000, 4] (1 sparse)"),
                       ("dims", "rank 0: [10, 4] (1 sparse), rank 1: [10, 4] (2 sparse)")):
        job = run_launch("--nproc", "2", str(script), how, timeout=60)
        assert job.code == 1, job.output
        report = job.stderr[job.stderr.index("root cause"):]
        assert f"ConfigError: embedding grad: the ranks all-reduce sparse tensors of different shapes ({named})" \
            in report, report
        assert "other ranks:" in report and "[ConfigError]" in report, report
