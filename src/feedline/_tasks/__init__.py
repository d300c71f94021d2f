"""The NLP task library, one module per task; the public plug-in surface is :mod:`feedline.tasks`."""
