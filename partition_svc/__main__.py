import sys

from partition_svc.server import main

sys.exit(main())
