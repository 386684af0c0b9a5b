"""A rank that does what the test asks: ``behave.py FAIL_RANK MODE``.

Every rank joins the job and prints ``ready``; the rank FAIL_RANK then fails by MODE
(``raise``, ``exit3``, ``sigkill``: after it has filled SIGKILL_HOLDS bytes, ``sigkill-holding-segment``: killed between creating a
shared-memory segment and unlinking it, ``segfault``: a crash in native code, ``stuck``:
alive but never back from a data loader, ``gil``: stuck in native code holding the GIL, ``busy``: working alone for a while
(``BEHAVE_BUSY_S``, 9 s) before it joins the others, ``outside``: the same, with work outside Python (FAIL_RANK and the
two after it, one kind each: ``work_outside``), ``uploader``: leaves a thread (not a daemon) that
works for 4.5 s after the script has ended, ``raise-held``: raises, leaving such a thread that never ends, ``huge-error`` / ``huge-line``: an
exception or a stderr line too large for one control message, ``after-shutdown``: a
collective after ``macfleet.shutdown()``, ``early``: shut down and exit 0, ``os-exit``: ``os._exit(0)``, ``no-init``: exit 0
before ``macfleet.init()``, ``late``: call it only after ``BEHAVE_LATE_S`` (6 s), ``child``:
raise, as every rank leaves background processes: one holding its stdout and stderr, one in a session of its own, one
meant to outlive the job, ``none``) while the others wait in all-reduces, which a failure
elsewhere must turn into an error rather than a hang. With ``hang`` the others wait forever
(until stopped); in ``orphans`` FAIL_RANK starts two processes (one in a session of its own) and exits while the others
hold the GIL for good; with ``hang-first`` only until a restart, which finishes. ``env`` prints the environment contract as this rank sees it,
then goes on as ``none``.
In the mismatch modes the ranks from FAIL_RANK on call a collective that differs from the
others' by its size (``numel``) or kind (``kind``: an all-gather) or by being a ``checkpoint.save`` (the torch DDP habit of saving from one rank
only); in ``gather`` every rank all-gathers, the others 8 numbers and these 9 (a collective of
one barrier on each side). In ``host-only`` these ranks take a shared tensor first
(``macfleet.host_tensor``, a collective of one host's ranks), then all-reduce as the others
do: where they are a whole host, their all-reduce is numbered one ahead of the others', and
its messages reach the other hosts as messages from a later collective. In ``root`` these ranks
broadcast from themselves and the others from rank 0; ``root-last`` is the same as the script's
last collective; in ``root-swapped`` every rank broadcasts from the next rank (all of them receive).
"""

import concurrent.futures
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import torch

import macfleet

SIGKILL_HOLDS = 1 << 30  # 1 GiB: some three times what a rank holds with torch imported


def mark(directory: str, name: str, text: str) -> None:
    """``directory/name`` holding ``text``, whole when it appears (written aside, then renamed)."""
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def native_deadlock() -> None:
    """Native code that never returns and holds the GIL (a C extension's deadlock, a GPU wait
    that never ends): no thread of the process runs Python again, heartbeats included."""
    import ctypes
    ctypes.PyDLL(None).sleep(600)


