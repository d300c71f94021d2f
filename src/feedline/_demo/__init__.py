"""The demo behind ``feedline demo`` / ``make demo``: an embedded corpus, tiny models, a training loop."""
