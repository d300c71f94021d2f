"""The Ray backend: the Ray task-map engine (:mod:`.map`, :mod:`.runtime`) and Ray Train helpers (:mod:`.train`)."""