def validate_alone(seconds: float) -> None:
    """Work that only this rank does while the others wait at a barrier (validation on rank 0)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"


def work_outside(kind: int, seconds: float) -> None:
    """Slow work of this rank's own that its main thread waits on outside Python, which neither
    moves its stack nor uses its processor: 0, a command that computes (``tar`` unpacking the data) in
    a grandchild, through ``os.system``; 1, a command that waits (``curl`` over a slow link); 2, a
    download through urllib, from a server that sends a byte every 0.2 s, in a thread pool whose
    result the main thread waits for (as huggingface_hub's ``snapshot_download`` fetches a model's
    files; a download on the main thread itself is test_units')."""
    if kind == 0:
        os.system(f"{shlex.quote(sys.executable)} -c {shlex.quote(SPIN)} {seconds}")
    elif kind == 1:
        subprocess.run([sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", str(seconds)],
                       check=True)
    else:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pool.submit(trickle_download, seconds).result()


def trickle_download(seconds: float) -> None:
    trickle = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trickle.py")
    server = subprocess.Popen([sys.executable, trickle, str(seconds)], stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as reply:
        reply.read()
    server.wait()


def next_batch() -> None:
    """A data loader that never returns: its process is alive, and joins no collective."""
    while True:
        time.sleep(0.05)


fail_rank, mode = int(sys.argv[1]), sys.argv[2]
if mode == "no-init" and int(os.environ["RANK"]) == fail_rank:  # finishes without ever joining
    sys.exit(0)
if mode == "late" and int(os.environ["RANK"]) == fail_rank:  # loading its data before it joins, say
    time.sleep(float(os.environ.get("BEHAVE_LATE_S", "6")))
macfleet.init()
rank = macfleet.rank()
if mode == "env":
    import random
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT", "MACFLEET_JOB_ID", "MACFLEET_JOB_SECRET",
                                          "MACFLEET_MEMORY_FRACTION", "PYTORCH_MPS_HIGH_WATERMARK_RATIO")}
    seen.update({k: v for k, v in os.environ.items() if k.startswith(("MACFLEET_TEST_", "EXTRA_"))})
    seen["cwd"] = os.getcwd()
    seen["torch_seed"] = torch.initial_seed()
    from macfleet.runtime import runtime  # the members of each ring this rank has sockets on
    seen["rings"] = [ring.members for ring in runtime().collectives.rings]
    seen["python_random"] = random.random()
    seen["shares"] = macfleet.shares()
    print("ENV " + json.dumps(seen))  # then on as with ``none``: one job serves tests of both
if mode == "child":  # a metrics service, say: it inherits the rank's output streams
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"child pid={child.pid}", flush=True)
    # the same in a session of its own, out of the rank's process group (a TensorBoard, a daemon)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(f"session pid={child.pid}", flush=True)
    # and one meant to outlive the job, started without its environment's mark
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             env={k: v for k, v in os.environ.items() if k != "MACFLEET_JOB_ID"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"kept pid={child.pid}", flush=True)
print(f"ready pid={os.getpid()}", flush=True)
macfleet.barrier()
if mode == "orphans":  # FAIL_RANK leaves a process behind and exits; the others hold the GIL for good
    marks = os.environ["BEHAVE_MARKS"]  # a directory: what each rank did, read by the test as files
    if rank == fail_rank:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        away = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mark(marks, "session", str(away.pid))
        mark(marks, "child", str(child.pid))
        macfleet.shutdown()
        os._exit(0)
    mark(marks, f"stuck-{rank}", str(os.getpid()))
    native_deadlock()
if mode == "outside" and fail_rank <= rank < fail_rank + 3:  # then they join the others: no failure at all
    work_outside(rank - fail_rank, float(os.environ.get("BEHAVE_BUSY_S", "9")))
