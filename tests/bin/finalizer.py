"""``finalizer.py OUT [exit N | raise]``: a script-level object records, when it is freed, whether
the interpreter was already being torn down. Plain ``python`` frees it in finalization, where
even ``open`` is gone; torch.distributed's process groups are freed the same way."""

import sys


class Recorder:
    def __del__(self) -> None:
        with open(sys.argv[1], "w") as f:
            f.write(f"finalizing={sys.is_finalizing()}")


recorder = Recorder()


def keep() -> Recorder:  # a function: the script's globals are in a reference cycle, as in any real script
    return recorder


if sys.argv[2:3] == ["exit"]:
    sys.exit(int(sys.argv[3]))
if sys.argv[2:3] == ["raise"]:
    raise ValueError("the script failed")
