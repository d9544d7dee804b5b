#!/usr/bin/env python3
"""Build the native op libraries against the installed TensorFlow:
`tfra_dynamic_embedding/tables/_tfra_de_ops.so` from `cc/ops/*.cc`, and the Redis tables'
`tfra_dynamic_embedding/tables/_tfra_de_redis_ops.so` from `cc/redis/*.cc` (linked with hiredis;
skipped, with a message, where hiredis' headers are not installed: `make system-deps`). Two
libraries, so that the main one keeps loading on machines without libhiredis.

This is the one place that knows how the op libraries are compiled with g++ against the installed
TensorFlow; `setup.py` (pip install, editable or not) and the Makefile (`make ops`) both call it.
Bazel builds the same sources its own way (see the root BUILD file).

    python tools/build_ops.py            # incremental: recompiles only changed sources
    python tools/build_ops.py --force    # recompile everything
    python tools/build_ops.py --check    # exit 1 if a rebuild is needed, build nothing
    python tools/build_ops.py --library redis   # only one of them (ops, redis; default all)

Each source is compiled to its own object in `build/tfra_de_ops/` (in parallel, one job per core),
then everything is linked into ONE shared library. Header dependencies are tracked with `-MMD`, and
the compile flags are re-read from `tf.sysconfig` whenever the installed TensorFlow changes, so an
up-to-date library is detected without importing TensorFlow (about 0.1 s).

With no `cc/ops/*.cc` at all nothing is built; the package imports without the library.
Environment: CXX (compiler, default g++), TFRA_DE_BUILD_JOBS (parallel jobs),
TFRA_DE_EXTRA_CXXFLAGS (appended to every compile, e.g. "-g -O0").
"""

import argparse
import collections
import concurrent.futures
import glob
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY_RELPATH = os.path.join("tfra_dynamic_embedding", "tables", "_tfra_de_ops.so")
SRC_RELDIR = os.path.join("cc", "ops")
BUILD_RELDIR = os.path.join("build", "tfra_de_ops")

# One op library: its sources, output, object directory, extra link flags, and the header whose
# absence skips it (None: always built).
Library = collections.namedtuple(
    "Library", "name src_reldir library_relpath build_reldir ldflags requires")
OPS = Library("ops", SRC_RELDIR, LIBRARY_RELPATH, BUILD_RELDIR, [], None)
# hiredis (Debian's libhiredis-dev) for the Redis tables' kernels. Its headers are searched in the
# standard include directories, which g++ and Bazel see without flags.
HIREDIS_HEADERS = ("/usr/include/hiredis/hiredis.h", "/usr/local/include/hiredis/hiredis.h")
REDIS = Library("redis", os.path.join("cc", "redis"),
                os.path.join("tfra_dynamic_embedding", "tables", "_tfra_de_redis_ops.so"),
                os.path.join("build", "tfra_de_redis_ops"), ["-lhiredis"], HIREDIS_HEADERS)
LIBRARIES = (OPS, REDIS)

# Our own flags; TensorFlow's compile/link flags are added from tf.sysconfig.
# -ffp-contract=off: a*b+c rounds twice, as in TF's kernels, so the keyed initial rows drawn in C++
# equal those of tables/keyed_random.py's TF ops bit for bit (cc/ops/de_keyed.h) on any -march.
BASE_CXXFLAGS = ["-std=c++17", "-fPIC", "-O3", "-ffp-contract=off", "-Wno-deprecated-declarations"]
# GCC >= 12 warns about Eigen's use of hardware_destructive_interference_size in every TF header.
GCC_EXTRA_CXXFLAGS = ["-Wno-interference-size"]
BASE_LDFLAGS = ["-shared"]


class BuildError(RuntimeError):
    pass


def _log(msg):
    print(f"[build_ops] {msg}", flush=True)


