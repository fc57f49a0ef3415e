"""The ctypes declarations of python/kolo/_lib.py against include/kolo/*.h.

A wrong ctypes prototype does not raise: it truncates a size_t, drops a
double or shifts every later argument, and the process crashes or computes
garbage. So this test parses the public headers itself (every ``KOLO_API``
declaration, the enums, the status map, the bootstrap struct and constants),
maps each C type to the ctypes type it must be declared with, and fails on
any difference: a function missing from PROTOTYPES or there without a
declaration, a wrong result type, a wrong argument type or count, a struct
field of the wrong name or type, a status/dtype/op code or a constant that
disagrees. The checker is tested too: mutated prototypes and headers must
make it fail.

Type mapping (what _lib.py must declare for each C type):

* ``int`` → c_int, ``int64_t`` → c_int64, ``size_t`` → c_size_t,
  ``double`` → c_double, ``bool`` → c_bool, ``void`` result → None;
* an enum typedef (kolo_status_t, kolo_dtype_t, kolo_op_t) → c_int;
* ``char *`` (const or not) → c_char_p, ``void *`` → c_void_p;
* a pointer to an opaque struct (kolo_comm_t *, ...) → c_void_p;
* a function pointer typedef (kolo_callback_fn, kolo_train_fn) → c_void_p
  (Python only ever passes NULL) or a CFUNCTYPE of the same signature;
* ``T *`` for any other T → POINTER(the mapping of T), recursively
  (``kolo_comm_t **`` → POINTER(c_void_p), ``const char *const *`` →
  POINTER(c_char_p));
* ``struct kolo_bootstrap_config *`` → POINTER(a Structure whose fields are
  the header's, in order, with these same mappings).
"""

from __future__ import annotations

import ctypes
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
INCLUDE = REPO / "include" / "kolo"
HEADERS = ["kolo.h", "async.h", "elastic.h", "bootstrap.h", "mxnet.h"]

sys.path.insert(0, str(REPO / "python"))
from kolo import _lib  # noqa: E402

# ---- a small parser for kolo's public headers ------------------------------


def strip_comments(text: str) -> str:
    """The text without /* */ and // comments (string literals in the
    headers never contain comment markers)."""
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"), text,
                  flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_preprocessor(text: str) -> tuple[list[str], str]:
    """(the preprocessor directives, continuation lines joined; the rest)."""
    text = text.replace("\\\n", " ")
    directives, rest = [], []
    for line in text.split("\n"):
        (directives if line.lstrip().startswith("#") else rest).append(line)
    return directives, "\n".join(rest)


