"""The warm ClientApp runtime of a SuperNode (``hetfed-supernode --runtime warm``).

Flower 1.42 starts one ``flwr-clientapp`` process per message (Python, torch and the
app imported anew, the silo's data loaded anew) and sleeps in fixed places (idle pull
3 s, reply waits 0.5 s, object-pull backoff from 1 s). The warm runtime keeps Flower's
SuperNode and its semantics and changes only who runs the ClientApp and how long the
SuperNode waits:

- :mod:`hetfed.runtime.worker`: one long-lived worker per SuperNode claims the
  SuperNode's ClientApp tasks on its Runtime API and runs the same ClientApp callable
  in-process, with Flower's own task-input, reply and task-output calls;
- :mod:`hetfed.runtime.waits`: the SuperNode's waits, short while messages flow and
  back at Flower's own values when idle;
- :mod:`hetfed.runtime.node_key`: a self-registering SuperNode signs with a P-256 key
  (verified ~7x faster by the SuperLink than Flower's P-384);
- :mod:`hetfed.runtime.supernode`: the launcher: self-test, waits, Flower's own
  ``flower-supernode`` in-process with ``--isolation process``, and the supervised worker;
- :mod:`hetfed.runtime.internals`: the self-test of every Flower internal the above
  relies on; any miss -> stock Flower, said in one line;
- :mod:`hetfed.runtime.pinning`: app pinning, in both runtimes: the SuperNode (and the
  warm worker) run only the app builds (FAB hashes) the silo approved;
- :mod:`hetfed.runtime.deferred_imports`: the worker imports Flower without FastAPI, pydantic
  and requests, which Flower's client modules name but a worker never uses (loaded if used).

On the SuperLink's side (``hetfed-superlink``, :mod:`hetfed.runtime.superlink`): Flower's
SuperLink with its middleware gated by API path (:mod:`hetfed.runtime.fast_path` for Fleet and
Runtime calls) and a SuperNode's pull answered from its own complete messages
(:mod:`hetfed.runtime.pull`), each self-tested with the same one-line fallback.
"""

import os


def telemetry_off() -> None:
    """This process and the Flower processes it starts send no usage events to Flower's telemetry
    server (``FLWR_TELEMETRY_ENABLED=0``) unless the variable is set already: a silo tells no third
    party that it runs, and on a machine without internet each event costs a failed HTTPS attempt
    (an SSL context each: py-spy found them in a SuperNode's busy rounds). Call before importing flwr:
    Flower reads the variable once, at import."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
