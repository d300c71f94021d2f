"""Reading: files and URLs, formats, splits, mixtures and shuffling.

One module per concept: :mod:`files` (paths, globs, URLs, codecs), :mod:`reader` (the reader
protocol and the format registry), one module per format family (:mod:`text`, :mod:`jsonl`,
...), :mod:`source` (one source over its splits and epochs), :mod:`mix` (weighted mixtures),
:mod:`shuffle` (the seeded buffer) and :mod:`report` (rejected-record accounting).
"""