class Header:
    """What one or more headers declare: ``functions`` {name: (ret, [params])}
    with each type a normalized C type string, ``enums`` {typedef name:
    {member: value}}, ``status`` {name: value} from KOLO_STATUS_MAP,
    ``defines`` {name: text}, ``structs`` {tag: [(field, C type)]},
    ``opaque`` (typedef names of incomplete structs), ``fnptrs`` {typedef
    name: (ret, [params])}, ``typedefs`` {alias: C type}."""

    def __init__(self, text: str):
        self.functions: dict[str, tuple[str, list[str]]] = {}
        self.enums: dict[str, dict[str, int]] = {}
        self.status: dict[str, int] = {}
        self.defines: dict[str, str] = {}
        self.structs: dict[str, list[tuple[str, str]]] = {}
        self.opaque: set[str] = set()
        self.fnptrs: dict[str, tuple[str, list[str]]] = {}
        self.typedefs: dict[str, str] = {}
        directives, body = split_preprocessor(strip_comments(text))
        for d in directives:
            m = re.match(r"\s*#\s*define\s+(\w+)(\([^)]*\))?\s*(.*)$", d)
            if m:
                self.defines[m.group(1)] = m.group(3).strip()
        for m in re.finditer(r"\bX\(\s*(\w+)\s*,\s*(-?\d+)\s*,", self.defines.get(
                "KOLO_STATUS_MAP", "")):
            self.status[m.group(1)] = int(m.group(2))
        self._parse(body)

    def _parse(self, body: str) -> None:
        # Enums: typedef enum tag { ... } name_t;
        for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", body, re.S):
            members, value = {}, -1
            for item in m.group(1).split(","):
                item = item.strip()
                if not item:
                    continue
                mm = re.fullmatch(r"(\w+)(?:\s*=\s*(-?\d+))?", item)
                if not mm:
                    # KOLO_STATUS_MAP(...) expands to the status list.
                    if item.startswith("KOLO_STATUS_MAP"):
                        members.update({f"KOLO_{k}": v for k, v in self.status.items()})
                        continue
                    raise ValueError(f"cannot parse enum member {item!r}")
                value = int(mm.group(2)) if mm.group(2) is not None else value + 1
                members[mm.group(1)] = value
            self.enums[m.group(2)] = members
        body = re.sub(r"typedef\s+enum\s+\w*\s*\{.*?\}\s*\w+\s*;", ";", body, flags=re.S)
        # Struct definitions: struct tag { fields };
        for m in re.finditer(r"\bstruct\s+(\w+)\s*\{(.*?)\}\s*;", body, re.S):
            fields = []
            for decl in m.group(2).split(";"):
                decl = " ".join(decl.split())
                if decl:
                    fields.append(split_decl(decl))
            self.structs[m.group(1)] = [(n, t) for t, n in fields]
        body = re.sub(r"\bstruct\s+\w+\s*\{.*?\}\s*;", ";", body, flags=re.S)
        # Typedefs: opaque structs, function pointers, plain aliases.
        for m in re.finditer(r"\btypedef\s+([^;]*);", body):
            decl = " ".join(m.group(1).split())
            fp = re.fullmatch(r"(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)", decl)
            if fp:
                self.fnptrs[fp.group(2)] = (normalize(fp.group(1)), params(fp.group(3)))
                continue
            op = re.fullmatch(r"struct\s+\w+\s+(\w+)", decl)
            if op:
                self.opaque.add(op.group(1))
                continue
            t, n = split_decl(decl)
            self.typedefs[n] = t
        # Functions: KOLO_API <ret> <name>(<params>);
        for m in re.finditer(r"\bKOLO_API\b([^;]*);", body):
            decl = " ".join(m.group(1).split())
            fm = re.fullmatch(r"(.*?)\b(\w+)\s*\((.*)\)", decl)
            if not fm:
                raise ValueError(f"cannot parse declaration {decl!r}")
            ret, name = normalize(fm.group(1)), fm.group(2)
            if name in self.functions:
                raise ValueError(f"{name} is declared twice")
            self.functions[name] = (ret, params(fm.group(3)))


def normalize(t: str) -> str:
    """A C type without qualifiers, in the form 'base **'."""
    t = re.sub(r"\b(const|volatile|restrict)\b", " ", t)
    stars = t.count("*")
    base = " ".join(t.replace("*", " ").split())
    return base + (" " + "*" * stars if stars else "")


def split_decl(decl: str) -> tuple[str, str]:
    """'const char *name' -> ('char *', 'name')."""
    m = re.fullmatch(r"(.*?)(\w+)\s*", decl)
    if not m or not m.group(1).strip():
        raise ValueError(f"cannot parse declaration {decl!r}")
    return normalize(m.group(1)), m.group(2)


def params(text: str) -> list[str]:
    text = text.strip()
    if text in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        p = " ".join(p.split())
        # An unnamed parameter is a type alone: it ends with '*', or its
        # last word is a C scalar or a typedef name (kolo_*_t, kolo_*_fn).
        words = re.findall(r"\w+", normalize(p))
        if p.endswith("*") or len(words) == 1 or (words and (
                words[-1] in _C_SCALARS or re.fullmatch(r"kolo_\w+_(t|fn)", words[-1]))):
            out.append(normalize(p))
        else:
            out.append(split_decl(p)[0])
    return out


_C_SCALARS = {"int", "int64_t", "size_t", "double", "bool", "char", "void", "float"}


def parse_headers(texts: list[str]) -> Header:
    """The declarations of every header, parsed as one translation unit."""
    return Header("\n".join(texts))


def read_headers() -> Header:
    return parse_headers([(INCLUDE / h).read_text() for h in HEADERS])


# ---- canonical type descriptions on both sides -----------------------------


def _int_desc(signed: bool, size: int) -> str:
    return f"{'int' if signed else 'uint'}{8 * size}"


