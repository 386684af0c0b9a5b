"""``macfleet launch`` end to end: output, exit codes, the root-cause report, Ctrl-C, bad input."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
from macfleet import openfiles
from conftest import (BIN, Job, bare_python, job_processes, kill_group, launch_command, run_launch, start_launch,
                      wait_for_no_job_processes)
from test_faults import behave_line

BEHAVE = str(BIN / "behave.py")


@pytest.fixture(scope="module")
def job_that_succeeds() -> Job:
    """One job of two ranks that all finish, each printing the environment it was given, for the
    tests of what a user sees of one and of the environment contract."""
    return run_launch("--nproc", "2", "--seed", "40", BEHAVE, "-1", "env", timeout=60)


def test_success_exits_zero_and_prefixes_every_line_with_its_rank(job_that_succeeds: Job) -> None:
    job = job_that_succeeds
    assert job.code == 0, job.output
    for rank in range(2):
        assert f"[rank {rank}] ready" in job.stdout
        assert f"[rank {rank}] finished" in job.stdout


def test_a_raising_rank_fails_the_job_with_its_traceback() -> None:
    job = run_launch("--nproc", "2", BEHAVE, "1", "raise", timeout=60)
    assert job.code == 1
    report = job.stderr[job.stderr.index("root cause"):]
    assert "rank 1 (host localhost" in report.splitlines()[1]
    assert "ValueError: deliberate failure on rank 1" in report
    assert "behave.py" in report  # the traceback reaches into the script
    assert "[PeerLost]" in report  # the other ranks were released, not left hanging
    assert job.seconds < 30


def test_the_root_cause_exit_code_is_the_launchers() -> None:
    job = run_launch("--nproc", "2", BEHAVE, "1", "exit3", timeout=60)
    assert job.code == 3, job.output
    assert "rank 1" in job.stderr and "exited with code 3" in job.stderr


def test_a_scripts_objects_are_freed_before_the_interpreter_is_torn_down(tmp_path) -> None:
    """Freed in finalization, a gloo process group can abort the rank (pytorch#190489)."""
    for ending, code in (([], 0), (["exit", "3"], 3), (["raise"], 1)):
        out = tmp_path / f"freed-{'-'.join(ending) or 'end'}.txt"
        job = run_launch("--nproc", "1", str(BIN / "finalizer.py"), str(out), *ending, timeout=60)
        assert job.code == code, job.output
        assert out.read_text() == "finalizing=False", ending
    assert "ValueError: the script failed" in job.stderr  # the last, raising run still reports its error


NANOBIND_EXTENSIONS = ("triton._C.libtriton", "mlx.core")  # torch 2.15's CUDA build brings triton; Macs may have MLX


def test_a_script_with_an_extension_built_with_nanobind_ends_without_its_leak_report(tmp_path) -> None:
    """A rank freezes what is left at its end, for a faster exit, and nanobind reports each of its
    types and functions still alive once the interpreter has ended: some 30 lines from every
    rank of a clean run on torch 2.15, whose optimizers import triton. Runs where such an
    extension is installed (``.ci/other-torch 2.15.0``; not torch 2.13's CPU build)."""
    name = next((n for n in NANOBIND_EXTENSIONS if importlib.util.find_spec(n.split(".")[0])), None)
    if name is None:
        pytest.skip("no extension built with nanobind here (triton, MLX)")
    script = tmp_path / "nanobind_user.py"
    script.write_text(f"import {name}\nprint('imported', {name}.__name__)\n")
    job = run_launch("--nproc", "1", str(script), timeout=60)
    assert job.code == 0, job.output
    assert f"imported {name}" in job.output
    assert "nanobind: leaked" not in job.output, job.output[-2000:]


def test_a_module_imported_lazily_and_never_used_is_not_loaded_at_the_rank_s_end(tmp_path) -> None:
    """Looking for nanobind's objects at a rank's end must not load a module that importlib's
    LazyLoader holds back: any attribute of it runs its code."""
    (tmp_path / "lazy_heavy.py").write_text("print('lazy_heavy was loaded')\n")
    script = tmp_path / "lazy_user.py"  # its folder is on sys.path, as the script's folder always is
    script.write_text(
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('lazy_heavy')\n"
        "spec.loader = importlib.util.LazyLoader(spec.loader)\n"
        "sys.modules['lazy_heavy'] = module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print('registered lazily')\n")
    job = run_launch("--nproc", "1", str(script), timeout=60)
    assert job.code == 0, job.output
    assert "registered lazily" in job.output
    assert "lazy_heavy was loaded" not in job.output


def test_a_rank_killed_by_a_signal_is_reported_by_name() -> None:
    """A SIGKILL from outside (here the rank's own, after it filled 1 GiB, as the OOM killer's
    comes) is most often the system's, out of memory: the report says so, with what it held."""
    job = run_launch("--nproc", "2", BEHAVE, "0", "sigkill", timeout=60)
    assert job.code == 128 + signal.SIGKILL, job.output
    assert "rank 0" in job.stderr and "SIGKILL" in job.stderr
    held = re.search(r"At its peak this rank held ([\d.]+) GiB of memory, of the ([\d.]+) GiB that localhost has",
                     job.stderr)
    assert held and "most often the system sends it when memory runs out" in job.stderr, job.stderr
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert 1.0 <= float(held.group(1)) < total and abs(float(held.group(2)) - total) < 0.1, held.group(0)


def test_a_crash_in_native_code_is_reported_with_the_script_s_line() -> None:
    """A segfault in an extension (or Metal aborting the process) raises no Python exception
    and writes no error file: the report named the signal and nothing else."""
    job = run_launch("--nproc", "2", BEHAVE, "1", "segfault", timeout=60)
    assert job.code == 128 + signal.SIGSEGV, job.output
    report = job.stderr[job.stderr.index("root cause"):]
    assert "rank 1 (host localhost" in report and "SIGSEGV" in report
    crash = behave_line("string_at(0)")
    assert f'behave.py", line {crash} in <module>' in report, report


def test_ctrl_c_stops_every_process_of_the_job() -> None:
    proc, _ = start_launch("--nproc", "2", BEHAVE, "-1", "hang", ready=" ready pid=", ranks=2)
    try:
        assert len(job_processes()) >= 4  # launcher, agent, two ranks
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert code == 130
        assert time.monotonic() - started < 15
    finally:
        kill_group(proc.pid)
        proc.communicate()


def test_a_launcher_started_with_ctrl_c_ignored_keeps_ignoring_it() -> None:
    """A job started in the background of a shell script (``macfleet launch ... &``), or under
    nohup, starts with Ctrl-C ignored: the shell keeps the Ctrl-C meant for its foreground away
    from it. The launcher's handler took it anyway, and the job stopped with code 130."""
    proc, _ = start_launch("--nproc", "2", BEHAVE, "-1", "hang", ready=" ready pid=", ranks=2,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)  # what stops it: the first signal the launcher takes is its exit code
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        kill_group(proc.pid)
        proc.communicate()


def test_a_job_started_beside_another_on_its_host_says_so() -> None:
    """Two jobs on one Mac share its GPU, and each caps its ranks' share of the GPU's memory as
    if it were alone (0.9 split among its own ranks), so together they may ask for more memory
    than the Mac has, and it pages. A job forgotten in another terminal halves the next one's
    speed. A job started beside another now says so, with what it may ask for together (on a
    host with a GPU; here, without one, --device auto asks for none); a job whose agent is gone
    (its directory not yet removed) is not counted."""
    import shutil
    from conftest import SCRATCH
    from macfleet.workers.other_jobs import gpus_here

    gone = os.path.join(SCRATCH, "macfleet-gonejob-x")  # an agent killed a moment ago: its note, unlocked
    os.makedirs(gone)
    with open(os.path.join(gone, "agent.json"), "w") as note:
        json.dump({"job_id": "gonejob", "pid": 1, "ranks": 8, "script": "gone.py", "started": time.time(),
                   "device": "auto", "memory_fraction": None}, note)
    proc, _ = start_launch("--nproc", "2", BEHAVE, "-1", "hang", ready=" ready pid=", ranks=2)
    try:
        second = run_launch("--nproc", "1", "--memory-fraction", "0.6", BEHAVE, "-1", "none", timeout=60)
        assert second.code == 0, second.output
        said = [line for line in second.stderr.splitlines() if "other macfleet job" in line]
        assert len(said) == 1, second.output
        assert said[0].startswith(f"macfleet agent on localhost: another macfleet job is running here: 2 ranks of "
                                  f"{BEHAVE}, started under a minute ago"), said
        if gpus_here() == 1:  # a Mac's: 2 ranks at 0.9 / 2 each and one at 0.6; shared evenly, 0.9 among 3
            assert "together 1.50 times its memory" in said[0], said
            assert "the 3 ranks on one GPU add up to 0.9 at most (0.3 each)" in said[0], said
        elif not gpus_here():  # --device auto trains on the CPU here: no GPU memory to share out
            assert "times its memory" not in said[0], said
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        _, first = proc.communicate()
        assert "other macfleet job" not in first, first  # it started alone: the note of a dead agent is no job
    finally:
        kill_group(proc.pid)
        proc.communicate()
        shutil.rmtree(gone)


INTERRUPTIBLE = """
import os, sys, time
import macfleet
macfleet.init()
try:  # before the ready line: a Ctrl-C that came between the two escaped the handler below
    print("ready pid=", os.getpid(), flush=True)
    while True:  # working between collectives, where no abort reaches it
        time.sleep(0.01)
except KeyboardInterrupt:  # what a script does on Ctrl-C: save what it has, then stop
    open(os.path.join(sys.argv[1], f"interrupted-{macfleet.rank()}"), "w").close()
    raise
"""


@pytest.mark.parametrize("where", ["launcher", "terminal"])
def test_ctrl_c_reaches_the_script_as_keyboard_interrupt(tmp_path, where: str) -> None:
    """Ctrl-C in the terminal (its whole process group: the launcher and local agents) or a
    SIGINT to the launcher alone (a remote Mac's ranks): every rank gets KeyboardInterrupt where
    it is, as ``python train.py`` would. Ranks working outside a collective never saw the
    abort, and were SIGTERMed after the grace period, with no chance to save anything."""
    script = tmp_path / "work.py"
    script.write_text(INTERRUPTIBLE)
    proc, _ = start_launch("--nproc", "2", str(script), str(tmp_path), ready=" ready pid=", ranks=2)
    try:
        if where == "terminal":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert sorted(p.name for p in tmp_path.glob("interrupted-*")) == ["interrupted-0", "interrupted-1"]
    finally:
        kill_group(proc.pid)
        proc.communicate()


TERMINABLE = """
import os, signal, sys, time
import macfleet
macfleet.init()

def on_term(signum, frame):  # what a script does on SIGTERM (a preempted machine): save, then stop
    open(os.path.join(sys.argv[1], f"terminated-{macfleet.rank()}"), "w").close()
    sys.exit(128 + signum)

signal.signal(signal.SIGTERM, on_term)
print("ready pid=", os.getpid(), flush=True)
while True:
    time.sleep(0.01)
"""


def _default_actions() -> None:
    """As from a terminal, where SIGHUP and SIGQUIT have their default actions (pytest-xdist's
    workers ignore SIGHUP)."""
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig, where", [(signal.SIGHUP, "launcher"), (signal.SIGHUP, "terminal"),
                                        (signal.SIGQUIT, "terminal")], ids=["hangup", "hangup-group", "ctrl-backslash"])
