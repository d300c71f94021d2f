"""The offline tools, as functions (each is also a ``feedline`` command; ``docs/tools.md``).

* :func:`pack` / :func:`pack_file`: tokenize and pack a corpus into Arrow/Parquet/JSONL/msgpack rows;
  :func:`export`: write a spec's examples or batches to files.
* :func:`shard`: split a corpus into shuffled shards; :func:`count_tokens`: word counts for a vocabulary.
* :func:`train_tokenizer` / :func:`train_sentencepiece`: train a tokenizer on a corpus.
* :func:`label_vocabulary`: a classification spec's labels in id order (for ``id2label``);
  :func:`join_predictions`: join inference outputs back to their records by key.
* :func:`write_indexed_dataset`: write token documents as a Megatron-LM ``.bin``/``.idx`` pair.
* :func:`ensure_demo_assets`: the embedded demo corpus and its tokenizer, built on first use.

Example::

    from feedline.tools import train_tokenizer
    train_tokenizer(["corpus.jsonl"], "tok/", kind="bpe", vocab_size=8000)
"""

from feedline._demo.corpus import ensure_demo_assets
from feedline._sources.megatron import write_indexed_dataset
from feedline._tools.count_tokens import count_tokens
from feedline._tools.export import export
from feedline._tools.labels import label_vocabulary
from feedline._tools.pack import pack, pack_file
from feedline._tools.predictions import join_predictions
from feedline._tools.shard import ShardReport, shard
from feedline._tools.train_sentencepiece import train_sentencepiece
from feedline._tools.train_tokenizer import train_tokenizer

__all__ = [
    "ShardReport",
    "count_tokens",
    "ensure_demo_assets",
    "export",
    "join_predictions",
    "label_vocabulary",
    "pack",
    "pack_file",
    "shard",
    "train_sentencepiece",
    "train_tokenizer",
    "write_indexed_dataset",
]
