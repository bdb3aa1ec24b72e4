import sys

from coordinator_svc.server import main

sys.exit(main())