_SIMPLE = {
    "b": (True, 1), "B": (False, 1), "h": (True, 2), "H": (False, 2), "i": (True, 4),
    "I": (False, 4), "l": (True, ctypes.sizeof(ctypes.c_long)),
    "L": (False, ctypes.sizeof(ctypes.c_ulong)), "q": (True, 8), "Q": (False, 8),
}


def describe_ctypes(t) -> str:
    """A canonical text for a ctypes type: 'int32', 'uint64', 'double',
    'bool', 'char*', 'void*', 'ptr(...)', 'struct{name:type,...}',
    'fn(ret;args)', 'void' (None)."""
    if t is None:
        return "void"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return f"ptr({describe_ctypes(t._type_)})"
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return "struct{" + ",".join(f"{f[0]}:{describe_ctypes(f[1])}" for f in t._fields_) + "}"
    if isinstance(t, type) and issubclass(t, ctypes._CFuncPtr):
        return f"fn({describe_ctypes(t._restype_)};" + ",".join(
            describe_ctypes(a) for a in t._argtypes_) + ")"
    code = getattr(t, "_type_", None)
    if code in _SIMPLE:
        return _int_desc(*_SIMPLE[code])
    return {"d": "double", "f": "float", "?": "bool", "z": "char*", "P": "void*",
            "c": "char"}.get(code, f"unknown ctypes type {t!r}")


class CMapper:
    """Maps the headers' C types to the canonical text of the ctypes type
    _lib.py must declare (see the module docstring)."""

    def __init__(self, h: Header):
        self.h = h

    def describe(self, t: str) -> str:
        n = t.count("*")
        base = t.replace("*", "").strip()
        if base in self.h.typedefs:
            inner = self.h.typedefs[base]
            return self.describe(inner + (" " + "*" * n if n else ""))
        if n == 0:
            return self._value(base)
        if n == 1 and base == "char":
            return "char*"
        if n == 1 and (base == "void" or base in self.h.opaque):
            return "void*"
        if base in self.h.fnptrs:
            # A function pointer typedef is itself a pointer.
            return self.describe_ptr_to(self._value(base), n)
        return self.describe_ptr_to(self.describe(base + " " + "*" * (n - 1)) if n > 1
                                    else self._value(base), 1)

    @staticmethod
    def describe_ptr_to(inner: str, n: int) -> str:
        for _ in range(n):
            inner = f"ptr({inner})"
        return inner

    def _value(self, base: str) -> str:
        if base in self.h.enums:
            return _int_desc(True, 4)
        if base in self.h.fnptrs:
            return "fnptr:" + base
        if base.startswith("struct "):
            tag = base[len("struct "):]
            if tag not in self.h.structs:
                raise KeyError(f"struct {tag} is not defined in the headers")
            return "struct{" + ",".join(f"{n}:{self.describe(t)}"
                                        for n, t in self.h.structs[tag]) + "}"
        scalars = {
            "int": _int_desc(True, ctypes.sizeof(ctypes.c_int)),
            "int64_t": "int64",
            "size_t": _int_desc(False, ctypes.sizeof(ctypes.c_size_t)),
            "double": "double",
            "float": "float",
            "bool": "bool",
            "void": "void",
            "char": "char",
        }
        if base not in scalars:
            raise KeyError(f"no ctypes mapping for C type {base!r}")
        return scalars[base]

    def matches(self, c_desc: str, py_desc: str) -> bool:
        """Whether a declared ctypes type fits a C type; function pointers
        also accept c_void_p (Python passes NULL)."""
        if c_desc.startswith("fnptr:"):
            ret, args = self.h.fnptrs[c_desc[len("fnptr:"):]]
            fn = f"fn({self.describe(ret)};" + ",".join(self.describe(a) for a in args) + ")"
            return py_desc in ("void*", fn)
        return c_desc == py_desc