def _tf_identity():
    """Cheap fingerprint of the installed TensorFlow (no import): its location and framework lib."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(
            f"TensorFlow is not installed for {sys.executable}; "
            "install tensorflow-cpu first (the op library is built against it)")
    tf_dir = os.path.realpath(list(spec.submodule_search_locations)[0])
    parts = [tf_dir, sys.version.split()[0]]
    for name in ("libtensorflow_framework.so.2", "libtensorflow_framework.so"):
        lib = os.path.join(tf_dir, name)
        if os.path.exists(lib):
            st = os.stat(lib)
            parts += [name, str(st.st_size), str(st.st_mtime_ns)]
            break
    return "|".join(parts)


def _tf_flags():
    """(compile_flags, link_flags) from tf.sysconfig, read in a child process to keep this one light."""
    code = ("import json, tensorflow as tf; "
            "print(json.dumps([tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise BuildError("could not read tf.sysconfig flags:\n" + proc.stderr[-4000:])
    compile_flags, link_flags = json.loads(proc.stdout.strip().splitlines()[-1])
    return compile_flags, link_flags


def _is_gcc(cxx):
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"C++ compiler {cxx!r} not found ({e}); install g++ or set CXX")
    return "clang" not in out.lower()


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _deps_from_depfile(path):
    """Dependencies listed in a g++ -MMD file (make syntax), or None when missing/unreadable."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    text = text.replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    # Paths with spaces are escaped as '\ '; keep them together.
    return [p.replace("\0", " ") for p in deps.replace("\\ ", "\0").split()]


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _object_is_fresh(obj, depfile):
    obj_time = _mtime(obj)
    if obj_time is None:
        return False
    deps = _deps_from_depfile(depfile)
    if not deps:
        return False
    for dep in deps:
        t = _mtime(dep)
        if t is None or t > obj_time:
            return False
    return True


def sources(root=ROOT, library=OPS):
    return sorted(glob.glob(os.path.join(root, library.src_reldir, "*.cc")))


def missing_requirement(library):
    """None when `library` can be built here, else why not (its header is missing)."""
    if library.requires is None or any(os.path.exists(h) for h in library.requires):
        return None
    return (f"{library.requires[0]} not found: the {library.name} op library is not built "
            f"(install libhiredis-dev: `make system-deps`)")


def _object_name(src):
    base = os.path.splitext(os.path.basename(src))[0]
    return base + "." + hashlib.sha1(src.encode()).hexdigest()[:8]


