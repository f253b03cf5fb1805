"""`python -m nodepool_k8s.dev.simulator` is the same as `nodepool-k8s-sim`."""

import sys

from nodepool_k8s.dev.simulator.cli import main

sys.exit(main())
