"""`python -m tfra_dynamic_embedding.demo [--data PATH] [--rows N] [--epochs E] [--out DIR] ...`"""

import sys

from tfra_dynamic_embedding.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