def build(root=ROOT, output=None, build_dir=None, jobs=None, force=False, check=False, quiet=False,
          library=OPS):
    """Builds (if needed) one op library (`OPS` or `REDIS`); returns its path, or None when there
    are no sources or its requirement (hiredis' header) is missing.

    With check=True builds nothing and returns True/False: whether the library is up to date.
    """
    root = os.path.abspath(root)
    output = os.path.abspath(output or os.path.join(root, library.library_relpath))
    build_dir = os.path.abspath(build_dir or os.path.join(root, library.build_reldir))
    log = (lambda m: None) if quiet else _log
    srcs = sources(root, library)
    if not srcs:
        if check:
            return True
        log(f"no {library.src_reldir}/*.cc sources: nothing to build")
        return None
    missing = missing_requirement(library)
    if missing:
        if check:
            return True
        log(missing)
        return None

    os.makedirs(build_dir, exist_ok=True)
    config_path = os.path.join(build_dir, "config.json")
    config = _read_json(config_path) or {}
    identity = _tf_identity()
    extra = shlex.split(os.environ.get("TFRA_DE_EXTRA_CXXFLAGS", ""))
    cxx = os.environ.get("CXX", "g++")
    settings = {"format": 2, "identity": identity, "cxx": cxx, "extra": extra, "base": BASE_CXXFLAGS,
                "root": root}
    if library.ldflags:   # (only then: the main library's settings, and objects, stay as they were)
        settings["ldflags"] = library.ldflags
    if config.get("settings") != settings or "compile" not in config:
        if check:
            return False
        compile_flags, link_flags = _tf_flags()
        config = {"settings": settings, "compile": compile_flags, "link": link_flags,
                  "gcc": _is_gcc(cxx)}
        force = True  # new compiler/TF/flags: every object is stale
        for stale in glob.glob(os.path.join(build_dir, "*.o")):
            os.remove(stale)
        _write_json(config_path, config)  # so a failed compile does not force a full rebuild
    cxxflags = (BASE_CXXFLAGS + (GCC_EXTRA_CXXFLAGS if config.get("gcc") else [])
                + config["compile"] + ["-I" + root] + extra)
    ldflags = BASE_LDFLAGS + config["link"] + library.ldflags

    todo, objects = [], []
    for src in srcs:
        stem = os.path.join(build_dir, _object_name(src))
        obj, dep = stem + ".o", stem + ".d"
        objects.append(obj)
        if force or not _object_is_fresh(obj, dep):
            todo.append((src, obj, dep))

    out_time = _mtime(output)
    linked = config.get("linked")
    need_link = (bool(todo) or out_time is None or linked != [output] + objects
                 or any((_mtime(o) or 0) > out_time for o in objects))
    if check:
        return not need_link
    if not need_link:
        log(f"up to date: {os.path.relpath(output, root)}")
        return output

    if todo:
        jobs = jobs or int(os.environ.get("TFRA_DE_BUILD_JOBS", "0") or 0) or os.cpu_count() or 1
        log(f"compiling {len(todo)} of {len(srcs)} source(s) with {min(jobs, len(todo))} job(s)")

        def compile_one(item):
            src, obj, dep = item
            tmp_obj = f"{obj}.tmp.{os.getpid()}"
            cmd = [cxx] + cxxflags + ["-MMD", "-MF", dep, "-MT", obj, "-c", src, "-o", tmp_obj]
            start = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_obj, obj)
            else:
                for p in (tmp_obj, dep):
                    if os.path.exists(p):
                        os.remove(p)
            return src, cmd, proc, time.time() - start

        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for src, cmd, proc, secs in pool.map(compile_one, todo):
                rel = os.path.relpath(src, root)
                if proc.returncode != 0:
                    failures.append(rel)
                    print(f"[build_ops] FAILED {rel}:\n  {shlex.join(cmd)}\n{proc.stderr}",
                          file=sys.stderr, flush=True)
                else:
                    log(f"compiled {rel} ({secs:.1f} s)")
                    if proc.stderr.strip() and not quiet:
                        print(proc.stderr, file=sys.stderr, flush=True)
        if failures:
            raise BuildError(f"compilation failed: {', '.join(failures)}")

    os.makedirs(os.path.dirname(output), exist_ok=True)
    tmp_out = f"{output}.tmp.{os.getpid()}"
    cmd = [cxx] + objects + ["-o", tmp_out] + ldflags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if os.path.exists(tmp_out):
            os.remove(tmp_out)
        raise BuildError(f"link failed:\n  {shlex.join(cmd)}\n{proc.stderr}")
    # Atomic replace: processes that already loaded the old library keep their mapping intact.
    os.replace(tmp_out, output)
    config["linked"] = [output] + objects
    _write_json(config_path, config)
    log(f"linked {os.path.relpath(output, root)} from {len(objects)} object(s)")
    return output


def build_all(root=ROOT, jobs=None, force=False, check=False, quiet=False, base=None):
    """Builds every op library (`LIBRARIES`); returns the paths built. `base`: the directory the
    libraries' relative paths are under (default: `root`; setup.py passes its build_lib).
    With check=True returns whether all are up to date."""
    results = []
    for library in LIBRARIES:
        output = os.path.join(base, library.library_relpath) if base else None
        results.append(build(root, output, None, jobs, force, check, quiet, library))
    if check:
        return all(results)
    return [r for r in results if r]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--library", choices=["all"] + [lib.name for lib in LIBRARIES],
                        default="all", help="which op library (default: all)")
    parser.add_argument("--output", help="library path (one --library only; default: under "
                                         "<root>/tfra_dynamic_embedding/tables/)")
    parser.add_argument("--build-dir", help="object directory (one --library only; default: "
                                            "<root>/build/<library>/)")
    parser.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: cores)")
    parser.add_argument("--force", action="store_true", help="recompile every source")
    parser.add_argument("--check", action="store_true",
                        help="build nothing; exit 0 if up to date, 1 if a rebuild is needed")
    args = parser.parse_args(argv)
    if args.library == "all" and (args.output or args.build_dir):
        parser.error("--output and --build-dir need one --library (ops or redis)")
    try:
        if args.library == "all":
            result = build_all(args.root, args.jobs, args.force, args.check)
        else:
            library = next(lib for lib in LIBRARIES if lib.name == args.library)
            result = build(args.root, args.output, args.build_dir, args.jobs, args.force,
                           args.check, library=library)
    except BuildError as e:
        print(f"[build_ops] error: {e}", file=sys.stderr)
        return 1
    if args.check:
        return 0 if result else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
