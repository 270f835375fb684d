"""The problem every command works on (problem.py), the one place that builds it into a module and inputs
(build.py), the one formula set for FLOPs and bytes (counts.py), and the records that cross packages
(records.py)."""

from .parse import (
    parse_float_list as parse_float_list,
    parse_int_list as parse_int_list,
    parse_seq_len as parse_seq_len,
    parse_seq_lens as parse_seq_lens,
    parse_size as parse_size,
)
from .problem import ELEMENT_BYTES as ELEMENT_BYTES, Problem as Problem