def test_a_hangup_or_a_quit_stops_the_job_as_sigterm_does(tmp_path, sig: signal.Signals, where: str) -> None:
    """The terminal closed, or the ssh connection it ran over dropped: the shell sends SIGHUP to
    its foreground job (the launcher and the local agents), or the launcher alone gets it. Or
    the user pressed Ctrl-\\, which sends SIGQUIT to the foreground job. The launcher died of
    either at once, with no word and no exit code of its own, and left the ranks to their
    agents' heartbeat. Now it stops every rank as for SIGTERM, whose handlers run."""
    script = tmp_path / "work.py"
    script.write_text(TERMINABLE)
    proc, _ = start_launch("--nproc", "2", str(script), str(tmp_path), ready=" ready pid=", ranks=2,
                           preexec_fn=_default_actions)
    try:
        if where == "terminal":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        kill_group(proc.pid)
        _, err = proc.communicate()
    assert code == 128 + sig, err
    assert f"{sig.name} received, stopping every rank" in err
    assert sorted(p.name for p in tmp_path.glob("terminated-*")) == ["terminated-0", "terminated-1"]


SIZE = """
import os, shutil
import macfleet
macfleet.init()
print("SIZE", tuple(shutil.get_terminal_size()), os.environ.get("MACFLEET_TERMINAL"), flush=True)
"""


def read_terminal(leader: int, deadline: float) -> bytes:
    """What a terminal shows (read from its ``leader`` end) until every process holding it has
    closed it, or ``deadline`` (monotonic)."""
    shown = b""
    while time.monotonic() < deadline:
        if not select.select([leader], [], [], 1)[0]:
            continue
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: every process holding the terminal has closed it
            break
        if not data:
            break
        shown += data
    return shown