def check_prototypes(h: Header, prototypes: dict) -> list[str]:
    """Every disagreement between the headers' KOLO_API functions and
    ``prototypes`` ({name: (restype, [argtypes])}), as readable lines."""
    m = CMapper(h)
    problems = []
    for name in h.functions:
        if name not in prototypes:
            problems.append(f"{name}: declared in include/kolo but missing from PROTOTYPES")
    for name in prototypes:
        # _lib.OPTIONAL: declared ahead of headers (and libraries) that may
        # not have them yet; checked like the rest once the headers do.
        if name not in h.functions and name not in _lib.OPTIONAL:
            problems.append(f"{name}: in PROTOTYPES but not declared KOLO_API in include/kolo")
    for name, (ret, args) in h.functions.items():
        if name not in prototypes:
            continue
        restype, argtypes = prototypes[name]
        want, got = m.describe(ret), describe_ctypes(restype)
        if not m.matches(want, got):
            problems.append(f"{name}: returns {ret!r} (ctypes {want}), PROTOTYPES says {got}")
        if len(argtypes) != len(args):
            problems.append(f"{name}: {len(args)} parameters in the header, {len(argtypes)} in "
                            f"PROTOTYPES")
            continue
        for i, (c, p) in enumerate(zip(args, argtypes)):
            want, got = m.describe(c), describe_ctypes(p)
            if not m.matches(want, got):
                problems.append(f"{name}: parameter {i} is {c!r} (ctypes {want}), PROTOTYPES "
                                f"says {got}")
    return problems


def check_struct(h: Header, tag: str, cls) -> list[str]:
    """Disagreements between struct ``tag`` of the headers and ctypes
    Structure ``cls``: field names, order and types."""
    if tag not in h.structs:
        return [f"struct {tag} is not defined in the headers"]
    m = CMapper(h)
    want = [(n, m.describe(t)) for n, t in h.structs[tag]]
    got = [(f[0], describe_ctypes(f[1])) for f in cls._fields_]
    if want == got:
        return []
    return [f"struct {tag}: header fields {want}, {cls.__name__}._fields_ {got}"]


def check_tables(h: Header, status: dict, dtypes: dict, ops: dict, constants: dict) -> list[str]:
    """Disagreements between the headers' status map, enum kolo_dtype, enum
    kolo_op and #defines and the tables of _lib.py (``constants`` maps a
    macro name to the value _lib.py uses)."""
    problems = []
    if status != h.status:
        problems.append(f"STATUS {status} != KOLO_STATUS_MAP {h.status}")
    for table, enum, got in (("DTYPES", "kolo_dtype_t", dtypes), ("OPS", "kolo_op_t", ops)):
        want = {k[len("KOLO_"):].lower(): v for k, v in h.enums.get(enum, {}).items()
                if not k.endswith("_COUNT")}
        if want != got:
            problems.append(f"{table} {got} != enum {enum} {want}")
    for macro, value in constants.items():
        if macro not in h.defines:
            problems.append(f"{macro} is not #defined in the headers")
        elif h.defines[macro] != str(value):
            problems.append(f"{macro} is {h.defines[macro]} in the headers, {value} in _lib.py")
    return problems


LIB_CONSTANTS = {
    "KOLO_BOOTSTRAP_CARD_SIZE": _lib.BOOTSTRAP_CARD_SIZE,
    "KOLO_BOOTSTRAP_HOST_MAX": _lib.BOOTSTRAP_HOST_MAX,
}

# ---- the checks ------------------------------------------------------------


@pytest.fixture(scope="module")
def headers() -> Header:
    return read_headers()


def test_headers_parse_completely(headers):
    """The parser saw every KOLO_API line: a declaration it skipped would
    hide a missing prototype."""
    raw = "\n".join(strip_comments((INCLUDE / h).read_text()) for h in HEADERS)
    declared = len(re.findall(r"^\s*KOLO_API\b", raw, re.M))
    assert declared == len(headers.functions) >= 60
    assert {"kolo_status_t", "kolo_dtype_t", "kolo_op_t"} <= set(headers.enums)
    assert {"kolo_comm_t", "kolo_handle_t", "kolo_state_t", "kolo_bootstrap_t"} <= headers.opaque
    assert set(headers.fnptrs) == {"kolo_callback_fn", "kolo_train_fn"}
    assert "kolo_bootstrap_config" in headers.structs


def test_prototypes_match_headers(headers):
    problems = check_prototypes(headers, _lib.PROTOTYPES)
    assert not problems, "\n".join(problems)


