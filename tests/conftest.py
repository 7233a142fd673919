import os

# Nothing may download during tests: hub clients must fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Seeds and recipes one after another by default in tests: a worker process costs seconds of imports, more than a
# tiny run trains. tests/test_time_to_result.py asks for workers explicitly and checks they give the same figures.
os.environ.setdefault("FEDVLR_JOBS", "1")
