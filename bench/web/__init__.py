"""Web benchmarks: ``python -m bench.web.<script> --help`` (``bench/README.md``)."""