def take_terminal() -> None:
    """In a child started in a session of its own, with a terminal as stdin: make it the
    session's controlling terminal, as a shell does, so that the child is its foreground and
    reads what is typed there."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_ranks_get_the_width_of_the_launcher_s_terminal_less_their_prefix(tmp_path) -> None:
    """A rank's output is a pipe, so its progress bars (tqdm, rich) took 80 columns whatever
    the terminal: the ranks get COLUMNS and LINES from the launcher's terminal, less the width
    of their "[rank K] " prefix. Piped, the launcher passes nothing on (Python's 80x24)."""
    script = tmp_path / "size.py"
    script.write_text(SIZE)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # 30 lines of 100 columns
    proc = subprocess.Popen(launch_command("--nproc", "2", str(script)), stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    os.close(follower)
    try:
        shown = read_terminal(leader, time.monotonic() + 60)
        assert proc.wait(timeout=60) == 0, shown
    finally:
        kill_group(proc.pid)
        proc.communicate()
        os.close(leader)
    for rank in (0, 1):  # "[rank 0] " takes 9 of the 100 columns
        assert f"[rank {rank}] SIZE (91, 30) None" in shown.decode(), shown
    piped = subprocess.run(launch_command("--nproc", "1", str(script)), capture_output=True, text=True, env=env,
                           timeout=60)
    assert piped.returncode == 0 and piped.stdout.count("SIZE (80, 24) None") == 1, piped.stdout


def test_the_environment_contract_and_per_rank_seeds(job_that_succeeds: Job) -> None:
    job = job_that_succeeds
    assert job.code == 0, job.output
    assert "Failed to initialize NumPy" not in job.stderr  # torch's warning where NumPy is absent, once a rank
    seen = {}
    for line in job.stdout.splitlines():
        if " ENV " in line:
            fields = json.loads(line.split(" ENV ", 1)[1])
            seen[int(fields["RANK"])] = fields
    assert sorted(seen) == [0, 1]
    for rank, fields in seen.items():
        assert fields["WORLD_SIZE"] == "2" and fields["LOCAL_RANK"] == str(rank) and fields["LOCAL_WORLD_SIZE"] == "2"
        assert fields["MASTER_ADDR"] and int(fields["MASTER_PORT"]) > 0
        assert fields["MACFLEET_JOB_SECRET"] is None  # init() removed it from the environment
        assert fields["torch_seed"] == 40 + rank
        assert float(fields["MACFLEET_MEMORY_FRACTION"]) == 0.45  # two processes share the GPU
        assert fields["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == fields["MACFLEET_MEMORY_FRACTION"]
        assert fields["rings"] == []  # one Mac's ranks share memory: no data socket at all
    assert seen[0]["MACFLEET_JOB_ID"] == seen[1]["MACFLEET_JOB_ID"]
    assert seen[0]["python_random"] != seen[1]["python_random"]


def test_ranks_whose_datasets_or_samplers_differ_are_told_which() -> None:
    """Each rank shards a shuffle of its own dataset's indices, made by its own sampler's options,
    so ranks whose datasets or options differ take parts that overlap and miss samples, and
    nothing else shows it. The launcher names each line of the script whose samplers differ
    (``datasets.py`` says what each makes), once, and the job goes on (the ranks' shards of the
    first add up to 14 + 14 + 13):
    - an incomplete copy of the data on one Mac: the first sampler's, rank 2's one sample short
      (rank 0's sampler made before it for itself alone is not the first's counterpart; nor is
      each rank's own ``num_replicas=1`` sampler, nor the first made again);
    - two samplers made at one line, each short on rank 0, each named by its number there;
    - the training part of a random_split with each rank's own seed, which holds other samples
      on every rank, and one with a seed for ranks 0-1 and another for rank 2 (the split with one
      seed everywhere is let be);
    - a seed drawn from each rank's own generator."""
    script = BIN / "datasets.py"
    job = run_launch("--nproc", "3", str(script), "2", timeout=60)
    assert job.code == 0 and "rank 0: 41 samples in the shards" in job.stdout, job.output

    def at(name: str) -> str:
        """The line that makes it, as reports name a line: relative to the working directory
        where the file is under it (the ranks' is the launcher's), else in full."""
        number = next(n for n, line in enumerate(script.read_text().splitlines(), 1) if f"{name} = " in line)
        relative = os.path.relpath(script)
        return f"{script if relative.startswith('..') else relative}:{number}"

    told = re.findall(r"warning: the ranks' datasets differ in length \(the DistributedSamplers made at (.*?)\): "
                      r"(.*?)\. ", job.stderr)
    assert told == [(at("first"), "40 on ranks 0-1, 39 on rank 2"),
                    (at("shrinking"), "29 on rank 0, 30 on ranks 1-2"),
                    (f"{at('shrinking')}, the 2nd made there", "19 on rank 0, 20 on ranks 1-2")], job.stderr
    told = re.findall(r"warning: the ranks' datasets are different parts of their data \(the DistributedSamplers made "
                      r"at (.*?): a Subset of (\d+) samples on every rank, but (.*?)\)\. "
                      r".*?generator=torch.Generator\(\).manual_seed\(0\)\)", job.stderr)
    assert told == [(at("own_split"), "30", "each rank's holds other samples"),
                    (at("two_splits"), "30", "ranks 0-1 hold one set; rank 2 holds another")], job.stderr
    told = re.findall(r"warning: the ranks' DistributedSamplers are made with different options \(the "
                      r"DistributedSamplers made at (.*?)\): (.*?)\. ", job.stderr)
    assert told == [(at("own_seed"), "seed 0 on rank 0, 1 on rank 1, 2 on rank 2")], job.stderr


def test_bench_allreduce_prints_both_libraries_side_by_side(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", "--nproc", "2", "--sizes", "4K,256K",
                           "--budget", "0.05", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every result was checked against the exact sum
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["bytes"], r["library"]) for r in rows) == [(4096, "gloo"), (4096, "macfleet"),
                                                                  (262144, "gloo"), (262144, "macfleet")]
    for row in rows:
        assert row["calls"] >= 3
        # the libraries take turns: as many calls of each
        assert row["calls"] == next(r["calls"] for r in rows if r["bytes"] == row["bytes"])
        assert abs(row["busbw_gbs"] - row["bytes"] / row["seconds"] / 1e9) < 1e-6 * row["busbw_gbs"]  # 2(N-1)/N = 1
    table = proc.stdout[proc.stdout.index("speed-up"):].splitlines()[1:3]
    for line, size in zip(table, (4096, 262144), strict=True):
        ours, gloo = (next(r["seconds"] for r in rows if r["bytes"] == size and r["library"] == lib)
                      for lib in ("macfleet", "gloo"))
        assert line.split()[-1] == f"{gloo / ours:.2f}x", line
    assert "share of each rank's time" not in proc.stderr  # a training job's line; the table says it here
    # progress, size by size as it runs, on stderr
    assert re.findall(r"^\[rank 0\] (\w+): macfleet [\d.]+ ms, gloo [\d.]+ ms$", proc.stderr, re.M) == ["4K", "256K"]


def test_bench_allreduce_refuses_what_it_cannot_measure() -> None:
    """One rank was a traceback from deep in the worker; sizes under one element were measured
    as one element and printed as 4B."""
    for args, wanted in ((["--nproc", "1"], "needs at least 2 ranks"), ([], "needs at least 2 ranks"),
                         (["--nproc", "2", "--sizes", "4K,3"], "'3' is less than one float32 element (4 bytes)"),
                         (["--nproc", "2", "--sizes", "0"], "less than one float32 element"),
                         (["--nproc", "2", "--sizes", "1", "--dtype", "bfloat16"], "less than one bfloat16 element"),
                         (["--nproc", "2", "--sizes", "4X"], "'4X' is not a size"),
                         (["--nproc", "2", "--sizes", "infK"], "'infK' is not a size"),
                         # a traceback after the whole measurement
                         (["--nproc", "2", "--json", "/nonexistent/out.json"], "cannot write in /nonexistent")):
        proc = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and wanted in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_bench_allreduce_refuses_sizes_its_host_cannot_hold_before_timing_any() -> None:
    """A size past the host's memory was a traceback from the allocator after the smaller sizes
    had been timed (and a size just under it had the ranks killed by the OOM killer)."""
    proc = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", "--nproc", "2",
                           "--sizes", "4K,99999G"], capture_output=True, text=True, timeout=60)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    said = re.findall(r"^(.*)--sizes up to 99999G: 2 ranks on localhost would hold about ([\d.]+) GiB, and it has "
                      r"([\d.]+) GiB \(4 tensors of that size a rank\): give smaller --sizes, or fewer ranks on that "
                      r"host$", proc.stderr, re.M)
    assert proc.returncode == 1 and [line for line, _, _ in said] == ["[rank 0] ", "  "], proc.stderr  # said once
    _, held, has = said[0]
    assert float(held) >= 2 * 4 * 99999 and abs(float(has) - memory) < 0.1, said
    assert "Traceback" not in proc.stderr and "4K:" not in proc.stderr, proc.stderr  # nothing timed first


def test_bench_allreduce_reduces_shared_tensors_in_place_and_small_ones_after_one_barrier(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", "--nproc", "3", "--sizes",
                           "4K,1M", "--budget", "0.05", "--shared-tensors", "--json", str(out),
                           "--env", "MACFLEET_SHM_SLOT_BYTES=64K"],  # the 1M tensor in pieces of one slot
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every result was checked against the exact sum
    result = json.loads(out.read_text())
    assert {(r["bytes"], r["algorithm"]) for r in result["rows"] if r["library"] == "macfleet"} == {
        (4096, "shared memory, one barrier"), (1 << 20, "shared memory, in place")}
    assert "tensors in shared memory" in proc.stdout
    assert result["slot_bytes"] == 64 << 10 and "shared memory on, slots of 64K" in proc.stdout, proc.stdout


