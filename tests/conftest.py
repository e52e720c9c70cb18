"""Test set-up: without a CUDA device, kernels run on CPU tensors through the Triton interpreter."""
import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# every test output starts as NaN, so an element the kernel never writes fails the comparison
os.environ["TILEATTN_DEBUG_FILL_NAN"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET else "cuda"


def pytest_collection_modifyitems(config, items):
    if DEVICE == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this run uses the Triton interpreter on the CPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed(request):
    # fresh inputs for every test, yet reproducible from the test id
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
