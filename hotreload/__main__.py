import sys

from hotreload.cli import main

sys.exit(main())
