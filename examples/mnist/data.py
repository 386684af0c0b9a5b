"""MNIST for the example: real IDX files when there are some, generated digits when not.

- ``load_idx_dir(dir)`` reads the four MNIST IDX files (raw or ``.gz``) from ``dir``;
  ``missing(dir)`` names those that are not there.
- ``download(dir)`` fetches them, checking each file's MD5 before it is kept.
- ``synthetic_digits(n, seed)`` draws 28x28 digits from stroke templates with random
  slant, scale, position, thickness and noise, so the example runs with no network and no
  files. It is easier than MNIST, but a real learning task (a linear model gets ~85%).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import socket
import struct
import urllib.request

import torch

FILES = {  # name -> md5 of the .gz, as published with the data set
    "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
}
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")
MEAN, STD = 0.1307, 0.3081


def read_idx(path: str) -> torch.Tensor:
    """One IDX file (``.gz`` or raw) as a uint8 tensor of the shape its header gives."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4: 4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    if len(body) != math.prod(dims):
        raise ValueError(f"{path}: header says {dims} but holds {len(body)} bytes")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).view(*dims)


def _find(directory: str, name: str) -> str | None:
    for candidate in (name, name + ".gz", name.replace("-idx", ".idx")):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    return None


def missing(directory: str) -> list[str]:
    """The MNIST files ``directory`` lacks (all four if it does not exist)."""
    return [name for name in FILES if _find(directory, name) is None]


def load_idx_dir(directory: str) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """((train_x, train_y), (test_x, test_y)) with x as normalized float32 [N, 1, 28, 28], or None."""
    paths = {name: _find(directory, name) for name in FILES}
    if any(p is None for p in paths.values()):
        return None
    x_train, y_train, x_test, y_test = (read_idx(paths[n]) for n in FILES)  # type: ignore[arg-type]
    return (_normalize(x_train), y_train.long()), (_normalize(x_test), y_test.long())


def download(directory: str) -> None:
    """Fetch the files that are missing, each checked against its MD5 before it is kept."""
    os.makedirs(directory, exist_ok=True)
    for name, md5 in FILES.items():
        if _find(directory, name):
            continue
        target = os.path.join(directory, name + ".gz")
        errors = []
        for mirror in MIRRORS:
            try:
                with urllib.request.urlopen(mirror + name + ".gz", timeout=60) as response:
                    blob = response.read()
            except OSError as exc:
                errors.append(f"{mirror}: {exc}")
                continue
            if hashlib.md5(blob).hexdigest() != md5:
                errors.append(f"{mirror}: checksum mismatch")
                continue
            # a name of this process's own: Macs sharing a home directory download into it at once
            part = f"{target}.part-{socket.gethostname()}-{os.getpid()}"
            with open(part, "wb") as f:
                f.write(blob)
            os.replace(part, target)
            break
        else:
            raise RuntimeError(f"could not download {name}: " + "; ".join(errors))


def _normalize(images: torch.Tensor) -> torch.Tensor:
    return ((images.float() / 255.0 - MEAN) / STD).unsqueeze(1)


def _ellipse(cx: float, cy: float, rx: float, ry: float, a0: float = 0.0, a1: float = 360.0, n: int = 14):
    return [(cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a)))
            for a in torch.linspace(a0, a1, n).tolist()]


