"""pip's build of GeoCCL's Python package (PEP 517, through setuptools).

    pip install --no-build-isolation .     # into the environment it is for

installs the package geoccl/ with its extension geoccl._C, compiled against
the torch that the building interpreter imports, and a copy of libgeoccl in
geoccl/lib/, which _C finds through its rpath $ORIGIN/lib. Both come from
GeoCCL's own autotools build, which this file drives rather than repeats:
configure --with-python=<this interpreter> (which finds that torch's
headers, C++ standard and ABI) in a build folder, then the Makefile's
target install-geoccl-python into setuptools' build folder.

torch must be importable while building, hence --no-build-isolation: pip's
isolated environment has no torch, and one installed there would be
another torch than the one the package runs with.

A checkout gets configure from autogen.sh (autoconf, automake, libtool); an
sdist carries it. Environment:
  GEOCCL_BUILD_DIR       folder for everything the build writes (default:
                         build-pip/ in the source tree): setuptools' files,
                         the egg-info and the autotools build, which a
                         later build reuses when configure's arguments are
                         the same
  GEOCCL_CONFIGURE_ARGS  more arguments for configure (--without-cuda, ...)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.abspath(os.environ.get("GEOCCL_BUILD_DIR") or os.path.join(HERE, "build-pip"))


def _fail(msg):
    raise SystemExit("geoccl: " + msg)


def _run(cmd, cwd):
    print("geoccl: (cd %s && %s)" % (cwd, " ".join(shlex.quote(c) for c in cmd)), flush=True)
    try:
        subprocess.check_call(cmd, cwd=cwd)
    except (OSError, subprocess.CalledProcessError) as e:
        _fail("%s failed: %s" % (cmd[0], e))


def _version():
    with open(os.path.join(HERE, "configure.ac")) as f:
        m = re.search(r"AC_INIT\(\[geoccl\],\s*\[([^\]]+)\]", f.read())
    if not m:
        _fail("configure.ac has no AC_INIT([geoccl], [version])")
    return m.group(1)


def _generated_files():
    """configure and Makefile.in: an sdist carries them; a checkout gets them
    from autogen.sh, again when their sources are newer (as the Makefile's
    own rules would, which this build turns off)."""
    m4 = os.path.join(HERE, "config", "m4")
    sources = {
        "configure": ["configure.ac"] + [os.path.join("config", "m4", f)
                                         for f in os.listdir(m4) if f.endswith(".m4")],
        "Makefile.in": ["Makefile.am", "configure.ac"],
    }

    def stale(out, ins):
        out = os.path.join(HERE, out)
        if not os.path.exists(out):
            return True
        t = os.path.getmtime(out)
        return any(os.path.getmtime(os.path.join(HERE, f)) > t for f in ins)

    missing = not all(os.path.exists(os.path.join(HERE, f)) for f in sources)
    if not missing and not any(stale(o, i) for o, i in sources.items()):
        return
    if not shutil.which("autoreconf"):
        if missing:
            _fail("%s has no configure (a checkout): autogen.sh makes it, with autoconf, "
                  "automake and libtool; or install from an sdist, which carries it" % HERE)
        return  # older than their sources but usable: an sdist unpacked oddly
    _run(["sh", os.path.join(HERE, "autogen.sh")], HERE)


def _not_configured_in_place():
    if os.path.exists(os.path.join(HERE, "config.status")):
        _fail("%s is configured in place (config.status): configure then refuses the build "
              "folder of its own that this build needs; `make distclean` there first, or "
              "build from another checkout or an sdist" % HERE)


class BuildGeoccl(build_ext):
    """Builds geoccl._C and libgeoccl with GeoCCL's autotools build and puts
    them, with the package's Python files and geoccl/_build.py, into
    setuptools' build folder."""

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"  # the Makefile's name

    def run(self):
        if self.inplace:
            _fail("editable installs are not supported: pip install --no-build-isolation "
                  "<source> (without -e)")
        try:
            import torch  # noqa: F401
        except ImportError as e:
            _fail("%s cannot import torch (%s). geoccl._C is compiled against the torch of "
                  "the environment that builds it: install torch there, then build with "
                  "isolation off, pip install --no-build-isolation <source>"
                  % (sys.executable, e))
        _generated_files()
        _not_configured_in_place()
        build = os.path.join(BUILD_DIR, "autotools")
        os.makedirs(build, exist_ok=True)
        args = [os.path.join(HERE, "configure"), "--prefix=" + os.path.join(build, "prefix"),
                "--with-python=" + sys.executable, "--disable-maintainer-mode"]
        args += shlex.split(os.environ.get("GEOCCL_CONFIGURE_ARGS", ""))
        stamp = os.path.join(build, "setup-configure-args")
        status = os.path.join(build, "config.status")
        try:
            with open(stamp) as f:
                same = f.read() == "\n".join(args) and \
                    os.path.getmtime(status) >= os.path.getmtime(args[0])
        except OSError:
            same = False
        if not same:
            _run(args, build)
            with open(stamp, "w") as f:
                f.write("\n".join(args))
        make = [os.environ.get("MAKE", "make")]
        if "-j" not in os.environ.get("MAKEFLAGS", ""):
            make.append("-j%d" % (os.cpu_count() or 1))
        dest = os.path.join(os.path.abspath(self.build_lib), "geoccl")
        _run(make + ["install-geoccl-python", "GEOCCL_PYTHON_LIBDIR=lib", "DESTDIR=",
                     "pkgpyexecdir=" + dest], build)


class SdistGeoccl(sdist):
    """An sdist with configure and Makefile.in (MANIFEST.in), generated here
    if need be, so that it builds without autotools."""

    def run(self):
        _generated_files()
        _not_configured_in_place()
        sdist.run(self)


os.makedirs(BUILD_DIR, exist_ok=True)  # egg_info wants its egg_base to exist
setup(
    name="geoccl",
    version=_version(),
    description="GeoCCL's torch.distributed backend (\"geoccl\") and its library",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.7",
    # No install_requires torch: the extension fits only the torch it was
    # built against, which is already there; a resolver must not swap it.
    packages=["geoccl"],
    ext_modules=[Extension("geoccl._C", sources=[])],
    cmdclass={"build_ext": BuildGeoccl, "sdist": SdistGeoccl},
    zip_safe=False,
    options={"build": {"build_base": os.path.join(BUILD_DIR, "setuptools")},
             "egg_info": {"egg_base": BUILD_DIR}},
)
