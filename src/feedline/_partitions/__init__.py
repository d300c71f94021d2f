"""A partitioned global stream: K pipelines over dealt splits, composed step by step, placed anywhere.

``compose.py`` (:class:`Composed`: the stage that builds each global step from the partitions),
``placement.py`` (a placement opens each partition as a stage; the registry of placements by name,
and ``threads``), ``processes.py`` + ``streams.py`` + ``pool.py`` + ``launch.py`` + ``worker.py``
(worker processes: the placement and the router of their messages, a partition's worker stream and
warm-start handover, the pool, starting one, its body), ``rows.py`` (joining partition batches into one).
"""