def test_a_data_address_that_is_not_this_machine_s_is_named_not_a_traceback(tmp_path) -> None:
    """addr= in a hostfile (or --data-addr) naming another Mac's address, or an old one: every
    rank's bind failed, and the agent of the launching Mac died with a traceback, reported as
    "exited unexpectedly". A name where an address belongs is refused before anything starts."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2 addr=192.0.2.1\n")  # TEST-NET-1: nobody's address
    job = run_launch("--hostfile", str(hostfile), str(BIN / "behave.py"), "0", "none", timeout=60)
    assert job.code != 0 and "ready" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):]
    assert "cannot train over 192.0.2.1" in root and "not an address of this machine" in root, root
    assert "addr= in the hostfile" in root and "Traceback" not in job.stderr, job.output
    assert job.seconds < 15
    job = run_launch("--nproc", "2", "--data-addr", "mini1.local", str(BIN / "behave.py"), "0", "none")
    assert job.code == 2 and "--data-addr: mini1.local is not an IP address" in job.stderr, job.output


# Runs a command under a limit on open files (soft, hard): ``ulimit -n`` in the shell of a Mac.
UNDER_LIMIT = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
               "(int(sys.argv[1]), int(sys.argv[2]))); os.execvp(sys.argv[3], sys.argv[3:])"]


def test_the_job_directory_goes_where_macfleet_scratch_dir_says_and_is_removed(tmp_path) -> None:
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('DIR', os.environ['MACFLEET_SHM_DIR'], flush=True)\n")
    scratch = tmp_path / "made" / "scratch"  # made if missing
    job = run_launch("--nproc", "2", str(script), env={"MACFLEET_SCRATCH_DIR": str(scratch)})
    assert job.code == 0, job.output
    dirs = {line.split()[-1] for line in job.stdout.splitlines() if " DIR " in line}
    assert len(dirs) == 1 and os.path.dirname(dirs.pop()) == str(scratch), job.stdout
    assert list(scratch.iterdir()) == []
    (tmp_path / "file").write_text("")
    job = run_launch("--nproc", "1", str(script), env={"MACFLEET_SCRATCH_DIR": str(tmp_path / "file" / "below")})
    assert job.code != 0 and "Traceback" not in job.stderr, job.stderr
    assert f"cannot make the job's directory (MACFLEET_SCRATCH_DIR={tmp_path / 'file' / 'below'})" in job.stderr, \
        job.stderr


def test_a_limit_on_open_files_is_raised_for_the_ranks_or_named_before_they_start(tmp_path) -> None:
    """A Mac's shell allows 256 open files, and an agent holds about seven for each of its
    ranks: past the limit it failed to start the next rank with a traceback (EMFILE). Under a
    hard limit that allows it the soft limit is raised, for the ranks too (which inherit it: a
    rank on a CUDA machine holds about 55 before its script opens any, and failed at the 56 the
    agent raised it to for itself); under one that does not, the agent or the launcher refuses
    the job before any rank starts, with the numbers."""
    script = tmp_path / "limit.py"
    script.write_text("import resource, macfleet\nmacfleet.init()\n"
                      "print('soft limit', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    job = run_launch("--nproc", "4", str(script), prefix=[*UNDER_LIMIT, "32", "4096"], timeout=60)
    assert job.code == 0 and job.stdout.count(f"soft limit {openfiles.RANKS_SOFT}") == 4, job.output
    job = run_launch("--nproc", "2", str(script), prefix=[*UNDER_LIMIT, "32", "100"], timeout=60)
    assert job.code == 0 and job.stdout.count("soft limit 100") == 2, job.output  # as far as the hard limit allows
    job = run_launch("--nproc", "4", BEHAVE, "-1", "none", prefix=[*UNDER_LIMIT, "40", "40"], timeout=60)
    assert job.code != 0 and "ready" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):]
    assert re.search(r"macfleet agent on localhost: it needs about \d+ open files for 4 ranks, and the limit on "
                     r"open files is 40, which only an administrator can raise", root), root
    assert "Traceback" not in job.stderr, job.stderr
    job = run_launch("--nproc", "40", BEHAVE, "-1", "none", prefix=[*UNDER_LIMIT, "40", "40"], timeout=60)
    assert job.code == 2 and "ready" not in job.stdout, job.output
    assert re.search(r"the launcher needs about \d+ open files for 40 ranks, and the limit on open files is 40",
                     job.stderr), job.stderr


def test_an_agent_given_a_spec_of_another_macfleet_says_so_not_a_traceback() -> None:
    """A Mac upgraded and another not: the launcher's job spec has a field this agent does not
    know (here data_addr, which this version calls data_addrs). The agent died with a TypeError
    traceback, before the hosts' versions could be compared."""
    spec = {"job_id": "x", "coordinator": "tcp://127.0.0.1:9", "secret_hex": "00", "host_index": 0, "host": "h",
            "data_addr": "127.0.0.1", "rank_base": 0, "slots": 1, "world_size": 1, "script": "s", "args": []}
    out = subprocess.run([sys.executable, "-m", "macfleet.workers.agent"], input=json.dumps(spec) + "\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "cannot read the launcher's job spec (" in out.stderr and "'data_addr'" in out.stderr, out.stderr
    assert "install the same macfleet on every Mac" in out.stderr, out.stderr


def test_a_missing_script_is_a_one_line_error(tmp_path) -> None:
    job = run_launch("--nproc", "2", str(tmp_path / "nope.py"))
    assert job.code == 2
    assert "no such file" in job.stderr and "Traceback" not in job.stderr


def test_a_mistyped_option_is_named_as_an_option_not_a_missing_script() -> None:
    """Unknown options pass on to the script, after it; one before it (``--nprocs 2``) was taken
    for the script: "no such file: --nprocs"."""
    for typed, meant in (("--nprocs", "Did you mean --nproc?"), ("--host", "--hosts,")):
        job = run_launch(typed, "2", BEHAVE, "-1", "none")
        said = job.stderr.replace("'", "").replace(":", "")  # click 8.1.0: "option: --x", later: "option '--x'"
        assert job.code == 2 and f"No such option {typed}" in said and meant in said, job.stderr
        assert "no such file" not in job.stderr and "[rank" not in job.stdout, job.output


def test_another_launcher_s_habits_are_answered_with_macfleet_s_way() -> None:
    """horovodrun takes ``python train.py`` and ``-H``, torchrun ``--nproc_per_node``, mlx.launch
    ``-n``. The interpreter was run as the script by every rank (a SyntaxError from each, or "no
    such file: python"), and the options were "no such option" at best."""
    for python in ("python", sys.executable):
        job = run_launch("--nproc", "2", python, "-u", BEHAVE, "-1", "none")
        assert job.code == 2 and "Traceback" not in job.stderr and "[rank" not in job.stdout, job.output
        assert f"give the script first: macfleet launch [OPTIONS] {BEHAVE} -1 none" in job.stderr, job.stderr
    for typed, whose, ours in (("-H", "horovodrun's", "--hosts"), ("--nproc_per_node", "torchrun's", "--nproc"),
                               ("-n", "mlx.launch's", "--nproc")):
        job = run_launch(typed, "2", BEHAVE, "-1", "none")
        assert job.code == 2 and f"that is {whose}; macfleet's is {ours}" in job.stderr, job.stderr


def test_a_shell_script_as_script_is_refused_before_any_rank_runs_it(tmp_path) -> None:
    """Every rank runs SCRIPT with Python. A shell wrapper (``run.sh``, which sets things up and
    runs ``python train.py``) was run as Python by each rank: a SyntaxError from every one.
    A Python script whose ``#!`` line names another runner (uv's) runs, as python runs it."""
    for name, first in (("run.sh", "#!/bin/sh"), ("train-wrapper", "#!/usr/bin/env -S LR=3 bash -e")):
        (tmp_path / name).write_text(f"{first}\npython train.py\n")
        job = run_launch("--nproc", "2", name, "--lr", "3", cwd=str(tmp_path), timeout=60)
        shell = first.split()[-2] if "env" in first else "sh"
        assert job.code == 2 and "[rank" not in job.stdout and "SyntaxError" not in job.output, job.output
        assert f"{name} is a {shell} script ({first})" in job.stderr, job.stderr
        assert "give the Python script it runs" in job.stderr and "--env K=V" in job.stderr, job.stderr
    (tmp_path / "tool.py").write_text("#!/usr/bin/env -S uv run --script\nimport sys\nprint('ran', sys.argv[1:])\n")
    job = run_launch("--nproc", "1", "tool.py", "--lr", "3", cwd=str(tmp_path), timeout=60)
    assert job.code == 0 and "[rank 0] ran ['--lr', '3']" in job.stdout, job.output


def test_a_folder_as_script_runs_its_main_as_python_runs_it(tmp_path) -> None:
    """``python tool/`` runs ``tool/__main__.py``, and so does torchrun, which hands SCRIPT to
    python; ours said "'tool' is a directory". One without a ``__main__.py`` is named."""
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "helper.py").write_text("WORD = 'helped'\n")  # its folder is on sys.path, as under python
    (tmp_path / "tool" / "__main__.py").write_text("import sys, helper\nprint(helper.WORD, sys.argv[1:])\n")
    job = run_launch("--nproc", "2", "tool", "--lr", "3", cwd=str(tmp_path), timeout=60)
    assert job.code == 0 and job.stdout.count("] helped ['--lr', '3']") == 2, job.output
    (tmp_path / "empty").mkdir()
    job = run_launch("--nproc", "2", "empty", cwd=str(tmp_path), timeout=60)
    assert job.code == 2 and "empty is a folder without a __main__.py" in job.stderr, job.output


def test_a_relative_python_is_found_from_cwd_as_the_ranks_run_it(tmp_path) -> None:
    """``--cwd proj --python .venv/bin/python``: the agents run it from --cwd (``cd CWD && exec``
    on the other Macs), but the check before the job looked for it from the launcher's folder,
    and refused a job that would run, or passed one whose agent then could not start."""
    (tmp_path / "proj" / "bin").mkdir(parents=True)
    wrapper = tmp_path / "proj" / "bin" / "py"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "hello.py").write_text("import macfleet\nmacfleet.init()\nprint('hello', macfleet.rank())\n")
    script = str(tmp_path / "hello.py")
    job = run_launch("--nproc", "2", "--cwd", "proj", "--python", "bin/py", script, cwd=str(tmp_path), timeout=60)
    assert job.code == 0 and job.stdout.count("] hello ") == 2, job.output
    job = run_launch("--nproc", "2", "--cwd", str(tmp_path), "--python", "proj/bin/py", script,
                     cwd=str(tmp_path / "proj"), timeout=60)
    assert job.code == 0 and job.stdout.count("] hello ") == 2, job.output
    job = run_launch("--nproc", "2", "--cwd", str(tmp_path), "--python", "bin/py", script, cwd=str(tmp_path / "proj"),
                     timeout=60)
    assert job.code == 2 and f"no such program: bin/py in {tmp_path}, where the ranks run" in job.stderr, job.output
    doctor = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--cwd", "proj", "--python",
                             "bin/py", "--megabytes", "1"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    rows = [line.split() for line in doctor.stdout.splitlines() if line.startswith("localhost")]
    assert doctor.returncode == 0 and rows and rows[0][1] == "ok", doctor.stdout + doctor.stderr


