"""Kill a random process of a running job with a random signal; check the job ends, cleanly."""
import os, random, signal, subprocess, sys, time, glob

def descendants(pid):
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    kids = {}
    args = {}
    for line in out.splitlines():
        p, pp, a = line.split(None, 2) if len(line.split(None, 2)) == 3 else (*line.split(None, 2), "")
        kids.setdefault(int(pp), []).append(int(p)); args[int(p)] = a
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            found.append(c); todo.append(c)
    return found, args

def shm():
    return set(glob.glob("/dev/shm/*")) | set(glob.glob("/tmp/macfleet*"))

seed = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
HOSTS = os.environ.get("CHAOS_HOSTS")  # e.g. 127.0.0.2:2,127.0.0.3:1: through a test sshd
server = None
if HOSTS:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests"))
    import sshd as helper, tempfile, pathlib
    server = helper.start_sshd(pathlib.Path(tempfile.mkdtemp()), sorted({h.split(":")[0] for h in HOSTS.split(",")}))
rng = random.Random(seed)
sigs = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSEGV, signal.SIGSTOP, signal.SIGHUP]
bad = 0
for it in range(n):
    before = shm()
    nproc = rng.choice([2, 3])
    placement = ["--hosts", HOSTS, *server.launch_options()] if HOSTS else ["--nproc", str(nproc)]
    launcher_sig = rng.random() < 0.15
    cmd = os.environ.get("CHAOS_LAUNCH", "macfleet launch").split() + [*placement, "--heartbeat-timeout", "3", "--stall-timeout", "5", *os.environ.get("CHAOS_ARGS", "").split(), os.environ.get("CHAOS_SCRIPT", ".exp/chaos/work.py"), str(rng.choice([0, 1]))]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # wait until all ranks are ready
    lines = []
    ready = 0
    while ready < 1:
        line = p.stdout.readline()
        if not line: break
        lines.append(line)
        if "READY" in line: ready += 1
    time.sleep(rng.uniform(0.2, 3.0))
    procs, args = descendants(p.pid)
    if server is not None:
        remote, rargs = descendants(server.proc.pid)
        procs += remote; args.update(rargs)
    if launcher_sig or not procs:
        target, what = p.pid, "launcher"
    else:
        target = rng.choice(procs); what = args.get(target, "?")[:90]
        ppid = int(open(f"/proc/{target}/stat").read().split()[3])
        role = ("agent" if "python" in args[target] and " -c " in args[target] else "rank" if "bootstrap" in args[target] and "-c " in args.get(ppid, "") else
                "loader" if "bootstrap" in args[target] else "store" if "workers.store" in args[target] else "ssh" if args[target].startswith(("ssh", "sshd")) else "helper")
        what = role + ": " + what
    sig = rng.choice(sigs if not launcher_sig else [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
    try:
        os.kill(target, sig)
    except ProcessLookupError:
        pass
    killed_at = time.time()
    helper = what.startswith("helper") or what.startswith("store")
    survived = False
    import threading
    got = []
    reader = threading.Thread(target=lambda: got.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        p.wait(timeout=40 if not helper else 8)
        reader.join(5); rest = "".join(got)
    except subprocess.TimeoutExpired:
        n0 = sum("STEP" in l for l in got); time.sleep(3); stepping = sum("STEP" in l for l in got) > n0
        if stepping and not helper:
            what = "(still training) " + what
        if not helper and not stepping:
            os.killpg(p.pid, signal.SIGKILL); p.wait(); reader.join(5); rest = "".join(got)
            print(f"[{it}] HANG sig={sig.name} target={what}\n" + "".join(lines[-5:]) + rest[-3000:]); bad += 1
            continue
        survived = True
        if sig == signal.SIGSTOP:
            os.kill(target, signal.SIGCONT)
        os.kill(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=30); reader.join(5); rest = "".join(got)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL); p.wait(); rest = "".join(got)
            print(f"[{it}] HANG after ctrl-c, sig={sig.name} target={what}\n" + rest[-3000:]); bad += 1
            continue
    took = time.time() - killed_at
    # leftovers: any process still alive from the tree
    def alive_now():
        out = []
        for q in procs:
            try:
                if open(f"/proc/{q}/stat").read().split()[2] != "Z": out.append(q)
            except OSError: pass
        return out
    deadline = time.time() + 20
    while time.time() < deadline and (alive_now() or shm() - before):
        time.sleep(0.2)
    cleaned_in = time.time() - killed_at
    alive = alive_now()
    left = shm() - before
    status = "ok"
    if alive: status = f"LEFT {alive}"
    if left: status += f" SHM {sorted(left)}"
    if p.returncode == 0: status += " RC0"
    tail = [l for l in rest.splitlines() if l.startswith("macfleet")][-3:]
    print(f"[{it}] n={nproc} sig={sig.name} target={what!r} rc={p.returncode} ended in {took:.1f}s, clean in {cleaned_in:.1f}s {'(survived, then ctrl-c) ' if survived else ''}{status}")
    for l in tail: print("     ", l[:200])
    if status != "ok":
        bad += 1
        for q in alive:
            try: os.kill(q, signal.SIGKILL)
            except Exception: pass
print("bad", bad)
if server is not None:
    server.stop()
