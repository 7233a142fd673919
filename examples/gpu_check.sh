#!/usr/bin/env bash
# Check and time fedvlr-plus on a machine with a CUDA GPU, from the repository root with the package installed:
# first the CUDA tests (a run on the GPU against the same run on the CPU, for FedAvg, FedNCF, the FedVLR layer and
# recbole:BPR, and the private states in files against memory), then the speed suite on the GPU.
#
#     examples/gpu_check.sh [OUT_DIR]        # default reports/gpu-suite: suite.json and suite.md
#
# The ml-100k FedVLR case encodes the item titles with the sentence model all-MiniLM-L6-v2; offline, it needs the
# model in the local Hugging Face cache, or it is recorded as failed with the reason and the suite goes on.
set -euo pipefail
out=${1:-reports/gpu-suite}
python - <<'PY' || exit 1
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device is visible to torch " + torch.__version__ + "; nothing to check here")
print("gpu_check.sh: " + torch.cuda.get_device_name(0) + ", torch " + torch.__version__)
PY
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} python -m pytest -q tests/test_cuda.py
OMP_NUM_THREADS=1 fedvlr-plus bench suite --device cuda --no-sequential --case-timeout 900 --out "$out"
