"""One sub-package per operation: kernels.py (Triton), launch.py (host side), configs.py, reference.py."""
