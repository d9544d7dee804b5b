"""Cluster specs: `{"ps": ["host:port", ...], "worker": [...], "chief": [...]}` from a JSON file,
a JSON string or the `TF_CONFIG` environment variable; free loopback ports for local clusters.

Imports no TensorFlow, so that `tfra-de` and the launcher of a local cluster start fast.

Example:
    >>> import tempfile
    >>> spec = local_spec(ps=2, worker=1)
    >>> spec
    {'ps': ['localhost:...', 'localhost:...'], 'worker': ['localhost:...']}
    >>> tmp = tempfile.TemporaryDirectory()
    >>> write_spec(spec, os.path.join(tmp.name, "cluster.json"))
    >>> environ = {"TF_CONFIG": tf_config(spec, "ps", 1)}     # job and task from TF_CONFIG
    >>> server_target(os.path.join(tmp.name, "cluster.json"), None, None, environ)[1:]
    ('ps', 1)
    >>> tmp.cleanup()
"""

import json
import os
import random
import socket

JOBS = ("chief", "worker", "ps", "evaluator")


def free_port():
    """A TCP port on loopback that nothing listens on now, below the kernel's ephemeral range.

    A port the OS hands out for `bind(0)` may be handed out again to another process (a TF
    client's own gRPC server, another test) before the server meant for it starts; a port below
    that range is only taken by whoever asks for it by number. Falls back to the OS's pick when
    the range leaves no room below it.
    """
    low = _ephemeral_low()
    if low > 12000:
        pick = random.SystemRandom()   # not the (often seeded) global generator
        for _ in range(200):
            port = pick.randrange(10000, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (Linux; 32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("localhost", port))
        except OSError:
            return False
    return True


def local_spec(**job_sizes):
    """A cluster spec on loopback with `job_sizes[job]` tasks per job, each on a free port.

    Example:
        >>> spec = local_spec(ps=2, worker=2)
        >>> spec
        {'ps': ['localhost:...', 'localhost:...'], 'worker': ['localhost:...', 'localhost:...']}
        >>> len({address for addresses in spec.values() for address in addresses})   # distinct
        4
    """
    spec, taken = {}, set()
    for job, size in job_sizes.items():
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"{job} must be a non-negative task count; got {size!r}")
        if size:
            spec[job] = []
            while len(spec[job]) < size:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    spec[job].append(f"localhost:{port}")
    return spec


def check_spec(spec):
    """`spec` itself if it is a valid cluster spec (job -> list of "host:port"), else ValueError."""
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"cluster must be a non-empty dict of job -> addresses; got {spec!r}")
    for job, addresses in spec.items():
        if not isinstance(job, str) or not job:
            raise ValueError(f"cluster job names must be non-empty strings; got {job!r}")
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(f"cluster job {job!r} needs a non-empty list of addresses; "
                             f"got {addresses!r}")
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"cluster job {job!r}: address must be 'host:port'; "
                                 f"got {address!r}")
    return spec


def load_spec(source):
    """A cluster spec from a JSON file path or a JSON string; a TF_CONFIG-shaped document
    (`{"cluster": {...}, "task": {...}}`) gives its "cluster"."""
    text = source
    if not source.lstrip().startswith("{"):
        with open(source, encoding="utf-8") as f:
            text = f.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"cluster {source!r} is not valid JSON: {error}") from None
    if isinstance(document, dict) and "cluster" in document:
        document = document["cluster"]
    return check_spec(document)


def write_spec(spec, path):
    """Writes `spec` as JSON to `path` (for `tfra-de server --cluster path`)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(check_spec(spec), f, indent=1)


def tf_config(spec, job, task):
    """The `TF_CONFIG` value (a JSON string) of task `task` of `job` in `spec`."""
    return json.dumps({"cluster": check_spec(spec), "task": {"type": job, "index": task}})


def server_target(cluster=None, job=None, task=None, environ=None):
    """(spec, job, task) of the server to start: explicit arguments first, then `TF_CONFIG`.

    Raises ValueError naming what is missing or not in the spec.
    """
    environ = os.environ if environ is None else environ
    config = {}
    if environ.get("TF_CONFIG"):
        try:
            config = json.loads(environ["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not cluster and not config.get("cluster"):
        raise ValueError("no cluster: pass --cluster (a JSON file or string) or set TF_CONFIG")
    spec = load_spec(cluster) if cluster else check_spec(config["cluster"])
    task_config = config.get("task") or {}
    job = job if job is not None else task_config.get("type")
    task = task if task is not None else task_config.get("index")
    if job is None or task is None:
        raise ValueError("the server's job and task are needed: pass --job and --task, or set "
                         "TF_CONFIG's task {'type': ..., 'index': ...}")
    if job not in spec:
        raise ValueError(f"job {job!r} is not in the cluster (jobs: {sorted(spec)})")
    task = int(task)
    if not 0 <= task < len(spec[job]):
        raise ValueError(f"task {task} is out of range for job {job!r} "
                         f"({len(spec[job])} task(s))")
    return spec, job, task
