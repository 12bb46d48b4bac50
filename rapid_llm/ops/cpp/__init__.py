"""C++/CUDA op extensions built just in time (`jit.py`); their sources ship as package data in `csrc/`."""
