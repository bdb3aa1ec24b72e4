import sys

from txlog.cli.program import main

sys.exit(main())