# Each digit is a list of strokes; a stroke is a polyline in a unit box (x right, y down).
STROKES: list[list[list[tuple[float, float]]]] = [
    [_ellipse(0.5, 0.5, 0.28, 0.42)],
    [[(0.33, 0.25), (0.52, 0.08), (0.52, 0.92)]],
    [[(0.2, 0.3), (0.3, 0.12), (0.5, 0.07), (0.7, 0.12), (0.78, 0.3), (0.7, 0.48), (0.2, 0.92), (0.82, 0.92)]],
    [[(0.2, 0.12), (0.5, 0.07), (0.75, 0.2), (0.7, 0.4), (0.45, 0.5), (0.72, 0.6), (0.78, 0.8), (0.5, 0.93), (0.2, 0.85)]],
    [[(0.65, 0.92), (0.65, 0.08), (0.15, 0.65), (0.85, 0.65)]],
    [[(0.78, 0.08), (0.3, 0.08), (0.26, 0.45), (0.5, 0.4), (0.72, 0.5), (0.75, 0.75), (0.55, 0.92), (0.22, 0.85)]],
    [[(0.7, 0.1), (0.45, 0.15), (0.28, 0.4), (0.25, 0.7), (0.4, 0.92), (0.65, 0.9), (0.75, 0.7), (0.62, 0.52),
      (0.4, 0.52), (0.27, 0.65)]],
    [[(0.18, 0.08), (0.82, 0.08), (0.4, 0.92)]],
    [_ellipse(0.5, 0.28, 0.21, 0.2), _ellipse(0.5, 0.7, 0.26, 0.22)],
    [_ellipse(0.5, 0.32, 0.24, 0.22), [(0.74, 0.32), (0.68, 0.92)]],
]


def _segments(digit: int) -> torch.Tensor:
    """[K, 2, 2]: the digit's strokes as line segments (start, end)."""
    segs = [(a, b) for stroke in STROKES[digit] for a, b in zip(stroke, stroke[1:], strict=False)]
    return torch.tensor(segs, dtype=torch.float32)


def synthetic_digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` generated digits: normalized float32 images [n, 1, 28, 28] and int64 labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.zeros(n, 28 * 28)
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    px, py = xs.reshape(1, -1) + 0.5, ys.reshape(1, -1) + 0.5  # [1, 784] pixel centres
    for digit in range(10):
        idx = (labels == digit).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        b = idx.numel()
        seg = _segments(digit).expand(b, -1, -1, -1).clone()  # [b, K, 2, 2]
        seg += 0.03 * torch.randn(seg.shape, generator=g)  # wobble every control point
        # random affine: slant, rotation, scale, then place within the 28x28 frame
        angle = math.radians(12) * torch.randn(b, generator=g).clamp(-2, 2)
        shear = 0.25 * torch.randn(b, generator=g).clamp(-2, 2)
        scale = 17 + 3 * torch.rand(b, generator=g)
        aspect = 0.8 + 0.35 * torch.rand(b, generator=g)
        shift = 14 + 1.5 * torch.randn(b, 2, generator=g).clamp(-2, 2)
        cos, sin = angle.cos(), angle.sin()
        m = torch.stack([torch.stack([cos * aspect, -sin + shear], -1), torch.stack([sin * aspect, cos], -1)], -2)
        pts = (seg - 0.5) @ (m * scale[:, None, None]).transpose(1, 2)[:, None] + shift[:, None, None]
        # squared distance from every pixel to the nearest segment, x and y as separate [b, 784]
        # planes: elementwise work only (a batched matmul and norm over a dimension of 2 cost 5x more)
        dist2 = torch.full((b, 28 * 28), float("inf"))
        for k in range(pts.shape[1]):
            ax, ay = pts[:, k, 0, 0:1], pts[:, k, 0, 1:2]  # [b, 1]
            dx, dy = pts[:, k, 1, 0:1] - ax, pts[:, k, 1, 1:2] - ay
            rx, ry = px - ax, py - ay  # [b, 784]
            t = torch.addcmul(rx * dx, ry, dy).mul_(1 / (dx * dx + dy * dy).clamp_min(1e-6)).clamp_(0, 1)
            rx.addcmul_(t, dx, value=-1)  # now the offset from the nearest point of the segment
            ry.addcmul_(t, dy, value=-1)
            torch.minimum(dist2, rx.mul_(rx).addcmul_(ry, ry), out=dist2)
        dist = dist2.sqrt_()
        width = 0.9 + 0.9 * torch.rand(b, 1, generator=g)
        images[idx] = (1.0 - (dist - width).clamp(0, 1.0)).clamp(0, 1)
    images = (images + 0.08 * torch.randn(images.shape, generator=g)).clamp(0, 1)
    return ((images - MEAN) / STD).view(n, 1, 28, 28), labels
