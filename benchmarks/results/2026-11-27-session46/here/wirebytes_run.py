import sys, subprocess, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main/tests")
import netns, sshd
hosts = netns.create(2)
try:
    d = Path(tempfile.mkdtemp())
    port = sshd.free_port()
    servers = [sshd.start_sshd(d, [h.addr], port=port, prefix=h.exec_prefix()) for h in hosts]
    for h in hosts: netns.set_rate(h, sys.argv[1] if len(sys.argv) > 1 else "1gbit")
    subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "launch", "--hosts", ",".join(h.addr for h in hosts),
                    *servers[0].launch_options(), sys.argv[2] if len(sys.argv) > 2 else "/work/main/.exp/wirebytes.py"])
finally:
    for s in servers: s.stop()
    netns.destroy(2)
