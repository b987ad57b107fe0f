import sys

from sheepop.cli import main

sys.exit(main())
