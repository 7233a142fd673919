"""The names the views commands accept (encoders, index types, stored precisions), kept apart from the modules
that implement them so that the command-line parser is built without numpy, pandas or FAISS."""

ENCODERS = ("auto", "precomputed", "open_clip", "sentence", "hashing")
INDEX_TYPES = ("flat", "hnsw", "ivf")
DTYPES = ("float32", "float16")
