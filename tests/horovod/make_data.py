#!/usr/bin/python3
"""Local stand-ins for the data sets of Horovod's PyTorch examples, so that
they run with nothing downloaded:

  mnist     ROOT/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte, the
            uncompressed IDX files that torchvision.datasets.MNIST reads. Its
            check for an existing copy (_check_exists) only asks that these
            four files exist, so MNIST(ROOT, download=True) finds them and
            downloads nothing. The images are 28x28 seven-segment digits
            0..9, each drawn at a random size, place, slant, stroke width and
            brightness, over noise: ten classes that a small network
            learns, so the test accuracy that an example
            prints means something.
  imagenet  ROOT/train/<wnid>/*.png|jpg and ROOT/val/<wnid>/*, two
            torchvision.datasets.ImageFolder trees of small images: per class
            a colour, a shape and a stripe direction, over noise.

Deterministic for a given --seed. Standard library only, except --format
jpeg, which needs Pillow (what torchvision depends on).

    make_data.py mnist --root DIR [--train 6000] [--test 1000]
    make_data.py imagenet --root DIR [--classes 4] [--train-per-class 8]
                 [--val-per-class 2] [--size 32] [--format png|jpeg]
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import zlib

# ---- MNIST -----------------------------------------------------------------

SIDE = 28
# Seven segments: a top, b upper right, c lower right, d bottom, e lower
# left, f upper left, g middle.
SEGMENTS = {
    0: "abcdef", 1: "bc", 2: "abged", 3: "abgcd", 4: "fgbc",
    5: "afgcd", 6: "afgedc", 7: "abc", 8: "abcdefg", 9: "abcdfg",
}


def _segment_boxes(w: int, h: int, t: int) -> dict:
    """Each segment as a box (x0, y0, x1, y1), end exclusive, in a w x h
    digit with strokes t thick."""
    mid = (h - t) // 2
    return {
        "a": (0, 0, w, t),
        "g": (0, mid, w, mid + t),
        "d": (0, h - t, w, h),
        "f": (0, 0, t, mid + t),
        "b": (w - t, 0, w, mid + t),
        "e": (0, mid, t, h),
        "c": (w - t, mid, w, h),
    }


def digit_image(label: int, rng: random.Random) -> bytes:
    """One 28x28 grey image (row-major bytes) of the digit ``label``."""
    w, h, t = rng.randint(9, 14), rng.randint(15, 21), rng.randint(2, 3)
    x0 = rng.randint(3, SIDE - 3 - w)
    y0 = rng.randint(3, SIDE - 3 - h)
    slant = rng.uniform(-0.25, 0.25)  # x shift per row, about the centre
    ink = rng.uniform(170, 255)
    sigma = rng.uniform(5, 30)
    img = [max(0.0, rng.gauss(0, sigma)) for _ in range(SIDE * SIDE)]
    strokes = [b for s, b in _segment_boxes(w, h, t).items() if s in SEGMENTS[label]]
    for bx0, by0, bx1, by1 in strokes:
        for y in range(by0, by1):
            yy = y0 + y
            if not 0 <= yy < SIDE:
                continue
            shift = int(round(slant * (y - h / 2)))
            for x in range(bx0, bx1):
                xx = x0 + x + shift
                if 0 <= xx < SIDE:
                    img[yy * SIDE + xx] += ink * rng.uniform(0.75, 1.0)
    return bytes(min(255, int(v)) for v in img)


def write_idx(path: str, dims: list, payload: bytes) -> None:
    """An IDX file of unsigned bytes: magic 0x08 0x<ndims>, big-endian dims."""
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, len(dims)))
        f.write(struct.pack(">" + "I" * len(dims), *dims))
        f.write(payload)


def make_mnist(root: str, n_train: int, n_test: int, seed: int) -> str:
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n, salt in (("train", n_train, 1), ("t10k", n_test, 2)):
        rng = random.Random(seed * 1000003 + salt)
        labels = [i % 10 for i in range(n)]
        rng.shuffle(labels)
        images = b"".join(digit_image(c, rng) for c in labels)
        write_idx(os.path.join(raw, f"{split}-images-idx3-ubyte"), [n, SIDE, SIDE], images)
        write_idx(os.path.join(raw, f"{split}-labels-idx1-ubyte"), [n], bytes(labels))
    return raw


# ---- ImageNet-like ImageFolder ------------------------------------------------

def png_bytes(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG (no Pillow needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    stride = width * 3
    rows = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def class_image(cls: int, size: int, rng: random.Random) -> bytes:
    """RGB bytes of one image of class ``cls``: a class colour, a square or
    a disc, stripes horizontal or vertical, all over noise."""
    hue = [(200, 40, 40), (40, 170, 60), (50, 70, 210), (210, 190, 40),
           (170, 60, 190), (40, 190, 190), (230, 120, 30), (120, 120, 120)][cls % 8]
    disc, vertical = cls % 2 == 1, (cls // 2) % 2 == 1
    r = rng.uniform(0.2, 0.35) * size
    cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
    period = max(2, size // 8)
    out = bytearray()
    for y in range(size):
        for x in range(size):
            inside = ((x - cx) ** 2 + (y - cy) ** 2 <= r * r) if disc else \
                (abs(x - cx) <= r and abs(y - cy) <= r)
            stripe = ((x if vertical else y) // period) % 2
            base = hue if inside else tuple(60 + 60 * stripe for _ in range(3))
            out += bytes(max(0, min(255, int(c + rng.gauss(0, 20)))) for c in base)
    return bytes(out)


def make_imagenet(root: str, classes: int, n_train: int, n_val: int, size: int, fmt: str,
                  seed: int) -> tuple:
    if fmt == "jpeg":
        try:
            from PIL import Image
        except ImportError:
            raise SystemExit(f"make_data: --format jpeg needs Pillow, which {sys.executable} "
                             "lacks (use --format png)")
    rng = random.Random(seed)
    dirs = []
    for split, n in (("train", n_train), ("val", n_val)):
        top = os.path.join(root, split)
        dirs.append(top)
        for c in range(classes):
            d = os.path.join(top, f"n{c:08d}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                rgb = class_image(c, size, rng)
                if fmt == "png":
                    with open(os.path.join(d, f"{split}_{c}_{i:04d}.png"), "wb") as f:
                        f.write(png_bytes(size, size, rgb))
                else:
                    Image.frombytes("RGB", (size, size), rgb).save(
                        os.path.join(d, f"{split}_{c}_{i:04d}.JPEG"), quality=90)
    return tuple(dirs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("mnist", help="MNIST IDX files under ROOT/MNIST/raw")
    m.add_argument("--root", required=True)
    m.add_argument("--train", type=int, default=6000, help="training images (default 6000)")
    m.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    m.add_argument("--seed", type=int, default=0)
    i = sub.add_parser("imagenet", help="ImageFolder trees ROOT/train and ROOT/val")
    i.add_argument("--root", required=True)
    i.add_argument("--classes", type=int, default=4)
    i.add_argument("--train-per-class", type=int, default=8)
    i.add_argument("--val-per-class", type=int, default=2)
    i.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    i.add_argument("--format", choices=("png", "jpeg"), default="png")
    i.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.what == "mnist":
        raw = make_mnist(a.root, a.train, a.test, a.seed)
        print(f"make_data: MNIST {a.train} train + {a.test} test images in {raw}")
    else:
        train, val = make_imagenet(a.root, a.classes, a.train_per_class, a.val_per_class,
                                   a.size, a.format, a.seed)
        print(f"make_data: ImageFolder {a.classes} classes, {a.train_per_class} train + "
              f"{a.val_per_class} val images each ({a.size}x{a.size} {a.format}) in "
              f"{train} and {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
