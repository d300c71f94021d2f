"""The spec: :class:`Spec` (``spec.py``: loading, validation, the hash, the registries) and its sections (``sections.py``)."""

from feedline._spec.files import read_spec_file
from feedline._spec.sections import (
    BatchingSpec,
    MixSpec,
    ParallelSpec,
    ShuffleSpec,
    SourceSpec,
    TaskSpec,
    TokenizerSpec,
    TokensSpec,
    TransformSpec,
)
from feedline._spec.spec import NOT_HASHED, Registry, Spec, join_root, portable_path, use_registry

__all__ = ["NOT_HASHED", "BatchingSpec", "MixSpec", "ParallelSpec", "Registry", "ShuffleSpec", "SourceSpec", "Spec", "TaskSpec",
           "TokenizerSpec", "TokensSpec", "TransformSpec", "join_root", "portable_path", "read_spec_file", "use_registry"]
