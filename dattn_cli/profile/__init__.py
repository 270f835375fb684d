"""`dattn profile`: one Problem run with the pattern cache and memory pool on, then off.

settings and profile-only checks (config.py), report models (report.py), peak-memory measurement
(memory.py), the repeated call and its timing (work.py), the two settings, trace and notes (run.py).
"""

from .config import ProfileSettings
from .report import ProfileReport
from .run import block_table_for, run_profile

__all__ = ["ProfileReport", "ProfileSettings", "block_table_for", "run_profile"]
