import sys

from producer_id_svc.server import main

sys.exit(main())