def test_bootstrap_config_matches_header(headers):
    problems = check_struct(headers, "kolo_bootstrap_config", _lib.BootstrapConfig)
    assert not problems, "\n".join(problems)


def test_tables_match_headers(headers):
    problems = check_tables(headers, _lib.STATUS, _lib.DTYPES, _lib.OPS, LIB_CONSTANTS)
    assert not problems, "\n".join(problems)


def test_library_exports_every_prototype():
    """The built libkolo exports every function of the headers (loading it
    declares every prototype; a missing symbol raises ImportError)."""
    lib = _lib.library()
    for name in read_headers().functions:
        assert hasattr(lib, name), f"{_lib.path()} does not export {name}"


def test_only_lib_loads_the_library():
    """STYLE: nothing but _lib.py touches ctypes.CDLL."""
    pkg = REPO / "python" / "kolo"
    offenders = []
    for f in pkg.rglob("*.py"):
        if f.name == "_lib.py" and f.parent == pkg:
            continue
        text = f.read_text()
        if re.search(r"\bCDLL\s*\(|\bcdll\.|LoadLibrary\s*\(|\bPyDLL\s*\(", text):
            offenders.append(str(f.relative_to(REPO)))
    assert not offenders, f"ctypes libraries loaded outside kolo/_lib.py: {offenders}"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_layout_matches_compiler(tmp_path):
    """sizeof and offsetof of struct kolo_bootstrap_config and the enum
    sizes, from the C compiler, against ctypes."""
    src = tmp_path / "layout.c"
    fields = [f[0] for f in _lib.BootstrapConfig._fields_]
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kolo/kolo.h"',
             '#include "kolo/async.h"', '#include "kolo/elastic.h"',
             '#include "kolo/bootstrap.h"', 'int main(void) {',
             ' printf("sizeof %zu\\n", sizeof(struct kolo_bootstrap_config));',
             ' printf("enum %zu %zu %zu\\n", sizeof(kolo_status_t), sizeof(kolo_dtype_t), '
             'sizeof(kolo_op_t));']
    for f in fields:
        lines.append(f' printf("{f} %zu\\n", offsetof(struct kolo_bootstrap_config, {f}));')
    lines += [" return 0;", "}"]
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)],
                   check=True, timeout=120)
    out = dict(line.split(" ", 1) for line in
               subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                              timeout=30).stdout.splitlines())
    assert int(out["sizeof"]) == ctypes.sizeof(_lib.BootstrapConfig)
    assert [int(x) for x in out["enum"].split()] == [ctypes.sizeof(ctypes.c_int)] * 3
    for f in fields:
        assert int(out[f]) == getattr(_lib.BootstrapConfig, f).offset, f


# ---- the checker itself must fail on mutations -----------------------------

P = ctypes.POINTER


def _mutated(name: str, ret=None, args=None, drop_arg: int | None = None) -> dict:
    protos = dict(_lib.PROTOTYPES)
    r, a = protos[name]
    a = list(a)
    if args is not None:
        for i, t in args.items():
            a[i] = t
    if drop_arg is not None:
        del a[drop_arg]
    protos[name] = (r if ret is None else ret, a)
    return protos


