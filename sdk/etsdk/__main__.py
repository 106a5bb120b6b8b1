import sys

from etsdk.cli import main

sys.exit(main())
