# What produced README.md's table: benchmarks/collectives.py across two "hosts" (127.0.0.2:2,127.0.0.3:2, a
# real sshd from tests/sshd.py) on the 2-core machine, with macfleet/collectives.py of each
# commit given, in turns: python across_hosts.py 2b99bca bfc0ec0 2b99bca bfc0ec0
import subprocess, sys
sys.path.insert(0, "/work/main/tests")
from pathlib import Path
import sshd as helper
server = helper.start_sshd(Path("/tmp/bench/sshd"), ["127.0.0.2", "127.0.0.3"])
try:
    opts = " ".join(server.launch_options())
    for tag in sys.argv[1:]:
        subprocess.run(["git", "checkout", "-q", tag, "--", "macfleet/collectives.py"], cwd="/work/main", check=True)
        subprocess.run([sys.executable, "benchmarks/collectives.py", "--sizes", "256,4K,64K", "--budget", "1",
                        "--launch", f"--hosts 127.0.0.2:2,127.0.0.3:2 {opts}", "--json", f"/tmp/bench/{tag}.json"],
                       cwd="/work/main", check=True)
finally:
    server.stop()
