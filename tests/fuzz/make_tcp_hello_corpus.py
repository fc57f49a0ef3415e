#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tcp_hello: hellos as a connector sends them
(transport_tcp/tcp_internal.h has the layout, docs/transport.md the
handshake), MAC'd with the token and nonce fuzz_tcp_hello.c checks them with.

    /usr/bin/python3 tests/fuzz/make_tcp_hello_corpus.py [DIR]
"""
import hashlib
import hmac
import os
import struct
import sys

MAGIC, WIRE_VERSION = 0x6B6F6C6F, 2
TOKEN = b"fuzz-token"
NONCE = bytes(range(32))
JOB, ROUND, RANK = b"fuzz-job", 3, 1  # what the target admits against (size 4)


def hello(src=0, dst=RANK, tag=0, stream=0, nstreams=1, probe_port=0, job=JOB, round_=ROUND,
          cnonce=bytes(range(100, 132))):
    body = (struct.pack("<II", MAGIC, WIRE_VERSION) + job.ljust(128, b"\0")
            + struct.pack("<qiiiIII", round_, src, dst, tag, stream, nstreams, probe_port)
            + cnonce)
    assert len(body) == 200
    return body + hmac.new(TOKEN, NONCE + body, hashlib.sha256).digest()


SEEDS = {
    "one_stream": hello(),
    "two_streams_second": hello(src=2, tag=7, stream=1, nstreams=2, probe_port=40001),
    "max_streams_last": hello(src=3, tag=-1, stream=15, nstreams=16, probe_port=65535),
    "ring_tag": hello(src=0, tag=0x10000, stream=3, nstreams=4, probe_port=1234),
    # refused by admission, authentic all the same
    "stale_round": hello(round_=2),
    "other_rank": hello(dst=2),
    "other_job": hello(job=b"another-job"),
    "sender_out_of_round": hello(src=4),
    "stream_out_of_range": hello(stream=2, nstreams=2),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus",
                                                             "tcp_hello")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        assert len(data) == 232
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
