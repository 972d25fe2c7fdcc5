from tests.webapp.fixtures import other_user, owner, studio_dirs  # noqa: F401
