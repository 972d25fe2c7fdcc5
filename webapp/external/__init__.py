"""Runs the studio did not launch: verl, TRL or the engine's CLI report them through the API."""