if rank == fail_rank:
    if mode == "raise-held":  # and its exit waits for good for a thread of the script (not a daemon)
        threading.Thread(target=next_batch, name="prefetcher").start()
    if mode in ("raise", "child", "raise-held"):
        raise ValueError(f"deliberate failure on rank {rank}")
    if mode == "exit3":
        sys.exit(3)
    if mode == "sigkill":  # as the OOM killer ends a rank that holds too much memory
        held = torch.ones(SIGKILL_HOLDS // 4)  # every page written: resident
        os.kill(os.getpid(), signal.SIGKILL)
        del held
    if mode == "sigkill-holding-segment":  # as a host's first rank creates one (macfleet.shm)
        from macfleet.segments import Segments, object_name, use_objects
        Segments(os.environ["MACFLEET_SHM_DIR"], use_objects()).create("shm-left-by-a-crash", 1 << 20)
        print(f"holding {object_name('shm-left-by-a-crash')}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segfault":  # as a native library's bug does: no Python exception, no error file
        import ctypes
        ctypes.string_at(0)
    if mode == "stuck":
        next_batch()
    if mode == "gil":
        native_deadlock()
    if mode == "busy":  # then it joins the others: no failure at all
        validate_alone(float(os.environ.get("BEHAVE_BUSY_S", "9")))
    if mode == "huge-error":  # an exception whose message holds a tensor's repr
        raise ValueError("shapes differ: " + repr(list(range(20000))) + " END")
    if mode == "huge-line":  # a stderr line with no end (binary output), then a crash with no traceback
        sys.stderr.write("x" * 300_000 + " END\n")
        sys.stderr.flush()
        os._exit(3)
    if mode == "uploader":  # a thread that is no daemon and goes on after the script: Python waits for it
        def upload() -> None:
            threading.main_thread().join()  # the script has ended
            time.sleep(4.5)  # the upload itself: past the 3 s after which the rank names the thread
        threading.Thread(target=upload, name="uploader").start()
    if mode == "os-exit":  # code 0, but no goodbye: os._exit skips macfleet's exit hook
        os._exit(0)
    if mode == "early":  # a clean finish, while the others still have collectives to do
        macfleet.shutdown()
        sys.exit(0)
if mode == "after-shutdown":  # every rank leaves the job; one goes on with a collective
    macfleet.shutdown()
    print(f"left as rank {macfleet.rank()} of {macfleet.world_size()}", flush=True)
    if rank == fail_rank:
        macfleet.all_reduce(torch.ones(8))
    sys.exit(0)
mismatch = {"numel": lambda: macfleet.all_reduce(torch.ones(9)),
            "kind": lambda: macfleet.all_gather(torch.ones(8)),
            "save": lambda: macfleet.checkpoint.save("/nonexistent/never-written.pt", torch.nn.Linear(2, 2)),
            "gather": lambda: macfleet.all_gather(torch.ones(9)),
            "host-only": lambda: macfleet.host_tensor(8, torch.float32) + macfleet.all_reduce(torch.ones(8)),
            "root": lambda: macfleet.broadcast(torch.ones(8) * rank, rank)}  # each takes itself for the source
mismatch["root-last"] = mismatch["root"]  # the script's last collective
mismatch["root-swapped"] = lambda: macfleet.broadcast(torch.ones(8) * rank, (rank + 1) % macfleet.world_size())  # each waits
agreed = {"gather": lambda: macfleet.all_gather(torch.ones(8)), "root": lambda: macfleet.broadcast(torch.ones(8) * rank, 0)}.get(mode, lambda: macfleet.all_reduce(torch.ones(8)))
agreed = (lambda: macfleet.broadcast(torch.ones(8) * rank, 0)) if mode == "root-last" else agreed
if mode in mismatch:
    result = mismatch[mode]() if rank >= fail_rank else agreed()
    print(f"returned {result.tolist()}", flush=True)  # what the test must never see
    if mode == "root-last":
        sys.exit(0)
if mode == "hang-first":  # as hang in the first attempt; a restart sums a one from each rank and finishes
    if os.environ["MACFLEET_RESTART_COUNT"] == "0":
        mode = "hang"
    else:
        print(f"sum {macfleet.all_reduce(torch.ones(1)).item():.0f} of world {macfleet.world_size()}", flush=True)
if mode == "hang":
    while True:
        macfleet.all_reduce(torch.ones(8))  # where the others wait in mode hang
for _ in range(3):
    macfleet.all_reduce(torch.ones(8))
if mode == "save-alone" and rank == fail_rank:  # a DDP script's habit: one rank saves, as the script ends
    macfleet.checkpoint.save("/nonexistent/never-written.pt", torch.nn.Linear(2, 2))
print("finished", flush=True)