@pytest.mark.parametrize("mutation,expect", [
    # size_t count declared as int: the classic silent truncation.
    (lambda: _mutated("kolo_allreduce", args={3: ctypes.c_int}), "parameter 3"),
    # double prescale declared as float.
    (lambda: _mutated("kolo_allreduce_async", args={7: ctypes.c_float}), "parameter 7"),
    # a pointer-to-pointer out parameter declared as a plain pointer.
    (lambda: _mutated("kolo_init", args={0: ctypes.c_void_p}), "parameter 0"),
    # const char *const * declared as char *.
    (lambda: _mutated("kolo_grouped_allreduce_async", args={2: ctypes.c_char_p}),
     "parameter 2"),
    # size_t * declared as int *.
    (lambda: _mutated("kolo_alltoall_async", args={4: P(ctypes.c_int)}), "parameter 4"),
    # a callback declared as an int.
    (lambda: _mutated("kolo_barrier_async", args={1: ctypes.c_int}), "parameter 1"),
    # a callback declared with the wrong signature.
    (lambda: _mutated("kolo_barrier_async",
                      args={1: ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_double)}),
     "parameter 1"),
    # int64_t result declared as int.
    (lambda: _mutated("kolo_round", ret=ctypes.c_int), "returns"),
    # bool result declared as int.
    (lambda: _mutated("kolo_elastic_enabled", ret=ctypes.c_int), "returns"),
    # void result declared as int, and a string result as void *.
    (lambda: _mutated("kolo_abort", ret=ctypes.c_int), "returns"),
    (lambda: _mutated("kolo_last_error", ret=ctypes.c_void_p), "returns"),
    # a dropped argument.
    (lambda: _mutated("kolo_broadcast_async", drop_arg=5), "parameters in the header"),
    # a missing and an extra function.
    (lambda: {k: v for k, v in _lib.PROTOTYPES.items() if k != "kolo_free"},
     "missing from PROTOTYPES"),
    (lambda: {**_lib.PROTOTYPES, "kolo_frobnicate": (None, [])}, "not declared KOLO_API"),
])
def test_checker_rejects_mutated_prototypes(headers, mutation, expect):
    problems = check_prototypes(headers, mutation())
    assert problems and any(expect in p for p in problems), problems


def test_checker_accepts_matching_callback_type(headers):
    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    assert not check_prototypes(headers, _mutated("kolo_elastic_run", args={2: cb}))


def test_checker_rejects_mutated_struct(headers):
    class SwappedOrder(ctypes.Structure):
        _fields_ = [("size", ctypes.c_int), ("rank", ctypes.c_int)] + \
            _lib.BootstrapConfig._fields_[2:]

    class WrongType(ctypes.Structure):
        _fields_ = _lib.BootstrapConfig._fields_[:5] + [("timeout_ms", ctypes.c_int64)]

    class MissingField(ctypes.Structure):
        _fields_ = _lib.BootstrapConfig._fields_[:5]

    for cls in (SwappedOrder, WrongType, MissingField):
        assert check_struct(headers, "kolo_bootstrap_config", cls), cls.__name__
    # A prototype taking the wrong struct must fail too.
    protos = _mutated("kolo_bootstrap_create", args={0: P(WrongType)})
    assert any("parameter 0" in p for p in check_prototypes(headers, protos))


def test_checker_rejects_mutated_tables(headers):
    good = (_lib.STATUS, _lib.DTYPES, _lib.OPS, LIB_CONSTANTS)
    assert not check_tables(headers, *good)
    assert check_tables(headers, {**_lib.STATUS, "EPEER": 30}, *good[1:])
    assert check_tables(headers, {k: v for k, v in _lib.STATUS.items() if k != "EAUTH"},
                        *good[1:])
    assert check_tables(headers, good[0], {**_lib.DTYPES, "int16": 8}, *good[2:])
    assert check_tables(headers, good[0], _lib.DTYPES, {**_lib.OPS, "min": 3, "max": 2},
                        good[3])
    assert check_tables(headers, *good[:3], {**LIB_CONSTANTS, "KOLO_BOOTSTRAP_CARD_SIZE": 64})


SAMPLE = r"""
/* a comment with KOLO_API inside: KOLO_API int not_a_function(void); */
#define KOLO_API
#define KOLO_STATUS_MAP(X) \
	X(OK, 0, "ok") \
	X(EBAD, 7, "bad")
typedef enum kolo_status {
#define E_(n, v, t) KOLO_##n = v,
	KOLO_STATUS_MAP(E_)
#undef E_
} kolo_status_t;
typedef enum kolo_color { KOLO_RED, KOLO_GREEN = 5, KOLO_BLUE, KOLO_COLOR_COUNT } kolo_color_t;
typedef struct kolo_thing kolo_thing_t;
typedef int (*kolo_visit_fn)(void *arg, const kolo_thing_t *t);
struct kolo_opts { int a; /* x */ const char *name; size_t n; };
KOLO_API const char *const *
kolo_names(const kolo_thing_t *thing,
           size_t *count,    // out
           kolo_visit_fn fn);
KOLO_API void kolo_none(void);
KOLO_API kolo_status_t kolo_make(const struct kolo_opts *opts, kolo_thing_t **out, int64_t,
                                 double scale, bool flag, kolo_color_t color);
"""


