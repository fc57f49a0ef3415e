"""libkolo calls its own libcurl and libcrypto, not the copies that another
library in the process made global. TensorFlow does exactly that: after
``import tensorflow``, its libtensorflow_framework exports a bundled libcurl
and BoringSSL (OpenSSL's function names). kolo loads libkolo with
RTLD_DEEPBIND (python/kolo/_lib.py); this test reads the dynamic linker's
bindings (LD_DEBUG) of a worker that imports TensorFlow first."""

import importlib.util
import pathlib

import pytest

from conftest import kolorun, results, PYTHON, WORKERS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="no tensorflow in this interpreter")


def test_libkolo_binds_its_own_curl_and_crypto_after_tensorflow(tmp_path):
    log = tmp_path / "ld"
    p = kolorun(1, [PYTHON, str(WORKERS / "tf_first.py")], timeout=120,
                env={"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log),
                     "TF_CPP_MIN_LOG_LEVEL": "3"})
    pid = results(p)[0][0]["pid"]
    lines = [ln for ln in pathlib.Path(f"{log}.{pid}").read_text().splitlines()
             if "libkolo.so" in ln.split(" to ")[0]]
    wanted = {"curl_easy_perform": "libcurl.so", "curl_easy_init": "libcurl.so",
              "HMAC": "libcrypto.so"}
    for sym, lib in wanted.items():
        found = [ln for ln in lines if f"`{sym}'" in ln]
        assert found, f"libkolo never bound {sym}"
        assert all(lib in ln.split(" to ")[1] for ln in found), found
