"""Offline tools behind CLI commands: tokenizer training, export, packing, sharding, token counting."""
