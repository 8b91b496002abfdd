"""Runs PyTorch's own distributed test suite
(torch.testing._internal.distributed.distributed_test) against one backend,
the way PyTorch's test/distributed/test_distributed_spawn.py drives it: the
environment names the backend (BACKEND), the ranks (WORLD_SIZE) and a
scratch folder (TEMP_DIR), and every test of DistributedTest._DistTestBase
spawns WORLD_SIZE fresh processes that join a group through a file store.

    python dist_suite.py --backend geoccl --out geoccl.tsv [test names or substrings]
    python dist_suite.py --compare gloo.tsv geoccl.tsv

Each test's outcome (pass, fail, error, hang, skip) goes to --out as
"name<TAB>outcome<TAB>seconds<TAB>detail"; --compare prints two such files
side by side and the tests that pass for the first and not for the second
(exit status 1 when there are any).

geoccl is held to gloo's CPU feature set. The suite decides what a backend
may run from its DistTestCases tables and from decorators and branches
that name backends by string ("gloo", "nccl"); so, for --backend geoccl:
 - every DistTestCases set that holds "gloo" gets "geoccl" (DDP, subgroups,
   the "gpu"/"cuda" feature sets, which only gate on device counts here),
   and "plugin" gets it (the suite's mark of a registered third-party
   backend);
 - the suite's module-level BACKEND is a string that is "geoccl" but also
   compares equal to "gloo" and hashes as "gloo", so that
   `BACKEND == "gloo"`, `BACKEND != "gloo"` and `BACKEND in {"gloo", ...}`
   (require_backend) choose gloo's branch, in decorators and in test bodies
   alike; init_process_group gets the plain name "geoccl". Tests that check
   for gloo's own classes or options still see the real group;
 - the tests listed in GEOCCL_SKIPS, which test features of gloo itself
   rather than of the c10d interface, are skipped with their reason.
A test that outlives --timeout (per test, all ranks) is reported as a hang:
its processes are killed and the run goes on.
"""
import argparse
import atexit
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

# What only gloo has, so that geoccl is not held to it. Reason: shown as the
# skip's message and listed in docs/pytorch.md.
GEOCCL_SKIPS = {}


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gloo", "geoccl"])
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds a test may take before it is reported as a hang")
    p.add_argument("--out", help="file for the per-test outcomes")
    p.add_argument("--list", action="store_true", help="print the test names and stop")
    p.add_argument("--compare", nargs=2, metavar=("A.tsv", "B.tsv"))
    p.add_argument("tests", nargs="*", help="test names, or substrings of them")
    return p.parse_args()


class _HeldToGloo(str):
    """The name "geoccl" that the suite's backend checks also take for "gloo"."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        # so that `BACKEND in {"gloo", ...}` (require_backend) finds gloo's entry
        return hash("gloo")


class _EnvView(dict):
    """os.environ while the suite's module is imported: BACKEND reads as a
    _HeldToGloo (os.environ itself can only hold plain strings)."""

    def __init__(self, env, backend):
        super().__init__(env)
        self._backend = backend

    def __getitem__(self, key):
        return self._backend if key == "BACKEND" else super().__getitem__(key)

    def get(self, key, default=None):
        return self._backend if key == "BACKEND" else super().get(key, default)


def _setup_environment(backend, world_size, timeout):
    """Before the suite's modules are imported: they read these once."""
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    if backend == "geoccl":
        # receives without src, which gloo has (geoccl.torch: asked for,
        # because each send then pays a round trip to the store)
        os.environ.setdefault("GEOCCL_TORCH_ANY_SOURCE", "1")
    if "TEMP_DIR" not in os.environ:
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="dist_suite_")
        atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)


