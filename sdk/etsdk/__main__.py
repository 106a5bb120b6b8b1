import sys

from etsdk.cli.main import main

sys.exit(main())