def test_python_m_macfleet_is_the_macfleet_command(tmp_path) -> None:
    """Where ``pip install --user`` put the ``macfleet`` command off the PATH (macOS's
    ~/Library/Python/3.x/bin), ``python -m macfleet`` runs it, as ``python -m
    torch.distributed.run`` runs torchrun. It was "'macfleet' is a package and cannot be
    directly executed"."""
    proc = subprocess.Popen([sys.executable, "-m", "macfleet", "launch", "--nproc", "2", str(BIN / "chatter.py"), "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err
    assert sorted(line.split("] ", 1)[1][:10] for line in out.splitlines()) == [
        "chatter 0 ", "chatter 0 ", "chatter 1 ", "chatter 1 "], out


def test_a_module_runs_as_python_m_runs_it(tmp_path) -> None:
    """``-m pkg.mod`` as with torchrun and python: the module is found from --cwd and runs as
    __main__ with the arguments that follow; one that is not there is named in one line. A
    folder named ``macfleet`` in --cwd (the root of a checkout of macfleet) is not imported in
    place of the installed macfleet: every agent and rank died of it."""
    (tmp_path / "macfleet").mkdir()
    (tmp_path / "macfleet" / "__init__.py").write_text("raise ImportError('the macfleet folder in --cwd')\n")
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("import os, sys\nimport macfleet\nmacfleet.init()\nmacfleet.barrier()\n"
                                     "print('ran', __name__, macfleet.rank(), sys.argv[1:], sys.path[0] == os.getcwd(), "
                                     "flush=True)\n")
    job = run_launch("--nproc", "1", "--cwd", str(tmp_path), "-m", "trainer.main", "--lr", "3", timeout=60)
    assert job.code == 0, job.output
    # and the working directory first on sys.path, as python -m puts it
    assert "[rank 0] ran __main__ 0 ['--lr', '3'] True" in job.stdout, job.output
    missing = run_launch("--nproc", "1", "--cwd", str(tmp_path), "-m", "trainer.nope", timeout=60)
    root = missing.stderr[missing.stderr.index("root cause"):]
    assert missing.code == 1 and "No module named 'trainer.nope'" in root and "bootstrap" not in root, root
    assert "is not installed" not in root, root  # trainer is there: no package to install
    bad = run_launch("--nproc", "1", "-m", "not/a/module")
    assert bad.code == 2 and "is not a module name" in bad.stderr and "Traceback" not in bad.stderr


def test_a_script_s_folder_is_first_on_its_path_and_ps_shows_the_script(tmp_path) -> None:
    """As under ``python src/train.py``: the script's folder first on sys.path (a module beside
    it imports), and the working directory not on it. ``ps`` shows a rank as ``python -P -m
    macfleet.workers.bootstrap src/train.py ARGS``; it showed a -c line of 300 characters
    first. (Python 3.10 has no -P, and keeps the -c line.)"""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "helper.py").write_text("VALUE = 7\n")
    (folder / "train.py").write_text(
        "import os, subprocess, sys\nimport helper\n"
        "print('path', sys.path[0], os.getcwd() in sys.path, helper.VALUE, flush=True)\n"
        "ps = subprocess.run(['ps', '-ww', '-o', 'args=', '-p', str(os.getpid())], capture_output=True, text=True)\n"
        "print('ps', ps.stdout.strip(), flush=True)\n")
    job = run_launch("--nproc", "1", "--cwd", str(tmp_path), str(folder / "train.py"), "--lr", "3", timeout=60)
    assert job.code == 0, job.output
    assert f"[rank 0] path {folder} False 7" in job.stdout, job.output
    shown = next(line for line in job.stdout.splitlines() if line.startswith("[rank 0] ps "))
    assert shown.endswith(f"{folder / 'train.py'} --lr 3"), shown
    if sys.version_info >= (3, 11):
        assert shown == f"[rank 0] ps {sys.executable} -P -m macfleet.workers.bootstrap {folder / 'train.py'} --lr 3"


@pytest.mark.parametrize("how", ["script", "module"])
def test_a_script_that_does_not_compile_is_shown_as_python_shows_it(tmp_path, how: str) -> None:
    """The file and line, the caret and the message, as ``python train.py`` prints them: the
    report began with the frames of macfleet's bootstrap and runpy, which never reach the script."""
    (tmp_path / "train.py").write_text("import macfleet\nmacfleet.init(\n")
    target = ["-m", "train"] if how == "module" else [str(tmp_path / "train.py")]
    job = run_launch("--nproc", "1", "--cwd", str(tmp_path), *target, timeout=60)
    root = job.stderr[job.stderr.index("root cause"):]
    assert job.code == 1 and f'File "{tmp_path / "train.py"}", line 2' in root, root
    assert "SyntaxError: '(' was never closed" in root and "bootstrap" not in root and "runpy" not in root, root


def test_the_terminal_shows_only_rank_lines_and_macfleets_own(job_that_succeeds: Job) -> None:
    """Every line a user sees is a rank's (prefixed) or the launcher's: the agent's store process
    used to add torch's import-time warning (no numpy installed) unprefixed, once per job."""
    job = job_that_succeeds
    assert job.code == 0, job.output
    stray = [line for line in job.stderr.splitlines() if not line.startswith(("[rank ", "macfleet: "))]
    assert not stray, job.stderr


def test_a_package_the_script_lacks_is_named_with_the_python_and_host(tmp_path) -> None:
    """A script that imports a package one Mac lacks: after the traceback, which package, for
    which Python, on which host, and what to do."""
    script = tmp_path / "train.py"
    script.write_text("import macfleet\nimport a_package_no_host_has\n")
    job = run_launch("--nproc", "2", str(script), timeout=60)
    root = job.stderr[job.stderr.index("root cause"):]
    python = re.search(r"a_package_no_host_has is not installed for (\S+) on localhost: install it there", root)
    assert job.code == 1 and python, root
    assert os.path.samefile(python.group(1), sys.executable), root  # the ranks' Python: --python's default


def test_a_python_without_macfleet_is_named_with_its_fix(tmp_path) -> None:
    """--python (or the same path on another Mac) that is a Python without macfleet installed:
    the user saw the agent's traceback and "exited unexpectedly: ModuleNotFoundError"."""
    if os.environ.get("PYTHONPATH"):
        pytest.skip("PYTHONPATH hands every Python here macfleet (the device machine's install)")
    python = bare_python(tmp_path)
    job = run_launch("--nproc", "1", "--python", python, BEHAVE, "-1", "none", timeout=60)
    root = job.stderr[job.stderr.index("root cause"):]
    assert job.code == 1 and f"macfleet is not installed for {python} on localhost: install it there" in root, root
    assert "Traceback" not in job.stderr and "[rank" not in job.stdout, job.output
    # doctor names it in its table, as it does for a remote host's, before any job starts
    doctor = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--python", python],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 1 and f"localhost  {python} there has no macfleet and no torch" in doctor.stdout, \
        doctor.stdout + doctor.stderr


def test_bad_flags_are_usage_errors() -> None:
    """nan and inf passed click's ranges: a heartbeat timeout of nan never ran out (a lost Mac
    was never noticed), and a memory fraction of nan failed every rank. An empty --hosts ran one
    rank on this Mac, an empty --log-dir wrote the logs where the job runs."""
    for args, says in ((["--nproc", "0"], "'--nproc'"), (["--hosts", "a:x"], "'x' in 'a:x' is not a whole number"),
                       # mac1:$N with N unset ran one rank there
                       (["--hosts", "localhost:"], "'localhost:' has no slots after its ':' (give localhost:2, or "
                                                   "localhost for one)"),
                       (["--device", "tpu"], "'tpu' is not one of"), (["--memory-fraction", "1.5"], "not in the range"),
                       (["--python", "/no/python"], "no such program"), (["--cwd", "/no/directory"], "no such directory"),
                       (["--seed", str(2**64)], "not in the range"), (["--seed", "-1"], "not in the range"),
                       (["--memory-fraction", "nan"], "'nan' is not a finite number"),
                       (["--heartbeat-timeout", "nan"], "'nan' is not a finite number"),
                       (["--stall-timeout", "inf"], "'inf' is not a finite number"),
                       (["--hosts", ""], "--hosts is empty"),
                       # "" (an unset shell variable) was taken for the current directory, or for none
                       (["--log-dir", ""], "'--log-dir': is empty"), (["--data-iface", ""], "'--data-iface': is empty"),
                       # ssh said only "Permission denied (publickey)" for a key file that is not there
                       (["--hosts", "mac1", "--ssh-identity", "/no/key"], "'--ssh-identity': no such file: /no/key"),
                       # the agent sets it over --env's, which was dropped without a word
                       (["--env", "MACFLEET_DEVICE=cuda"], "MACFLEET_DEVICE is set for each rank by its agent, "
                                                          "whatever --env says: give --device")):
        job = run_launch(*args, BEHAVE)
        assert job.code == 2 and says in job.stderr, (args, job.stderr)
        assert "Traceback" not in job.stderr and "[rank" not in job.stdout, job.output


def test_host_lists_and_knobs_that_would_not_run_as_written_are_usage_errors() -> None:
    """Knobs (MACFLEET_*) are checked before any rank starts, not by every rank. ``--nproc`` is the slots of hosts listed without any; with Horovod's habit (a total, -np)
    a host list that gives every host's slots ignored it silently. And this machine listed
    under two names started two agents, whose ranks exchanged over sockets, not shared memory."""
    for args, says in ((["--nproc", "3", "--hosts", "localhost:2"], "--nproc 3 gives the slots of hosts listed "
                        "without any, and every host has its own (2 ranks in all)"),
                       (["--hosts", "127.0.0.1:1,localhost:1"], "127.0.0.1 and localhost name this machine alike")):
        job = run_launch(*args, BEHAVE, "-1", "none")
        assert job.code == 2 and says in job.stderr, job.stderr
        assert "Traceback" not in job.stderr and "[rank" not in job.stdout
    job = run_launch("--nproc", "2", "--env", "MACFLEET_STREAMS=two", BEHAVE, "-1", "none", env={"MACFLEET_SHM": "off"})
    assert job.code == 2 and "MACFLEET_STREAMS='two' is not a whole number" in job.stderr, job.stderr
    assert "MACFLEET_SHM='off': give 1 (on) or 0 (off)" in job.stderr and "[rank" not in job.stdout
    job = run_launch("--nproc", "2", "--hosts", "localhost:2", BEHAVE, "-1", "none", timeout=60)  # -np's sense
    assert job.code == 0 and job.stdout.count("finished") == 2, job.output


def test_a_script_named_relative_to_cwd_is_found_there(tmp_path) -> None:
    """The ranks run in --cwd, as ``cd DIR && python train.py`` would: a script named relative
    to it is found there (it was "no such file" unless the launcher ran there too)."""
    (tmp_path / "train.py").write_text("import os, macfleet\nmacfleet.init()\nprint('in', os.getcwd())\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = run_launch("--nproc", "1", "--cwd", str(tmp_path), "train.py", cwd=str(elsewhere), timeout=60)
    assert job.code == 0 and job.stdout.count(f"in {tmp_path}") == 1, job.output
    job = run_launch("--nproc", "1", "--cwd", str(tmp_path), "missing.py", cwd=str(elsewhere))
    assert job.code == 2 and f"no such file: missing.py (in {elsewhere} or --cwd {tmp_path})" in job.stderr, job.stderr


def test_a_rank_whose_exit_waits_for_a_thread_names_it_and_still_lets_it_finish() -> None:
    """Python waits at exit for threads that are not daemons. A prefetcher that loops for good
    kept every rank and the job running after the last line, with no word of why. Rank 1's
    thread uploads for 4.5 s after its script: the rank names it and where it is, and waits."""
    job = run_launch("--nproc", "2", BEHAVE, "1", "uploader", timeout=60)
    assert job.code == 0 and job.stdout.count("finished") == 2, job.output
    notes = [line for line in job.stderr.splitlines() if "Python waits for its threads" in line]
    assert len(notes) == 1 and notes[0].startswith("[rank 1] "), job.stderr
    line = behave_line("time.sleep(4.5)")
    assert f"thread 'uploader' at {BEHAVE}:{line} in upload" in notes[0], notes


@pytest.mark.parametrize("mode", ["collectives", "dp"])
def test_the_rank_that_sets_the_pace_is_named_at_the_end(mode):
    """Rank 2 is slower at every step: the others spend most of their time waiting for it, and
    the launcher's last lines must say so. In ``dp`` the exchange runs on DataParallel's own
    thread while the script waits at the end of backward; counting both would put the fast
    ranks over 100%. The slow rank's own exchanges count as waiting too (on a 2-core machine 10-14%
    of its time, for three ranks), so its extra work is large enough to stand well apart. On the
    CPU: where auto picked a GPU (a CUDA machine), the ranks' start on it diluted the shares."""
    steps, extra_s = 10, 0.3
    job = run_launch("--nproc", "3", "--device", "cpu", str(BIN / "pace.py"), "2", mode, str(steps), timeout=90)
    assert job.code == 0, job.output
    line = next(x for x in job.stderr.splitlines() if "share of each rank's time" in x)
    shares = {int(r): int(p) for r, p in re.findall(r"rank (\d+) (\d+)%", line)}
    assert sorted(shares) == [0, 1, 2], line
    timing = {int(r): (float(loop), float(total)) for r, loop, total in
              re.findall(r"\[rank (\d+)\] timing loop_s=([\d.]+) total_s=([\d.]+)", job.stdout)}
    for r in (0, 1):  # they waited for most of rank 2's extra work, and never longer than their loop
        loop, total = timing[r]
        assert 100 * 0.7 * steps * extra_s / total <= shares[r] <= 100 * loop / total + 2, (line, timing)
    # the report names the slowest rank once the most and the least waiting differ by 20 points;
    # on a loaded machine the ranks' start dilutes all three shares, and one fast rank may then
    # wait less than 20 points more than rank 2 (25% and 30% against 8%)
    assert shares[2] < min(shares[0], shares[1]), line
    assert "rank 2 sets the pace" in job.stderr, job.stderr


def test_a_dataloader_worker_that_re_runs_the_script_is_told_to_use_a_main_guard() -> None:
    """A 'spawn' worker (macOS's default) re-runs a script that has no main guard, and its
    macfleet.init() used to take the rank for an orphan and SIGKILL the rank's whole group:
    the report said only 'killed by SIGKILL'. (One rank: every rank's worker does the same, and
    each rank or worker started imports torch.)"""
    job = run_launch("--nproc", "1", str(BIN / "children.py"), "spawn", timeout=90)
    assert job.code == 1 and "finished" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):].split("other ranks")[0]
    assert "ConfigError" in root and "subprocess of rank" in root and '__name__ == "__main__"' in root, root


