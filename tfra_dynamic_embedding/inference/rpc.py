"""Shards over TensorFlow's own RPC (`tf.distribute.experimental.rpc`): a process serving the
signatures of one SavedModel, and a client that calls it on one of its replicas.

    python -m tfra_dynamic_embedding.inference.rpc --saved-model DIR --address localhost:PORT

    client = ShardClient("shard_0", ["localhost:PORT", "localhost:PORT2"])   # 2 replicas
    pending = [client.call("lookup", {"ids": ids, "segments": segments})]   # issued, not awaited
    outputs = pending[0].result()                                           # {name: tensor}

Every signature of the SavedModel becomes an RPC method of the same name; its inputs travel as
positional tensors in the order of their sorted names (both sides sort), its outputs come back as
the signature's dict. The SavedModel is loaded with stock `tf.saved_model.load`: a shard needs no
op of this package. Requests to several shards run in parallel because `call` only issues the RPC;
`result()` waits for it.

Replicas are stateless copies: calls go round-robin over the replicas that answer. A replica that
fails to answer (unavailable, or over `timeout` seconds) is set aside and the call goes to the
next; it is tried again `retry_after` seconds later, so a restarted replica is used again. When no
replica answers, `result()` raises `tf.errors.UnavailableError` naming the shard and its
addresses -- within about `timeout` seconds per replica, never a hang.
"""

import argparse
import os
import sys
import threading
import time

READY = "tfra-de shard ready"
# Status codes of the RPC ops that mean "this replica did not answer" (gRPC's codes).
_UNAVAILABLE, _DEADLINE_EXCEEDED = 14, 4


