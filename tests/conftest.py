import os

# Nothing may download during tests: hub clients must fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Seeds and recipes one after another by default in tests: a worker process costs seconds of imports, more than a
# tiny run trains. tests/test_time_to_result.py asks for workers explicitly and checks they give the same figures.
os.environ.setdefault("FEDVLR_JOBS", "1")

# Under pytest-xdist (`pytest -n N`) the workers share the machine's cores: each gets its share of threads, so that
# N workers with every core's worth of torch threads each do not fight over the same cores (it slows both).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    from fedvlr_plus.federation.runs.parallel import usable_cores  # (imports neither torch nor the engine)

    _threads = str(max(1, usable_cores() // _workers))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)
