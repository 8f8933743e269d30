"""`python -m keras_txl ...` is the `txl` command."""

import sys

from keras_txl.cli import main

sys.exit(main())
