"""Imports TensorFlow before kolo, then makes kolo talk to the rendezvous
(init and finalize): test_symbols.py reads the dynamic linker's bindings."""
import os

import tensorflow  # noqa: F401  (first: its bundled libcurl and BoringSSL go global)

import kolo
from _common import report

kolo.init()
kolo.finalize()
report({"pid": os.getpid()})
