"""Batching: examples to global batches (pad, bucket, pack, concat) and global steps to rank slices."""
