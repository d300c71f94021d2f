"""A partitioned global stream: K pipelines over dealt splits, composed step by step, placed anywhere.

``compose.py`` (:class:`Composed`: the stage that builds each global step from the partitions),
``placement.py`` (the :class:`Placement` interface, the registry of placements by name, and
``threads``), ``processes.py`` + ``launch.py`` + ``worker.py`` (worker processes: the placement,
starting one, its body), ``rows.py`` (joining partition batches into one).
"""
