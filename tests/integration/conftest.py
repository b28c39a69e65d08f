import sys
from pathlib import Path

# Share the unit tier's fake provider.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
