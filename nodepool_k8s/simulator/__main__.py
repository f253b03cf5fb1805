"""`python -m nodepool_k8s.simulator` is the same as `nodepool-k8s-sim`."""

import sys

from nodepool_k8s.simulator.cli import main

sys.exit(main())
