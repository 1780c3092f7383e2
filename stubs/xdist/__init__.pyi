# What tests/conftest.py uses of pytest-xdist, which ships no type information (by hand).
