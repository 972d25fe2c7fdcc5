"""Training benchmarks: ``python -m bench.training.<script> --help`` (``bench/README.md``)."""
