"""``python -m macfleet launch ...``: the ``macfleet`` command, where it is not on the PATH (a
``pip install --user`` on macOS puts it in ~/Library/Python/3.x/bin), as ``python -m
torch.distributed.run`` is torchrun and ``python -m mlx.launch`` is mlx.launch."""

from macfleet.launcher.cli import run

if __name__ == "__main__":
    run()
