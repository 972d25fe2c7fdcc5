"""PostTrain Studio's benchmarks, run as modules from the repository root (``bench/README.md``).

``bench.training``: the engine against TRL, Ray and its own variants. ``bench.web``: the studio's
pages and live charts under load, in Debian's Chromium.
"""
