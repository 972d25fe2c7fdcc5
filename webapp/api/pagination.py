"""The lists' pagination: ``limit`` (1 to 500, default 100) and ``offset``, with bounds a query
can hold (an offset past a 64-bit integer would reach PostgreSQL as an error)."""

from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination

MAX_LIMIT = 500
MAX_OFFSET = 10**9


class Pages(LimitOffsetPagination):
    """``{"items": [...], "count": n}`` for ``?limit=&offset=``."""

    class Input(Schema):
        limit: int = Field(100, ge=1, le=MAX_LIMIT)
        offset: int = Field(0, ge=0, le=MAX_OFFSET)
