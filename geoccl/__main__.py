"""``python -m geoccl``: what this installation of GeoCCL is.

Prints the version, the library it loads, the torch its extension was built
for against the torch this interpreter imports, whether the extension
loads, whether the build found CUDA and NVIDIA's NCCL, then every
environment parameter with its value in force, default and help, and the
NCCL variables read in their place (as geoccl-info prints them).

libgeoccl is read through ctypes, not through the extension, so that the
report still comes when the extension does not load (built for another
torch, say), and says why. Exits 0 when everything loads, 1 otherwise.
"""
import ctypes
import os
import sys


class _Param(ctypes.Structure):  # geocclParamInfo (geoccl.h)
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p),
                ("dflt", ctypes.c_char_p), ("help", ctypes.c_char_p),
                ("is_set", ctypes.c_int)]


class _NcclVar(ctypes.Structure):  # geocclNcclVarInfo (geoccl.h)
    _fields_ = [("name", ctypes.c_char_p), ("geoccl", ctypes.c_char_p),
                ("how", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else None


def _load_library(build):
    here = os.path.dirname(os.path.abspath(build.__file__))
    path = os.path.join(here, build.LIBDIR, build.LIBGEOCCL)
    lib = ctypes.CDLL(path)
    lib.geocclVersionString.restype = ctypes.c_char_p
    lib.geocclParamCount.restype = ctypes.c_int
    lib.geocclParamGet.argtypes = [ctypes.c_int, ctypes.POINTER(_Param)]
    lib.geocclNcclVarCount.restype = ctypes.c_int
    lib.geocclNcclVarGet.argtypes = [ctypes.c_int, ctypes.POINTER(_NcclVar)]
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib, path


def _torch_now():
    try:
        import torch
        return torch.__version__, None
    except Exception as e:  # noqa: BLE001  any failure is worth reporting
        return None, "%s: %s" % (type(e).__name__, e)


def _extension():
    try:
        import torch  # noqa: F401  _C's base class lives in torch
        from geoccl import _C
        return _C, None
    except Exception as e:  # noqa: BLE001
        return None, "%s: %s" % (type(e).__name__, e)


def _row(what, text):
    print("%-12s %s" % (what, text))


def main(argv):
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print("usage: python -m geoccl\n  prints GeoCCL's version, the torch its extension was "
              "built for, CUDA and NCCL as the build found them, and its environment "
              "parameters")
        return 0
    try:
        from geoccl import _build
    except ImportError:
        print("geoccl: this copy of the package was not built (no geoccl/_build.py): install "
              "it with pip, or use a build tree (make) with PYTHONPATH=<build dir>",
              file=sys.stderr)
        return 1
    try:
        lib, path = _load_library(_build)
    except OSError as e:
        print("geoccl: cannot load libgeoccl (%s): %s" % (_build.LIBGEOCCL, e), file=sys.stderr)
        return 1

    ok = True
    api = ctypes.c_int(0)
    lib.ncclGetVersion(ctypes.byref(api))
    print("GeoCCL %s (NCCL API %d)" % (_s(lib.geocclVersionString()), api.value))
    _row("package", os.path.dirname(os.path.abspath(_build.__file__)))
    _row("library", path)
    _row("built for", "torch %s (%s)" % (_build.TORCH_VERSION, _build.PYTHON))
    now, why = _torch_now()
    if now is None:
        _row("torch now", "does not import: %s" % why)
        ok = False
    else:
        same = "" if now == _build.TORCH_VERSION else \
            " (not the torch the extension was built for: reinstall geoccl)"
        _row("torch now", "%s (%s)%s" % (now, sys.executable, same))
    ext, why = _extension()
    if ext is None:
        _row("extension", "geoccl._C does not load: %s" % why)
        ok = False
    else:
        _row("extension", "geoccl._C loads (c10d %s, CUDA tensors: %s)"
             % (ext.torch_api, "yes" if ext.cuda else "no"))
    _row("CUDA", "yes (the toolkit was found; CUDA tensors also need a torch with CUDA)"
         if _build.CUDA else
         "no (the build found no CUDA toolkit: CPU tensors only)")
    if _build.NCCL_LIB_DIR:
        _row("NCCL", "NVIDIA's libnccl found by the build in %s; loaded at run time "
             "(GEOCCL_NCCL_LIB names another)" % _build.NCCL_LIB_DIR)
    else:
        _row("NCCL", "not found by the build; loaded at run time from the loader's path "
             "or GEOCCL_NCCL_LIB")

    print("\n%-24s %-12s %-10s %s" % ("parameter", "value", "default", "meaning"))
    for i in range(lib.geocclParamCount()):
        p = _Param()
        if lib.geocclParamGet(i, ctypes.byref(p)) != 0:
            return 1
        print("%-24s %-12s %-10s %s%s" % (_s(p.name), _s(p.value) or "-", _s(p.dflt) or "-",
                                           _s(p.help), " [set]" if p.is_set else ""))
    print("\nNCCL variables, read when the GEOCCL_ one is unset (it wins when both are set):")
    print("%-24s %-24s %s" % ("NCCL variable", "read as", "how"))
    for i in range(lib.geocclNcclVarCount()):
        n = _NcclVar()
        if lib.geocclNcclVarGet(i, ctypes.byref(n)) != 0:
            return 1
        print("%-24s %-24s %s%s" % (_s(n.name), _s(n.geoccl) or "-", _s(n.how),
                                     " [set: %s]" % _s(n.value) if n.value else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        rc = main(sys.argv)
        sys.stdout.flush()
    except BrokenPipeError:  # python -m geoccl | head: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        rc = 0
    sys.exit(rc)