def register_signatures(server, loaded):
    """Registers every signature of `loaded` (a `tf.saved_model.load` result) on `server` as a
    method of the same name; returns the names."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    names = sorted(loaded.signatures)
    for name in names:
        function = loaded.signatures[name]
        specs = function.structured_input_signature[1]
        order = sorted(specs)

        def method(*args, function=function, order=order):
            return function(**dict(zip(order, args)))

        server.register(name, tf.function(method, input_signature=[specs[n] for n in order]))
    return names


def serve(saved_model_dir, address, parent_pid=None):
    """Serves the signatures of the SavedModel in `saved_model_dir` at `address` until
    SIGTERM/SIGINT (or until process `parent_pid` is gone)."""
    from tfra_dynamic_embedding.distributed import server as server_lib  # pylint: disable=import-outside-toplevel
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    server_lib.exit_on_stop_signals(parent_pid)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    loaded = tf.saved_model.load(saved_model_dir)
    server = tf.distribute.experimental.rpc.Server.create("grpc", address)
    methods = register_signatures(server, loaded)
    server.start()
    print(f"{READY}: {saved_model_dir} at {address} (methods: {', '.join(methods)})", flush=True)
    while True:
        time.sleep(0.2)  # short: the handler of a stop signal runs when this thread wakes


class ShardClient:
    """Calls the methods of one shard, served by `addresses` (its replicas), round-robin.

    Args:
      name: the shard's name, used in errors.
      addresses: "host:port" of each replica.
      timeout: seconds one replica may take to answer a call (or a connection).
      retry_after: seconds before a replica that failed is tried again.
    """

    def __init__(self, name, addresses, timeout=5.0, retry_after=1.0):
        if isinstance(addresses, str) or not addresses:
            raise ValueError(f"addresses of shard {name!r} must be a non-empty list of "
                             f"'host:port'; got {addresses!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds; got {timeout!r}")
        self.name = name
        self.addresses = list(addresses)
        self.timeout = float(timeout)
        self.retry_after = float(retry_after)
        self.calls = [0] * len(self.addresses)   # answered calls per replica
        self._clients = [None] * len(self.addresses)
        self._failed_at = [None] * len(self.addresses)
        self._next = 0
        self._lock = threading.Lock()

    def call(self, method, inputs):
        """Issues `method` with `inputs` ({input name: tensor}) on the next live replica and
        returns a `PendingCall` (its `result()` waits)."""
        args = [inputs[k] for k in sorted(inputs)]
        return PendingCall(self, method, args, self.issue(method, args, tried=()))

    def issue(self, method, args, tried):
        """(replica index, StatusOrResult, error) of the first replica not in `tried` that takes
        the call; (None, None, last error) when none does."""
        error = None
        for index in self._order(tried):
            client, error = self._client(index)
            if client is None:
                continue
            if not hasattr(client, method):
                raise ValueError(f"shard {self.name!r} has no method {method!r}")
            return index, getattr(client, method)(*args), None
        return None, None, error

    def _order(self, tried):
        """Replica indices to try, round-robin, those failed recently last but never skipped
        entirely (a restarted replica is found again)."""
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.addresses)
            now = time.monotonic()
            ring = [(start + k) % len(self.addresses) for k in range(len(self.addresses))]
            ring = [i for i in ring if i not in tried]
            fresh = [i for i in ring if self._failed_at[i] is None
                     or now - self._failed_at[i] >= self.retry_after]
            return fresh + [i for i in ring if i not in fresh]

    def _client(self, index):
        with self._lock:
            client = self._clients[index]
        if client is not None:
            return client, None
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        try:
            client = tf.distribute.experimental.rpc.Client.create(
                "grpc", self.addresses[index], timeout_in_ms=int(self.timeout * 1000))
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
            self.mark_failed(index)
            return None, error
        with self._lock:
            self._clients[index] = client
            self._failed_at[index] = None
        return client, None

    def count(self, index):
        with self._lock:
            self.calls[index] += 1

    def mark_failed(self, index):
        with self._lock:
            self._clients[index] = None
            self._failed_at[index] = time.monotonic()

    def unavailable(self, method, error):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        return tf.errors.UnavailableError(
            None, None, f"shard {self.name!r} did not answer {method!r} on any replica "
            f"({', '.join(self.addresses)}) within {self.timeout:g} s each: {error}")


class PendingCall:
    """An issued call; `result()` waits for its outputs (see `ShardClient`)."""

    def __init__(self, shard, method, args, issued):
        self._shard, self._method, self._args = shard, method, args
        self._index, self._status, self._error = issued
        self._tried = () if self._index is None else (self._index,)

    def result(self):
        """{output name: tensor} of the call; raises UnavailableError naming the shard when no
        replica answered, or the shard's own error (e.g. InvalidArgumentError)."""
        shard = self._shard
        while True:
            if self._status is None:
                raise shard.unavailable(self._method, self._error)
            if bool(self._status.is_ok()):
                shard.count(self._index)
                return self._status.get_value()
            code, message = self._status.get_error()
            code, message = int(code), message.numpy().decode(errors="replace")
            if code not in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
                import tensorflow as tf  # pylint: disable=import-outside-toplevel
                raise tf.errors.InvalidArgumentError(
                    None, None, f"shard {shard.name!r} ({shard.addresses[self._index]}) failed "
                    f"{self._method!r}: {message}")
            shard.mark_failed(self._index)
            self._error = f"{shard.addresses[self._index]}: {message.strip()}"
            index, self._status, error = shard.issue(
                self._method, self._args, self._tried)
            if index is None:
                self._status, self._error = None, error or self._error
            else:
                self._index, self._tried = index, self._tried + (index,)


def main(argv=None):
    """`python -m tfra_dynamic_embedding.inference.rpc --saved-model DIR --address HOST:PORT`."""
    parser = argparse.ArgumentParser(prog="python -m tfra_dynamic_embedding.inference.rpc",
                                     description="Serve a SavedModel's signatures over TF RPC.")
    parser.add_argument("--saved-model", required=True, metavar="DIR")
    parser.add_argument("--address", required=True, metavar="HOST:PORT")
    parser.add_argument("--parent-pid", type=int, metavar="PID",
                        help="exit when process PID is gone")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.saved_model):
        print(f"error: --saved-model {args.saved_model!r} is not a directory", file=sys.stderr)
        return 2
    serve(args.saved_model, args.address, args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
