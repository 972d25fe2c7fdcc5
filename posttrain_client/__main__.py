import sys

from posttrain_client.cli import main

sys.exit(main())