SPAWNS_ITS_WORKERS = """
import torch, torch.multiprocessing as mp
import macfleet

def main(local_rank, world_size):
    macfleet.init()
    print("joined", flush=True)

if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=1)
"""


def test_a_ddp_script_that_spawns_its_own_workers_is_told_to_call_them_itself(tmp_path) -> None:
    """A DDP script run without torchrun starts its workers with mp.spawn. Each worker's
    init() was refused with the advice for a DataLoader worker, to use a main guard, which the
    script already has."""
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS_ITS_WORKERS)
    job = run_launch("--nproc", "1", str(script), timeout=90)
    assert job.code == 1 and "joined" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):].split("other ranks")[0]
    assert "ConfigError: macfleet.init() was called in a process that rank 0" in root, root
    assert "mp.spawn(main, nprocs=N) becomes main(macfleet.local_rank(), ...)" in root and "__main__" not in root


def test_a_collective_in_a_forked_dataloader_worker_is_refused() -> None:
    """Linux's DataLoader workers are forked: they inherit the rank's runtime, and a collective
    there ran through the rank's own sockets and shared-memory slots, beside its collectives.
    The rank then exits at once, as under a plain `python`: it waited 5 s for its worker (the
    loader's iterator, freed with the traceback, signalled the worker through a closed queue)."""
    job = run_launch("--nproc", "2", str(BIN / "children.py"), "fork-collective", timeout=90)
    assert job.code == 1 and "batch" not in job.stdout and "finished" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):].split("other ranks")[0]
    assert "ConfigError: a collective in a subprocess of rank" in root, root
    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL  # the loader's wait for its workers (5 s)

    for rank in (0, 1):
        loading, exiting = (float(re.search(rf"\[rank {rank}\] {what} at ([\d.]+)", job.stdout)[1])
                            for what in ("loading", "exiting"))
        # a fork, one item, a traceback: a fraction of a second, or the wait on top of them
        assert exiting - loading < MP_STATUS_CHECK_INTERVAL, job.stdout


