"""kolo.common: what every framework binding shares, once.

As Horovod keeps ``horovod/common``, the framework modules (``kolo.torch``,
``kolo.tensorflow``, ``kolo.keras``) are thin adapters over these:

- :mod:`.basics`: init and topology, process sets, the reduction ops, the
  timeline and the build flags;
- :mod:`.handles`: Horovod's int handles (``poll``/``synchronize``) over
  kolo handles, and grouped submission;
- :mod:`.util`: operation names, argument checks and mismatch errors;
- :mod:`.objects`: ``broadcast_object`` and ``allgather_object`` (pickled
  bytes as numpy arrays);
- :mod:`.compression`: the ``Compression`` specs, cast through a framework
  adapter;
- :mod:`.elastic`: elastic state and the reset loop (``elastic.run``).

None of them imports a framework.
"""