def test_parser_on_a_sample():
    h = parse_headers([SAMPLE])
    assert h.status == {"OK": 0, "EBAD": 7}
    assert h.enums["kolo_color_t"] == {"KOLO_RED": 0, "KOLO_GREEN": 5, "KOLO_BLUE": 6,
                                       "KOLO_COLOR_COUNT": 7}
    assert h.enums["kolo_status_t"] == {"KOLO_OK": 0, "KOLO_EBAD": 7}
    assert set(h.functions) == {"kolo_names", "kolo_none", "kolo_make"}
    assert h.functions["kolo_names"] == ("char **", ["kolo_thing_t *", "size_t *",
                                                     "kolo_visit_fn"])
    assert h.functions["kolo_none"] == ("void", [])
    assert h.structs["kolo_opts"] == [("a", "int"), ("name", "char *"), ("n", "size_t")]
    m = CMapper(h)
    assert m.describe("char **") == "ptr(char*)"
    assert m.describe("kolo_thing_t **") == "ptr(void*)"
    assert m.describe("kolo_color_t") == "int32"
    assert m.describe("struct kolo_opts *") == "ptr(struct{a:int32,name:char*,n:uint64})"

    class Opts(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int), ("name", ctypes.c_char_p), ("n", ctypes.c_size_t)]

    good = {
        "kolo_names": (P(ctypes.c_char_p), [ctypes.c_void_p, P(ctypes.c_size_t),
                                            ctypes.c_void_p]),
        "kolo_none": (None, []),
        "kolo_make": (ctypes.c_int, [P(Opts), P(ctypes.c_void_p), ctypes.c_int64,
                                     ctypes.c_double, ctypes.c_bool, ctypes.c_int]),
    }
    assert check_prototypes(h, good) == []
    visit = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    assert check_prototypes(h, {**good, "kolo_names": (good["kolo_names"][0],
                                                       [ctypes.c_void_p, P(ctypes.c_size_t),
                                                        visit])}) == []
    bad = {**good, "kolo_make": (ctypes.c_int, [P(Opts), P(ctypes.c_void_p), ctypes.c_int,
                                                ctypes.c_double, ctypes.c_bool,
                                                ctypes.c_int])}
    assert check_prototypes(h, bad) == ["kolo_make: parameter 2 is 'int64_t' (ctypes int64), "
                                        "PROTOTYPES says int32"]
    assert check_prototypes(h, {**good, "kolo_names": (ctypes.c_char_p,
                                                       good["kolo_names"][1])})


@pytest.mark.parametrize("old,new,expect", [
    # A header change that _lib.py did not follow: a parameter's type...
    ("void *recvbuf,\n                                      size_t count, kolo_dtype_t dtype, "
     "kolo_op_t op);", "void *recvbuf,\n                                      int count, "
     "kolo_dtype_t dtype, kolo_op_t op);", "kolo_allreduce: parameter 3"),
    # ... a new parameter, a new function, a new status code, a new field.
    ("KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm);",
     "KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm, int flags);", "kolo_barrier: 2"),
    ("KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm);",
     "KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm);\nKOLO_API int kolo_new(void);",
     "kolo_new: declared"),
    ('X(EUNSUPPORTED, 14, "not supported")',
     'X(EUNSUPPORTED, 14, "not supported") X(ENEW, 15, "new")', "STATUS"),
    ("int timeout_ms;", "int timeout_ms;\n\tint flags;", "struct kolo_bootstrap_config"),
])
def test_checker_rejects_mutated_headers(old, new, expect):
    texts = [(INCLUDE / h).read_text() for h in HEADERS]
    joined = "\n".join(texts)
    assert joined.count(old) == 1, f"the sample text is no longer in the headers: {old!r}"
    h = parse_headers([joined.replace(old, new)])
    problems = (check_prototypes(h, _lib.PROTOTYPES)
                + check_struct(h, "kolo_bootstrap_config", _lib.BootstrapConfig)
                + check_tables(h, _lib.STATUS, _lib.DTYPES, _lib.OPS, LIB_CONSTANTS))
    assert any(p.startswith(expect) or expect in p for p in problems), problems
