"""dattn: verify, benchmark, profile and capacity-plan long-context (dilated) attention."""

__version__ = "0.1.0"
