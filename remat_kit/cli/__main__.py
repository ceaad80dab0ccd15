"""``python -m remat_kit.cli``: the same as the ``remat-kit`` console script."""

from remat_kit.cli import main

raise SystemExit(main())
