"""The stage protocol: recipes, stateful iterators, records, counter-based randomness."""
