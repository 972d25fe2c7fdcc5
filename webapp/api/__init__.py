"""The studio's REST API (``/api/``) and the per-user tokens that authenticate it."""
