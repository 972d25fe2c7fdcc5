from tests.webapp.api.helpers import api, bob, token_of  # noqa: F401
from tests.webapp.fixtures import client_in, other_user, owner, studio_dirs  # noqa: F401
