import subprocess, time, os, signal, threading, sys
p = subprocess.Popen(["macfleet","launch","--nproc","2",*sys.argv[2:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
t0=time.monotonic()
def rd():
    for line in p.stdout: print(round(time.monotonic()-t0,2), line.rstrip())
th=threading.Thread(target=rd); th.start()
time.sleep(float(sys.argv[1]))
print(round(time.monotonic()-t0,2), "SIGINT")
os.killpg(p.pid, signal.SIGINT)
p.wait(60); th.join()
print("rc", p.returncode, round(time.monotonic()-t0,2))
