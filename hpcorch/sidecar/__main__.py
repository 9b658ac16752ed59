import sys

from hpcorch.sidecar.run import main

sys.exit(main())
