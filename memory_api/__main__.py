import sys

from memory_api.cli.main import main

sys.exit(main())
