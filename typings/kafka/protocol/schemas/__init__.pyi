# Hand-written: the package of kafka-python's schema machinery (see fields/base.pyi).
