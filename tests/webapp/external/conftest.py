from tests.webapp.api.helpers import api, bob  # noqa: F401
from tests.webapp.api.test_rate_limit import limit  # noqa: F401
from tests.webapp.fixtures import client_in, other_user, owner, studio_dirs  # noqa: F401
from tests.webapp.live import private_redis_layer  # noqa: F401
