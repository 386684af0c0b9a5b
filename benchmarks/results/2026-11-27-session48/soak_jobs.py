"""What the three soak scripts share: drawing knobs, running one job, keeping a failed job's files."""
import os, pathlib, shutil, signal, subprocess, sys, tempfile

LAUNCH = [sys.executable, "-m", "macfleet.launcher.cli", "launch"]


def arguments(prefix):
    """SEED JOBS [OUTDIR] from the command line; OUTDIR made (a new temporary one if not given)."""
    outdir = pathlib.Path(sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix=prefix))
    outdir.mkdir(parents=True, exist_ok=True)
    return int(sys.argv[1]), int(sys.argv[2]), outdir


def drawer(rng, env):
    """``pick(name, values, p)``: with probability ``p``, set ``env[name]`` to one of ``values``."""
    def pick(name, values, p=0.5):
        if rng.random() < p:  # drawn in this order, so a seed draws the jobs it drew before
            env[name] = str(rng.choice(values))
    return pick


def run_job(cmd, env, timeout=300):
    """Run ``cmd`` (a launch) in its own session with ``env`` added: ("ok" | "exit N" | "HUNG", output).
    A hung job gets SIGINT, as Ctrl-C, then SIGKILL 30 s later."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **env}, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return ("ok" if p.returncode == 0 else f"exit {p.returncode}"), out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        return "HUNG", out


def settle(work, verdict, out):
    """Remove a good job's files; keep a bad one's with its output, and print its end. True if bad."""
    if verdict == "ok":
        shutil.rmtree(work)
        return False
    (work / "output.txt").write_text(out)
    print(out[-3000:], flush=True)
    return True