def test_a_forked_child_leaves_the_rank_its_job_directory() -> None:
    """A child forked after init that exits normally ran the inherited shutdown, which removed
    the job's directory (shared memory, error files) as if the rank were an orphan."""
    job = run_launch("--nproc", "1", str(BIN / "children.py"), "fork", timeout=90)
    assert job.code == 1, job.output
    root = job.stderr[job.stderr.index("root cause"):].split("other ranks")[0]
    assert "ValueError: rank" in root and "no error file" not in root, root


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_progress_bar_reaches_the_terminal_while_it_is_drawn(request, tmp_path, where: str) -> None:
    """tqdm redraws with a carriage return and writes no newline until it finishes; the agent
    (and, for a remote host, the launcher relaying ssh) cut output at newlines only, so a bar
    showed nothing for a whole epoch. Rank 0 waits until the test has seen its bar; another
    rank's line, printed while the bar is open, must start on a line of its own. That rank's
    own bar shows only its last state: each redraw started a line of its own, and a bar on
    every rank scrolled the terminal a line per redraw."""
    hosts = ["--nproc", "2"]
    if where == "remote":
        hosts = ["--hosts", "127.0.0.2:2", *request.getfixturevalue("sshd").launch_options()]
    proc = subprocess.Popen(launch_command(*hosts, str(BIN / "progress.py"), str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        seen = b""
        for wanted, go in ((b"[rank 0] step 1/2", "go"), (b"rank 1 says hello\n", "go2")):
            deadline = time.monotonic() + 60
            while wanted not in seen and time.monotonic() < deadline and proc.poll() is None:
                if select.select([proc.stderr], [], [], 0.5)[0]:
                    seen += os.read(proc.stderr.fileno(), 65536)
            assert wanted in seen, seen
            (tmp_path / go).touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, seen + err)
        output = seen + err
        assert b"[rank 0] step 1/2\n[rank 1] bar 3/3\n[rank 1] rank 1 says hello\n" in output, output  # ended
        assert b"bar 1/3" not in output and b"bar 2/3" not in output, output
        assert b"[rank 0] step 2/2\n" in output, output
        assert all(m.start() == 0 for m in re.finditer(rb"(?<![\r\n])\[rank ", output)), output  # at line starts
    finally:
        kill_group(proc.pid)


def test_a_rank_held_up_in_mid_line_still_prints_it_whole(tmp_path) -> None:
    """print() wrote its text and its newline in two calls (ranks ran unbuffered): a rank held
    up between them longer than the agent waits for a line's end had its text forwarded alone
    and another rank's lines printed after it on the same line, the newline later on a line of
    its own."""
    job = run_launch("--nproc", "2", str(BIN / "stall_mid_line.py"), str(tmp_path), timeout=60)
    assert job.code == 0, job.output
    assert "[rank 0] held resumed\n" in job.stdout, job.stdout
    lines = job.stdout.splitlines()
    assert all(re.fullmatch(r"\[rank 0\] held resumed|\[rank 1\] meanwhile \d+", line) for line in lines), lines
    assert sum(line.startswith("[rank 1]") for line in lines) > 5, lines  # printed while rank 0 was held


def test_a_reader_slower_than_the_job_still_gets_its_last_lines() -> None:
    """``macfleet launch ... | less``, the user not scrolling yet: the agents exit once their
    last lines are in the pipes to the launcher, and the launcher waited 2 s at most for its
    relays, then exited without those lines (the final accuracy; a failure's traceback)."""
    proc = subprocess.Popen(launch_command("--nproc", "2", str(BIN / "chatter.py"), "400"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        # 100 KB in all: more than the pipe to us holds, less than it and the agent's pipe together
        def ranks_and_agents() -> list[str]:
            return [p for p in job_processes() if "macfleet.workers" in p]

        assert wait_for_no_job_processes(60, find=ranks_and_agents) == []
        time.sleep(3)  # the reader away for longer than the launcher waited: what is tested, not a wait for it
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err
    lines = out.decode().splitlines()
    assert len(lines) == 800 and all(line.endswith("." * 100) for line in lines), (len(lines), lines[-3:])


def close_std_streams() -> None:
    for fd in (0, 1, 2):
        os.close(fd)


@pytest.mark.parametrize("gone", ["pipe", "terminal", "closed"])
def test_a_job_whose_output_has_gone_still_ends_with_its_ranks_code(gone: str, tmp_path) -> None:
    """``pipe``: ``macfleet launch ... 2>&1 | head``. Once the reader had gone, each launcher line
    failed (BrokenPipeError) and the error ended the launcher. Its last line, the pace line, made
    a job whose ranks all exited 0 exit 1; a line in mid-job would have stopped the job. The
    thread that copies the ranks' stderr died on it too, and a rank that wrote more than a pipe
    holds to its stderr waited for good. ``terminal``: a launcher left running in the background
    (``&``, ``disown``) whose terminal then closes: its writes fail with EIO, not EPIPE, and
    with the fix for the pipe alone the job still waited for good. ``closed``: started with no
    stdin, stdout or stderr at all (``<&- >&- 2>&-``): Python gave the launcher no sys.stdout,
    and it failed on it before starting a rank."""
    logs = tmp_path / "logs"  # each rank's "finished" (stdout) is there whatever the launcher's streams
    command = launch_command("--nproc", "2", "--log-dir", str(logs), str(BIN / "reader_gone.py"), "stderr")
    reader = write = None
    if gone == "pipe":
        reader, write = os.pipe()
        os.close(reader)  # gone before the first line
        streams = {"stdout": subprocess.DEVNULL, "stderr": write}
    elif gone == "terminal":
        reader, write = pty.openpty()
        streams = {"stdout": write, "stderr": write}
    else:
        streams = {"preexec_fn": close_std_streams}
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, **streams, start_new_session=True)
    if write is not None:
        os.close(write)
    try:
        if gone == "terminal":  # the first line of a rank, then the terminal closes
            seen, deadline = b"", time.monotonic() + 60
            while b"[rank " not in seen and select.select([reader], [], [], max(0.0, deadline - time.monotonic()))[0]:
                seen += os.read(reader, 4096)
            os.close(reader)
            assert b"[rank " in seen, seen
        proc.wait(timeout=60)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0
    for rank in (0, 1):
        assert "finished" in (logs / f"rank-{rank}.log").read_text()


def test_log_dir_keeps_every_ranks_output_while_show_ranks_quiets_the_terminal(tmp_path) -> None:
    """Rank 1 fails in both attempts, hidden from the terminal: its log holds both attempts,
    unprefixed, and the report still names its error."""
    job = run_launch("--nproc", "2", "--log-dir", "logs", "--show-ranks", "0", "--max-restarts", "1",
                     BEHAVE, "1", "raise", cwd=str(tmp_path), timeout=90)
    assert job.code == 1, job.output
    assert job.stdout.count("[rank 0] ready") == 2, job.stdout  # shown, in both attempts
    assert "[rank 1]" not in job.output.split("root cause")[0], job.output
    assert "ValueError: deliberate failure on rank 1" in job.stderr[job.stderr.index("root cause"):]
    assert f"each rank's output is also in {tmp_path / 'logs' / 'rank-K.log'}" in job.stderr
    for rank in range(2):
        log = (tmp_path / "logs" / f"rank-{rank}.log").read_text()
        headers = [line for line in log.splitlines() if line.startswith("--- macfleet job ")]
        assert [f"rank {rank} on localhost" in h for h in headers] == [True, True], log
        assert "restart 1" in headers[1] and "restart" not in headers[0], headers
        assert log.count("ready pid=") == 2 and "[rank" not in log, log
        assert ("ValueError: deliberate failure on rank 1" in log) == (rank == 1), log


def test_a_log_dir_that_fills_up_is_said_once_per_log_and_the_terminal_keeps_everything(tmp_path) -> None:
    """A full disk under --log-dir cut the logs without a word, and the launcher's last line
    still said the output was there. Each log is now said to end where it ends, once (though
    both of the rank's streams go to it), and the terminal still gets every line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(logs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        job = run_launch("--nproc", "2", "--log-dir", str(logs), str(BIN / "chatter.py"), "2000", timeout=60)
        said = {rank: re.findall(rf"^macfleet agent on localhost: cannot write {logs}/rank-{rank}\.log \(No space left "
                                 rf"on device\): that log ends at (\d+) bytes, and the rank's output goes on only here$",
                                 job.stderr, re.M) for rank in (0, 1)}
        sizes = {rank: (logs / f"rank-{rank}.log").stat().st_size for rank in (0, 1)}
        kept = {rank: (logs / f"rank-{rank}.log").read_text().splitlines()[1:] for rank in (0, 1)}  # past the header
    finally:
        subprocess.run(["umount", str(logs)], check=True)
    assert job.code == 0, job.output
    # and the launcher's last line, which said the output was there, says where it is not
    assert f"each rank's output is also in {logs}/rank-K.log, cut short for ranks 0, 1 (no room on the disk)" \
        in job.stderr, job.stderr[-500:]
    for rank in (0, 1):
        assert said[rank] == [str(sizes[rank])], (rank, said, sizes, job.stderr[-2000:])
        lines = [f"chatter {rank} {i} {'.' * 100}" for i in range(2000)]
        assert kept[rank] and "\n".join(lines).startswith("\n".join(kept[rank])), kept[rank][-3:]  # its start, as it came
        assert [line for line in job.stdout.splitlines() if line.startswith(f"[rank {rank}]")] == [
            f"[rank {rank}] {line}" for line in lines]


def test_an_output_with_no_room_left_is_said_in_one_line_on_stderr(tmp_path) -> None:
    """``macfleet ... > out.txt`` on a full disk (here /dev/full, which takes no byte): the ranks'
    output was dropped without a word, and bench's table ended in a traceback, --json unwritten."""
    def run_into_full(*args: str) -> tuple[int, str]:
        with open("/dev/full", "wb") as full:
            proc = subprocess.Popen([sys.executable, "-m", "macfleet.launcher.cli", *args], stdout=full,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=90)
        finally:
            kill_group(proc.pid)
        return proc.returncode, err

    code, said = run_into_full("launch", "--nproc", "2", str(BIN / "chatter.py"), "200")
    assert code == 0 and said.count("macfleet: cannot write the ranks' output (No space left on device)") == 1, said
    out = tmp_path / "bench.json"
    code, bench = run_into_full("bench", "allreduce", "--nproc", "2", "--sizes", "4K", "--budget", "0.05", "--json", str(out))
    assert code == 1 and "macfleet: cannot write its output (No space left on device)" in bench, bench
    assert "Traceback" not in said + bench, said + bench
    assert sorted(row["library"] for row in json.loads(out.read_text())["rows"]) == ["gloo", "macfleet"]


def test_bad_log_dirs_and_rank_filters_are_usage_errors(tmp_path) -> None:
    (tmp_path / "file").touch()
    for args, wanted in ((["--show-ranks", "3"], "among the job's ranks 0-1"),
                         (["--show-ranks", "1-0"], "empty range"), (["--show-ranks", "0,x"], "'x' is not a rank"),
                         (["--log-dir", str(tmp_path / "file" / "logs")], "cannot make")):
        job = run_launch("--nproc", "2", *args, BEHAVE, "-1", "none", timeout=30)
        assert job.code == 2 and wanted in job.stderr, (args, job.stderr)
        assert "Traceback" not in job.stderr


@pytest.mark.parametrize("where", ["local", "remote"])
def test_breakpoint_and_input_in_a_rank_read_the_launchers_stdin(request, where: str) -> None:
    """Ranks had /dev/null for stdin: ``breakpoint()`` quit at once and ``input()`` raised.
    Every rank gets what is typed, and the end of input when it ends."""
    hosts = ["--nproc", "2"]
    if where == "remote":
        hosts = ["--hosts", "127.0.0.2:2", *request.getfixturevalue("sshd").launch_options()]
    proc = subprocess.Popen(launch_command(*hosts, str(BIN / "debugger.py")), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate("p answer * 2\nanswer = 7\nc\nhello\n", timeout=90)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, out + err
    for rank in (0, 1):
        said = [line.removeprefix(f"[rank {rank}] ") for line in out.splitlines() if line.startswith(f"[rank {rank}] ")]
        assert f"(Pdb) {2 * (41 + rank)}" in said, said  # pdb evaluated the first line typed
        assert any(line.endswith("after the debugger, answer=7") for line in said), said
        assert said[-2:] == ["read 'hello'", "end of input"], said


def test_a_mac_without_ssh_is_told_so_for_a_remote_host(tmp_path) -> None:
    job = run_launch("--hosts", "127.0.0.2:1", BEHAVE, "-1", "none", env={"PATH": str(tmp_path)}, timeout=60)
    assert job.code == 1 and "Traceback" not in job.stderr, job.output
    assert "cannot start the agent for 127.0.0.2:" in job.stderr and "'ssh'" in job.stderr, job.stderr


@pytest.mark.parametrize("command", [["doctor", "--hosts", "127.0.0.2"], ["cabling", "--hosts", "localhost,127.0.0.2"]])
def test_doctor_and_cabling_on_a_machine_without_ssh_say_so(tmp_path, command: list[str]) -> None:
    """Both printed a traceback from deep inside subprocess (FileNotFoundError: 'ssh'), as seen
    on a Linux machine with no ssh client; launch said what was wrong (the test above)."""
    job = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", *command], capture_output=True, text=True,
                         env={**os.environ, "PATH": str(tmp_path)}, timeout=60)
    assert job.returncode == 1 and "Traceback" not in job.stdout + job.stderr, job
    assert "cannot run ssh: No such file or directory" in job.stdout + job.stderr, job


def test_doctor_checks_this_machine_named_by_its_address_without_ssh(tmp_path) -> None:
    """A hostfile of the whole cluster names the launching Mac too: a job starts its ranks here,
    and doctor, which rebuilt the host list and lost which host was this one, ssh'd to it (and
    said "unreachable" where this Mac has no Remote Login on, or no ssh)."""
    from macfleet.netaddr import held_addresses

    own = [str(net.ip) for _, net in held_addresses() if net.version == 4 and not net.ip.is_loopback]
    if not own:
        pytest.skip("this machine has no address but loopback")
    job = subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hosts", own[0], "--megabytes", "1"],
                         capture_output=True, text=True, env={**os.environ, "PATH": str(tmp_path)}, timeout=120)
    rows = [line.split() for line in job.stdout.splitlines() if line.startswith(own[0])]
    assert job.returncode == 0 and rows and rows[0][1] == "ok", job.stdout + job.stderr


@pytest.mark.parametrize("shm, asks", [("1", "pdb"), ("0", "readline"), ("1", "input"), ("0", "getpass")])
def test_ranks_waiting_for_one_in_pdb_or_at_a_prompt_are_not_a_stall(shm: str, asks: str) -> None:
    """Rank 0 sits at pdb's prompt while rank 1 waits for it in a barrier (through shared memory,
    or sockets). With a stall timeout of 2 s the launcher aborted the job 4 s in, in the middle
    of the debugging session; with a collective timeout of 3 s rank 1 gave up. Once rank 0
    goes on, the time rank 1 waited must not count as a stall either (it did, until rank 1's
    next heartbeat said it was through). A prompt of the script's own (``input()``; a line read
    from ``sys.stdin`` itself; ``getpass``, as a hub's login asks for a token) was aborted
    alike. (Over sockets, the prompts stand for pdb too: what a rank waits for is the same.)

    With ``input``, the launcher runs on a terminal, where the user types: the launcher's note
    (on stderr) went on after the prompt (on stdout), on its line; and once the answer was
    typed, the terminal's echo had ended the prompt's line, but the rank's next line came as
    the rest of it, without "[rank 0]"."""
    terminal = asks == "input"
    if terminal:
        leader, follower = pty.openpty()
        streams: dict = {"stdin": follower, "stdout": follower, "stderr": follower, "preexec_fn": take_terminal}
    else:
        streams = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(launch_command("--nproc", "2", "--stall-timeout", "2", str(BIN / "debugger.py"), "wait",
                                           asks),
                            **streams, start_new_session=True,
                            env={**os.environ, "MACFLEET_TIMEOUT": "3", "MACFLEET_SHM": shm})
    if terminal:
        os.close(follower)
        fd, prompt = leader, b"[y/N]"
    else:  # what each prompt writes, and where (getpass: on stderr, a rank having no terminal)
        prompt, stream = {"pdb": (b"(Pdb)", proc.stdout), "readline": (b"[y/N]", proc.stdout),
                          "getpass": (b"token:", proc.stderr)}[asks]
        fd = stream.fileno()
    try:
        seen, deadline = b"", time.monotonic() + 60
        while prompt not in seen and time.monotonic() < deadline and proc.poll() is None:
            if select.select([fd], [], [], 0.5)[0]:
                seen += os.read(fd, 65536)
        assert prompt in seen, seen
        time.sleep(5)  # the user reads the code: past the stall's abort (4 s) and the collective timeout (3 s)
        if terminal:
            os.write(leader, b"c\n")
            out, err = read_terminal(leader, time.monotonic() + 60), b""
            proc.wait(timeout=60)
        else:
            out, err = proc.communicate(b"c\n", timeout=60)
    finally:
        kill_group(proc.pid)
        if terminal:
            os.close(leader)
    assert proc.returncode == 0, (seen + out, err)
    assert (seen + out).count(b"past the barrier") == 2
    why = b"in a debugger" if asks == "pdb" else b"waiting for what you type"
    note = b"macfleet: rank 0 (localhost) is " + why + b"; rank 1 is waiting for it in all_reduce"
    assert note in seen + out + err, (seen + out, err)
    if terminal:
        assert b"\n" + note in seen + out, seen + out  # on a line of its own, not on after the prompt
        # the echo, then the rank's line (rank 1's, past the barrier, may come first: the two
        # ranks' pipes are read apart, and a loaded machine had rank 0's read a moment later)
        assert re.search(rb"c\r\n(\[rank 1\] past the barrier\r\n)?\[rank 0\] read 'c'", seen + out), seen + out
    elif asks != "pdb":
        assert b"read 'c'" in seen + out, seen + out
