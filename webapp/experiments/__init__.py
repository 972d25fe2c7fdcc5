"""Experiments: a named, validated engine config owned by one user, and the builder that makes it."""
