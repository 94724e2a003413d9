"""``python -m minidl ...`` is the ``minidl`` command."""
import sys

from minidl.cli import main

sys.exit(main())
