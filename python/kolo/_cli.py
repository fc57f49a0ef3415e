"""The console scripts of the kolo wheel: ``kolorun``, ``kolo-rendezvous``,
``kolo-info``, ``kolo-bench`` and ``kolo-doctor``.

The wheel carries the binaries at ``kolo/bin/``; ``pip install`` puts these
entry points on ``PATH``, and each one replaces itself (``os.execv``) with
its binary, the arguments unchanged, so that signals, the exit status and
the standard streams are the binary's own. A kolo installed with
``cmake --install`` has its binaries in ``<prefix>/bin`` and no ``kolo/bin``.
"""

from __future__ import annotations

import os
import pathlib
import sys

BIN_DIR = pathlib.Path(__file__).resolve().parent / "bin"
NAMES = ("kolorun", "kolo-rendezvous", "kolo-info", "kolo-bench", "kolo-doctor")


def binary(name: str) -> pathlib.Path:
    """The path of the packaged binary ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"kolo: no binary {name!r}; there are {', '.join(NAMES)}")
    return BIN_DIR / name


def run(name: str, args: list[str] | None = None) -> int:
    """Replaces this process with the binary ``name`` and ``args`` (default:
    this process's arguments). Returns only on failure: the exit status to
    use (127 when the binary is missing, 126 when it cannot be executed)."""
    path = binary(name)
    argv = [str(path)] + (sys.argv[1:] if args is None else list(args))
    if not path.is_file():
        print(f"{name}: {path} is missing: this kolo package carries no binaries (only a wheel "
              "has kolo/bin; a cmake --install puts them in <prefix>/bin)", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, argv)
    except OSError as e:
        print(f"{name}: cannot execute {path}: {e}", file=sys.stderr)
        return 126
    return 126  # not reached


def kolorun() -> int:
    return run("kolorun")


def kolo_rendezvous() -> int:
    return run("kolo-rendezvous")


def kolo_info() -> int:
    return run("kolo-info")


def kolo_bench() -> int:
    return run("kolo-bench")


def kolo_doctor() -> int:
    return run("kolo-doctor")


if __name__ == "__main__":  # python -m kolo._cli NAME [ARGS...]
    if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
        print(f"usage: python -m kolo._cli {{{','.join(NAMES)}}} [ARGS...]", file=sys.stderr)
        sys.exit(64)
    sys.exit(run(sys.argv[1], sys.argv[2:]))
