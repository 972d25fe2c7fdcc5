from tests.webapp.fixtures import client_in, other_user, owner, studio_dirs, team  # noqa: F401