def _stub_expecttest():
    """torch's test utilities import expecttest (a PyPI package that
    Debian does not ship) for its TestCase base and golden-output mode,
    which the distributed tests do not use: where it is missing, a module
    that gives unittest's TestCase stands in."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        stub = types.ModuleType("expecttest")
        stub.ACCEPT = False
        stub.TestCase = unittest.TestCase
        sys.modules["expecttest"] = stub


def _import_suite():
    """The suite's test base and TestDistBackend, for os.environ's BACKEND."""
    backend = os.environ["BACKEND"]
    _stub_expecttest()
    # torch's test utilities parse sys.argv when imported; they get none of ours
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        return _import_suite_for(backend)
    finally:
        sys.argv = argv


def _import_suite_for(backend):
    from torch.testing._internal import common_distributed as cd
    if backend == "geoccl":
        import geoccl.torch  # noqa: F401  registers the backend
        for feature in cd.DistTestCases.backend_feature.values():
            if "gloo" in feature:
                feature.add("geoccl")
        cd.DistTestCases.backend_feature["plugin"].add("geoccl")
        real = os.environ
        os.environ = _EnvView(real, _HeldToGloo("geoccl"))
        try:
            from torch.testing._internal.distributed import distributed_test as dt
        finally:
            os.environ = real
    else:
        from torch.testing._internal.distributed import distributed_test as dt
    return dt


_ARGS = _parse() if __name__ == "__main__" else None
if _ARGS is not None and _ARGS.backend:
    _setup_environment(_ARGS.backend, _ARGS.world_size, _ARGS.timeout)

# Spawned ranks import this file again (as __mp_main__) with the parent's
# environment, and need the same test class.
if os.environ.get("BACKEND") in ("gloo", "geoccl"):
    _dt = _import_suite()

    class TestDistBackendWithSpawn(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

    if os.environ["BACKEND"] == "geoccl":
        for _name, _why in GEOCCL_SKIPS.items():
            if hasattr(TestDistBackendWithSpawn, _name):
                setattr(TestDistBackendWithSpawn, _name,
                        unittest.skip(_why)(getattr(TestDistBackendWithSpawn, _name)))


class _Recorder(unittest.TextTestResult):
    """Keeps each test's outcome, time and first line of detail."""

    def __init__(self, *a, out=None, **kw):
        super().__init__(*a, **kw)
        self.outcomes = []
        self._out = out  # written as each test ends, so a long run can be watched
        self._start = 0.0

    def startTest(self, test):
        self._start = time.time()
        super().startTest(test)

    def _keep(self, test, outcome, detail=""):
        secs = time.time() - self._start
        name = test.id().split(".")[-1]
        detail = " ".join(str(detail).split())[:300]
        self.outcomes.append((name, outcome, secs, detail))
        if self._out:
            self._out.write("%s\t%s\t%.1f\t%s\n" % (name, outcome, secs, detail))
            self._out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._keep(test, "pass")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._keep(test, "skip", reason)

    def _problem(self, test, err, outcome):
        text = self._exc_info_to_string(err, test)
        if "timed out after" in text or "Timing out after" in text:
            outcome = "hang"
        # the exception's own line, not the C++ frames torch appends to it
        lines = [l.strip() for l in text.splitlines()]
        said = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Exit)\b.*:", l)]
        self._keep(test, outcome, said[-1] if said else (lines[-1] if lines else ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._problem(test, err, "fail")

    def addError(self, test, err):
        super().addError(test, err)
        self._problem(test, err, "error")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._keep(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._keep(test, "fail", "unexpected success")


def _select(names, wanted):
    if not wanted:
        return names
    exact = [n for n in names if n in wanted]
    rest = [w for w in wanted if w not in names]
    return exact + [n for n in names if n not in exact and any(w in n for w in rest)]


def _run(args):
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    names = _select(list(names), args.tests)
    if args.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    out = open(args.out, "w") if args.out else None
    runner = unittest.TextTestRunner(
        verbosity=2, stream=sys.stderr,
        resultclass=lambda *a, **kw: _Recorder(*a, out=out, **kw))
    result = runner.run(suite)
    if out:
        out.close()
    counts = {}
    for _, outcome, _, _ in result.outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    summary = ", ".join("%d %s" % (counts[k], k) for k in sorted(counts))
    print("%s: %d tests: %s" % (args.backend, len(result.outcomes), summary))
    return 0 if result.wasSuccessful() else 1


def _read(path):
    rows = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2:
                rows[parts[0]] = (parts[1], parts[3] if len(parts) > 3 else "")
    return rows


def _compare(a_path, b_path):
    a, b = _read(a_path), _read(b_path)
    an = os.path.basename(a_path).rsplit(".", 1)[0]
    bn = os.path.basename(b_path).rsplit(".", 1)[0]
    names = sorted(set(a) | set(b))
    width = max([len(n) for n in names] + [4])
    print("%-*s  %-6s  %-6s" % (width, "test", an, bn))
    for n in names:
        print("%-*s  %-6s  %-6s" % (width, n, a.get(n, ("-",))[0], b.get(n, ("-",))[0]))
    for label, rows in ((an, a), (bn, b)):
        counts = {}
        for outcome, _ in rows.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print("%s: %s" % (label, ", ".join("%d %s" % (counts[k], k) for k in sorted(counts))))
    worse = [n for n in names if a.get(n, ("",))[0] == "pass" and b.get(n, ("",))[0] != "pass"]
    print("pass for %s, not for %s: %d" % (an, bn, len(worse)))
    for n in worse:
        outcome, detail = b.get(n, ("missing", ""))
        print("  %s: %s %s" % (n, outcome, detail))
    return 1 if worse else 0


if __name__ == "__main__":
    if _ARGS.compare:
        sys.exit(_compare(*_ARGS.compare))
    if not _ARGS.backend:
        sys.exit("dist_suite.py: --backend or --compare is needed")
    sys.exit(_run(_ARGS))
