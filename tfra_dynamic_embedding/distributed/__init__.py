"""Running on a real TensorFlow cluster: cluster specs, the server entry point, local clusters.

TensorFlow's own distributed runtime is the engine: a PS or worker is a plain
`tf.distribute.Server` in a process that has loaded this package's kernels. See
docs/distributed.md.

    cluster.py     cluster specs from JSON files or TF_CONFIG, free loopback ports
    server.py      `tfra-de server`: one PS/worker server with the kernels loaded
    local.py       LocalCluster: server processes on loopback (tests, demo, benchmarks)
    failures.py    TF1 sessions that fail in bounded time when a PS dies (StepDeadlineHook)

Importing this package imports no TensorFlow; its modules do so when used.
"""
