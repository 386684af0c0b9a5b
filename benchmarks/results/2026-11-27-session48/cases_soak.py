"""Many jobs of random collective cases under random knobs; every result checked exactly.

python run.py SEED JOBS [OUTDIR]; CASE_HOSTS=127.0.0.2:2,127.0.0.3:1,127.0.0.1:2 runs through a test sshd.
Prints one line a job; keeps the case file and output of every job that failed or hung.
"""
import json, os, pathlib, random, sys, tempfile, time

from soak_jobs import LAUNCH, arguments, drawer, run_job, settle

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout
CASES = ROOT / "tests/bin/collective_cases.py"
FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "uint8", "int16", "int32", "int64"]
OTHERS = ["bool", "complex64"]


def numel(rng, knobs):
    r = rng.random()
    if r < 0.15:
        return rng.randint(0, 9)
    if r < 0.55:
        return rng.randint(10, 5000)
    if r < 0.85:  # near the knobs' boundaries, in elements of 1-8 bytes
        edge = rng.choice([int(v) for v in knobs.values() if v.isdigit() and int(v) > 8] or [65536])
        return max(0, edge // rng.choice([1, 2, 4, 8]) + rng.randint(-3, 3))
    if r < 0.97:
        return rng.randint(5000, 400_000)
    return rng.randint(400_000, 3_000_000)


def case(rng, knobs):
    kind = rng.choice(["all_reduce"] * 3 + ["broadcast", "all_gather"])
    extra = {}
    r = rng.random()
    if kind == "all_reduce" and r < 0.08:
        dtype = rng.choice(["float32", "int64", "bfloat16", "float64"])
        op = rng.choice(["sum", "avg"] if dtype in FLOATS else ["sum"])
        extra["sparse"] = True
    elif kind == "all_reduce" and r < 0.16:
        dtype = rng.choice(["float32", "float16", "bfloat16"])
        op = rng.choice(["sum", "avg", "max", "min"])
        extra["compression"] = rng.choice(["fp16", "bf16"])
        if rng.random() < 0.3:
            extra["column"] = True
    else:
        dtype = rng.choice(FLOATS + INTS + OTHERS)
        op = rng.choice({"complex64": ["sum", "avg"]}.get(dtype, ["sum", "avg", "max", "min"] if dtype in FLOATS
                                                           else ["sum", "max", "min"]))
        if rng.random() < 0.3:
            extra["shared"] = True
        if rng.random() < 0.15:
            extra["leaf"] = True
        elif rng.random() < 0.1:
            extra["inference"] = rng.choice(["made", "inside"])
        elif not extra and rng.random() < 0.25:
            extra["column"] = True
    return {"kind": kind, "dtype": dtype, "numel": numel(rng, knobs), "seed": rng.randint(0, 10**6), "op": op,
            "src": rng.randint(0, 7), **extra}


def knobs(rng):
    env = {}
    pick = drawer(rng, env)
    pick("MACFLEET_SHM", [0, 1], 0.4)
    pick("MACFLEET_CHUNK_BYTES", [1000, 4096, 65536, 1 << 20])
    pick("MACFLEET_SMALL_BYTES", [64, 256, 4096, 65536])
    pick("MACFLEET_STREAMS", [1, 2, 3])
    pick("MACFLEET_MIN_PART_BYTES", [4096, 16384])
    pick("MACFLEET_ZERO_COPY_BYTES", [1, 65536], 0.3)
    pick("MACFLEET_INLINE_BYTES", [64, 1 << 20], 0.3)
    pick("MACFLEET_SHM_SLOT_BYTES", [4096, 8192, 65536, 1 << 20])
    pick("MACFLEET_SHM_GATHER_BYTES", [64, 4096], 0.3)
    pick("MACFLEET_SHM_OBJECTS", [0, 1], 0.3)
    return env


def main():
    seed, jobs, outdir = arguments("casesoak-")
    hosts = os.environ.get("CASE_HOSTS")
    server = None
    if hosts:
        sys.path.insert(0, str(ROOT / "tests"))
        import sshd as helper
        layouts = hosts.split(";")  # one drawn for each job
        server = helper.start_sshd(pathlib.Path(tempfile.mkdtemp()),
                                   sorted({h.split(":")[0] for lay in layouts for h in lay.split(",")}))
    rng = random.Random(seed)
    bad = 0
    total_cases = 0
    for j in range(jobs):
        env = knobs(rng)
        layout = rng.choice(layouts) if hosts else None
        world = sum(int(h.split(":")[1]) for h in layout.split(",")) if layout else rng.choice([1, 2, 2, 3, 3, 4, 5, 6])
        cases = [case(rng, env) for _ in range(rng.randint(30, 90))]
        for c in cases:
            c["src"] %= world
        if os.environ.get("ONLY_JOB") and int(os.environ["ONLY_JOB"]) != j:
            continue
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"job{j}-", dir=outdir))
        (work / "cases.json").write_text(json.dumps(cases))
        (work / "out").mkdir()
        placement = ["--hosts", layout, *server.launch_options()] if layout else ["--nproc", str(world)]
        launch = [*os.environ["CASE_LAUNCH"].split(), "launch"] if os.environ.get("CASE_LAUNCH") else LAUNCH
        cmd = [*launch, *placement, "--device", "cpu", str(CASES), str(work / "cases.json"), str(work / "out")]
        t0 = time.time()
        verdict, out = run_job(cmd, env)
        failures = []
        for f in sorted((work / "out").glob("rank-*.json")):
            failures += json.loads(f.read_text())["failures"]
        if verdict == "ok" and len(list((work / "out").glob("rank-*.json"))) != world:
            verdict = "missing reports"
        if failures:
            verdict = f"{len(failures)} WRONG"
        total_cases += len(cases)
        sizes = sorted(c["numel"] for c in cases)
        print(f"job {j} {layout or ''} world {world} cases {len(cases)} max numel {sizes[-1]} {time.time() - t0:.1f}s {verdict} "
              f"{' '.join(f'{k[9:]}={v}' for k, v in sorted(env.items()))}", flush=True)
        (work / "env.json").write_text(json.dumps({"env": env, "world": world, "cmd": cmd}))
        bad += settle(work, verdict, out)
    if server is not None:
        server.stop()
    print(f"done: {jobs} jobs, {total_cases} cases, {bad} bad; kept in {outdir}", flush=True)


if __name__ == "__main__":
    main()
