"""Data that ships with kernel-kb: the pattern catalog, retrieval gold sets, example kernels and the
benchmark operators. A package only so that wheels carry it beside the code that reads it."""
