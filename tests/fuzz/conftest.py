from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for path in (HERE, HERE.parent / "reliability"):  # campaign.py and mutate.py; hostile.py (the valid models)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
